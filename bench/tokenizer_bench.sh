#!/usr/bin/env bash
# Tokenizer speed against tiktoken (WASM) and Hugging Face tokenizers, as tables (see
# tokenizer_bench.mjs). Installs the npm references and makes the tokenizer files the way
# tests/tokenizer/compare.sh does (it runs that first when they are missing).
#   bench/tokenizer_bench.sh [BUILD_DIR] [RUNS]     (default build 5; needs BUILD_DIR/bin/bench_tokenizer)
# Each encoder runs on one thread; preprocess with 2 workers needs 2 free cores to show its scaling.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
runs=${2:-5}
files=$build/tokenizer-compare
if [ ! -s "$files/cl100k_base.tiktoken" ] || [ ! -s "$build/tokenizer-refs/installed" ]; then
  "$here/../tests/tokenizer/compare.sh" "$build" >/dev/null || true
fi
[ -s "$files/cl100k_base.tiktoken" ] || { echo "error: no tokenizer files in $files (tests/tokenizer/compare.sh)" >&2; exit 2; }
export TOKENIZERS_PARALLELISM=false RAYON_NUM_THREADS=1
exec node "$here/tokenizer_bench.mjs" "$build/tokenizer-refs" "$build" "$files" "$files/kjv.txt" "$runs"
