#!/usr/bin/env bash
# Compares tripod's tokenizers with the reference implementations on the King James Bible and on
# stress.txt (see compare.mjs): GPT-2 (vocab.json + merges.txt, tokenizer.json, r50k rank file),
# cl100k, o200k, Llama 3 and a Qwen 2-style tokenizer.json (NFC normalizer), ids and
# decode(encode(x)) == x (NFC(x) for Qwen 2).
#   tests/tokenizer/compare.sh [BUILD_DIR]     (default build; uses BUILD_DIR/bin/tripod)
# The npm packages are installed once into BUILD_DIR/tokenizer-refs (test references only; tripod
# never runs them). Exit 77 (ctest's "skipped") with the reason when node or the npm registry is
# not there; 1 on any difference.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
tripod=$build/bin/tripod
refs=$build/tokenizer-refs
work=$build/tokenizer-compare
# Pinned: the versions these comparisons were written against.
pkgs=(tokenizers@0.23.2 tiktoken@1.0.22 js-tiktoken@1.0.21 gpt-3-encoder@1.1.4 llama3-tokenizer-js@1.2.0)

[ -x "$tripod" ] || { echo "error: $tripod not found; build first" >&2; exit 2; }
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIPPED: node and npm are not installed (apt-get install nodejs npm); the comparison needs the npm references"
  exit 77
fi
if [ "$(cat "$refs/installed" 2>/dev/null)" != "${pkgs[*]}" ]; then
  if ! timeout 60 npm view tiktoken@1.0.22 version >/dev/null 2>&1; then
    echo "SKIPPED: the npm registry is not reachable; the comparison needs ${pkgs[*]}"
    exit 77
  fi
  rm -rf "$refs"
  mkdir -p "$refs"
  echo '{"name": "tripod-tokenizer-refs", "private": true}' > "$refs/package.json"
  timeout 600 npm install --prefix "$refs" --no-audit --no-fund --loglevel=error "${pkgs[@]}"
  echo "${pkgs[*]}" > "$refs/installed"
fi

mkdir -p "$work"
# The King James Bible as Debian's bible-kjv prints it (what scripts/prepare_corpus.sh reads):
# 4.3 MB of "Book N" headings and indented, numbered verses.
kjv=$work/kjv.txt
if [ ! -s "$kjv" ]; then
  if command -v bible >/dev/null; then
    bible -l100000 "Gen1:1-Rev22:21" > "$kjv.tmp" && mv "$kjv.tmp" "$kjv"
  elif [ -s "$build/corpus/kjv.txt" ]; then
    cp "$build/corpus/kjv.txt" "$kjv"
  else
    echo "error: no King James Bible: install bible-kjv (scripts/setup.sh --deps)" >&2
    exit 2
  fi
fi
exec node "$here/compare.mjs" "$refs" "$tripod" "$work" "$here/stress.txt" "$kjv"
