#!/usr/bin/env bash
# Context parallelism on this machine: a small GPT (2 layers, d_model 128, 4 heads, vocab 512) at
# seq 8192, one sequence per step, cp = 1 on one rank against cp = 2 on two ranks (ring and
# all-gather), every rank on one thread (OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = 1). Per run:
# tokens/s (the median of its steps after the first WARMUP), the peak activation bytes of rank 0
# as measured by the allocator (metrics.jsonl, the last step) and as planned by the memory plan
# (tripod schedule --config --json), and their ratio to cp = 1. Runs alternate cp = 1 and cp = 2 so
# a drifting machine load falls on both alike. cp = 1 keeps the attention probabilities (the CPU
# backend's default without recomputation; O(seq^2) per head); cp1_selective recomputes them, as
# context parallelism always does, for the like-for-like activation ratio.
#
#   bench/bench_cp.sh [--steps S] [--warmup W] [--seq T] [--tripod build/bin/tripod]
set -euo pipefail

steps=6 warmup=2 seq=8192
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tripod=$root/build/bin/tripod
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --tripod) tripod=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$tripod" ] || { echo "error: tripod executable '$tripod' not found (build it, or pass --tripod)" >&2; exit 2; }
[ "$steps" -gt "$warmup" ] || { echo "error: --steps must exceed --warmup" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/tripod_cp_bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
cat >"$work/cp.toml" <<TOML
[model]
n_layers = 2
n_heads = 4
d_model = 128
seq_len = $seq
max_positions = $seq
vocab_size = 512

[train]
micro_batch_size = 1
global_batch_size = 1
steps = $steps
lr = 1e-4
log_interval = 1
trace = false
straggler_factor = 0

[data]
synthetic = true
TOML
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mpi=(mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS=1 -x OMP_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)

# median of stdin numbers
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# run NAME NP SETS...: prints "tokens_per_s measured_activation_bytes planned_activation_bytes"
run() {
  local name=$1 np=$2
  shift 2
  local dir=$work/$name sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  "${mpi[@]}" -np "$np" "$tripod" train --config "$work/cp.toml" "${sets[@]}" --set "train.output_dir=$dir" \
    >/dev/null 2>"$dir.log" || { echo "error: run $name failed:" >&2; tail -5 "$dir.log" >&2; exit 1; }
  local tps act planned
  tps=$(sed -n 's/.*"step":\([0-9]*\).*"tokens_per_s":\([0-9.e+-]*\).*/\1 \2/p' "$dir/metrics.jsonl" |
    awk -v w="$warmup" '$1 > w { print $2 }' | median)
  act=$(tail -1 "$dir/metrics.jsonl" | sed -n 's/.*"activations":\([0-9]*\).*/\1/p')
  planned=$("$tripod" schedule --config "$work/cp.toml" "${sets[@]}" --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["memory_bytes"][0]["activations"])')
  echo "$tps $act $planned"
}

declare -A out
out[cp1]=$(run cp1 1 parallel.cp=1)
out[cp2_ring]=$(run cp2_ring 2 parallel.cp=2 parallel.cp_comm=ring)
out[cp1_again]=$(run cp1_again 1 parallel.cp=1)
out[cp2_allgather]=$(run cp2_allgather 2 parallel.cp=2 parallel.cp_comm=allgather)
out[cp1_selective]=$(run cp1_selective 1 parallel.cp=1 recompute.mode=selective)

read -r t1 a1 p1 <<<"${out[cp1]}"
read -r _ asel _ <<<"${out[cp1_selective]}"
read -r t1b _ _ <<<"${out[cp1_again]}"
base=$(printf '%s\n%s\n' "$t1" "$t1b" | median)
printf "context parallelism, %d layers d_model 128, seq %d, 1 sequence per step, 1 thread per rank, %d steps (median after %d)\n" \
  2 "$seq" "$steps" "$warmup"
printf "%-16s %5s %12s %9s %16s %16s %10s %9s %9s\n" run ranks tokens/s "x cp=1" "act. measured" "act. planned" "plan/meas" "act/cp=1" "act/sel."
for name in cp1 cp1_again cp1_selective cp2_ring cp2_allgather; do
  read -r t a p <<<"${out[$name]}"
  np=1
  case $name in cp2*) np=2 ;; esac
  awk -v n="$name" -v np="$np" -v t="$t" -v b="$base" -v a="$a" -v p="$p" -v a1="$a1" -v asl="$asel" 'BEGIN {
    printf "%-16s %5d %12.0f %8.2fx %16.0f %16.0f %10.4f %8.1f%% %8.1f%%\n", n, np, t, t / b, a, p, p / a, 100 * a / a1, 100 * a / asl }'
done
