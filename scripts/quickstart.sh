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
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
ROOT=()
[ "$(id -u)" -eq 0 ] && ROOT=(--allow-run-as-root)
echo "== training on 8 ranks: (dp, pp, tp) = (2, 2, 2), interleaved 1F1B"
mpirun "${ROOT[@]}" --oversubscribe --bind-to none -np 8 build/bin/tripod train --config configs/quickstart.toml "$@"
echo "== pipeline timeline"
build/bin/tripod trace merge "$RUN"
echo "== done: $RUN/metrics.jsonl, $RUN/trace.json (Perfetto), $RUN/trace.svg"
