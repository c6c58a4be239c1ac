# Sourced by the shell tests that kill one rank of a running job.
#
# worker_pid CHECKPOINT RANK: the pid of rank RANK among the workers whose command line names
# CHECKPOINT (a run's own path, so that other jobs on the machine are never chosen). The test
# bed's hosts share this machine's pid namespace, so this finds a worker on any of them.
worker_pid() {
  local pid
  for pid in $(pgrep -f -- "--checkpoint $1"); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "RANK=$2"; then
      echo "$pid"
      return
    fi
  done
}
