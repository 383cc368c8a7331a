#!/usr/bin/env bash
# How `tripod data preprocess` scales with --workers: the runs of each worker count take turns
# (1, 2, 1, 2, ...), so a change in the machine's load hits them alike; the table gives medians.
#   bench/preprocess_workers.sh [BUILD_DIR] [RUNS] [WORKERS] [REPEAT]
#     (defaults: build, 7, "1 2", 16)
# Input: build/corpus/kjv.txt and kjv.jsonl (scripts/prepare_corpus.sh: one chapter per line)
# repeated REPEAT times. Tokenizer: cl100k_base.tiktoken from tests/tokenizer/compare.sh when it
# is there, else the corpus's SentencePiece model; TOKENIZER=FILE picks another.
# Columns: MB/s as tripod reports it (reading, encoding, writing; the tokenizer's loading apart),
# the ratio to the first worker count's median, CPU seconds (user + system of all threads over
# the same span) per MB, and the writing thread's share of them (the only serial work). With
# perfect scaling the CPU seconds per MB stay the same while MB/s grows with the workers. On a
# loaded machine the wall-clock ratios fall short (with the kernel's autogroup scheduling, as on
# a shared desktop or container host, a process gets its session's share of the cores however
# many threads it runs); the CPU columns still show whether work was added.
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
runs=${2:-7}
read -r -a workers <<<"${3:-1 2}"
repeat=${4:-16}
tripod=$build/bin/tripod
[ -x "$tripod" ] || { echo "error: $tripod not found; build first" >&2; exit 2; }
corpus=$build/corpus
for f in kjv.txt kjv.jsonl; do
  [ -s "$corpus/$f" ] || { echo "error: $corpus/$f missing: run scripts/prepare_corpus.sh $build" >&2; exit 2; }
done
tok=${TOKENIZER:-}
if [ -z "$tok" ]; then
  tok=$build/tokenizer-compare/cl100k_base.tiktoken
  [ -s "$tok" ] || tok=$corpus/kjv_bpe4096.model
fi
[ -s "$tok" ] || { echo "error: tokenizer $tok missing" >&2; exit 2; }

tmp=$(mktemp -d /tmp/preprocess_workers_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
for f in kjv.txt kjv.jsonl; do
  for ((r = 0; r < repeat; ++r)); do cat "$corpus/$f"; done >"$tmp/$f"
done

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# One worker pinned to each core in turn, before and after: N workers can reach N x one worker
# only when the cores run alike (a virtual machine's cores may not: one was seen at 0.6x).
core_speeds() {
  command -v taskset >/dev/null || { echo "(no taskset)"; return; }
  local out="" c
  for ((c = 0; c < $(nproc); ++c)); do
    rm -f "$tmp/pin.bin" "$tmp/pin.idx"
    out+="core $c $(taskset -c "$c" "$tripod" data preprocess --input "$tmp/kjv.txt" --tokenizer-model "$tok" \
      --output-prefix "$tmp/pin" --workers 1 --no-progress 2>&1 | sed -nE 's/.*\(([0-9.]+) MB\/s.*/\1/p') MB/s; "
  done
  echo "${out%; }"
}
speeds_before=$(core_speeds)
load_before=$(cut -d' ' -f1 /proc/loadavg)
for f in kjv.txt kjv.jsonl; do
  for ((r = 0; r < runs; ++r)); do
    for w in "${workers[@]}"; do
      # Each run writes a new dataset: replacing the last run's output would free its page cache
      # inside the timed span (tens of ms for 66 MB, on every worker count alike).
      rm -f "$tmp/out_$w.bin" "$tmp/out_$w.idx"
      line=$("$tripod" data preprocess --input "$tmp/$f" --tokenizer-model "$tok" --output-prefix "$tmp/out_$w" \
        --workers "$w" --overwrite --no-progress 2>&1 | grep 'info: wrote') || {
        echo "error: tripod data preprocess --workers $w failed on $tmp/$f" >&2
        exit 1
      }
      # "... from 17.2 MB in 0.41 s (42.10 MB/s, 0.40 CPU s with 1 workers, 0.02 of it writing; ..."
      echo "$line" | sed -E 's/.* from ([0-9.]+) MB in ([0-9.]+) s \(([0-9.]+) MB\/s, ([0-9.]+) CPU s with [0-9]+ workers, ([0-9.]+) of it writing.*/\1 \3 \4 \5/' \
        >>"$tmp/$f.w$w"
    done
  done
  cmp -s "$tmp/out_${workers[0]}.bin" "$tmp/out_${workers[-1]}.bin" &&
    cmp -s "$tmp/out_${workers[0]}.idx" "$tmp/out_${workers[-1]}.idx" || {
    echo "error: $f: the outputs of --workers ${workers[0]} and ${workers[-1]} differ" >&2
    exit 1
  }
done
load_after=$(cut -d' ' -f1 /proc/loadavg)
speeds_after=$(core_speeds)

echo "tripod data preprocess --workers N: $(basename "$tok"), build/corpus/kjv.{txt,jsonl} x$repeat" \
  "(one chapter per line), median of $runs interleaved runs"
echo "$(nproc) cores; load average $load_before before, $load_after after (other work on the machine slows the" \
  "wall-clock figures most); outputs identical for every worker count"
echo "one worker pinned to each core (text), before: $speeds_before; after: $speeds_after"
echo
echo "| input | MB | workers | MB/s | vs ${workers[0]} worker(s) | CPU s per MB | writing, CPU s per MB | MB/s of each run |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
for f in kjv.txt kjv.jsonl; do
  base=""
  for w in "${workers[@]}"; do
    mb=$(head -1 "$tmp/$f.w$w" | cut -d' ' -f1)
    mbs=$(cut -d' ' -f2 "$tmp/$f.w$w" | median)
    cpu=$(awk -v mb="$mb" '{print $3 / mb}' "$tmp/$f.w$w" | median)
    wcpu=$(awk -v mb="$mb" '{print $4 / mb}' "$tmp/$f.w$w" | median)
    [ -n "$base" ] || base=$mbs
    all=$(cut -d' ' -f2 "$tmp/$f.w$w" | tr '\n' ' ')
    printf "| %s | %s | %s | %.2f | %.2fx | %.4f | %.4f | %s|\n" "$f" "$mb" "$w" "$mbs" \
      "$(awk -v a="$mbs" -v b="$base" 'BEGIN {print a / b}')" "$cpu" "$wcpu" "$all"
  done
done
