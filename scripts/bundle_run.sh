#!/usr/bin/env bash
# run.sh of a tripod bundle (scripts/bundle.sh writes it): finds the NVIDIA libraries on this
# machine, prints the GPU, driver, cuDNN and NCCL versions, and runs stages, writing three files
# into one results folder: run.log (everything), summary.txt (one line per stage, then the curves
# and tables) and details.tar.gz (each stage's logs, JSON and metrics), the last two after every stage.
#   run.sh [--dry-run] [--results DIR] [stage ...]
# Stages, in this order by default (mpi tests train grid bench-tripod bench-torch):
#   mpi           2 CPU ranks train the tiny config for 3 steps through the bundled mpirun
#   tests         every CUDA test binary (ops vs CPU, GPT step, comms, one-GPU grid, CLI, checkpoints)
#   train         50 steps of the quick-start model on cuda beside the CPU curve (cuda_train_test)
#   grid          the (2,2,2) grid on one GPU, 8 ranks with staged MPI, vs the single-rank run
#   bench-tripod  tripod_gpu_bench: GPT-2 124M and 350M, seq 1024 (--json kept)
#   bench-torch   bench/gpu/torch_baseline.py on the same shapes, then the side-by-side table
#   sanitize      compute-sanitizer memcheck of the kernel tests and three training steps (on request)
#   profile       ncu per-kernel times of a 124M step (on request)
# --results DIR (default $OUT when set, else ./results); --dry-run prints what was found and the
# commands, runs nothing, and fails when a library does not resolve.
# TRIPOD_CUDA_LIBS=dir1:dir2 adds folders to search first; BENCH_ARGS / TORCH_ARGS pass options.
set -uo pipefail
B=$(cd "$(dirname "$0")" && pwd)
DRY=0 RESULTS=${OUT:-$PWD/results} STAGES=()
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1; shift ;;
    --results) RESULTS=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    mpi|tests|train|grid|bench-tripod|bench-torch|sanitize|profile) STAGES+=("$1"); shift ;;
    *) echo "error: unknown argument '$1' (stages: mpi tests train grid bench-tripod bench-torch sanitize profile; options: --dry-run --results DIR)" >&2; exit 2 ;;
  esac
