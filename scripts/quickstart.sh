#!/usr/bin/env bash
# The README's main job, from a fresh clone: install what is missing, build, prepare the bundled
# corpus (the King James Bible, tokenized), then train a tiny GPT on 8 CPU ranks as
# (dp, pp, tp) = (2, 2, 2) with the interleaved schedule (configs/quickstart.toml).
#   scripts/quickstart.sh [--set section.key=value ...]   (overrides go to tripod train)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
RUN=runs/quickstart
rm -rf "$RUN"
echo "== training on 8 ranks: (dp, pp, tp) = (2, 2, 2), interleaved 1F1B"
launch/local.sh 8 configs/quickstart.toml "$@"
echo "== report"
build/bin/tripod trace merge "$RUN" >/dev/null
build/bin/tripod report "$RUN"
echo "== done: $RUN/report.html (open it in a browser), $RUN/metrics.jsonl, $RUN/trace.json (Perfetto)"
