#!/usr/bin/env bash
# run.sh of a tripod bundle (scripts/bundle.sh writes it): finds the NVIDIA libraries on this
# machine and runs the GPU checks as stages in priority order within a time budget, writing into
# one results folder: run.log (everything, long outputs cut), summary.txt (a table of the stages,
# then the versions, curves and tables) and details.tar.gz (every stage's full logs, JSON,
# curves), the last two rewritten after every stage so a run cut off still returns what it had,
# and hardware_cuda.toml when the calibrate stage ran.
#   run.sh [--budget S] [--dry-run] [--results DIR] [stage ...]
#   run.sh --quick [--previous SUMMARY] [--budget S] [--dry-run] [--results DIR]
# Stages, by default all but mpi in this order (cap = the most a stage may take):
#   probe          GPU, driver, CUDA runtime, cuBLAS(Lt), cuDNN, NCCL versions; the tools found
#   ops            cuda_kernels_test: every CUDA op against the CPU backend, poisoned outputs
#   step           one training step on CUDA against the CPU: cuda_model_test (tiny GPT and
#                  Llama: loss, every gradient and master weight) and CudaTrain.OneStepMatchesCpu
#                  (the quick-start model: loss, grad norm, every parameter's gradient and update)
#   train          50 quick-start steps against the CPU curve; a GPU checkpoint evaluated on the CPU
#   bench-124m     tripod_gpu_bench GPT-2 124M, seq 1024, 20 timed steps (tokens/s, MFU, memory, split)
#   torch-compile  the PyTorch baseline on the same shape and micro-batch with torch.compile, and the ratio
#   torch-eager    the same baseline eager
#   bench-1b       tripod_gpu_bench, a Llama-3.2-1B-shaped model
#   bench-350m     tripod_gpu_bench GPT-2 350M
#   hf             tripod's Hugging Face exports of a trained tiny GPT-2, Llama and Mixtral loaded by
#                  transformers (fp32): the same chapters' log-likelihoods as tripod eval, within
#                  1e-5 relative (bench/gpu/hf_check.py)
#   grid           the (2,2,2) quick-start grid as 8 ranks on one GPU against one rank
#   comm           cuda_comm_test (2 ranks), cuda_grid_test (4 ranks), cuda_cli_test
#   calibrate      tripod calibrate --device cuda into hardware_cuda.toml (in the results folder)
#   plan-check     the planner on that file against this run's bench-124m/350m/1b steps
#                  (bench/gpu/plan_check.py), and a profiled 124M run's plan --check table
#   fp8            FP8 (train.precision = "fp8"): the casts and FP8 GEMMs against the CPU's emulation
#                  (every f32 converted as the CPU does; bytes equal, GEMMs within f32 noise), 50
#                  quick-start steps in fp8 (both recipes) against the bf16 curve, and
#                  tripod_gpu_bench --precision both: the Llama-3.2-1B shape at seq 2048 and GPT-2
#                  350M, fp8 tokens/s against bf16 in the same process (targets 1.3x and 1.15x)
#   sanitize       compute-sanitizer memcheck of cuda_kernels_test and a 3-step training run
#   profile        ncu: the top kernels of one 124M step by GPU time
#   mpi            (only when named) 2 CPU ranks train the tiny config through the bundled mpirun
# --budget S (default 540): the whole run's seconds. Each stage's cap is the smaller of its own cap
# and what is left minus 25 s (20 s to pack the results, 5 s for a killed stage to go); a stage
# whose cap would fall under its minimum is not started ("no-time") and later, smaller ones still
# run. A failing or timed-out stage never stops the next.
# --quick reruns probe and then only the stages that did not pass in an earlier run: FAILED,
# TIMED_OUT, no-time, pending (the run was cut off) or absent from its summary; it reads
# --previous SUMMARY, else the summary.txt that the last run from this folder left in last/ (on
# the same machine it starts from that run's details, so the tables stay whole).
# --results DIR (default $OUT when set, else ./results). --dry-run prints what was found, the plan
# (each stage's estimate, cap and start if every stage took its estimate) and the commands, runs
# nothing, and fails when a library does not resolve.
# TRIPOD_CUDA_LIBS=dir1:dir2 adds folders to search first; BENCH_ARGS / TORCH_ARGS pass options.
set -uo pipefail
B=$(cd "$(dirname "$0")" && pwd)
DRY=0 QUICK=0 PREVIOUS="" BUDGET=540 RESULTS=${OUT:-$PWD/results} STAGES=()
RESERVE=20 GRACE=5

