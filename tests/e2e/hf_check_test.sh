#!/usr/bin/env bash
# The GPU bundle's hf stage (bench/gpu/hf_check.py) without transformers: its tripod half on the
# CPU (a tiny GPT-2, Llama and Mixtral trained 2 steps on a corpus built from the Genesis fixture,
# exported to Hugging Face folders, the last chapters encoded and scored by tripod eval), so a
# change to tripod's commands breaks here rather than in a GPU window.
#   hf_check_test.sh TRIPOD_BIN SOURCE_DIR PYTHON
set -euo pipefail
bin=$1 src=$2 py=$3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
text=$src/tests/fixtures/data/genesis_1_8.jsonl
"$bin" data train-tokenizer --input "$text" --vocab-size 400 --model-prefix "$T/tok" > "$T/log" 2>&1
"$bin" data preprocess --input "$text" --tokenizer-model "$T/tok.model" --output-prefix "$T/gen" >> "$T/log" 2>&1
"$py" "$src/bench/gpu/hf_check.py" --tripod "$bin" --configs "$src/configs" --corpus "$T/gen" \
  --tokenizer "$T/tok.model" --work "$T/work" --device cpu --steps 2 --chapters 2 --tripod-only --out "$T/table.txt"
for family in gpt2 llama mixtral; do
  [ -f "$T/work/$family/hf/config.json" ] && [ -f "$T/work/$family/hf/model.safetensors" ] ||
    { echo "FAIL: no Hugging Face folder for $family"; ls -R "$T/work/$family"; exit 1; }
done
grep -q "3 of 3 families trained, exported and scored" "$T/table.txt" || { echo "FAIL"; cat "$T/work/hf_check.log"; exit 1; }
echo "hf_check_test: ok"
