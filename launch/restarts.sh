# Automatic restarts for the launchers (sourced by local.sh, multinode.sh and slurm.sbatch).
#
# restart_take_options ARGS...   removes --max-restarts N, --restart-backoff S (and, for Slurm,
#                                --requeue) from ARGS; sets max_restarts, restart_backoff,
#                                slurm_requeue and the array rest_args.
# run_with_restarts CMD...       runs CMD (mpirun/srun ... tripod train ...) and, when it fails
#                                restartably, runs it again with --set checkpoint.load=latest
#                                after restart_backoff seconds, up to max_restarts times.
#
# How a run ends decides what happens:
#   exit 0, last step reached      done (exit 0)
#   exit 2 (bad input)             never restarted: the same input would fail again (exit 2)
#   the launcher got SIGTERM/INT   forwarded to the job, which checkpoints; not restarted
#   anything else (a crash, a killed or frozen rank, a communication timeout, or a stop signal
#   sent to the ranks before the last step; a rank that stops beating is killed, see restart_watch)
#                                  restarted, up to max_restarts times
# Rank 0 of `tripod train` tells the launcher where the run lives and how far it got through the
# file named by TRIPOD_LAUNCH_STATUS; a restarted run gets TRIPOD_RESTART_ATTEMPT, _CAUSE,
# _EXIT_STATUS, _FAILED_AT and _PREVIOUS_START and logs the restart in <output_dir>/restarts.jsonl
# (cause, step resumed from, time lost), which `tripod report` shows.

restart_take_options() {
  max_restarts=0
  restart_backoff=${TRIPOD_RESTART_BACKOFF:-10}
  slurm_requeue=0
  rest_args=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --max-restarts)
        [ $# -ge 2 ] || die "--max-restarts needs a number (e.g. --max-restarts 3)"
        max_restarts=$2
        shift 2 ;;
      --max-restarts=*) max_restarts=${1#*=}; shift ;;
      --restart-backoff)
        [ $# -ge 2 ] || die "--restart-backoff needs a number of seconds"
        restart_backoff=$2
        shift 2 ;;
      --restart-backoff=*) restart_backoff=${1#*=}; shift ;;
      --requeue) slurm_requeue=1; shift ;;
      *) rest_args+=("$1"); shift ;;
    esac
  done
  [[ "$max_restarts" =~ ^[0-9]+$ ]] || die "--max-restarts must be a whole number >= 0, got '$max_restarts'"
  [[ "$restart_backoff" =~ ^[0-9]+([.][0-9]+)?$ ]] ||
    die "--restart-backoff must be a number of seconds >= 0, got '$restart_backoff'"
}

# The value of "key" in the one-line JSON status file ("" when absent).
restart_status_field() {
  [ -f "$restart_status" ] || return 0
  sed -n "s/.*\"$1\":\"\\{0,1\\}\\([^\",}]*\\)\"\\{0,1\\}[,}].*/\\1/p" "$restart_status" | head -n 1
}

# Why an attempt ended, from its exit status, its status file and its stderr.
restart_cause() {
  local rc=$1 log=$2 state line
  state=$(restart_status_field state)
  if [ -n "${restart_hang:-}" ]; then
    echo "$restart_hang"
  elif [ "$rc" -eq 0 ] && [ "$state" = stopped ]; then
    echo "stopped by a signal before its last step"
  elif grep -q "did not complete within" "$log" 2>/dev/null; then
    echo "communication timeout"
  elif line=$(grep -m 1 -E "exited on signal|killed by signal|terminated by signal|Killed|Terminated" "$log" 2>/dev/null); then
    line=$(echo "$line" | sed -n 's/.*process rank \([0-9]*\).*exited on signal \([0-9]*\).*/rank \1 exited on signal \2/p')
    echo "a rank was killed${line:+ ($line)}"
  elif [ "$rc" -gt 128 ]; then
    echo "killed by signal $((rc - 128))"
  else
    echo "crash"
  fi
}

restart_now() { date +%s.%N; }

