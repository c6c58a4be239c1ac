#!/usr/bin/env bash
# DDP training steps across two hosts of the namespace test bed (tests/multihost/hosts.sh: own
# network, hostname and /dev/shm each, one link shaped to RATE), NPROC ranks per host started by
# ddprun on each, on the reference models: PyTorch's own DDP (the peer, pytorch_ddp_bench.py,
# gloo) against ours ("auto": the hierarchy) with each comm hook of HOOKS:
#   none        DDP's default all-reduce, full precision
#   bf16-hosts  comm_hooks::bf16_compress_between_hosts(): only what crosses the link is bf16
#   fp16-hosts  the same with float16
#   powersgd    comm_hooks::powerSGD(), rank POWERSGD_RANK (default 8: within 0.5 points of the
#               uncompressed accuracy on Fashion-MNIST across 2 hosts), from the first measured step
#   bf16, fp16  the hooks that compress every rank's bucket
# and ours without DDP in lockstep (ddp_bench --lockstep: one float all-reduced after each
# backward), the floor of any synchronous data-parallel training on these cores. Runs alternate
# (peer, ours with each hook, lockstep), REPS times; the table reports medians of the per-run
# step medians, and each over PyTorch's. Root needed.
#
#   bench/run_two_hosts_ddp_bench.sh [RATE]      (default 1gbit)
#
# Environment: BUILD_DIR (default <repo>/build), PEERS_DIR (default <repo>/../shared/peers),
# PYTHON (/usr/bin/python3), MODELS ("mlp cnn resnet transformer"), HOOKS ("none bf16-hosts
# powersgd"), POWERSGD_RANK (8), NPROC (2), STEPS (20), WARMUP (5), REPS (3), OUT (a .jsonl to
# keep the lines).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="$(cd "${BUILD_DIR:-$ROOT/build}" && pwd)"
PEERS_DIR="$(cd "${PEERS_DIR:-$ROOT/../shared/peers}" && pwd)"
PYTHON="${PYTHON:-/usr/bin/python3}"
RATE="${1:-1gbit}"
MODELS="${MODELS:-mlp cnn resnet transformer}"
HOOKS="${HOOKS:-none bf16-hosts powersgd}"
NPROC="${NPROC:-2}"
STEPS="${STEPS:-20}"
WARMUP="${WARMUP:-5}"
REPS="${REPS:-3}"
export DDP_TESTBED=ddp-ddpbench$$
bed="$ROOT/tests/multihost/hosts.sh"
"$bed" check
out=$(mktemp -d /tmp/two_hosts_ddp_bench_XXXXXX)
trap '"$bed" down; rm -rf "$out"' EXIT
"$bed" up 2 "$RATE"
results="$out/all.jsonl"

# Runs PROGRAM ARGS on both hosts, NPROC ranks each; appends rank 0's JSON line, tagged with
# RUN, to the results.
on_two_hosts() {
  local run=$1 i status=0 pids=()
  shift
  for i in 1 0; do
    # OMP_NUM_THREADS=1 as the benchmarks on one host; the peer's Python ranks cannot find
    # their address (the hostnames resolve to nothing), so they are told the interface.
    OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 timeout 600 "$bed" exec $i \
      "$BUILD_DIR/tools/ddprun/ddprun" --nnodes 2 --node-rank $i --master-addr 198.18.0.1 \
      --master-port 29500 --nproc-per-node "$NPROC" "$@" > "$out/host$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || status=1; done
  if [ $status != 0 ]; then
    echo "$run failed:" >&2
    cat "$out/host0.log" "$out/host1.log" >&2
    return 1
  fi
  grep -o '{.*}' "$out/host0.log" | tail -n 1 |
    "$PYTHON" -c 'import json, sys; r = json.load(sys.stdin); r["run"] = sys.argv[1]; print(json.dumps(r))' \
      "$run" | tee -a "$results"
}

common=(--steps "$STEPS" --warmup "$WARMUP" --threads 1)
for model in $MODELS; do
  for ((rep = 1; rep <= REPS; rep++)); do
    on_two_hosts pytorch "$PYTHON" "$PEERS_DIR/pytorch_ddp_bench.py" --model "$model" "${common[@]}"
    for hook in $HOOKS; do
      extra=()
      # PowerSGD from the first measured step (PyTorch's default waits 1000 steps).
      [ "$hook" = powersgd ] &&
        extra=(--powersgd-start-iter "$WARMUP" --powersgd-rank "${POWERSGD_RANK:-8}")
      on_two_hosts "$hook" "$BUILD_DIR/bench/ddp_bench" --model "$model" "${common[@]}" \
        --comm-hook "$hook" "${extra[@]}"
    done
    on_two_hosts lockstep "$BUILD_DIR/bench/ddp_bench" --model "$model" "${common[@]}" --lockstep
  done
done
[ -z "${OUT:-}" ] || cp "$results" "$OUT"

echo
echo "2 hosts x $NPROC ranks at $RATE, median step (ms) and ours / PyTorch:"
"$PYTHON" - "$results" $HOOKS lockstep <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
hooks = sys.argv[2:]
print("| model | PyTorch DDP | " + " | ".join(f"ours, {h}" for h in hooks) + " |")
print("|---" * (2 + len(hooks)) + "|")
for model in dict.fromkeys(r["model"] for r in rows):
    def median(run):
        times = [r["step_ms_median"] for r in rows if r["model"] == model and r["run"] == run]
        return statistics.median(times) if times else None
    peer = median("pytorch")
    cells = [f"{peer:.1f}"]
    for h in hooks:
        ours = median(h)
        cells.append("-" if ours is None else f"{ours:.1f} ({ours / peer:.2f}x)")
    print(f"| {model} | " + " | ".join(cells) + " |")
PY
