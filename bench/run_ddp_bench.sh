#!/usr/bin/env bash
# Side-by-side training-step benchmark: ddp-cpp's DistributedDataParallel (build/bench/ddp_bench)
# against PyTorch's own DDP (the peer, pytorch_ddp_bench.py, Python + gloo), on the four
# reference models, at NPROC ranks (default 2) on this machine. For each model, alternating in
# one run (RUNS picks which, default all four):
#   ours_ddp       ours, default backend ("auto": shm, as the ranks share this host)
#   ours_ddp_gloo  ours with --backend gloo
#   pytorch_ddp    PyTorch's DDP (NPROC python processes, gloo), PYTHON's torch (Debian's 1.13)
#   pytorch_newest_ddp  the same with NEWEST_PYTHON's torch (pip's newest: scripts/pip_env.sh
#                  installs it), where NEWEST_PYTHON names one or the pip venv exists
#   ours_lockstep  ours without DDP but in lockstep (ddp_bench --lockstep: one float all_reduced
#                  after each backward), the floor of any synchronous data-parallel training here
#   ours_recorder_off  (not in the default RUNS) ours_ddp with the flight recorder off
#                  (DDP_CPP_TRACE_BUFFER=0): what the recorder, on by default, costs a step
#   ours_timeline  (not in the default RUNS) ours_ddp writing a timeline (DDP_CPP_TIMELINE)
#   ours_by_hand   (not in the default RUNS) ours, default backend, its ranks started by hand with
#                  torchrun's environment and without GLIBC_TUNABLES: glibc's defaults, as under
#                  torchrun, mpirun or srun, where only init_process_group's own tuning helps
#   each repeated REPS times, alternating; the table reports the median run. Then (EXTRAS,
#   default both):
#   single         ours, one process without DDP (compute only)
#   concurrent     ours, NPROC processes without DDP started at once (the slowest one)
# Our ranks are started by ddprun, or with LAUNCHER=env by hand with torchrun's environment
# variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK), as the peer's are.
# Every process runs with OMP_NUM_THREADS=1 and --threads 1, and with the same GLIBC_TUNABLES:
# ddprun's default for its workers (glibc keeps freed activations in the heap rather than
# page-faulting them back every step), given here to the PyTorch ranks and the no-DDP runs too,
# so that every process allocates alike. `GLIBC_TUNABLES= bench/run_ddp_bench.sh` (empty) runs
# everything with glibc's defaults instead: ours then tunes malloc itself in init_process_group
# (InitOptions::tune_allocator), whatever started it.
#
#   bench/run_ddp_bench.sh [OUT.jsonl]        (default: $BUILD_DIR/bench/ddp_bench_results.jsonl)
#
# Environment: BUILD_DIR (default <repo>/build), PEERS_DIR (default <repo>/../shared/peers),
# PYTHON (default /usr/bin/python3), NEWEST_PYTHON (default the pip venv's, DDP_PIP_VENV or
# /var/tmp/ddp-cpp-pip-torch, where it exists; empty leaves the run out), MODELS (default "mlp cnn resnet transformer"), NPROC (2),
# RUNS, EXTRAS, LAUNCHER (ddprun), STEPS (30), WARMUP (5), REPS (5), BUCKET_CAP_MB (25),
# GLIBC_TUNABLES (see above). Prints a markdown table at the end.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
PEERS_DIR="${PEERS_DIR:-$ROOT/../shared/peers}"
PYTHON="${PYTHON:-/usr/bin/python3}"
MODELS="${MODELS:-mlp cnn resnet transformer}"
STEPS="${STEPS:-30}"
WARMUP="${WARMUP:-5}"
REPS="${REPS:-5}"
BUCKET_CAP_MB="${BUCKET_CAP_MB:-25}"
NPROC="${NPROC:-2}"
NEWEST_PYTHON="${NEWEST_PYTHON-${DDP_PIP_VENV:-/var/tmp/ddp-cpp-pip-torch}/bin/python}"
[[ -z "$NEWEST_PYTHON" || -x "$NEWEST_PYTHON" ]] || NEWEST_PYTHON=""
default_runs="ours_ddp ours_ddp_gloo pytorch_ddp${NEWEST_PYTHON:+ pytorch_newest_ddp} ours_lockstep"
RUNS="${RUNS:-$default_runs}"
EXTRAS="${EXTRAS-single concurrent}"
LAUNCHER="${LAUNCHER:-ddprun}"
OUT="${1:-$BUILD_DIR/bench/ddp_bench_results.jsonl}"

BENCH="$BUILD_DIR/bench/ddp_bench"
DDPRUN="$BUILD_DIR/tools/ddprun/ddprun"
for f in "$BENCH" "$DDPRUN"; do
  [[ -x "$f" ]] || { echo "missing $f: cmake --build build --target ddp_bench ddprun" >&2; exit 1; }
done
[[ -f "$PEERS_DIR/pytorch_ddp_bench.py" ]] ||
  { echo "no peer in $PEERS_DIR: set PEERS_DIR" >&2; exit 1; }
