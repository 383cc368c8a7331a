#!/usr/bin/env bash
# Builds the King James Bible corpus under build/corpus/ (not committed), skipping what is done:
#   kjv.jsonl           one chapter per document: {"id": "Genesis 1", "text": "Genesis 1\nIn the beginning..."}
#   kjv.txt             the same documents, one per line (verses joined by spaces), for benchmarks
#   kjv_bpe4096.model   a SentencePiece BPE tokenizer (4096 pieces, end of document "<|endoftext|>")
#   kjv_text_document.{bin,idx}   the indexed dataset (Megatron-LM format) that configs/tiny_kjv.toml trains on
# The text comes from Debian's bible-kjv package (the `bible` program). Train, valid and test
# are split by whole chapters when the dataset is read (data.split), so they never overlap.
#   scripts/prepare_corpus.sh [BUILD_DIR]      (default build; uses BUILD_DIR/bin/tripod)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
TRIPOD=${TRIPOD_BIN:-$BUILD/bin/tripod}
OUT=$BUILD/corpus
VOCAB=4096
[ -x "$TRIPOD" ] || { echo "error: $TRIPOD not found; build first (scripts/setup.sh)" >&2; exit 2; }
command -v bible >/dev/null || { echo "error: the bible program is missing; install bible-kjv (scripts/setup.sh --deps)" >&2; exit 2; }
mkdir -p "$OUT"

# 1. Text: `bible` prints a chapter as a "Book N" line, then "  V text" lines (no wrapping at
# this width). 1189 chapters, 31102 verses.
if [ ! -s "$OUT/kjv.jsonl" ] || [ ! -s "$OUT/kjv.txt" ]; then
  echo "prepare_corpus: extracting the King James Bible"
  bible -l100000 "Gen1:1-Rev22:21" | awk -v jsonl="$OUT/kjv.jsonl.tmp" -v txt="$OUT/kjv.txt.tmp" '
    function esc(s) { gsub(/\\/, "\\\\", s); gsub(/"/, "\\\"", s); gsub(/\t/, "\\t", s); return s }
    function flush() {
      if (title == "") return
      printf "{\"id\": \"%s\", \"text\": \"%s\\n%s\"}\n", esc(title), esc(title), esc(json_body) > jsonl
      print title " " text_body > txt
      chapters++
    }
    /^$/ { next }
    /^  [0-9]+ / {
      sub(/^  [0-9]+ /, "")
      json_body = json_body (json_body == "" ? "" : "\\n") esc($0)
      text_body = text_body (text_body == "" ? "" : " ") $0
      verses++
      next
    }
    { flush(); title = $0; json_body = ""; text_body = "" }
    END {
      flush()
      if (chapters != 1189 || verses != 31102) { print "prepare_corpus: expected 1189 chapters and 31102 verses, got " chapters " and " verses > "/dev/stderr"; exit 1 }
    }'
  mv "$OUT/kjv.jsonl.tmp" "$OUT/kjv.jsonl"
  mv "$OUT/kjv.txt.tmp" "$OUT/kjv.txt"
fi

# 2. Tokenizer.
MODEL=$OUT/kjv_bpe$VOCAB
if [ ! -s "$MODEL.model" ] || [ "$OUT/kjv.jsonl" -nt "$MODEL.model" ]; then
  echo "prepare_corpus: training the tokenizer ($VOCAB pieces)"
  "$TRIPOD" data train-tokenizer --input "$OUT/kjv.jsonl" --vocab-size $VOCAB --model-prefix "$MODEL" \
    --model-type bpe --character-coverage 1.0 --eod-piece '<|endoftext|>' --overwrite
fi

# 3. Indexed dataset.
DATA=$OUT/kjv_text_document
if [ ! -s "$DATA.idx" ] || [ ! -s "$DATA.bin" ] || [ "$MODEL.model" -nt "$DATA.idx" ] || [ "$OUT/kjv.jsonl" -nt "$DATA.idx" ]; then
  echo "prepare_corpus: preprocessing"
  "$TRIPOD" data preprocess --input "$OUT/kjv.jsonl" --tokenizer-model "$MODEL.model" --output-prefix "$DATA" \
    --workers 2 --overwrite
fi
echo "prepare_corpus: $DATA.{bin,idx} ready ($("$TRIPOD" data inspect "$DATA" --json))"
