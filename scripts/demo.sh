#!/usr/bin/env bash
# The main job: builds ddp-cpp and trains a CNN on Fashion-MNIST on 2 ranks through ddprun
# (DistributedDataParallel, DistributedSampler, a checkpoint per epoch). Extra arguments go to
# the example (e.g. --epochs 5, --resume); see build/examples/fashion_mnist --help.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --demo
mkdir -p out
cd out
exec ../build/tools/ddprun/ddprun --standalone --nproc-per-node 2 ../build/examples/fashion_mnist "$@"
