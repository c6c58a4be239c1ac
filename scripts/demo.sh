#!/usr/bin/env bash
# The main job: builds ddp-cpp and runs the 2-rank demo through the ddprun launcher.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec build/tools/ddprun/ddprun --standalone --nproc-per-node 2 \
  build/examples/collectives_demo/collectives_demo "$@"
