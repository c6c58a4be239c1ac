#!/usr/bin/env bash
# Sharded training (ZeroRedundancyOptimizer and its two exchanges, fully_shard) against DDP + plain
# Adam, on one host: runs zero_bench for each world size, backend and mode, REPS times
# alternating, the ranks started by hand (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and prints
# the JSON lines of rank 0. Where PEER_PYTHON is set, each repetition also runs PyTorch's DDP +
# Adam, DDP + ZeroRedundancyOptimizer and (PEER_MODES) fully_shard on gloo (bench/zero_peer.py,
# the transformer only) beside ours.
#
#   bench/run_zero_bench.sh [EXTRA zero_bench FLAGS...]
#   PEER_PYTHON=/var/tmp/ddp-cpp-pip-torch/bin/python NPROCS="2 4" MODES="ddp broadcast" \
#     bench/run_zero_bench.sh --model transformer
#
# Environment: BUILD_DIR (default <repo>/build), NPROCS ("2"), REPS (3), BACKENDS ("shm gloo"),
# MODES ("ddp broadcast allgather"; also fsdp), PEER_PYTHON (unset: no PyTorch runs), PEER_MODES
# (zero_peer.py's modes, "ddp zero"; also fsdp), PEERS_DIR (the peers' reference_models.py,
# default <repo>/../shared/peers).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
NPROCS="${NPROCS:-2}"
REPS="${REPS:-3}"
BACKENDS="${BACKENDS:-shm gloo}"
MODES="${MODES:-ddp broadcast allgather}"
PEER_PYTHON="${PEER_PYTHON:-}"
export PEERS_DIR="${PEERS_DIR:-$ROOT/../shared/peers}"
BENCH="$BUILD_DIR/bench/zero_bench"
[[ -x "$BENCH" ]] || { echo "missing $BENCH: cmake --build build --target zero_bench" >&2; exit 1; }
export OMP_NUM_THREADS=1 MASTER_ADDR=127.0.0.1
port=$((29600 + RANDOM % 1000))

# run_ranks NPROC COMMAND...: NPROC copies of COMMAND, one per rank, on a fresh port.
run_ranks() {
  local nproc=$1
  shift
  port=$((port + 1))
  local pids=()
  for ((rank = nproc - 1; rank >= 0; rank--)); do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$nproc MASTER_PORT=$port \
      TORCHELASTIC_RUN_ID="zero-bench-$$-$port" timeout 900 "$@" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
}

for ((rep = 1; rep <= REPS; rep++)); do
  for nproc in $NPROCS; do
    for backend in $BACKENDS; do
      for mode in $MODES; do
        run_ranks "$nproc" "$BENCH" --backend "$backend" --mode "$mode" "$@"
      done
    done
    if [[ -n "$PEER_PYTHON" ]]; then
      for mode in ${PEER_MODES:-ddp zero}; do
        run_ranks "$nproc" "$PEER_PYTHON" "$ROOT/bench/zero_peer.py" --mode "$mode"
      done
    fi
  done
done
