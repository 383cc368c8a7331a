#!/usr/bin/env bash
# The flight recorder's cost: step time of the quick-start grid (configs/quickstart.toml: 8 ranks,
# (dp, pp, tp) = (2, 2, 2), interleaved 1F1B, sequence parallel, distributed optimizer; synthetic
# tokens so no corpus is needed) with parallel.flight_recorder_size = 2000 (on) and 0 (off).
# Runs alternate off, on, off, on, ... so the machine's drifting load falls on both alike; each
# run's step time is the median of its steps after the first WARMUP; the table shows every pair
# and the median of the per-pair ratios (on / off). On a shared machine whose load swings by tens
# of percent between runs that ratio cannot resolve 1%, so the script also bounds the cost
# directly: the operations each rank records per step (read from the dumps of a run stopped by a
# timeout in step 3) times the recorder's time per operation (build/bin/bench_flight), over the
# median step time.
#
#   bench/flight_overhead.sh [--pairs N] [--steps S] [--warmup W] [--tripod build/bin/tripod]
set -euo pipefail

pairs=5 steps=30 warmup=5
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tripod=$root/build/bin/tripod
while [ $# -gt 0 ]; do
  case "$1" in
    --pairs) pairs=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --tripod) tripod=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$tripod" ] || { echo "error: tripod executable '$tripod' not found (build it, or pass --tripod)" >&2; exit 2; }
[ "$steps" -gt "$warmup" ] || { echo "error: --steps must exceed --warmup" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/tripod_flight_bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
mpi=(mpirun -np 8 --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS=1 -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)

# One run: prints the median step time (seconds) of its steps after the warm-up.
run() {
  local size=$1 dir=$work/run_$1_$2
  OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "${mpi[@]}" "$tripod" train --config "$root/configs/quickstart.toml" \
    --set data.synthetic=true --set data.prefixes=[] --set data.tokenizer= --set checkpoint.dir= --set checkpoint.interval=0 \
    --set train.eval_interval=0 --set train.trace=false --set train.log_interval=1 --set "train.steps=$steps" \
    --set "train.output_dir=$dir" --set "parallel.flight_recorder_size=$size" >/dev/null 2>"$dir.log" ||
    { echo "error: the run with flight_recorder_size=$size failed:" >&2; tail -5 "$dir.log" >&2; exit 1; }
  sed -n 's/.*"step":\([0-9]*\).*"step_time_s":\([0-9.e+-]*\).*/\1 \2/p' "$dir/metrics.jsonl" |
    awk -v w="$warmup" '$1 > w { print $2 }' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

printf "flight recorder on (2000 operations) vs off, quick-start grid on 8 ranks, %d steps (median after %d)\n" \
  "$steps" "$warmup"
printf "%5s %14s %14s %10s\n" pair "off (ms/step)" "on (ms/step)" "on / off"
ratios=()
for ((i = 1; i <= pairs; ++i)); do
  off=$(run 0 "$i")
  on=$(run 2000 "$i")
  ratio=$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.4f", a / b }')
  ratios+=("$ratio")
  awk -v i="$i" -v a="$off" -v b="$on" -v r="$ratio" 'BEGIN { printf "%5d %14.2f %14.2f %10s\n", i, 1e3 * a, 1e3 * b, r }'
done
median=$(printf "%s\n" "${ratios[@]}" | sort -g |
  awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
awk -v m="$median" 'BEGIN { printf "median ratio on / off: %.4f (%+.2f%%; target: < 1%% slower)\n", m, 100 * (m - 1) }'

# The direct bound: operations per step per rank (step 2 of a run whose rank 0 sleeps in step 3,
# so that the others time out and dump), times the time per operation.
dump=$work/dump
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 TRIPOD_TEST_COMM_FAULT=sleep:0@3:60 "${mpi[@]}" "$tripod" train \
  --config "$root/configs/quickstart.toml" --set data.synthetic=true --set data.prefixes=[] --set data.tokenizer= \
  --set checkpoint.dir= --set checkpoint.interval=0 --set train.eval_interval=0 --set train.trace=false \
  --set train.steps=5 --set parallel.timeout_s=5 --set "train.output_dir=$dump" >/dev/null 2>&1 || true
ops=$(for f in "$dump"/flight/rank_*.json; do grep -c '"step": 2,' "$f"; done | sort -g | tail -n 1)
bench=$(dirname "$tripod")/bench_flight
if [ -n "$ops" ] && [ -x "$bench" ]; then
  step_ms=$(awk -v s="${off:-0}" 'BEGIN { print 1e3 * s }')
  "$bench" --ops-per-step "$ops" --step-ms "$step_ms"
else
  echo "(no direct bound: the dump run left no flight/ dumps or build/bin/bench_flight is missing)"
fi
