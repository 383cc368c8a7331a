#!/usr/bin/env bash
# The README's main job, from a fresh clone: install what is missing, build, prepare the bundled
# corpus (the King James Bible, tokenized), then train a tiny GPT on 8 CPU ranks as
# (dp, pp, tp) = (2, 2, 2) with the interleaved schedule (configs/quickstart.toml), checkpointing
# as it goes; evaluate the last checkpoint, sample from it, and write the HTML report.
#   scripts/quickstart.sh [--set section.key=value ...]   (overrides go to tripod train)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
RUN=runs/quickstart
rm -rf "$RUN"
echo "== training on 8 ranks: (dp, pp, tp) = (2, 2, 2), interleaved 1F1B"
launch/local.sh 8 configs/quickstart.toml "$@"
echo "== evaluating the last checkpoint on the validation split (8 ranks, the same grid)"
TRIPOD_COMMAND=eval launch/local.sh 8 configs/quickstart.toml --load latest
echo "== sampling from it on 2 ranks (tp = 2; the checkpoint is resharded on loading)"
TRIPOD_COMMAND=generate launch/local.sh 2 configs/quickstart.toml --load latest --prompt "And God said" \
  --max-tokens 40 --temperature 0.8 --top-k 40 --seed 1
echo
echo "== report"
build/bin/tripod trace merge "$RUN" >/dev/null
build/bin/tripod report "$RUN"
echo "== done: $RUN/report.html (open it in a browser), $RUN/metrics.jsonl, $RUN/trace.json (Perfetto),"
echo "   $RUN/checkpoints/ (tripod ckpt inspect $RUN/checkpoints/latest)"