# The watchdog over the ranks' heartbeats (core/heartbeat.h) while the job CHILD runs. Every rank
# touches FILE.rank<R> (FILE: TRIPOD_LAUNCH_STATUS) each second; one whose file has not changed
# for its limit (max(parallel.timeout_s, 10 s), by this launcher's clock) while it has not exited
# is stopped or frozen, which its peers cannot always see (it may stop after they have finished,
# and mpirun would wait for it forever). On this host the launcher kills that rank, and mpirun ends
# the job as for any killed rank; a rank on another host (its file on a shared file system) ends
# the job through mpirun. The restart's cause says which rank stopped responding.
restart_watch() {
  local child=$1 f host pid limit state m now rank me
  local -A seen=() since=()
  me=$(hostname)
  while kill -0 "$child" 2>/dev/null; do
    sleep 1
    now=$(date +%s)
    for f in "$restart_status".rank*; do
      case $f in *.tmp) continue ;; esac
      read -r host pid limit state < "$f" 2>/dev/null || continue
      [ "$state" = alive ] && m=$(stat -c %Y "$f" 2>/dev/null) || continue
      if [ "${seen[$f]:-}" != "$m" ]; then seen[$f]=$m; since[$f]=$now; continue; fi
      [ $((now - since[$f])) -ge "${limit%.*}" ] || continue
      rank=${f##*.rank}
      if [ "$host" = "$me" ]; then
        kill -0 "$pid" 2>/dev/null || continue  # it ended; mpirun saw that
        restart_hang="rank $rank stopped responding (no heartbeat for $((now - since[$f])) s)"
        echo "tripod launch: $restart_hang; killing it (pid $pid)" >&2
        kill -KILL "$pid" 2>/dev/null
      else
        restart_hang="rank $rank on $host stopped responding (no heartbeat for $((now - since[$f])) s)"
        echo "tripod launch: $restart_hang; ending the job" >&2
        kill -TERM "$child" 2>/dev/null
        (sleep 10; kill -KILL "$child" 2>/dev/null) &
      fi
      since[$f]=$now
    done
  done
}

run_with_restarts() {
  local cmd=("$@") extra=() attempt=${restart_attempt0:-0} rc start end state cause ckpt
  restart_status=${TRIPOD_LAUNCH_STATUS:-$(mktemp "${restart_status_dir:-${TMPDIR:-/tmp}}/.tripod_launch.XXXXXX")}
  export TRIPOD_LAUNCH_STATUS=$restart_status
  restart_log=$(mktemp "${TMPDIR:-/tmp}/tripod_launch_log.XXXXXX")
  restart_stop=0
  restart_child=
  trap 'restart_stop=1; [ -n "$restart_child" ] && kill -TERM "$restart_child" 2>/dev/null' TERM INT
  trap 'rm -f "$restart_log" "$restart_status".rank*; [ "${restart_keep_status:-0}" = 1 ] || rm -f "$restart_status" "$restart_status.tmp"' EXIT
  while :; do
    start=$(restart_now)
    [ "${restart_keep_status:-0}" = 1 ] || rm -f "$restart_status"
    : > "$restart_log"
    rm -f "$restart_status".rank*
    restart_hang=
    "${cmd[@]}" "${extra[@]}" 2> >(tee -a "$restart_log" >&2) &
    restart_child=$!
    restart_watch "$restart_child"
    rc=0
    wait "$restart_child" || rc=$?
    # A trapped signal interrupts wait; wait again for the job's own exit status.
    while kill -0 "$restart_child" 2>/dev/null; do rc=0; wait "$restart_child" || rc=$?; done
    restart_child=
    end=$(restart_now)
    sleep 0.2  # tee's last lines
    state=$(restart_status_field state)
    if [ "$rc" -eq 0 ] && [ "$state" != stopped ]; then return 0; fi
    if [ "$rc" -eq 2 ]; then
      echo "tripod launch: bad input (exit status 2): not restarting" >&2
      return 2
    fi
    if [ "$restart_stop" = 1 ]; then return "$rc"; fi
    cause=$(restart_cause "$rc" "$restart_log")
    if [ "$attempt" -ge "$max_restarts" ]; then
      echo "tripod launch: $cause; no restart left (--max-restarts $max_restarts)" >&2
      [ "$rc" -eq 0 ] && rc=1
      return "$rc"
    fi
    attempt=$((attempt + 1))
    if [ "${slurm_requeue:-0}" = 1 ] && declare -F restart_requeue >/dev/null; then
      restart_requeue "$attempt" "$cause" "$rc" "$end" "$start"
      return $?
    fi
    extra=()
    ckpt=$(restart_status_field checkpoint_dir)
    if [ -n "$ckpt" ] && [ -f "$ckpt/latest" ]; then
      extra=(--set checkpoint.load=latest)
    fi
    export TRIPOD_RESTART_ATTEMPT=$attempt TRIPOD_RESTART_CAUSE="$cause" TRIPOD_RESTART_EXIT_STATUS=$rc \
      TRIPOD_RESTART_FAILED_AT=$end TRIPOD_RESTART_PREVIOUS_START=$start
    echo "tripod launch: $cause (exit status $rc); restart $attempt of $max_restarts in ${restart_backoff} s" \
      "${extra[*]:+from the latest checkpoint in $ckpt}" >&2
    sleep "$restart_backoff" &
    restart_child=$!
    wait "$restart_child" 2>/dev/null || true
    restart_child=
    if [ "$restart_stop" = 1 ]; then return "$rc"; fi
  done
}
