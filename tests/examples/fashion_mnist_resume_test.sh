#!/usr/bin/env bash
# The Fashion-MNIST example on 2 ranks, on a small synthetic IDX data set: a run interrupted after
# epoch 1 and resumed from its checkpoint ends with exactly the parameters of an uninterrupted
# run, and continues its metrics (per epoch, and the loss every few steps) and plot from the
# history kept in the checkpoint, even with the CSV files gone; the checkpoint is a dict that
# Python's torch.load reads; a missing data folder is named.
# Usage: fashion_mnist_resume_test.sh DDPRUN FASHION_MNIST
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ddprun=$1
example=$2
python=${DDP_TEST_PYTHON:-/usr/bin/python3}
work=$(mktemp -d /tmp/fashion_mnist_test_XXXXXX)
trap 'rm -rf "$work"' EXIT
# ddprun keeps a failed attempt's flight records under TMPDIR: here, removed with the rest.
export TMPDIR="$work"
cd "$work"

# 256 training and 64 test images of 28x28, labels 0..9, written as gzip-compressed IDX files.
"$python" "$here/synthetic_fashion_mnist.py" data

run() { timeout 120 "$ddprun" --standalone --nproc-per-node 2 "$example" --data data --batch-size 16 "$@"; }

outputs() { echo --checkpoint "$1.pt" --metrics "$1.csv" --loss-csv "$1_loss.csv" --plot "$1.svg"; }
run --epochs 2 --log-every 3 $(outputs whole) --stats-csv whole_stats.csv > whole.log
run --epochs 1 --log-every 3 $(outputs resumed) --stats-csv resumed_stats.csv > first.log
rm resumed.csv resumed_loss.csv resumed.svg  # the resumed run rebuilds them from the checkpoint
run --epochs 2 --log-every 3 $(outputs resumed) --resume --stats-csv resumed_stats.csv > second.log
grep -q "resumed from resumed.pt after epoch 1" second.log
tail -n 1 whole.log | grep -q '"test_accuracy"'
tail -n 1 whole.log | grep -q '"world_size": 2'

# 8 steps per epoch on each rank: the loss every 3 steps and at each epoch's end.
[ "$(cut -d, -f1 whole_loss.csv | tr '\n' ' ')" = "step 3 6 8 11 14 16 " ] || {
  cat whole_loss.csv; exit 1; }
# The resumed run's files hold both epochs, with the uninterrupted run's values (the times differ).
cmp whole_loss.csv resumed_loss.csv
[ "$(cut -d, -f1-3 whole.csv)" = "$(cut -d, -f1-3 resumed.csv)" ] || {
  paste -d'|' whole.csv resumed.csv; exit 1; }
[ "$(wc -l < resumed.csv)" = 3 ]
# DDP's statistics: a line per epoch; one CSV row per step, appended to by the resumed run, every
# step reducing the same bytes in the same buckets.
[ "$(grep -c "ddp stats, epoch .* (rank 0, mean of 8 steps)" whole.log)" = 2 ] || { cat whole.log; exit 1; }
for csv in whole_stats.csv resumed_stats.csv; do
  head -n 1 $csv | grep -q "^epoch,step,forward_ms,backward_compute_ms,exposed_communication_ms,"
  [ "$(tail -n +2 $csv | cut -d, -f1-2 | tr '\n' ' ')" = \
    "1,1 1,2 1,3 1,4 1,5 1,6 1,7 1,8 2,9 2,10 2,11 2,12 2,13 2,14 2,15 2,16 " ] || { cat $csv; exit 1; }
  [ "$(tail -n +2 $csv | cut -d, -f7-8 | sort -u | wc -l)" = 1 ] || { cat $csv; exit 1; }
done
for svg in whole.svg resumed.svg; do
  grep -q "<svg" $svg
  [ "$(grep -c "<circle" $svg)" = 5 ]  # two epoch means, their legend's dot, two accuracies
done
cmp whole.svg resumed.svg

"$python" - <<'PY'
import torch
# weights_only, the default since 2.6 (the safe unpickler of 1.13 cannot read floats)
safe = int(torch.__version__.split(".")[0]) >= 2
whole = torch.load("whole.pt", weights_only=safe)
resumed = torch.load("resumed.pt", weights_only=safe)
assert whole["epoch"] == resumed["epoch"] == 2, (whole["epoch"], resumed["epoch"])
assert whole["model"].keys() == resumed["model"].keys()
for name, tensor in whole["model"].items():
    assert torch.equal(tensor, resumed["model"][name]), f"{name} differs after resume"
assert tuple(resumed["history_epochs"].shape) == (2, 5), resumed["history_epochs"]
assert torch.equal(whole["history_losses"], resumed["history_losses"])
assert torch.equal(whole["history_epochs"][:, :3], resumed["history_epochs"][:, :3])
print("resumed run equals the uninterrupted one:", len(whole["model"]), "tensors")
PY

if run --epochs 1 --data "$work/nowhere" > missing.log 2>&1; then exit 1; fi
grep -q "nowhere/train-images-idx3-ubyte.gz" missing.log
grep -q "dataset-fashion-mnist" missing.log
echo "fashion_mnist example: OK"
