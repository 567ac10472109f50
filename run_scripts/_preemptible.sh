# Sourced by the SLURM scripts: run the launcher so that SLURM's warning signal reaches training.
#
#   #SBATCH --signal=B:USR1@120   SLURM sends SIGUSR1 to this batch shell 120 s before the time limit
#   #SBATCH --requeue             the job may be put back in the queue
#
# `preemptible SCRIPT CMD...` runs CMD (horovodrun / srun ... torchrun) in the background. On SIGUSR1 it
# forwards the signal to the training processes of SCRIPT on this node (python processes, never the
# launcher: horovodrun and torchrun would end the job at once). One rank is enough: the ranks agree on
# the stop at the next step, write the restore file together and exit with status 75. The job is then
# requeued (scontrol requeue; REQUEUE=0 turns it off) and the next run resumes from the restore file.
# The B: matters: without it SLURM signals every process of the job steps, torchrun's agent included,
# which SIGUSR1 kills. SIGTERM (scancel, the time limit) is not forwarded: SLURM sends it to every
# process already, and a second SIGTERM means "stop now" to the training processes.
preemptible() {
  local script="$1"
  shift
  PREEMPTED=0
  trap '_forward_preemption USR1 "'"$script"'"' USR1
  "$@" &
  local child=$! rc
  while true; do
    rc=0
    wait "$child" || rc=$?  # (the callers run under set -e: a non-zero wait must not end this shell)
    kill -0 "$child" 2>/dev/null || break  # still running: wait was interrupted by the trapped signal
  done
  trap - USR1
  if [ "$PREEMPTED" = 1 ] && [ -n "${SLURM_JOB_ID:-}" ] && [ "${REQUEUE:-1}" = 1 ]; then
    if scontrol requeue "$SLURM_JOB_ID"; then
      echo "[slurm] job $SLURM_JOB_ID requeued; it resumes from the restore file when it runs again" >&2
      return 0
    fi
    echo "[slurm] scontrol requeue $SLURM_JOB_ID failed; resubmit the job to resume" >&2
  fi
  return "$rc"
}

_descends_from() {  # pid ancestor: is pid in ancestor's process tree (another job on a shared node is not)
  local p="$1"
  while [ -n "$p" ] && [ "$p" -gt 1 ]; do
    [ "$p" = "$2" ] && return 0
    p="$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f2)" || return 1
  done
  return 1
}

_forward_preemption() {
  local sig="$1" script="$2" pid n=0
  PREEMPTED=1
  for pid in $(pgrep -f -- "$script" || true); do
    _descends_from "$pid" "$$" || continue  # only this job's processes, never another job's same script
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in python*) ;; *) continue ;; esac
    tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qE 'horovodrun|torch\.distributed\.run|torchrun' \
      && continue
    kill -s "$sig" "$pid" 2>/dev/null && n=$((n + 1))
  done
  echo "[slurm] SIG$sig: asked $n training process(es) of $script on $(hostname) to save and stop" >&2
}
