#!/usr/bin/env bash
# One node: NPROCS ranks of `tripod train` under Open MPI's mpirun, each bound to its own cores
# with OpenBLAS/OpenMP threads sized so the ranks do not fight over them.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: launch/local.sh NPROCS CONFIG [--max-restarts N] [tripod train args...]

Runs NPROCS ranks of `tripod train --config CONFIG [args...]` on this machine under mpirun
(`tripod eval` or `tripod generate` instead with TRIPOD_COMMAND=eval|generate).
  NPROCS    number of ranks (tp * pp * dp of the config; dp = 0 derives it from NPROCS)
  CONFIG    the TOML config file
  args      passed to tripod train, e.g. --set train.steps=10 --set parallel.pp=2

Threads: OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = cores / NPROCS (at least 1), each rank
bound to that many cores; more ranks than cores run oversubscribed and unbound.
  --max-restarts N   when the run fails (a crash, a killed or frozen rank, a communication
                     timeout, a stop signal to the ranks before the last step), start it again
                     with --set checkpoint.load=latest after a back-off, up to N times; bad input
                     (exit 2) is never retried; each restart is logged in <output_dir>/restarts.jsonl
                     and shown by tripod report (see launch/restarts.sh)
  --restart-backoff S  seconds between a failure and the restart (default 10)
Environment:
  TRIPOD              the tripod executable (default: build/bin/tripod of this checkout)
  MPIRUN              the mpirun to use (default: mpirun)
  THREADS_PER_RANK    overrides cores / NPROCS
  TRIPOD_COMMAND      the subcommand: train (default), eval or generate
  TRIPOD_LAUNCH_ECHO  when 1, print the command instead of running it
Example: launch/local.sh 4 configs/tiny.toml --set parallel.tp=2 --set parallel.pp=2
USAGE
}

die() {
  echo "error: $*" >&2
  exit 2
}

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=launch/restarts.sh
. "$root/launch/restarts.sh"
restart_take_options "$@"
set -- "${rest_args[@]}"
[ $# -ge 2 ] || die "expected NPROCS and CONFIG (usage: launch/local.sh NPROCS CONFIG [tripod train args...]; see --help)"
nprocs=$1
config=$2
shift 2
[[ "$nprocs" =~ ^[0-9]+$ ]] && [ "$nprocs" -ge 1 ] || die "NPROCS must be a whole number >= 1, got '$nprocs'"
[ -f "$config" ] && [ -r "$config" ] || die "config file '$config' does not exist or is not readable"

tripod=${TRIPOD:-$root/build/bin/tripod}
[ -x "$tripod" ] || die "tripod executable '$tripod' not found (build it with scripts/setup.sh, or set TRIPOD)"
subcommand=${TRIPOD_COMMAND:-train}
case "$subcommand" in
  train|eval|generate) ;;
  *) die "TRIPOD_COMMAND must be train, eval or generate, got '$subcommand'" ;;
esac
mpirun=${MPIRUN:-mpirun}
command -v "$mpirun" >/dev/null || die "'$mpirun' not found (install Open MPI: openmpi-bin, or set MPIRUN)"

# The CPUs this process may run on (nproc alone would answer OMP_NUM_THREADS when it is set).
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
threads=${THREADS_PER_RANK:-$(( cores / nprocs ))}
[[ "$threads" =~ ^[0-9]+$ ]] || die "THREADS_PER_RANK must be a whole number, got '$threads'"
[ "$threads" -ge 1 ] || threads=1
export OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads

args=(-np "$nprocs" -x OPENBLAS_NUM_THREADS -x OMP_NUM_THREADS)
if [ "$nprocs" -gt "$cores" ]; then
  # More ranks than cores: binding would refuse to overload a core; let the kernel share them.
  args+=(--oversubscribe --bind-to none)
else
  # Each rank gets `threads` consecutive logical CPUs for its BLAS/OpenMP threads (counted as
  # nproc counts them, hardware threads included, so mpirun's slots match).
  args+=(--use-hwthread-cpus --map-by "slot:PE=$threads" --bind-to hwthread)
fi
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)

cmd=("$mpirun" "${args[@]}" "$tripod" "$subcommand" --config "$config" "$@")
if [ "${TRIPOD_LAUNCH_ECHO:-0}" = 1 ]; then
  echo "OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads ${cmd[*]}"
  exit 0
fi
if [ "$max_restarts" -gt 0 ]; then
  [ "$subcommand" = train ] || die "--max-restarts restarts training only (TRIPOD_COMMAND is '$subcommand')"
  run_with_restarts "${cmd[@]}"
  exit $?
fi
exec "${cmd[@]}"