done
[ ${#STAGES[@]} -gt 0 ] || STAGES=(mpi tests train grid bench-tripod bench-torch)
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
# Each stage's files go to a scratch folder, archived into details.tar.gz after every stage: the
# results folder holds three files only (a device tool may bring back only a few).
D=$(mktemp -d /tmp/tripod-run.XXXXXX)/details
mkdir -p "$D"
trap 'rm -rf "$(dirname "$D")"' EXIT
exec > >(tee -a "$RESULTS/run.log") 2>&1

# ---- environment -------------------------------------------------------------------------
# The NVIDIA libraries: TRIPOD_CUDA_LIBS, the library path given, the toolkit's folders, then
# PyTorch's wheels (site-packages/nvidia/*/lib), then the loader's cache.
want=(libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnccl.so.2)
dirs=()
IFS=: read -r -a extra <<< "${TRIPOD_CUDA_LIBS:-}"
IFS=: read -r -a inherited <<< "${LD_LIBRARY_PATH:-}"
dirs+=("${extra[@]}" "${inherited[@]}" "${CUDA_HOME:-/usr/local/cuda}/lib64" "${CUDA_HOME:-/usr/local/cuda}/lib"
       /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu)
if command -v python3 >/dev/null; then
  while read -r d; do dirs+=("$d"); done < <(python3 - <<'EOF' 2>/dev/null
import glob, importlib.util, os
spec = importlib.util.find_spec("nvidia")
for root in (spec.submodule_search_locations if spec else []):
    for d in sorted(glob.glob(os.path.join(root, "*", "lib"))): print(d)
spec = importlib.util.find_spec("torch")
if spec and spec.origin: print(os.path.join(os.path.dirname(spec.origin), "lib"))
EOF
)
fi
found_dirs=()
declare -A where
for lib in "${want[@]}"; do
  for d in "${dirs[@]}"; do
    [ -n "$d" ] && [ -e "$d/$lib" ] || continue
    where[$lib]=$d
    case " ${found_dirs[*]} " in *" $d "*) ;; *) found_dirs+=("$d") ;; esac
    break
  done
  if [ -z "${where[$lib]:-}" ]; then
    # The driver may only be known to the loader's cache.
    p=$(/sbin/ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
    [ -n "$p" ] && where[$lib]=$(dirname "$p")
  fi
done
libpath=$B/lib
for d in "${found_dirs[@]}"; do libpath+=:$d; done
export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$B/bin:$PATH
# Open MPI and PMIx from the bundle, not from wherever they were built.
export OPAL_PREFIX=$B OPAL_EXEC_PREFIX=$B OPAL_BINDIR=$B/bin OPAL_LIBDIR=$B/lib OPAL_PKGLIBDIR=$B/lib/openmpi3 \
  OPAL_DATADIR=$B/share OPAL_PKGDATADIR=$B/share/openmpi OPAL_SYSCONFDIR=$B/etc
export PMIX_PREFIX=$B PMIX_EXEC_PREFIX=$B PMIX_LIBDIR=$B/lib PMIX_PKGLIBDIR=$B/lib/pmix PMIX_DATADIR=$B/share \
  PMIX_PKGDATADIR=$B/share/pmix PMIX_SYSCONFDIR=$B/etc PMIX_MCA_mca_base_component_path=$B/lib/pmix
export TRIPOD_SOURCE_DIR=$B/src TRIPOD_BIN=$B/bin/tripod TRIPOD_CORPUS=$B/src/build/corpus
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ncores=$(nproc)
MPIRUN=(mpirun --oversubscribe --bind-to none)

version_of() {  # a library's version from its own call (python3 ctypes), else from its real file name
  local d=${where[$1]:-} v=""
  [ -n "$d" ] || return 0
  command -v python3 >/dev/null && v=$(python3 - "$d/$1" <<'EOF' 2>/dev/null
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
if "cudnn" in sys.argv[1]:
    v = lib.cudnnGetVersion()                       # 91300 -> 9.13.0 (cuDNN 9: major*10000 + minor*100 + patch)
    print(f"{v // 10000}.{v // 100 % 100}.{v % 100}")
elif "nccl" in sys.argv[1]:
    n = ctypes.c_int()
    lib.ncclGetVersion(ctypes.byref(n))             # 22707 -> 2.27.7
    print(f"{n.value // 10000}.{n.value // 100 % 100}.{n.value % 100}")
elif "cublas" in sys.argv[1]:
    n = ctypes.c_int()
    lib.cublasGetVersion_v2(None, ctypes.byref(n))  # 130100 -> 13.1.0
    print(f"{n.value // 10000}.{n.value // 100 % 100}.{n.value % 100}")
EOF
)
  [ -n "$v" ] || v=$(basename "$(readlink -f "$d/$1")" | sed -n 's/^.*\.so\.//p')
  echo "$v"
}
echo "== tripod bundle $(cat "$B/VERSION") on $(hostname) at $(date -u +%FT%TZ)"
if command -v nvidia-smi >/dev/null; then
  GPU=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
else
  GPU="none (no nvidia-smi)"
fi
echo "GPU, driver, memory: $GPU"
echo "cuDNN: $(version_of libcudnn.so.9 || true)  NCCL: $(version_of libnccl.so.2 || true)  cuBLAS: $(version_of libcublas.so.13 || true)"
for lib in "${want[@]}"; do echo "  $lib: ${where[$lib]:-NOT FOUND}"; done
glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
read -r need needers < "$B/GLIBC_REQUIRED"
if [ "$(printf '%s\n%s\n' "$need" "$glibc" | sort -V | head -1)" != "$need" ]; then
  echo "error: this machine's glibc $glibc is older than the $need that $needers need (build the bundle on an older distribution)"
  exit 1
fi
unresolved=$(for f in "$B"/bin/*; do ldd "$f" 2>/dev/null | grep 'not found'; done | sort -u)
if [ -n "$unresolved" ]; then
  echo "error: libraries not found (set TRIPOD_CUDA_LIBS=dir:dir to where they are):"; echo "$unresolved"
  [ "$DRY" = 1 ] && exit 1
fi
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
echo "stages: ${STAGES[*]}; results in $RESULTS"

# ---- stages --------------------------------------------------------------------------------
SUMMARY=()
# run NAME TIMEOUT_S CMD...: logs to details/NAME.log and stdout; records status and time.
run() {
  local name=$1 limit=$2; shift 2
  echo "== $name: $*"
  [ "$DRY" = 1 ] && return 0
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" > >(tee "$D/$name.log") 2>&1
  rc=$?
  local st=ok; [ $rc -ne 0 ] && st="FAILED (exit $rc)"; [ $rc -eq 124 ] && st="TIMED OUT (${limit}s)"
  SUMMARY+=("$(printf '%-26s %-18s %5ds' "$name" "$st" $((SECONDS - t0)))")
  return $rc
}
gtest_counts() {  # "passed P, failed F, skipped S": distinct test names (every MPI rank prints its own)
  local f=$D/$1.log
  count() { grep -oE "^\[ *$1 *\] [A-Za-z_][A-Za-z0-9_/.]*" "$f" | sed 's/.*\] //' | sort -u | wc -l; }
  printf 'passed %s, failed %s, skipped %s' "$(count OK)" "$(count FAILED)" "$(count SKIPPED)"
}
gpu_tests() {
  local t np
  for t in "$B"/bin/cuda_*_test; do
    t=$(basename "$t")
    [ "$t" = cuda_train_test ] && continue   # its checks are the train and grid stages
    np=1
    case $t in cuda_comm_test) np=2 ;; cuda_grid_test) np=4 ;; esac
    if [ $np -gt 1 ]; then
      run "$t" 240 "${MPIRUN[@]}" -np $np "$B/bin/$t" --gtest_output="xml:$D/$t.xml"
    else
      run "$t" 240 "$B/bin/$t" --gtest_output="xml:$D/$t.xml"
    fi
    [ "$DRY" = 1 ] || SUMMARY[-1]+="  $(gtest_counts "$t")"
  done
}
train_test() {  # one test of cuda_train_test; it keeps its runs and curve under details/
  run "$1" 300 env TRIPOD_TEST_KEEP="$D/$1" "$B/bin/cuda_train_test" --gtest_filter="$2" --gtest_output="xml:$D/$1.xml"
  [ "$DRY" = 1 ] || SUMMARY[-1]+="  $(gtest_counts "$1")"
}
bench_tripod() {
  run bench-tripod 420 "$B/bin/tripod_gpu_bench" --json "$D/bench_tripod.json" ${BENCH_ARGS:-}
}
bench_torch() {
  if ! python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    SUMMARY+=("$(printf '%-26s %s' bench-torch 'skipped: no python3 with CUDA PyTorch')"); return 0
  fi
  local match=(); [ -f "$D/bench_tripod.json" ] && match=(--match "$D/bench_tripod.json")
  run bench-torch 480 python3 "$B/src/bench/gpu/torch_baseline.py" "${match[@]}" --json "$D/bench_torch.json" ${TORCH_ARGS:-}
}
sanitize() {
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [ -z "$cs" ]; then SUMMARY+=("$(printf '%-26s %s' sanitize 'skipped: no compute-sanitizer')"); return 0; fi
  run sanitize-kernels 280 "$cs" --tool memcheck --error-exitcode 3 "$B/bin/cuda_kernels_test"
  run sanitize-train 120 "$cs" --tool memcheck --error-exitcode 3 "$B/bin/tripod" train \
    --config "$B/src/configs/tiny.toml" --set train.device=cuda --set train.steps=3 --set train.log_interval=1 \
    --set train.output_dir="$D/sanitize-train-run"
}
profile() {
  local ncu
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
  if [ -z "$ncu" ]; then SUMMARY+=("$(printf '%-26s %s' profile 'skipped: no ncu')"); return 0; fi
  # Two 124M steps at micro-batch 8 (about 1000 kernels each), every kernel timed on its own.
  run profile 180 "$ncu" --csv --launch-count 3000 \
    --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    "$B/bin/tripod_gpu_bench" --model 124M --micro-batch 8 --steps 1 --warmup 1 --no-split
  [ "$DRY" = 1 ] || python3 "$B/src/bench/gpu/summary.py" --ncu "$D/profile.log" > "$D/profile_top.txt" || true
}

# summary.txt is rewritten after every stage, so a run cut short still leaves it.
write_summary() {
  {
    echo "tripod bundle $(cat "$B/VERSION"); GPU: $GPU; cuDNN $(version_of libcudnn.so.9); NCCL $(version_of libnccl.so.2)"
    printf '%s\n' "${SUMMARY[@]}"
    for f in "$D"/train/*/curve.txt "$D"/grid/*/curve.txt "$D"/train/*/evals.txt; do [ -f "$f" ] && { echo; cat "$f"; }; done
    if [ -f "$D/bench_tripod.json" ]; then
      echo
      python3 "$B/src/bench/gpu/summary.py" "$D/bench_tripod.json" $([ -f "$D/bench_torch.json" ] && echo "$D/bench_torch.json") ||
        cat "$D/bench-tripod.log"
    fi
    [ -f "$D/profile_top.txt" ] && { echo; cat "$D/profile_top.txt"; }
  } > "$RESULTS/summary.txt" 2>&1
}

for s in "${STAGES[@]}"; do
  case $s in
    mpi) run mpi 120 env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$B/bin/tripod" train \
           --config "$B/src/configs/tiny.toml" --set train.steps=3 --set train.log_interval=1 --set train.output_dir="$D/mpi-run" ;;
    tests) gpu_tests ;;
    train) train_test train 'CudaTrain.FiftyStepsFollowTheCpuCurve:CudaTrain.CheckpointsMoveBetweenDevices' ;;
    grid) train_test grid 'CudaTrain.GridOnOneGpuMatchesSingleRank' ;;
    bench-tripod) bench_tripod ;;
    bench-torch) bench_torch ;;
    sanitize) sanitize ;;
    profile) profile ;;
  esac
  [ "$DRY" = 1 ] && continue
  write_summary
  # Checkpoints stay out of the archive.
  tar -C "$(dirname "$D")" -czf "$RESULTS/details.tar.gz" --exclude='ckpt_*' --exclude='*.h5' details
done
[ "$DRY" = 1 ] && { echo "dry run: nothing ran"; exit 0; }
echo; cat "$RESULTS/summary.txt"
grep -q 'FAILED\|TIMED OUT' "$RESULTS/summary.txt" && exit 1
exit 0
