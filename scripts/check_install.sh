#!/usr/bin/env bash
# Installs the build into a fresh prefix, builds tests/install_consumer against it with nothing
# but find_package(ddp), and runs it on 3 ranks with the installed ddprun.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=$(mktemp -d /tmp/ddp_install_XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "${DDP_BUILD_DIR:-build}" --prefix "$prefix" >/dev/null
cmake -S tests/install_consumer -B "$prefix/consumer-build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer-build" -j"$(nproc)" >/dev/null
output=$("$prefix/bin/ddprun" --standalone --nproc-per-node 3 "$prefix/consumer-build/consumer")
echo "$output"
grep -q "consumer: OK on 3 ranks" <<<"$output"
echo "install check: OK"
