#!/usr/bin/env bash
# Two "hosts" on one machine for the multi-host test: two network namespaces joined by a veth
# pair (198.18.0.1/24 and 198.18.0.2/24, the benchmarking range, on those two links only), each
# with its own hostname. mpirun starts in the first; Open MPI reaches the second through a
# remote-shell agent that enters its namespace; launch/multinode.sh runs the training with MPI's
# TCP traffic restricted to the veth subnet. The namespaces (and any process left in them) are
# removed on every way out; nothing outside them is touched.
#
# usage: tests/e2e/multihost_netns.sh WORKDIR NPROCS CONFIG [tripod train args...]
#   exit 77: this machine cannot make network namespaces (the reason on stderr); else the
#   launcher's status. Prints "veth bytes: N" (traffic that crossed between the hosts).
set -euo pipefail

[ $# -ge 3 ] || { echo "usage: $0 WORKDIR NPROCS CONFIG [tripod train args...]" >&2; exit 2; }
work=$1
nprocs=$2
config=$3
shift 3
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

skip() {
  echo "skip: $*" >&2
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "not root (network namespaces need CAP_NET_ADMIN)"
for tool in ip unshare hostname timeout; do
  command -v "$tool" >/dev/null || skip "'$tool' not found"
done
unshare --uts true 2>/dev/null || skip "unshare --uts failed (no UTS namespaces here)"

# Names unique to this run, so parallel runs and leftovers of others are never touched.
tag="tripodmh$$"
nsa="${tag}a"
nsb="${tag}b"
made=()
child=
cleanup() {
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
  for ns in "${made[@]}"; do
    # Processes still inside (a failed run's daemons) were started by this script: end them.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true  # the veth pair goes with its namespaces
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$nsa" 2>"$work/netns.err" || skip "ip netns add failed: $(head -c 200 "$work/netns.err")"
made+=("$nsa")
ip netns add "$nsb"
made+=("$nsb")
ip link add mh0 netns "$nsa" type veth peer name mh1 netns "$nsb" 2>"$work/netns.err" ||
  skip "cannot make a veth pair: $(head -c 200 "$work/netns.err")"
ip -n "$nsa" addr add 198.18.0.1/24 dev mh0
ip -n "$nsb" addr add 198.18.0.2/24 dev mh1
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; done
ip -n "$nsa" link set mh0 up
ip -n "$nsb" link set mh1 up

# Open MPI's remote shell: "agent [options] HOST COMMAND..." runs COMMAND in HOST's namespace.
cat >"$work/rsh_agent.sh" <<AGENT
#!/bin/sh
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1
shift
case "\$host" in
  198.18.0.1) ns=$nsa name=mh-host-a ;;
  198.18.0.2) ns=$nsb name=mh-host-b ;;
  *) echo "rsh agent: unknown host \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$name; \$*"
AGENT
chmod +x "$work/rsh_agent.sh"
printf '198.18.0.1 slots=%d\n198.18.0.2 slots=%d\n' $(( (nprocs + 1) / 2 )) $(( nprocs / 2 )) >"$work/hostfile"

# A clean MPI environment (the caller may be an MPI process itself), then the test's settings.
while IFS= read -r var; do
  case "$var" in OMPI_*|PMIX_*|ORTE_*|OPAL_*) unset "$var" ;; esac
done < <(compgen -e)
export OMPI_MCA_plm_rsh_agent="$work/rsh_agent.sh" OMPI_MCA_plm_rsh_no_tree_spawn=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
export TRIPOD_IFACE=198.18.0.0/24 TRIPOD_BIND=none MPIRUN_ARGS="--display-map"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# In the background, so a signal to this script is handled at once (the cleanup ends the run).
timeout 100 ip netns exec "$nsa" unshare --uts /bin/sh -c 'hostname mh-host-a; exec "$@"' sh \
  "$root/launch/multinode.sh" "$work/hostfile" "$nprocs" "$config" "$@" &
child=$!
status=0
wait "$child" || status=$?
child=
echo "veth bytes: $(ip netns exec "$nsa" cat /sys/class/net/mh0/statistics/tx_bytes)"
exit "$status"
