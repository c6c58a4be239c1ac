#!/usr/bin/env bash
# ZeroRedundancyOptimizer against DDP + plain Adam, and its two exchanges, on one host: runs
# zero_bench for each backend and mode, REPS times alternating, NPROC ranks started by hand
# (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), and prints the JSON lines of rank 0.
#
#   bench/run_zero_bench.sh [EXTRA zero_bench FLAGS...]
#
# Environment: BUILD_DIR (default <repo>/build), NPROC (2), REPS (3), BACKENDS ("shm gloo").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
NPROC="${NPROC:-2}"
REPS="${REPS:-3}"
BACKENDS="${BACKENDS:-shm gloo}"
BENCH="$BUILD_DIR/bench/zero_bench"
[[ -x "$BENCH" ]] || { echo "missing $BENCH: cmake --build build --target zero_bench" >&2; exit 1; }
export OMP_NUM_THREADS=1 MASTER_ADDR=127.0.0.1 WORLD_SIZE="$NPROC"
port=$((29600 + RANDOM % 1000))
for ((rep = 1; rep <= REPS; rep++)); do
  for backend in $BACKENDS; do
    for mode in ddp broadcast allgather; do
      port=$((port + 1))
      pids=()
      for ((rank = NPROC - 1; rank >= 0; rank--)); do
        RANK=$rank MASTER_PORT=$port TORCHELASTIC_RUN_ID="zero-bench-$$-$port" \
          timeout 600 "$BENCH" --backend "$backend" --mode "$mode" "$@" &
        pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid"; done
    done
  done
done
