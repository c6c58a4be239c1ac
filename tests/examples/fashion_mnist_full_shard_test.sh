#!/usr/bin/env bash
# The Fashion-MNIST example with --shard full (ddp::fully_shard: each layer a unit), 2 ranks, on
# the small synthetic IDX data set: a run interrupted after epoch 1 and resumed ends with exactly
# the parameters of an uninterrupted run; its checkpoint holds the whole model and the whole
# optimizer state (Python's torch.load reads it, torch.optim.Adam loads it); a run at 3 ranks
# resumes from it; DDP's comm hooks are refused with it by name.
# Usage: fashion_mnist_full_shard_test.sh DDPRUN FASHION_MNIST
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ddprun=$1
example=$2
python=${DDP_TEST_PYTHON:-/usr/bin/python3}
work=$(mktemp -d /tmp/fashion_mnist_full_shard_test_XXXXXX)
trap 'rm -rf "$work"' EXIT
export TMPDIR="$work"
cd "$work"

"$python" "$here/synthetic_fashion_mnist.py" data

run() {
  local ranks=$1
  shift
  timeout 120 "$ddprun" --standalone --nproc-per-node "$ranks" "$example" --data data \
    --batch-size 16 --shard full "$@"
}
outputs() { echo --checkpoint "$1.pt" --metrics "$1.csv" --loss-csv "$1_loss.csv" --plot "$1.svg"; }
run 2 --epochs 2 $(outputs whole) > whole.log
run 2 --epochs 1 $(outputs resumed) > first.log
run 2 --epochs 2 $(outputs resumed) --resume > second.log
grep -q "resumed from resumed.pt after epoch 1" second.log
tail -n 1 whole.log | grep -q '"test_accuracy"'
cp resumed.pt at_three.pt
run 3 --epochs 3 $(outputs at_three) --resume > third.log
grep -q "resumed from at_three.pt after epoch 2" third.log
tail -n 1 third.log | grep -q '"world_size": 3'

"$python" - <<'PY'
import torch
safe = int(torch.__version__.split(".")[0]) >= 2
whole = torch.load("whole.pt", weights_only=safe)
resumed = torch.load("resumed.pt", weights_only=safe)
shapes = {"conv1.weight": (32, 1, 3, 3), "conv2.weight": (64, 32, 3, 3), "fc1.weight": (128, 9216),
          "fc2.weight": (10, 128)}
for name, shape in shapes.items():
    assert tuple(whole["model"][name].shape) == shape, (name, whole["model"][name].shape)
for name, tensor in whole["model"].items():
    assert torch.equal(tensor, resumed["model"][name]), f"{name} differs after resume"
state = whole["optimizer"]
params = list(whole["model"].values())
for index, param in enumerate(params):
    assert state["state"][index]["exp_avg"].shape == param.shape, index
    assert torch.equal(state["state"][index]["exp_avg"], resumed["optimizer"]["state"][index]["exp_avg"])
copies = [p.clone().requires_grad_() for p in params]
adam = torch.optim.Adam(copies, lr=1e-3)
adam.load_state_dict(state)
print("fully_shard checkpoint: whole, resumed run equals the uninterrupted one; Adam loads it")
PY

if run 2 --epochs 1 --checkpoint '' --comm-hook bf16 > bad.log 2>&1; then exit 1; fi
grep -q -- "--shard full trains without DDP" bad.log
echo "fashion_mnist --shard full: OK"
