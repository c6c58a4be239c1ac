#!/usr/bin/env bash
# Installs the Debian packages ddp-cpp needs (only those missing), then configures and builds.
# Run by scripts/demo.sh and scripts/test.sh; as root, or as a user with sudo. The build goes to
# $DDP_BUILD_DIR (default build/; scripts/trixie_env.sh uses build-trixie/); a first argument
# names what to build (default: everything).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake g++ make libtorch-dev libgloo-dev libopenblas0-pthread zlib1g-dev libgtest-dev
          python3-torch dataset-fashion-mnist)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# libtorch calls whatever libblas.so.3 the alternatives system points at. Debian's reference BLAS
# is about 7x slower on our models than OpenBLAS: make sure OpenBLAS is the one.
openblas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
if [ -e "$openblas" ] && [ "$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu)" != "$openblas" ]; then
  $sudo update-alternatives --set libblas.so.3-x86_64-linux-gnu "$openblas"
fi

build=${DDP_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" ${1:+--target "$@"}
