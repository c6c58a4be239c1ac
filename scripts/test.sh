#!/usr/bin/env bash
# Builds everything and runs every test: ctest (unit, multi-process, launcher), then an install
# check that builds a program outside the project against the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
(cd "${DDP_BUILD_DIR:-build}" && ctest --output-on-failure -j2 --timeout 120)
bash scripts/check_install.sh