# Absolute: the ranks run from PEERS_DIR.
PEERS_DIR="$(cd "$PEERS_DIR" && pwd)"
PEER="$PEERS_DIR/pytorch_ddp_bench.py"
BENCH="$(cd "$(dirname "$BENCH")" && pwd)/ddp_bench"
DDPRUN="$(cd "$(dirname "$DDPRUN")" && pwd)/ddprun"

export OMP_NUM_THREADS=1
# The peers' torch.distributed keeps the classic store client: Debian 13's python3-torch is built
# without libuv and otherwise refuses the rendezvous (1.13 and pip builds ignore or accept it).
export USE_LIBUV=0
export GLIBC_TUNABLES="${GLIBC_TUNABLES-glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456}"
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
COMMON=(--steps "$STEPS" --warmup "$WARMUP" --bucket-cap-mb "$BUCKET_CAP_MB" --threads 1)
TIMEOUT=300  # per run, seconds

mkdir -p "$(dirname "$OUT")"
: > "$OUT"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# record LABEL REP FILE: appends FILE's JSON lines (ddprun's "[0]: " prefix removed) to OUT,
# each tagged with "run" and "rep".
record() {
  local label=$1 rep=$2 file=$3 n
  n=$(grep -c '^\(\[[0-9]*\]: \)\?{' "$file" || true)
  if [[ "$n" -eq 0 ]]; then
    echo "no JSON line from run '$label' (rep $rep):" >&2; cat "$file" >&2; exit 1
  fi
  sed -n 's/^\(\[[0-9]*\]: \)\?{/{"run": "'"$label"'", "rep": '"$rep"', /p' "$file" | tee -a "$OUT"
}

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# by_hand PREFIX COMMAND...: NPROC ranks started with torchrun's environment, from PEERS_DIR;
# rank r writes PREFIX<r>.out and .err.
by_hand() {
  local prefix=$1 port pids=() r
  shift
  port=$(free_port)
  for ((r = 0; r < NPROC; r++)); do
    (cd "$PEERS_DIR" && MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r LOCAL_RANK=$r \
       WORLD_SIZE=$NPROC PYTHONPATH="$PEERS_DIR${PYTHONPATH:+:$PYTHONPATH}" \
       timeout "$TIMEOUT" "$@" > "$prefix$r.out" 2> "$prefix$r.err") &
    pids+=($!)
  done
  for ((r = 0; r < NPROC; r++)); do
    wait "${pids[$r]}" || { echo "rank $r of '$*' failed:" >&2; cat "$prefix$r.err" >&2; exit 1; }
  done
}

ours_ddp() {  # MODEL REP LABEL BACKEND [EXTRA FLAG]
  if [[ "$LAUNCHER" == env ]]; then
    by_hand "$TMP/ours" "$BENCH" --model "$1" "${COMMON[@]}" --backend "$4" ${5:+"$5"}
    record "$3" "$2" "$TMP/ours0.out"
    return
  fi
  timeout "$TIMEOUT" "$DDPRUN" --standalone --nproc-per-node "$NPROC" "$BENCH" --model "$1" \
    "${COMMON[@]}" --backend "$4" ${5:+"$5"} > "$TMP/out" 2> "$TMP/err" ||
    { cat "$TMP/err" >&2; exit 1; }
  record "$3" "$2" "$TMP/out"
}

peer_ddp() {  # MODEL REP LABEL PYTHON
  by_hand "$TMP/peer" "$4" "$PEER" --model "$1" "${COMMON[@]}"
  record "$3" "$2" "$TMP/peer0.out"
}

ours_single() {  # MODEL
  timeout "$TIMEOUT" "$BENCH" --model "$1" --no-ddp "${COMMON[@]}" > "$TMP/out"
  record ours_noddp_1proc 1 "$TMP/out"
}

ours_concurrent() {  # MODEL: NPROC no-DDP processes started at once
  local pids=() i
  for ((i = 0; i < NPROC; i++)); do
    timeout "$TIMEOUT" "$BENCH" --model "$1" --no-ddp "${COMMON[@]}" > "$TMP/conc$i.out" &
    pids+=($!)
  done
  for ((i = 0; i < NPROC; i++)); do
    wait "${pids[$i]}"
    record ours_noddp_concurrent $((i + 1)) "$TMP/conc$i.out"
  done
}

for python in "$PYTHON" $NEWEST_PYTHON; do
  echo "== peer $python: torch $("$python" -W ignore -c 'import torch; print(torch.__version__)' 2>/dev/null)" >&2
