#!/usr/bin/env bash
# The Fashion-MNIST example with --shard zero (ZeroRedundancyOptimizer), 2 ranks, on the small
# synthetic IDX data set: a run interrupted after epoch 1 and resumed ends with exactly the
# parameters of an uninterrupted run; its checkpoint holds the whole optimizer state in PyTorch's
# layout (Python's torch.load reads it and torch.optim.Adam loads it); a run at 3 ranks resumes
# from it; a comm hook works alongside; a bad --shard is refused by name.
# Usage: fashion_mnist_zero_test.sh DDPRUN FASHION_MNIST
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ddprun=$1
example=$2
python=${DDP_TEST_PYTHON:-/usr/bin/python3}
work=$(mktemp -d /tmp/fashion_mnist_zero_test_XXXXXX)
trap 'rm -rf "$work"' EXIT
# ddprun keeps a failed attempt's flight records under TMPDIR: here, removed with the rest.
export TMPDIR="$work"
cd "$work"

"$python" "$here/synthetic_fashion_mnist.py" data

run() {
  local ranks=$1
  shift
  timeout 120 "$ddprun" --standalone --nproc-per-node "$ranks" "$example" --data data \
    --batch-size 16 --shard zero "$@"
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
for name, tensor in whole["model"].items():
    assert torch.equal(tensor, resumed["model"][name]), f"{name} differs after resume"
state = whole["optimizer"]
params = list(whole["model"].values())
# The consolidated state: every parameter's Adam moments, under its global index.
assert sorted(state["state"].keys()) == list(range(len(params))), sorted(state["state"].keys())
for index, param in enumerate(params):
    assert state["state"][index]["exp_avg"].shape == param.shape, index
    assert torch.equal(state["state"][index]["exp_avg"], resumed["optimizer"]["state"][index]["exp_avg"])
assert state["param_groups"][0]["params"] == list(range(len(params)))
copies = [p.clone().requires_grad_() for p in params]
adam = torch.optim.Adam(copies, lr=1e-3)
adam.load_state_dict(state)
assert torch.equal(adam.state[copies[0]]["exp_avg_sq"], state["state"][0]["exp_avg_sq"])
print("ZeRO checkpoint: resumed run equals the uninterrupted one; torch.optim.Adam loads it")
PY

# A comm hook alongside: the gradients ZeRO steps with are the hook's.
run 2 --epochs 1 --checkpoint '' --comm-hook bf16 > hook.log
tail -n 1 hook.log | grep -q '"test_accuracy"'

if run 2 --epochs 1 --checkpoint '' --shard fsdp > bad.log 2>&1; then exit 1; fi
grep -q "shard must be none, zero or full, got 'fsdp'" bad.log
echo "fashion_mnist --shard zero: OK"
