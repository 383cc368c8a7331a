#!/usr/bin/env bash
# Installs the Debian packages tripod needs (only those missing), builds, and prepares the corpus.
# Idempotent: a second run installs nothing and rebuilds only what changed.
#   scripts/setup.sh            install + build build/bin/tripod for CPUs (what the quick start runs)
#   scripts/setup.sh --all      install + build everything: CUDA when nvcc is found, tests, benchmarks
#   scripts/setup.sh --deps     install only
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config
  libopenmpi-dev openmpi-bin
  libhdf5-openmpi-dev
  libsentencepiece-dev sentencepiece
  libpcre2-dev libicu-dev
  libtomlplusplus-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libopenblas-openmp-dev
  libprotobuf-dev protobuf-compiler
  libgtest-dev libgmock-dev libbenchmark-dev
  bible-kjv-text bible-kjv
  iproute2
  chromium
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "${1:-}" = "--deps" ] && exit 0

if [ "${1:-}" = "--all" ]; then
  cmake --preset release >/dev/null
  cmake --build --preset release
elif [ -f build/CMakeCache.txt ]; then
  cmake --build build --target tripod -j 2   # as build/ is configured (CUDA too after --all)
else
  cmake --preset cpu >/dev/null
  cmake --build --preset cpu --target tripod
fi
scripts/prepare_corpus.sh build
