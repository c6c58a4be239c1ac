#!/usr/bin/env bash
# The Fashion-MNIST example with --shard zero (ZeroRedundancyOptimizer) or --shard full
# (fully_shard: each layer a unit, without DDP), 2 ranks, on the small synthetic IDX data set: a
# run interrupted after epoch 1 and resumed ends with exactly the parameters of an uninterrupted
# run; its checkpoint holds the whole model and the whole optimizer state in PyTorch's layout
# (Python's torch.load reads it and torch.optim.Adam loads it); a run at 3 ranks resumes from it.
# zero: a comm hook works alongside, and a bad --shard is refused by name; full: DDP's comm hooks
# are refused with it by name.
# Usage: fashion_mnist_shard_test.sh DDPRUN FASHION_MNIST zero|full
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ddprun=$1
example=$2
mode=$3
python=${DDP_TEST_PYTHON:-/usr/bin/python3}
work=$(mktemp -d "/tmp/fashion_mnist_shard_${mode}_test_XXXXXX")
trap 'rm -rf "$work"' EXIT
# ddprun keeps a failed attempt's flight records under TMPDIR: here, removed with the rest.
export TMPDIR="$work"
cd "$work"

"$python" "$here/synthetic_fashion_mnist.py" data

run() {
  local ranks=$1
  shift
  timeout 120 "$ddprun" --standalone --nproc-per-node "$ranks" "$example" --data data \
    --batch-size 16 --shard "$mode" "$@"
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
# The whole model, whatever held it (fully_shard's ranks keep rows of each parameter).
shapes = {"conv1.weight": (32, 1, 3, 3), "conv2.weight": (64, 32, 3, 3), "fc1.weight": (128, 9216),
          "fc2.weight": (10, 128)}
for name, shape in shapes.items():
    assert tuple(whole["model"][name].shape) == shape, (name, whole["model"][name].shape)
for name, tensor in whole["model"].items():
    assert torch.equal(tensor, resumed["model"][name]), f"{name} differs after resume"
state = whole["optimizer"]
params = list(whole["model"].values())
# The consolidated state: every parameter's Adam moments, whole, under its global index.
assert sorted(state["state"].keys()) == list(range(len(params))), sorted(state["state"].keys())
for index, param in enumerate(params):
    assert state["state"][index]["exp_avg"].shape == param.shape, index
    assert torch.equal(state["state"][index]["exp_avg"], resumed["optimizer"]["state"][index]["exp_avg"])
assert state["param_groups"][0]["params"] == list(range(len(params)))
copies = [p.clone().requires_grad_() for p in params]
adam = torch.optim.Adam(copies, lr=1e-3)
adam.load_state_dict(state)
assert torch.equal(adam.state[copies[0]]["exp_avg_sq"], state["state"][0]["exp_avg_sq"])
print("sharded checkpoint: resumed run equals the uninterrupted one; torch.optim.Adam loads it")
PY

if [[ "$mode" == zero ]]; then
  # A comm hook alongside: the gradients ZeRO steps with are the hook's.
  run 2 --epochs 1 --checkpoint '' --comm-hook bf16 > hook.log
  tail -n 1 hook.log | grep -q '"test_accuracy"'
  if timeout 120 "$ddprun" --standalone --nproc-per-node 2 "$example" --data data \
    --epochs 1 --checkpoint '' --shard fsdp > bad.log 2>&1; then exit 1; fi
  grep -q "shard must be none, zero or full, got 'fsdp'" bad.log
else
  if run 2 --epochs 1 --checkpoint '' --comm-hook bf16 > bad.log 2>&1; then exit 1; fi
  grep -q -- "--shard full trains without DDP" bad.log
fi
echo "fashion_mnist --shard $mode: OK"