# name  estimate  cap  minimum (seconds). Estimates: the times the stages took on an H200 on
# 2026-11-29 (rounded up; profile did not complete there: ncu failed on a kernel of the first
# step and hung until its cap, so its estimate is still a guess).
STAGE_TABLE="
probe         10   30   5
ops           15  120  10
step          10  120   5
train         15  180  10
bench-124m    15  150  10
torch-compile 70  180  50
torch-eager   30  120  20
bench-1b      30  150  20
bench-350m    20  120  15
hf            30  120  20
grid          10  150   5
comm           5  120   5
calibrate     25  120  20
plan-check    10   90  10
fp8           65  240  45
sanitize      15  300  10
profile       90  150  60
mpi           15  120  10
"
declare -A EST CAP MIN
ALL=()
while read -r n e c m; do
  [ -n "$n" ] || continue
  EST[$n]=$e CAP[$n]=$c MIN[$n]=$m
  ALL+=("$n")
done <<< "$STAGE_TABLE"
DEFAULT=("${ALL[@]:0:${#ALL[@]}-1}")  # all but mpi

usage() { sed -n '2,44p' "$0" | sed 's/^# \{0,1\}//'; }
bad() { echo "error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY=1; shift ;;
    --quick) QUICK=1; shift ;;
    --previous) [ $# -ge 2 ] || bad "--previous needs a summary.txt"; PREVIOUS=$2; shift 2 ;;
    --budget) [ $# -ge 2 ] || bad "--budget needs a number of seconds"; BUDGET=$2; shift 2 ;;
    --results) [ $# -ge 2 ] || bad "--results needs a folder"; RESULTS=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) bad "unknown option '$1' (options: --budget S --quick --previous SUMMARY --dry-run --results DIR)" ;;
    *) [ -n "${EST[$1]:-}" ] || bad "unknown stage '$1' (stages: ${ALL[*]})"; STAGES+=("$1"); shift ;;
  esac
done
[[ $BUDGET =~ ^[0-9]+$ ]] && [ "$BUDGET" -ge 60 ] && [ "$BUDGET" -le 36000 ] ||
  bad "--budget $BUDGET: a whole number of seconds from 60 to 36000"

