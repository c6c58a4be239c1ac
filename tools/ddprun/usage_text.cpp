// The --help text, kept apart from the parser so that the parser stays readable.
#include "launcher_options.h"

namespace ddprun {

std::string UsageText() {
  return R"(usage: ddprun [options] PROGRAM [ARGS...]
       ddprun --analyze-trace DIR
       ddprun --merge-timeline DIR

Runs PROGRAM as nproc-per-node worker processes on this node, torchrun style (PyTorch 1.13
names and environment), for ddp-cpp data-parallel training. Options end at the first argument
that is not an option, or at `--`; PROGRAM and its ARGS are passed through untouched and PROGRAM
is looked up in PATH. Every option may be written `--name value` or `--name=value`, with dashes
or with torchrun's underscores (--nproc_per_node is --nproc-per-node).

options:
  -h, --help               print this text and exit 0
  --nproc-per-node N|gpu|cpu|auto
                           workers on this node (default 1): N; `gpu`, one per GPU that the
                           workers would see (libcuda.so.1 asked in a short-lived child process,
                           so CUDA_VISIBLE_DEVICES counts; an error when there is none); `cpu`,
                           one per online CPU core; `auto`, `gpu` when there is a GPU, else `cpu`
  --nnodes N               number of nodes (default 1); torchrun's MIN:MAX form is accepted only
                           with MIN == MAX: elastic ranges are not supported
  --node-rank R            rank of this node, 0 <= R < nnodes (default 0)
  --master-addr ADDR       address of the node running rank 0 (default 127.0.0.1)
  --master-port P          port of rank 0's store, 1..65535 (default 29500)
  --standalone             single node (nnodes must be 1): MASTER_ADDR is 127.0.0.1 and
                           MASTER_PORT a free port that ddprun picks itself
  --max-restarts N         times the whole worker group is restarted after a failure (default 0)
  --monitor-interval SECS  how often workers are checked, in seconds (default 0.1)
  --run-id ID              exported as TORCHELASTIC_RUN_ID (default none)
  --role NAME              exported as ROLE_NAME (default default)
  --stop-grace SECS        seconds between SIGTERM and SIGKILL when stopping workers (default 5)
  --no-python              accepted for torchrun compatibility; ddprun always runs PROGRAM itself
  --log-dir DIR            where each attempt's flight records go: DIR/<run-id>_XXXXXX/attempt_N
                           (default: TMPDIR or /tmp, ddprun_<run-id>_XXXXXX/attempt_N), exported
                           to the workers as DDP_CPP_TRACE_DIR unless that is already set. When
                           an attempt fails, the ranks still running that catch SIGUSR1 are
                           asked for their records (up to 2 s) before they are stopped, the
                           folder is kept, named, and its ranks' records are diagnosed (as
                           --analyze-trace does); when it succeeds, removed
  --analyze-trace DIR      runs nothing: reads the flight records that ranks left in DIR
                           (rank<R>.json, see DDP_CPP_TRACE_DIR), prints a diagnosis (per rank
                           and group the last completed collective and the current one, the first
                           sequence number where the ranks differ, who never entered it and who
                           entered another) and writes it to DIR/diagnosis.json; exits 1 when DIR
                           holds no records
  --merge-timeline DIR     runs nothing: merges the timelines that ranks wrote in DIR
                           (timeline_rank<R>.json, see DDP_CPP_TIMELINE) into DIR/timeline.json,
                           one process per rank, for ui.perfetto.dev or chrome://tracing; exits
                           1 when DIR holds none. ddprun does it itself after each attempt when
                           DDP_CPP_TIMELINE is set in its environment (the workers inherit it)

Each option falls back on the environment variable PET_<NAME> (upper case, underscores: e.g.
PET_NPROC_PER_NODE, PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_STANDALONE,
PET_MAX_RESTARTS, PET_MONITOR_INTERVAL, PET_RUN_ID, PET_ROLE, PET_STOP_GRACE, PET_LOG_DIR) when it is not on
the command line; the command line wins. Flags are set by a non-zero integer (PET_STANDALONE=1).

worker environment (local rank i of node k, p = nproc-per-node, n = nnodes), added to ddprun's:
  RANK=k*p+i  LOCAL_RANK=i  WORLD_SIZE=n*p  LOCAL_WORLD_SIZE=p  GROUP_RANK=k  GROUP_WORLD_SIZE=n
  ROLE_RANK=RANK  ROLE_WORLD_SIZE=WORLD_SIZE  ROLE_NAME  MASTER_ADDR  MASTER_PORT
  TORCHELASTIC_RESTART_COUNT (0, then 1, 2, ... per restart)  TORCHELASTIC_MAX_RESTARTS
  TORCHELASTIC_RUN_ID  DDPRUN_STDOUT_TTY (1 when ddprun's stdout is a terminal, else 0)
  OMP_NUM_THREADS=max(1, cores/p), unless already set for ddprun.
  GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456
    (keeps freed activations in the heap instead of page-faulting them back every step),
    unless GLIBC_TUNABLES or a MALLOC_* variable is already set for ddprun.
Rank 0 hosts the TCPStore at MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE is not set).

output:
  Each line a worker writes is relayed whole, prefixed with `[RANK]: `; its stdout goes to
  ddprun's stdout and its stderr to ddprun's stderr. A last line without a newline gets one.
  A carriage return starts a line over: a progress bar redrawn with "\r" becomes one line with
  its last state. When ddprun's stdout is a terminal (and TERM is not dumb), such a bar is drawn
  live at the bottom of it, below the other ranks' lines, and the workers get
  DDPRUN_STDOUT_TTY=1 (0 otherwise).

exit behaviour:
  0         every worker exited 0.
  CODE      a worker failed (non-zero exit or killed by a signal) and no restart was left: the
            other workers are stopped (SIGTERM to their process groups, SIGKILL after
            --stop-grace), a summary names the first failed rank, its exit code or signal, pid and
            last lines of stderr, and ddprun exits with that worker's exit code, or 128+signal.
            With restarts left, the whole group is stopped and started again instead.
  127       PROGRAM could not be found (a worker that cannot exec exits 127, or 126).
  128+SIG   ddprun got SIGINT, SIGTERM or SIGHUP: it is forwarded to the workers, which are
            waited for (SIGKILL after --stop-grace) and not restarted (130 for SIGINT).
  2         bad command line.
  1         ddprun itself failed (could not fork, could not pick a port).
Workers never outlive ddprun: each gets SIGKILL if ddprun dies, even by SIGKILL.
)";
}

}  // namespace ddprun
