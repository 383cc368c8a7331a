#!/usr/bin/env bash
# Packs the GPU bundle (scripts/bundle.sh; it reuses build-bundle/, so only the first run builds
# everything) and checks, without a GPU:
#   - with only the bundle's lib/ on the library path (and no other environment), every
#     dependency of every binary, library and MPI plugin resolves inside the bundle, except glibc
#     and the NVIDIA libraries (driver, CUDA toolkit, cuDNN, NCCL) that run.sh finds on the target;
#   - run.sh --dry-run finds the NVIDIA libraries here and lists the stages;
#   - run.sh's mpi stage trains 2 CPU ranks through the bundled mpirun without opening any file of
#     this machine's Open MPI or PMIx installation, and leaves run.log, summary.txt, details.tar.gz;
#   - the archive is small (under 60 MB: the device tool carries 64 MiB).
# BUNDLE_BUILD overrides the build folder (default build-bundle in the source tree).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d /tmp/tripod_bundle_test.XXXXXX)
trap 'rm -rf "$T"' EXIT
OUT=$T/tripod-bundle
fail() { echo "FAIL: $*" >&2; exit 1; }

BUILD=${BUNDLE_BUILD:-$SRC/build-bundle} "$SRC/scripts/bundle.sh" --archive "$T/tripod-bundle.tar.gz" "$OUT"

allowed='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libutil\.so|libcuda\.so|libcudart|libcublas|libcublasLt|libcudnn|libnccl|libnvrtc|libnvJitLink|libnvidia)'
# check_ldd FILE ENV...: every dependency of FILE (under env -i ENV) is allowed or inside $OUT/lib.
check_ldd() {
  local f=$1; shift
  env -i "$@" ldd "$f" | while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    echo "$name" | grep -Eq "$allowed" && continue
    case $(realpath -m "$path") in "$OUT"/lib/*) ;; *) echo "$f: $name => $path" ;; esac
  done
}
bad=$(for f in "$OUT"/bin/* "$OUT"/lib/*.so* "$OUT"/lib/openmpi3/*.so "$OUT"/lib/pmix/*.so; do
  check_ldd "$f" LD_LIBRARY_PATH="$OUT/lib"
done)
[ -z "$bad" ] || fail "dependencies outside the bundle:"$'\n'"$bad"
n_libs=$(ls "$OUT"/lib/*.so* | wc -l)
[ "$n_libs" -ge 10 ] || fail "only $n_libs libraries in lib/"
for f in tripod tripod_gpu_bench cuda_kernels_test cuda_train_test mpirun; do [ -x "$OUT/bin/$f" ] || fail "bin/$f missing"; done
for f in src/configs/quickstart.toml src/build/corpus/kjv_text_document.bin src/build/corpus/kjv_bpe4096.model \
         src/bench/gpu/torch_baseline.py src/bench/gpu/summary.py run.sh GLIBC_REQUIRED; do
  [ -s "$OUT/$f" ] || fail "$f missing"
done

dry=$("$OUT/run.sh" --dry-run --results "$T/dry") || fail "run.sh --dry-run failed:"$'\n'"$dry"
for want in "libcudnn.so.9: /" "libnccl.so.2: /" "libcublasLt.so.13: /" "== mpi: " "== cuda_kernels_test: " "== train: " "== grid: " "== bench-tripod: " "dry run: nothing ran"; do
  grep -qF -- "$want" <<< "$dry" || fail "run.sh --dry-run does not show '$want':"$'\n'"$dry"
done

# The bundled Open MPI, relocated: 2 ranks train, and no file of /usr's Open MPI or PMIx is opened
# (libmpi's RUNPATH still makes the loader probe its build folder for glibc: those opens fail).
strace -f -qq -e trace=open,openat,execve -o "$T/strace" "$OUT/run.sh" --results "$T/mpi" mpi > "$T/mpi.out" 2>&1 ||
  fail "run.sh mpi failed:"$'\n'"$(tail -30 "$T/mpi.out")"
grep -q 'mpi  *ok' "$T/mpi/summary.txt" || fail "no mpi ok in summary.txt: $(cat "$T/mpi/summary.txt")"
leaks=$(grep -E '= [0-9]+$' "$T/strace" | grep -oE '"/(usr/lib/x86_64-linux-gnu/(openmpi|pmix2|libmpi|libopen-|libpmix)|usr/share/(openmpi|pmix)|etc/openmpi)[^"]*"' | sort -u | head || true)
[ -z "$leaks" ] || fail "the bundled mpirun read the system's Open MPI files:"$'\n'"$leaks"
[ "$(ls "$T/mpi" | tr '\n' ' ')" = "details.tar.gz run.log summary.txt " ] ||
  fail "the results folder should hold details.tar.gz run.log summary.txt, not: $(ls "$T/mpi")"
tar -tzf "$T/mpi/details.tar.gz" | grep -q 'details/mpi-run/metrics.jsonl' || fail "details.tar.gz lacks the mpi run's metrics"

size=$(stat -c %s "$T/tripod-bundle.tar.gz")
unpacked=$(du -sb "$OUT" | cut -f1)
echo "bundle: $((unpacked / 1000000)) MB unpacked, archive $((size / 1000000)) MB, $n_libs libraries"
[ "$size" -lt 60000000 ] || fail "archive is $size bytes (limit 60 MB)"
echo "bundle_test: ok"
