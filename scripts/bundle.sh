#!/usr/bin/env bash
# Builds the release with CUDA (in build-bundle/, ccache when present) and writes a relocatable
# folder that runs on a bare GPU machine (driver, CUDA toolkit, cuDNN and NCCL there; none of
# tripod's Debian packages):
#   bin/     tripod, the CUDA test binaries, tripod_gpu_bench, mpirun (orterun) and orted
#   lib/     every shared library those need (found with ldd) except glibc and the NVIDIA ones
#            (driver, CUDA toolkit, cuDNN, NCCL), which run.sh finds on the target; Open MPI's
#            plugins in lib/openmpi3, PMIx's in lib/pmix (the network-fabric ones are left out:
#            one machine needs only shared memory and TCP)
#   share/ etc/   Open MPI / PMIx help texts and parameter files (relocated with OPAL_PREFIX)
#   src/     configs, test fixtures, the test and benchmark scripts, the tokenized KJV corpus
#   run.sh   (scripts/bundle_run.sh) sets everything up and runs the stages; --help
# tripod's binaries carry RPATH $ORIGIN/../lib (set at link time); run.sh sets LD_LIBRARY_PATH,
# which Open MPI's libraries need (their RUNPATH names the build machine's folder).
#   scripts/bundle.sh [--archive FILE.tar.gz] [--no-build] OUT
# BUILD (default build-bundle) names the build directory; --no-build packs what it holds.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
BUILD=${BUILD:-build-bundle}
ARCHIVE="" NO_BUILD=0 OUT=""
while [ $# -gt 0 ]; do
  case $1 in
    --archive) ARCHIVE=$2; shift 2 ;;
    --no-build) NO_BUILD=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "error: unknown option $1 (valid: --archive FILE, --no-build, OUT)" >&2; exit 2 ;;
    *) [ -z "$OUT" ] || { echo "error: one output folder only (got $OUT and $1)" >&2; exit 2; }; OUT=$1; shift ;;
  esac
done
[ -n "$OUT" ] || { echo "error: no output folder given (scripts/bundle.sh [--archive F] OUT)" >&2; exit 2; }
case $ARCHIVE in ''|*.tar.gz) ;; *) echo "error: --archive $ARCHIVE must end in .tar.gz" >&2; exit 2 ;; esac
# OUT is replaced: only a folder that is empty, absent or an earlier bundle.
if [ -d "$OUT" ] && [ -n "$(ls -A "$OUT")" ] && ! [ -f "$OUT/run.sh" -a -f "$OUT/GLIBC_REQUIRED" ]; then
  echo "error: $OUT exists and is not a bundle; name a new folder (it is replaced)" >&2; exit 2
fi
[ ! -e "$OUT" ] || [ -d "$OUT" ] || { echo "error: $OUT exists and is not a folder" >&2; exit 2; }

TARGETS="tripod tripod_gpu_bench cuda_kernels_test cuda_model_test cuda_comm_test cuda_grid_test cuda_cli_test cuda_train_test"
if [ "$NO_BUILD" = 0 ]; then
  T_LOG=$(mktemp)
  trap 'rm -f "$T_LOG"' EXIT
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  # No ICU (30 MB of Unicode data, for NFC tokenizers that the GPU checks never read: the archive
  # stays under 45 MB). Portable code for the target's CPU (x86-64-v3: AVX2/FMA), no build-tree RPATH (only
  # $ORIGIN/../lib, as DT_RPATH so it also serves the dependencies of libraries without a RUNPATH
  # of their own), and test discovery at ctest time, not at build time.
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIPOD_CUDA=ON -DTRIPOD_NATIVE=OFF -DTRIPOD_ICU=OFF \
    -DCMAKE_CXX_FLAGS=-march=x86-64-v3 -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib' \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST \
    "${launcher[@]}" > "$T_LOG" 2>&1 || { cat "$T_LOG"; exit 1; }
  # shellcheck disable=SC2086
  nice cmake --build "$BUILD" -j"$(nproc)" --target $TARGETS
fi
for t in $TARGETS; do [ -x "$BUILD/bin/$t" ] || { echo "error: $BUILD/bin/$t missing; build without --no-build" >&2; exit 2; }; done
TRIPOD_BIN="$BUILD/bin/tripod" scripts/prepare_corpus.sh "$BUILD" > /dev/null

rm -rf "$OUT"
mkdir -p "$OUT"/{bin,lib/openmpi3,lib/pmix,share,etc,src}
OUT=$(cd "$OUT" && pwd)
# shellcheck disable=SC2086
for t in $TARGETS; do strip --strip-unneeded -o "$OUT/bin/$t" "$BUILD/bin/$t"; done