done
start=$(date +%s)
for model in $MODELS; do
  echo "== $model (load average before: $(cut -d" " -f1-3 /proc/loadavg))" >&2
  for ((rep = 1; rep <= REPS; rep++)); do
    for run in $RUNS; do
      case "$run" in
        ours_ddp) ours_ddp "$model" "$rep" ours_ddp auto ;;
        ours_ddp_gloo) ours_ddp "$model" "$rep" ours_ddp_gloo gloo ;;
        pytorch_ddp) peer_ddp "$model" "$rep" pytorch_ddp "$PYTHON" ;;
        pytorch_newest_ddp) peer_ddp "$model" "$rep" pytorch_newest_ddp "$NEWEST_PYTHON" ;;
        ours_lockstep) ours_ddp "$model" "$rep" ours_lockstep auto --lockstep ;;
        ours_recorder_off) DDP_CPP_TRACE_BUFFER=0 ours_ddp "$model" "$rep" ours_recorder_off auto ;;
        ours_timeline)
          mkdir -p "$TMP/timeline"
          DDP_CPP_TIMELINE="$TMP/timeline" ours_ddp "$model" "$rep" ours_timeline auto ;;
        ours_by_hand)
          by_hand "$TMP/hand" env -u GLIBC_TUNABLES "$BENCH" --model "$model" "${COMMON[@]}"
          record ours_by_hand "$rep" "$TMP/hand0.out" ;;
        *) echo "unknown run '$run' in RUNS" >&2; exit 2 ;;
      esac
    done
  done
  for extra in $EXTRAS; do
    case "$extra" in
      single) ours_single "$model" ;;
      concurrent) ours_concurrent "$model" ;;
      *) echo "unknown extra '$extra' in EXTRAS" >&2; exit 2 ;;
    esac
  done
done
echo "== done in $(( $(date +%s) - start )) s; JSON lines in $OUT" >&2

"$PYTHON" - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
models = list(dict.fromkeys(r["model"] for r in rows))
def med(model, run, agg=statistics.median):
    v = [r["step_ms_median"] for r in rows if r["model"] == model and r["run"] == run]
    return agg(v) if v else float("nan")
backend = {r.get("backend") for r in rows if r["run"] == "ours_ddp"}
backend = backend.pop() if len(backend) == 1 else "MIXED " + str(sorted(map(str, backend)))
world = {r["world_size"] for r in rows if r["run"] == "pytorch_ddp"} or {"?"}
print(f"{world.pop()} ranks")
by_hand = any(r["run"] == "ours_by_hand" for r in rows)
newest = any(r["run"] == "pytorch_newest_ddp" for r in rows)
print(f"| model | params | ours ms ({backend}) | ours ms (gloo) | PyTorch ms (gloo) | ours/PyTorch | "
      "ours (gloo)/PyTorch | lockstep no-DDP ms | lockstep/PyTorch | no-DDP 1 proc ms | "
      "concurrent no-DDP ms |" + (" ours by hand ms | by hand/PyTorch |" if by_hand else "") +
      (" PyTorch newest ms (gloo) | ours/newest | lockstep/newest |" if newest else ""))
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if by_hand else "") +
      ("---:|---:|---:|" if newest else ""))
for m in models:
    params = {r["params"] for r in rows if r["model"] == m}
    p = "{:,}".format(params.pop()) if len(params) == 1 else "MISMATCH " + str(sorted(params))
    ours, gloo, peer = med(m, "ours_ddp"), med(m, "ours_ddp_gloo"), med(m, "pytorch_ddp")
    lock = med(m, "ours_lockstep")
    print(f"| {m} | {p} | {ours:.1f} | {gloo:.1f} | {peer:.1f} | {ours / peer:.2f} | {gloo / peer:.2f} | "
          f"{lock:.1f} | {lock / peer:.2f} | {med(m, 'ours_noddp_1proc'):.1f} | "
          f"{med(m, 'ours_noddp_concurrent', max):.1f} |" +
          (f" {med(m, 'ours_by_hand'):.1f} | {med(m, 'ours_by_hand') / peer:.2f} |" if by_hand else "") +
          (f" {med(m, 'pytorch_newest_ddp'):.1f} | {ours / med(m, 'pytorch_newest_ddp'):.2f} | "
           f"{lock / med(m, 'pytorch_newest_ddp'):.2f} |" if newest else ""))

# The recorder's and the timeline's cost: per rep, each run against the ours_ddp run beside it
# (alternating runs see the same load), then the median of those ratios.
def paired(model, run, base):
    pairs = {}
    for r in rows:
        if r["model"] == model and r["run"] in (run, base):
            pairs.setdefault(r["rep"], {})[r["run"]] = r["step_ms_median"]
    ratios = [p[run] / p[base] for p in pairs.values() if run in p and base in p]
    return statistics.median(ratios) if ratios else float("nan")
if any(r["run"] in ("ours_recorder_off", "ours_timeline") for r in rows):
    print("\n| model | recorder on (default) ms | recorder off ms | on/off | timeline on ms | "
          "timeline/recorder on |")
    print("|---|---:|---:|---:|---:|---:|")
    for m in models:
        print(f"| {m} | {med(m, 'ours_ddp'):.2f} | {med(m, 'ours_recorder_off'):.2f} | "
              f"{1 / paired(m, 'ours_recorder_off', 'ours_ddp'):.4f} | "
              f"{med(m, 'ours_timeline'):.2f} | {paired(m, 'ours_timeline', 'ours_ddp'):.4f} |")
PY
