#!/usr/bin/env bash
# Builds everything and runs every test: ctest (unit, multi-process, launcher), then an install
# check that builds a program outside the project against the installed package.
#
# DDP_ONLY_GPU_SKIPS=1 (scripts/pip_env.sh sets it) fails the run when a test skipped for any
# reason but a missing GPU: there the PyTorch peer and everything else a test may need is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build=${DDP_BUILD_DIR:-build}
python=${DDP_TEST_PYTHON:-/usr/bin/python3}
echo "test: the PyTorch peer is $python, torch $("$python" -W ignore -c 'import torch; print(torch.__version__)' 2>/dev/null || echo 'missing')"
log=$(mktemp /tmp/ddp-ctest.XXXXXX)
trap 'rm -f "$log"' EXIT
(cd "$build" && ctest --output-on-failure -j2 --timeout 120) 2>&1 | tee "$log"
[ "${DDP_ONLY_GPU_SKIPS:-0}" != 1 ] || bash scripts/lib/check_skips.sh "$build" "$log"
bash scripts/check_install.sh