# Open MPI 4 (Debian's layout; `ompi_info --path all` names the folders).
OMPI_LIBDIR=/usr/lib/x86_64-linux-gnu/openmpi/lib
PMIX_DIR=/usr/lib/x86_64-linux-gnu/pmix2
cp "$(readlink -f "$(command -v mpirun)")" "$OUT/bin/mpirun"
cp "$(command -v orted)" "$OUT/bin/orted"
cp -r /usr/share/openmpi "$OUT/share/openmpi"
cp -r "$PMIX_DIR/share/pmix" "$OUT/share/pmix"
cp "$PMIX_DIR"/lib/pmix/*.so "$OUT/lib/pmix/"
# Plugins that need a network fabric library (UCX, libfabric, verbs, PSM) are not needed on one
# machine and would pull in tens of MB; the parameter file below switches them off too.
fabric='libuc[pts]|libfabric|libibverbs|librdmacm|libpsm|libhcoll|libmxm|libknem|libxpmem'
# The libraries FILE names itself (DT_NEEDED): reading them is instant, where ldd maps every
# library of the closure (a second for anything near cuBLAS).
needed() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p'; }
for p in "$OMPI_LIBDIR"/openmpi3/mca_*.so; do
  needed "$p" | grep -Eq "$fabric" || cp "$p" "$OUT/lib/openmpi3/"
done
cat > "$OUT/etc/openmpi-mca-params.conf" <<'EOF'
# One machine: shared memory and TCP, no fabric plugins (they are not in the bundle).
btl_base_warn_component_unused = 0
btl = self,vader,tcp
pml = ob1
mtl = ^ofi
osc = ^ucx,pt2pt
# Containers often refuse cross-memory attach; plain copies work everywhere.
btl_vader_single_copy_mechanism = none
# GPU machines often have no ssh: Open MPI's rsh launcher refuses to start, even for local ranks,
# when its agent is missing. One machine launches nothing remotely, so any agent found will do.
plm_rsh_agent = false
EOF
: > "$OUT/etc/pmix-mca-params.conf"

# Every library the binaries and plugins load (ldd lists the libraries' own dependencies too),
# except glibc and NVIDIA's, which run.sh finds on the target.
allowed='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libutil\.so|libcuda\.so|libcudart|libcublas|libcublasLt|libcudnn|libnccl|libnvrtc|libnvJitLink|libnvidia)'
# ldd (it lists the libraries' own dependencies too) only for a file that names a library not yet
# in lib/ (the binaries first: they bring nearly all of them).
copy_deps() {
  local name missing=0
  for name in $(needed "$1"); do
    [[ $name =~ $allowed ]] || [ -e "$OUT/lib/$name" ] || missing=1
  done
  [ "$missing" = 1 ] || return 0
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
    echo "$name" | grep -Eq "$allowed" && continue
    [ -e "$OUT/lib/$name" ] || cp -L "$path" "$OUT/lib/$name"
  done
}
for f in "$OUT"/bin/* "$OUT"/lib/openmpi3/*.so "$OUT"/lib/pmix/*.so; do copy_deps "$f"; done
strip --strip-unneeded "$OUT"/lib/*.so* "$OUT"/lib/openmpi3/*.so "$OUT"/lib/pmix/*.so 2>/dev/null || true

# The newest glibc symbol version anything needs, and what needs it (run.sh compares it with the
# target's; Debian 12's libstdc++ and libevent need 2.36).
glibc_of() { objdump -T "$1" 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1; }
need=$(for f in "$OUT"/bin/* "$OUT"/lib/*.so* "$OUT"/lib/*/*.so; do glibc_of "$f"; done | sort -uV | tail -1)
echo "$need $(for f in "$OUT"/bin/* "$OUT"/lib/*.so* "$OUT"/lib/*/*.so; do
  [ "$(glibc_of "$f")" = "$need" ] && basename "$f"; done | tr '\n' ' ')" > "$OUT/GLIBC_REQUIRED"

# Sources the tests and benchmarks read, and the corpus (src/ is their source tree).
mkdir -p "$OUT/src/tests" "$OUT/src/bench" "$OUT/src/build"
cp -r configs "$OUT/src/"
cp -r tests/fixtures tests/cuda "$OUT/src/tests/"
rm -f "$OUT"/src/tests/cuda/*.cpp "$OUT"/src/tests/cuda/*.h "$OUT"/src/tests/cuda/CMakeLists.txt
cp -r bench/gpu "$OUT/src/bench/"
rm -f "$OUT"/src/bench/gpu/*.cpp "$OUT"/src/bench/gpu/CMakeLists.txt
mkdir -p "$OUT/src/build/corpus"
cp "$BUILD"/corpus/kjv_text_document.{bin,idx} "$BUILD"/corpus/kjv_bpe4096.model "$OUT/src/build/corpus/"
cp scripts/bundle_run.sh "$OUT/run.sh"
chmod +x "$OUT/run.sh"
git -C "$SRC" describe --always --dirty > "$OUT/VERSION" 2>/dev/null || echo unknown > "$OUT/VERSION"

echo "bundle: $OUT ($(du -sh "$OUT" | cut -f1), glibc >= $(cat "$OUT/GLIBC_REQUIRED"))"
if [ -n "$ARCHIVE" ]; then
  mkdir -p "$(dirname "$ARCHIVE")"
  tar -C "$(dirname "$OUT")" -czf "$ARCHIVE.tmp" "$(basename "$OUT")"
  mv "$ARCHIVE.tmp" "$ARCHIVE"
  echo "bundle: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"
fi
