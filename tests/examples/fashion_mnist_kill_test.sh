#!/usr/bin/env bash
# A rank killed with SIGKILL at a random step of a DDP training run under
# `ddprun --max-restarts 1`: the survivors fail instead of hanging, ddprun restarts the whole
# group, the example resumes from its last checkpoint, and the final parameters are bit-identical
# to those of an uninterrupted run. 2 and 3 ranks, on the shm and gloo backends; which rank dies,
# and when, is random (the seed is printed, DDP_KILL_SEED replays it). DDP_KILL_TRIALS=N runs N
# trials per case (default 1).
# Usage: fashion_mnist_kill_test.sh DDPRUN FASHION_MNIST
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ddprun=$1
example=$2
python=${DDP_TEST_PYTHON:-/usr/bin/python3}
trials=${DDP_KILL_TRIALS:-1}
seed=${DDP_KILL_SEED:-$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')}
RANDOM=$seed
echo "kill test: seed $seed (DDP_KILL_SEED=$seed replays it), $trials trial(s) per case"
work=$(mktemp -d /tmp/fashion_mnist_kill_XXXXXX)
trap 'pkill -KILL -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
# ddprun keeps a failed attempt's flight records under TMPDIR: here, removed with the rest.
export TMPDIR="$work"
cd "$work"
"$python" "$here/synthetic_fashion_mnist.py" data

epochs=3
batch=16
# Rank 0 prints a line per step ("epoch E/3 step S/T ...") when its stdout is not a terminal and
# an epoch has at most 10 steps: the killer watches for the chosen one.
common=(--data "$work/data" --epochs $epochs --batch-size $batch --log-every 100)

# shellcheck source=../support/worker_pid.sh
source "$here/../support/worker_pid.sh"

# Reads ddprun's output; when rank 0 reports the chosen step (every rank is at that step: DDP
# keeps them in lockstep), kills rank VICTIM, once. Fails if the step never came.
kill_at() {
  local marker=$1 checkpoint=$2 victim=$3 line pid killed=false
  while IFS= read -r line; do
    if ! $killed && [[ $line == "$marker"* ]]; then
      pid=$(worker_pid "$checkpoint" "$victim")
      [ -n "$pid" ] || { echo "rank $victim not found" >&2; return 1; }
      kill -KILL "$pid"
      killed=true
    fi
  done
  $killed || { echo "never saw '$marker'" >&2; return 1; }
}

# Every parameter equal to the bit.
params_equal() {
  "$python" - "$1" "$2" <<'PY'
import sys, torch
safe = int(torch.__version__.split(".")[0]) >= 2
a, b = (torch.load(path, weights_only=safe) for path in sys.argv[1:3])
assert a["epoch"] == b["epoch"] == 3, (a["epoch"], b["epoch"])
assert a["model"].keys() == b["model"].keys()
for name, tensor in a["model"].items():
    other = b["model"][name]
    assert torch.equal(tensor, other), \
        f"{name} differs from the uninterrupted run by {(tensor - other).abs().max().item()}"
PY
}
for world in 2 3; do
  steps=$(( (256 / world + batch - 1) / batch ))
  for backend in shm gloo; do
    # The uninterrupted run (per backend: their sums may round differently at 3 ranks).
    timeout 120 "$ddprun" --standalone --nproc-per-node $world "$example" "${common[@]}" \
      --backend $backend --checkpoint "$work/reference-$backend-$world.pt" > "reference.log"
    for ((trial = 1; trial <= trials; trial++)); do
      name=$backend-$world-$trial
      victim=$((RANDOM % world))
      epoch=$((1 + RANDOM % epochs))
      step=$((1 + RANDOM % (steps - 1)))
      echo "kill test: $world ranks on $backend: rank $victim dies at epoch $epoch step $step"
      set +e
      timeout 180 "$ddprun" --standalone --nproc-per-node $world --max-restarts 1 "$example" \
        "${common[@]}" --backend $backend --checkpoint "$work/$name.pt" \
        --metrics "$name.csv" --loss-csv "$name-loss.csv" --plot "$name.svg" 2> "$name.err" |
        tee "$name.log" | kill_at "[0]: epoch $epoch/$epochs step $step/$steps " "$work/$name.pt" $victim
      statuses=("${PIPESTATUS[@]}")
      set -e
      if [ "${statuses[0]}" != 0 ] || [ "${statuses[2]}" != 0 ]; then
        echo "ddprun exited ${statuses[0]}, the killer ${statuses[2]}:"; cat "$name.log" "$name.err"
        exit 1
      fi
      grep -q "restarting" "$name.err" || { echo "no restart:"; cat "$name.err"; exit 1; }
      # The restarted group resumed from the last checkpoint of the first attempt: after the K
      # epochs that attempt reported (K + 1 if rank 0 died between a save and its report). The
      # kill lands a few steps after the chosen one: steps here take milliseconds.
      done_epochs=$(awk '/training on/ { attempt++ } attempt == 1 && /: epoch [0-9]+: train loss/' \
                      "$name.log" | wc -l)
      resumed=$(sed -n 's/.*resumed from .* after epoch \([0-9]*\)$/\1/p' "$name.log")
      if [ -z "$resumed" ]; then
        [ "$done_epochs" = 0 ] || { echo "no resume after $done_epochs epochs:"; cat "$name.log"; exit 1; }
      elif [ "$resumed" != "$done_epochs" ] && [ "$resumed" != $((done_epochs + 1)) ]; then
        echo "resumed after epoch $resumed, not $done_epochs:"; cat "$name.log"; exit 1
      fi
      echo "  the first attempt finished $done_epochs epoch(s); the restart resumed after ${resumed:-none}"
      params_equal "$work/reference-$backend-$world.pt" "$work/$name.pt" ||
        { cat "$name.log" "$name.err"; exit 1; }
      # The resumed group continued the metrics: every epoch is there once.
      [ "$(cut -d, -f1 "$name.csv" | tr '\n' ' ')" = "epoch 1 2 3 " ] || { cat "$name.csv"; exit 1; }
    done
  done
done
echo "kill test: OK"