# ---- the stages to run -------------------------------------------------------------------
declare -A PREV_LINE
# quick_select SUMMARY: probe, then each default stage whose status in SUMMARY's stage table
# (the lines after the "stage status" header, up to the first blank line) is not ok or skipped.
quick_select() {
  awk -v stages="${DEFAULT[*]}" '
    BEGIN { n = split(stages, order, " ") }
    /^stage +status/ { table = 1; found = 1; next }
    table && NF == 0 { exit }
    table { status[$1] = $2 }
    END {
      if (!found) exit 3
      printf "probe"
      for (i = 1; i <= n; i++) {
        s = order[i]
        if (s == "probe") continue
        if (!(s in status) || (status[s] != "ok" && status[s] != "skipped")) printf " %s", s
      }
      print ""
    }' "$1"
}
if [ "$QUICK" = 1 ]; then
  [ ${#STAGES[@]} -eq 0 ] || bad "--quick picks the stages from the earlier run's summary; name none (got ${STAGES[*]})"
  [ -n "$PREVIOUS" ] || PREVIOUS=$B/last/summary.txt
  [ -f "$PREVIOUS" ] || bad "--quick: no earlier summary at $PREVIOUS (give the first run's summary.txt with --previous FILE)"
  picked=$(quick_select "$PREVIOUS") || bad "--previous $PREVIOUS: no stage table (a line 'stage status ...') in it; is it a run.sh summary.txt?"
  read -r -a STAGES <<< "$picked"
  # The earlier statuses of the stages not rerun go into this run's table (so a later --quick
  # from this run's summary still knows them).
  while read -r n line; do PREV_LINE[$n]=$line; done < <(awk '/^stage +status/ { t = 1; next } t && NF == 0 { exit } t' "$PREVIOUS")
else
  [ -z "$PREVIOUS" ] || bad "--previous is for --quick"
fi
[ ${#STAGES[@]} -gt 0 ] || STAGES=("${DEFAULT[@]}")

mkdir -p "$RESULTS" || bad "--results $RESULTS: cannot create it"
RESULTS=$(cd "$RESULTS" && pwd)
# Each stage's files go to a scratch folder, archived into details.tar.gz after every stage: the
# results folder holds a few files only (easy to copy back from a node).
D=$(mktemp -d /tmp/tripod-run.XXXXXX)/details
mkdir -p "$D"
TEE_PID=""
# On exit: the scratch folder goes, and run.log is complete before run.sh returns (a job script
# may copy the results folder as soon as the command ends).
trap 'rm -rf "$(dirname "$D")"; if [ -n "$TEE_PID" ]; then exec >&- 2>&-; wait "$TEE_PID"; fi' EXIT
# A --quick on the machine of the run it follows starts from that run's details (so the summary's
# tables stay whole).
if [ "$QUICK" = 1 ] && [ "$DRY" = 0 ] && [ -d "$B/last/details" ] && cmp -s "$PREVIOUS" "$B/last/summary.txt"; then
  cp -r "$B/last/details/." "$D/"
  rm -f "$D"/*.log.cut
fi
exec > >(tee -a "$RESULTS/run.log") 2>&1
TEE_PID=$!

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
  while read -r d; do dirs+=("$d"); done < <(timeout 30 python3 - <<'EOF' 2>/dev/null
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
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
MPIRUN=(mpirun --oversubscribe --bind-to none)

# A library's version from its own call (python3 ctypes), else from its real file name.
version_of() {
  local d=${where[$1]:-} v=""
  [ -n "$d" ] || { echo "not found"; return 0; }
  command -v python3 >/dev/null && v=$(timeout 15 python3 - "$d/$1" <<'EOF' 2>/dev/null
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
n = ctypes.c_int()
def dotted(v, major):                                # 91300 -> 9.13.0; 13000 -> 13.0 (CUDA: major*1000 + minor*10)
    return f"{v // major}.{v // (major // 100) % 100}.{v % 100}" if major == 10000 else f"{v // 1000}.{v % 1000 // 10}"
if "cudnn" in sys.argv[1]:
    print(dotted(lib.cudnnGetVersion(), 10000))
elif "nccl" in sys.argv[1]:
    lib.ncclGetVersion(ctypes.byref(n)); print(dotted(n.value, 10000))
elif "cublasLt" in sys.argv[1]:
    lib.cublasLtGetVersion.restype = ctypes.c_size_t; print(dotted(lib.cublasLtGetVersion(), 10000))
elif "cublas" in sys.argv[1]:
    lib.cublasGetVersion_v2(None, ctypes.byref(n)); print(dotted(n.value, 10000))
elif "cudart" in sys.argv[1]:
    lib.cudaRuntimeGetVersion(ctypes.byref(n)); r = dotted(n.value, 1000)
    lib.cudaDriverGetVersion(ctypes.byref(n))
    print(f"{r} (the driver supports CUDA {dotted(n.value, 1000)})" if n.value else f"{r} (no driver)")
EOF
)
  [ -n "$v" ] || v=$(basename "$(readlink -f "$d/$1")" | sed -n 's/^.*\.so\.//p')
  echo "$v"
}
echo "== tripod bundle $(cat "$B/VERSION") on $(hostname) at $(date -u +%FT%TZ)"
GPU="none (no nvidia-smi)"
command -v nvidia-smi >/dev/null &&
  GPU=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)
echo "GPU, driver, memory: $GPU"
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
echo "budget ${BUDGET}s; stages: ${STAGES[*]}$([ "$QUICK" = 1 ] && echo " (--quick from $PREVIOUS)"); results in $RESULTS"

# ---- running a stage ---------------------------------------------------------------------
# The clock: seconds since run.sh started (SECONDS); a dry run plans from 0 (SIM) as if every
# stage took its estimate (or its cap, when smaller).
SIM=0
declare -A STATUS TIME CAPS NOTES
for s in "${STAGES[@]}"; do STATUS[$s]=pending; done
STAGE="" STAGE_END=0 STAGE_RC=0

# cmd LABEL CMD...: one command of the current stage, killed at the stage's deadline; its output
# goes to details/STAGE.log whole and to run.log cut at 400 lines of 300 characters.
cmd() {
  local label=$1; shift
  echo "-- $STAGE/$label: $*"
  [ "$DRY" = 1 ] && return 0
  local t=$((STAGE_END - SECONDS)) rc
  if [ $t -le 0 ]; then STAGE_RC=124; echo "   (no time left in $STAGE's cap)"; return 124; fi
  echo "-- $STAGE/$label: $*" >> "$D/$STAGE.log"
  timeout --kill-after=$GRACE $t "$@" 2>&1 | tee -a "$D/$STAGE.log" |
    awk 'NR <= 400 { print substr($0, 1, 300) } NR == 401 { print "   ... (the rest in details/'"$STAGE"'.log)" }'
  rc=${PIPESTATUS[0]}
  [ $rc -eq 137 ] && rc=124
  echo "-- $STAGE/$label: exit $rc"
  if [ $rc -ne 0 ] && { [ $STAGE_RC -eq 0 ] || [ $rc -eq 124 ]; }; then STAGE_RC=$rc; fi
  return $rc
}
skip() { echo "-- $STAGE: skipped: $*"; STAGE_RC=skip; NOTES[$STAGE]="$*"; }
note() { NOTES[$STAGE]="${NOTES[$STAGE]:+${NOTES[$STAGE]}; }$*"; }

# "passed P, failed F, skipped S" and the failed tests' names, from a stage's GoogleTest output
# (distinct names: every MPI rank prints its own).
gtest_note() {
  local f=$D/$STAGE.log
  [ "$DRY" = 0 ] && [ -f "$f" ] || return 0
  names() { grep -oE "^\[ *$1 *\] [A-Za-z_][A-Za-z0-9_/.]*" "$f" | sed 's/.*\] //' | sort -u; }
  local failed
  failed=$(names FAILED | tr '\n' ' ')
  note "passed $(names OK | wc -l), failed $(names FAILED | wc -l), skipped $(names SKIPPED | wc -l)${failed:+: $failed}"
}

# ---- the stages ----------------------------------------------------------------------------
probe() {
  local f=$D/probe.txt
  if [ "$DRY" = 1 ]; then echo "-- probe: nvidia-smi, the libraries' versions, the tools found -> details/probe.txt"; return; fi
  {
    echo "GPU, driver, memory: $GPU"
    command -v nvidia-smi >/dev/null &&
      echo "compute capability: $(timeout 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>&1 | head -1)"
    echo "CUDA runtime: $(version_of libcudart.so.13)"
    echo "cuBLAS: $(version_of libcublas.so.13)  cuBLASLt: $(version_of libcublasLt.so.13)"
    echo "cuDNN: $(version_of libcudnn.so.9)  NCCL: $(version_of libnccl.so.2)"
    for lib in "${want[@]}"; do echo "  $lib: ${where[$lib]:-NOT FOUND}"; done
    echo "PyTorch: $(timeout 60 python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "available" if torch.cuda.is_available() else "no GPU")' 2>/dev/null || echo none)"
    echo "compute-sanitizer: $(tool compute-sanitizer || echo none)  ncu: $(tool ncu || echo none)"
    echo "host: $(nproc) cores, glibc $glibc, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  } > "$f" 2>&1
  cat "$f"
  if ! command -v nvidia-smi >/dev/null || ! timeout 20 nvidia-smi -L > /dev/null 2>&1; then
    STAGE_RC=1; note "no GPU: nvidia-smi $(command -v nvidia-smi >/dev/null && echo fails || echo 'not found')"
  else
    note "$(echo "$GPU" | cut -d, -f1)"
  fi
  [ -n "${where[libcudnn.so.9]:-}" ] && [ -n "${where[libnccl.so.2]:-}" ] || { STAGE_RC=1; note "cuDNN or NCCL not found"; }
}
tool() { command -v "$1" 2>/dev/null || ls "${CUDA_HOME:-/usr/local/cuda}/bin/$1" /usr/local/cuda/bin/"$1" 2>/dev/null | head -1; }
gtest() {  # gtest LABEL BINARY [ARGS...]: one test binary, its XML beside the log
  local label=$1 bin=$2; shift 2
  cmd "$label" "$B/bin/$bin" --gtest_output="xml:$D/$label.xml" "$@"
}
train_test() {  # train_test LABEL FILTER: tests of cuda_train_test; their runs and curves under details/STAGE/
  cmd "$1" env TRIPOD_TEST_KEEP="$D/$STAGE" "$B/bin/cuda_train_test" --gtest_filter="$2" --gtest_output="xml:$D/$1.xml"
}
bench() {  # bench MODEL STEPS WARMUP [OPTION...]
  # shellcheck disable=SC2086
  cmd "tripod_gpu_bench" "$B/bin/tripod_gpu_bench" --model "$1" --steps "$2" --warmup "$3" --json "$D/bench_$1.json" \
    "${@:4}" ${BENCH_ARGS:-}
  bench_note "$D/bench_$1.json"
}
# bench_note JSON: the stage's note from a tripod_gpu_bench or torch_baseline.py --json file.
bench_note() {
  [ "$DRY" = 0 ] && [ -f "$1" ] && note "$(python3 - "$1" <<'EOF' 2>/dev/null
import json, sys
for m in json.load(open(sys.argv[1]))["models"]:
    print(f"{m['model']} B={m['micro_batch']}: {m['tokens_per_s']:.0f} tok/s, MFU {100 * m['mfu']:.1f}%, peak {m['peak_gib']:.1f} GiB")
EOF
)"
}
torch_baseline() {  # torch_baseline eager|compiled
  if [ "$DRY" = 0 ] && ! timeout 60 python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    skip "no python3 with CUDA PyTorch"; return
  fi
  local args=(--model 124M --steps 20 --warmup 3 --json "$D/torch_$1.json")
  [ "$1" = eager ] && args+=(--no-compile)
  { [ "$DRY" = 1 ] || [ -f "$D/bench_124M.json" ]; } && args+=(--match "$D/bench_124M.json")
  # shellcheck disable=SC2086
  cmd torch_baseline python3 "$B/src/bench/gpu/torch_baseline.py" "${args[@]}" ${TORCH_ARGS:-}
  bench_note "$D/torch_$1.json"
}
# The datasheet file of this GPU: what calibration does not measure (the network) comes from it.
base_hardware() {
  case $GPU in
    *A100*|*A800*) echo "$B/src/configs/hardware/a100_80gb_sxm.toml" ;;
    *H200*) echo "$B/src/configs/hardware/h200_sxm.toml" ;;
    *) echo "$B/src/configs/hardware/h100_sxm.toml" ;;
  esac
}
calibrate() {
  local base; base=$(base_hardware)
  cmd calibrate "$B/bin/tripod" calibrate --device cuda --base "$base" --name "calibrated: ${GPU%%,*}" \
    --out "$D/hardware_cuda.toml" --repeats 3 --force
  if [ "$DRY" = 0 ] && [ -f "$D/hardware_cuda.toml" ]; then
    cp "$D/hardware_cuda.toml" "$RESULTS/hardware_cuda.toml"
    note "hardware_cuda.toml (base $(basename "$base"))"
  fi
}
# The planner with the file just calibrated: a profiled run of the 124M bench's shape and
# micro-batch (every family measured beside its prediction), then every benchmark of this run
# predicted on the calibrated and on the datasheet file beside its measured step.
plan_check() {
  local hw=$D/hardware_cuda.toml base jsons=() f
  base=$(base_hardware)
  [ "$DRY" = 1 ] || [ -f "$hw" ] || { skip "no hardware_cuda.toml (the calibrate stage did not run)"; return; }
  for f in "$D"/bench_124M.json "$D"/bench_350M.json "$D"/bench_1B.json; do
    { [ "$DRY" = 1 ] || [ -f "$f" ]; } && jsons+=("$f")
  done
  [ ${#jsons[@]} -gt 0 ] || { skip "no bench-124m/350m/1b result in this run"; return; }
  local run=()
  if [ "$DRY" = 1 ] || [ -f "$D/bench_124M.json" ]; then
    cmd config python3 "$B/src/bench/gpu/plan_check.py" --config-of 124M --out "$D/plan_124M.toml" "$D/bench_124M.json" &&
      cmd train "$B/bin/tripod" train --config "$D/plan_124M.toml" --set train.steps=6 --set train.log_interval=1 \
        --set train.trace=false --set parallel.hardware="$hw" --set train.output_dir="$D/plan-check-run" --profile-steps 4 &&
      run=(--run "$D/plan-check-run")
  fi
  cmd predict python3 "$B/src/bench/gpu/plan_check.py" --tripod "$B/bin/tripod" --hardware "$hw" --base "$base" \
    "${run[@]}" --out "$D/plan_check.txt" "${jsons[@]}"
  [ "$DRY" = 0 ] && [ -f "$D/plan_check.txt" ] && note "$(tail -1 "$D/plan_check.txt")"
}
# The exports against transformers: three tiny models trained here, exported, scored by both.
hf() {
  if [ "$DRY" = 0 ] && ! timeout 60 python3 -c 'import torch, transformers' 2>/dev/null; then
    skip "no python3 with PyTorch and transformers"; return
  fi
  cmd hf_check python3 "$B/src/bench/gpu/hf_check.py" --tripod "$B/bin/tripod" --configs "$B/src/configs" \
    --corpus "$B/src/build/corpus/kjv_text_document" --tokenizer "$B/src/build/corpus/kjv_bpe4096.model" \
    --work "$D/hf" --device cuda --out "$D/hf_check.txt"
  [ "$DRY" = 0 ] && [ -f "$D/hf_check.txt" ] && note "$(tail -1 "$D/hf_check.txt")"
}
sanitize() {
  local cs; cs=$(tool compute-sanitizer)
  [ -n "$cs" ] || [ "$DRY" = 1 ] || { skip "no compute-sanitizer"; return; }
  cmd memcheck-ops "${cs:-compute-sanitizer}" --tool memcheck --error-exitcode 3 --print-limit 20 "$B/bin/cuda_kernels_test"
  cmd memcheck-train "${cs:-compute-sanitizer}" --tool memcheck --error-exitcode 3 --print-limit 20 "$B/bin/tripod" train \
    --config "$B/src/configs/tiny.toml" --set train.device=cuda --set train.steps=3 --set train.log_interval=1 \
    --set train.output_dir="$D/sanitize-train-run"
  [ "$DRY" = 0 ] && note "$(grep -h 'ERROR SUMMARY' "$D/sanitize.log" 2>/dev/null | tr '\n' ' ')"
}
profile() {
  local ncu; ncu=$(tool ncu)
  [ -n "$ncu" ] || [ "$DRY" = 1 ] || { skip "no ncu"; return; }
  # One steady 124M step at micro-batch 8 (about 1000 kernels; the bench brackets its last step
  # with cudaProfilerStart/Stop), each kernel timed on its own.
  cmd ncu "${ncu:-ncu}" --csv --profile-from-start off --launch-count 1500 \
    --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    "$B/bin/tripod_gpu_bench" --model 124M --micro-batch 8 --steps 1 --warmup 1 --no-split --profile-last
  [ "$DRY" = 0 ] && python3 "$B/src/bench/gpu/summary.py" --ncu "$D/profile.log" > "$D/profile_top.txt" 2>&1
}

fp8_stage() {
  gtest fp8-ops cuda_kernels_test --gtest_filter='Fp8Conversion.*:CudaOpsTest.Fp8*:CudaOpsTest.BiasBackwardMatchesCpu'
  train_test fp8-train 'CudaTrain.Fp8FollowsTheBf16Curve'
  gtest_note
  # bf16 and then fp8 in one process, at one micro-batch, timed steps only (no per-op split); the
  # delayed recipe, whose casts take their amax in the same pass (tensorwise needs one more).
  cmd bench-1b "$B/bin/tripod_gpu_bench" --model 1B --seq 2048 --micro-batch 4 --precision both --fp8-recipe delayed \
    --steps 4 --warmup 2 --no-split --json "$D/bench_fp8_1B.json"
  cmd bench-350m "$B/bin/tripod_gpu_bench" --model 350M --seq 1024 --micro-batch 8 --precision both --fp8-recipe delayed \
    --steps 4 --warmup 2 --no-split --json "$D/bench_fp8_350M.json"
  if [ "$DRY" = 0 ]; then
    local jsons=()
    for f in "$D"/bench_fp8_1B.json "$D"/bench_fp8_350M.json; do [ -f "$f" ] && jsons+=("$f"); done
    if [ ${#jsons[@]} -gt 0 ]; then
      python3 "$B/src/bench/gpu/summary.py" --fp8 "${jsons[@]}" > "$D/fp8_bench.txt" 2>&1
      note "$(awk 'NR > 2 && $6 ~ /x$/ {printf "%s%s %s", sep, $1, $6; sep = ", "}' "$D/fp8_bench.txt")"
    fi
  fi
}

run_stage() {
  case $1 in
    probe) probe ;;
    ops) gtest cuda_kernels_test cuda_kernels_test; gtest_note ;;
    step) gtest cuda_model_test cuda_model_test; train_test onestep 'CudaTrain.OneStepMatchesCpu'; gtest_note ;;
    train) train_test train 'CudaTrain.FiftyStepsFollowTheCpuCurve:CudaTrain.CheckpointsMoveBetweenDevices'; gtest_note ;;
    grid) train_test grid 'CudaTrain.GridOnOneGpuMatchesSingleRank'; gtest_note ;;
    fp8) fp8_stage ;;
    comm) cmd cuda_comm_test "${MPIRUN[@]}" -np 2 "$B/bin/cuda_comm_test" --gtest_output="xml:$D/cuda_comm_test.xml"
          cmd cuda_grid_test "${MPIRUN[@]}" -np 4 "$B/bin/cuda_grid_test" --gtest_output="xml:$D/cuda_grid_test.xml"
          gtest cuda_cli_test cuda_cli_test; gtest_note ;;
    bench-124m) bench 124M 20 3 ;;
    bench-350m) bench 350M 10 2 ;;
    # A fixed micro-batch: the search down from 128 spent the whole cap on the first H200 run.
    bench-1b) bench 1B 10 2 --micro-batch 16 ;;
    torch-eager) torch_baseline eager ;;
    torch-compile) torch_baseline compiled ;;
    calibrate) calibrate ;;
    plan-check) plan_check ;;
    hf) hf ;;
    sanitize) sanitize ;;
    profile) profile ;;
    mpi) cmd tripod env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "${MPIRUN[@]}" -np 2 "$B/bin/tripod" train \
           --config "$B/src/configs/tiny.toml" --set train.steps=3 --set train.log_interval=1 --set train.output_dir="$D/mpi-run" ;;
  esac
}

# ---- results -------------------------------------------------------------------------------
stage_table() {
  local s rows=("${STAGES[@]}") prev
  [ "$QUICK" = 1 ] && rows=("${DEFAULT[@]}")
  printf '%-14s %-9s %5s %5s %5s  %s\n' stage status time cap est notes
  for s in "${rows[@]}"; do
    if [ -n "${STATUS[$s]:-}" ]; then
      printf '%-14s %-9s %5s %5s %5s  %s\n' "$s" "${STATUS[$s]}" "${TIME[$s]:--}" "${CAPS[$s]:--}" "${EST[$s]}s" "${NOTES[$s]:-}"
    elif [ -n "${PREV_LINE[$s]:-}" ]; then
      read -r -a prev <<< "${PREV_LINE[$s]}"
      local notes="${prev[*]:4}"
      printf '%-14s %-9s %5s %5s %5s  %s\n' "$s" "${prev[0]}" - - "${EST[$s]}s" "(earlier run) ${notes#(earlier run) }"
    fi
  done
}
write_summary() {
  {
    echo "tripod bundle $(cat "$B/VERSION"); GPU: $GPU; budget ${BUDGET}s, ${SECONDS}s used$(
      [ "$QUICK" = 1 ] && echo "; --quick after $PREVIOUS")"
    stage_table
    [ -f "$D/probe.txt" ] && { echo; cat "$D/probe.txt"; }
    for f in "$D"/step/*/onestep.txt "$D"/train/*/curve.txt "$D"/train/*/evals.txt "$D"/grid/*/curve.txt \
             "$D"/fp8/*/curve_fp8_*.txt "$D"/fp8_bench.txt; do
      [ -f "$f" ] && { echo; cat "$f"; }
    done
    local jsons=()
    for f in "$D"/bench_124M.json "$D"/bench_350M.json "$D"/bench_1B.json "$D"/torch_eager.json "$D"/torch_compiled.json; do
      [ -f "$f" ] && jsons+=("$f")
    done
    if [ -f "$D/bench_124M.json" ] || [ -f "$D/bench_350M.json" ] || [ -f "$D/bench_1B.json" ]; then
      echo; python3 "$B/src/bench/gpu/summary.py" "${jsons[@]}" || cat "$D"/bench-*.log
    fi
    [ -f "$D/calibrate.log" ] && { echo; grep -h 'hardware_cuda.toml' "$D/calibrate.log" | tail -1; }
    [ -f "$D/hf_check.txt" ] && { echo; cat "$D/hf_check.txt"; }
    [ -f "$D/plan_check.txt" ] && { echo; cat "$D/plan_check.txt"; }
    [ -f "$D/sanitize.log" ] && { echo; grep -h -B2 'ERROR SUMMARY' "$D/sanitize.log"; }
    [ -f "$D/profile_top.txt" ] && { echo; cat "$D/profile_top.txt"; }
  } > "$RESULTS/summary.txt.tmp" 2>&1
  mv "$RESULTS/summary.txt.tmp" "$RESULTS/summary.txt"
}
pack() {
  # Logs over 8 MB keep their first and last 4 MB; checkpoints stay out.
  local f
  for f in "$D"/*.log; do
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 8000000 ] &&
      { head -c 4000000 "$f"; echo; echo "... (cut)"; tail -c 4000000 "$f"; } > "$f.cut" && mv "$f.cut" "$f"
  done
  tar -C "$(dirname "$D")" -czf "$RESULTS/details.tar.gz.tmp" --exclude='ckpt_*' --exclude='*_ckpt' --exclude='*.h5' --exclude='*.safetensors' details
  mv "$RESULTS/details.tar.gz.tmp" "$RESULTS/details.tar.gz"
  # What --quick reads next time (the bundle's folder stays on a warm machine).
  if mkdir -p "$B/last" 2>/dev/null && cp "$RESULTS/summary.txt" "$B/last/summary.txt.tmp" 2>/dev/null; then
    mv "$B/last/summary.txt.tmp" "$B/last/summary.txt"
    rm -rf "$B/last/details"
    tar -C "$(dirname "$D")" -cf - --exclude='ckpt_*' --exclude='*_ckpt' --exclude='*.h5' --exclude='*.safetensors' details | tar -C "$B/last" -xf -
  fi
  true
}

# ---- the run -------------------------------------------------------------------------------
[ "$DRY" = 1 ] && echo "plan (budget ${BUDGET}s from 0, ${RESERVE}s to pack, ${GRACE}s for a killed stage; if each stage takes its estimate):"
[ "$DRY" = 0 ] && write_summary
for s in "${STAGES[@]}"; do
  if [ "$DRY" = 1 ]; then left=$((BUDGET - SIM)); else left=$((BUDGET - SECONDS)); fi
  cap=$((left - RESERVE - GRACE))
  [ $cap -gt "${CAP[$s]}" ] && cap=${CAP[$s]}
  if [ $cap -lt "${MIN[$s]}" ]; then
    STATUS[$s]=no-time NOTES[$s]="${left}s left, needs ${MIN[$s]}s"
    echo "== $s: no time (${left}s left of ${BUDGET}s; it needs ${MIN[$s]}s and ${RESERVE}s stay for packing)"
    [ "$DRY" = 1 ] && echo "plan: $s no-time left=$left min=${MIN[$s]}"
    continue
  fi
  CAPS[$s]=${cap}s
  STAGE=$s STAGE_RC=0 STAGE_END=$((SECONDS + cap))
  echo "== $s: cap ${cap}s (${left}s left), estimate ${EST[$s]}s"
  [ "$DRY" = 1 ] && echo "plan: $s est=${EST[$s]} cap=$cap start=$SIM"
  t0=$SECONDS
  run_stage "$s"
  if [ "$DRY" = 1 ]; then
    SIM=$((SIM + (EST[$s] < cap ? EST[$s] : cap)))
    continue
  fi
  TIME[$s]=$((SECONDS - t0))s
  case $STAGE_RC in
    0) STATUS[$s]=ok ;;
    skip) STATUS[$s]=skipped ;;
    124) STATUS[$s]=TIMED_OUT; note "killed at its ${cap}s cap" ;;
    *) STATUS[$s]=FAILED; note "exit $STAGE_RC" ;;
  esac
  echo "== $s: ${STATUS[$s]} in ${TIME[$s]}"
  write_summary
  pack
done
[ "$DRY" = 1 ] && { echo "dry run: nothing ran"; exit 0; }
echo; cat "$RESULTS/summary.txt"
grep -qE '^[a-z0-9-]+ +(FAILED|TIMED_OUT)' "$RESULTS/summary.txt" && exit 1
exit 0
