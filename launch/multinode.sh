#!/usr/bin/env bash
# Several nodes: NPROCS ranks of `tripod train` under Open MPI across the hosts of a hostfile,
# one rank per GPU. Ranks fill each node's slots in order, so node-local rank i drives GPU i
# (tripod picks GPU = OMPI_COMM_WORLD_LOCAL_RANK) and tensor-parallel groups, the fastest axis of
# the grid, stay inside a node.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: launch/multinode.sh HOSTFILE NPROCS CONFIG [--max-restarts N] [tripod train args...]

Runs NPROCS ranks of `tripod train --config CONFIG [args...]` across the hosts of HOSTFILE.
  HOSTFILE  Open MPI hostfile, one node per line with its GPU count as slots:
                node01 slots=8
                node02 slots=8
  NPROCS    number of ranks (tp * pp * dp of the config), at most the slots in HOSTFILE
  CONFIG    the TOML config file (at the same path on every node: a shared file system)
  args      passed to tripod train, e.g. --set parallel.pp=4

Passed to every rank: NCCL_*, UCX_*, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER,
CUDA_DEVICE_MAX_CONNECTIONS, OMP_*, OPENBLAS_*, TRIPOD_*, PATH and LD_LIBRARY_PATH when set here;
OMPI_MCA_* settings reach them through mpirun. OMP_NUM_THREADS and OPENBLAS_NUM_THREADS default
to this node's cores / ranks per node (at least 1).
  --max-restarts N   when the run fails (a crash, a killed or frozen rank, a communication
                     timeout, a stop signal to the ranks before the last step), start it again
                     with --set checkpoint.load=latest after a back-off, up to N times; bad input
                     (exit 2) is never retried; each restart is logged in <output_dir>/restarts.jsonl
                     and shown by tripod report (see launch/restarts.sh)
  --restart-backoff S  seconds between a failure and the restart (default 10)
Environment:
  TRIPOD              the tripod executable, same path on every node (default: build/bin/tripod
                      of this checkout)
  MPIRUN              the mpirun to use (default: mpirun)
  TRIPOD_IFACE        network for MPI's TCP traffic and NCCL's bootstrap: an interface name
                      (e.g. ib0, eth1) or, for MPI only, a subnet like 10.0.0.0/16
  TRIPOD_BIND         mpirun --bind-to value (default: none; e.g. numa, socket)
  MPIRUN_ARGS         extra mpirun arguments (split on spaces)
  TRIPOD_LAUNCH_ECHO  when 1, print the command instead of running it
Example: launch/multinode.sh hosts.txt 32 configs/gpt2_1558m.toml --set parallel.pp=4
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
[ $# -ge 3 ] || die "expected HOSTFILE, NPROCS and CONFIG (usage: launch/multinode.sh HOSTFILE NPROCS CONFIG [tripod train args...]; see --help)"
hostfile=$1
nprocs=$2
config=$3
shift 3
[ -f "$hostfile" ] && [ -r "$hostfile" ] || die "hostfile '$hostfile' does not exist or is not readable"
[[ "$nprocs" =~ ^[0-9]+$ ]] && [ "$nprocs" -ge 1 ] || die "NPROCS must be a whole number >= 1, got '$nprocs'"
[ -f "$config" ] && [ -r "$config" ] || die "config file '$config' does not exist or is not readable"

# Hosts and slots: "host [slots=N] [max_slots=M]"; comments and blank lines skipped.
hosts=0 slots=0 all_slots=1 first_slots=0
line_no=0
while read -r host rest || [ -n "${host:-}" ]; do
  line_no=$((line_no + 1))
  [ -z "$host" ] || [[ "$host" == \#* ]] && continue
  rest=${rest%%#*}
  [[ "$host" =~ ^[A-Za-z0-9._:-]+$ ]] && [[ "$rest" =~ ^([[:space:]]*[a-z_]+=[^[:space:]=]+)*[[:space:]]*$ ]] ||
    die "hostfile '$hostfile' line $line_no: '$host $rest' is not 'HOST [slots=N] [max_slots=N]'"
  hosts=$((hosts + 1))
  if [[ " $rest " =~ [[:space:]]slots=([0-9]+)[[:space:]] ]]; then
    n=${BASH_REMATCH[1]}
    slots=$((slots + n))
    [ "$hosts" -eq 1 ] && first_slots=$n
  else
    all_slots=0
  fi
done < "$hostfile"
[ "$hosts" -ge 1 ] || die "hostfile '$hostfile' names no host (lines like: node01 slots=8)"
if [ "$all_slots" -eq 1 ] && [ "$nprocs" -gt "$slots" ]; then
  die "NPROCS = $nprocs exceeds the $slots slots (GPUs) of the $hosts host(s) in '$hostfile'"
fi

tripod=${TRIPOD:-$root/build/bin/tripod}
[ -x "$tripod" ] || die "tripod executable '$tripod' not found (build it with scripts/setup.sh, or set TRIPOD)"
mpirun=${MPIRUN:-mpirun}
command -v "$mpirun" >/dev/null || die "'$mpirun' not found (install Open MPI: openmpi-bin, or set MPIRUN)"

# Host threads per rank: this node's cores over the ranks per node (nodes alike).
per_node=$first_slots
[ "$per_node" -ge 1 ] || per_node=$(( (nprocs + hosts - 1) / hosts ))
threads=$(( $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) / per_node ))
[ "$threads" -ge 1 ] || threads=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$threads}

args=(--hostfile "$hostfile" -np "$nprocs" --map-by slot --bind-to "${TRIPOD_BIND:-none}")
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
if [ -n "${TRIPOD_IFACE:-}" ]; then
  args+=(--mca btl_tcp_if_include "$TRIPOD_IFACE" --mca oob_tcp_if_include "$TRIPOD_IFACE")
  # NCCL takes interface names only (a subnet is for MPI).
  [[ "$TRIPOD_IFACE" == */* ]] || export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-$TRIPOD_IFACE}
fi
while IFS= read -r var; do
  case "$var" in
    NCCL_*|UCX_*|OMP_*|OPENBLAS_*|TRIPOD_*|CUDA_VISIBLE_DEVICES|CUDA_DEVICE_ORDER|CUDA_DEVICE_MAX_CONNECTIONS|PATH|LD_LIBRARY_PATH)
      args+=(-x "$var") ;;
  esac
done < <(compgen -e | sort)
# shellcheck disable=SC2206  # MPIRUN_ARGS is split on purpose
[ -n "${MPIRUN_ARGS:-}" ] && args+=(${MPIRUN_ARGS})

cmd=("$mpirun" "${args[@]}" "$tripod" train --config "$config" "$@")
if [ "${TRIPOD_LAUNCH_ECHO:-0}" = 1 ]; then
  echo "${cmd[*]}"
  exit 0
fi
if [ "$max_restarts" -gt 0 ]; then
  # The status file must be where rank 0 (on the first host) can write it: the shared file system.
  restart_status_dir=$(pwd)
  run_with_restarts "${cmd[@]}"
  exit $?
fi
exec "${cmd[@]}"
