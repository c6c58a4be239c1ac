#!/usr/bin/env bash
# Installs the Debian packages ddp-cpp needs (only those missing), then configures and builds.
#
#   scripts/setup.sh            # everything: library, launcher, examples, benchmarks, tests
#   scripts/setup.sh --demo     # only what scripts/demo.sh runs: the library, ddprun, the example
#
# Run by scripts/demo.sh and scripts/test.sh; as root, or as a user with sudo. The build goes to
# $DDP_BUILD_DIR (default build/; scripts/trixie_env.sh uses build-trixie/). The demo leaves out
# the test-only packages (googletest, python3-torch: PyTorch is the tests' reference peer) and
# the tests' and benchmarks' objects, so that a newcomer's first training step comes minutes
# sooner; a later scripts/test.sh adds them to the same build.
#
# DDP_TORCH_CMAKE_PREFIX (set by scripts/pip_env.sh) names another libtorch's CMake folder
# (torch.utils.cmake_prefix_path, or <unzipped libtorch>/share/cmake): the build uses it, and
# Debian's libtorch-dev and python3-torch are not installed; DDP_GLOO_INCLUDE_DIR names the folder
# of gloo's headers.
set -euo pipefail
cd "$(dirname "$0")/.."

demo=false
if [ "${1:-}" = "--demo" ]; then
  demo=true
  shift
fi

torch_prefix=${DDP_TORCH_CMAKE_PREFIX:-}
packages=(cmake g++ make libgloo-dev libopenblas0-pthread zlib1g-dev dataset-fashion-mnist)
[ -n "$torch_prefix" ] || packages+=(libtorch-dev)
$demo || packages+=(libgtest-dev)
$demo || [ -n "$torch_prefix" ] || packages+=(python3-torch)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
if [ ${#missing[@]} -gt 0 ]; then
  # Without recommended packages: 363 packages instead of 452 on a fresh Debian 12 (systemd among
  # those left out), none of which ddp-cpp uses. Quiet unless it fails.
  echo "setup: installing ${missing[*]} (a few minutes on a fresh machine)"
  log=$(mktemp /tmp/ddp-setup-apt.XXXXXX)
  if ! { $sudo apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
           "${missing[@]}"; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "setup: installing the packages failed (the lines above are apt's last; all of it is in $log)" >&2
    exit 1
  fi
  rm -f "$log"
fi

# libtorch calls whatever libblas.so.3 the alternatives system points at. Debian's reference BLAS
# is about 7x slower on our models than OpenBLAS: make sure OpenBLAS is the one.
openblas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
if [ -e "$openblas" ] && [ "$(readlink -f /etc/alternatives/libblas.so.3-x86_64-linux-gnu)" != "$openblas" ]; then
  $sudo update-alternatives --set libblas.so.3-x86_64-linux-gnu "$openblas"
fi

build=${DDP_BUILD_DIR:-build}
configure=(-DCMAKE_BUILD_TYPE=Release)
[ -z "$torch_prefix" ] || configure+=(-DCMAKE_PREFIX_PATH="$torch_prefix")
[ -z "${DDP_GLOO_INCLUDE_DIR:-}" ] || configure+=(-DDDP_GLOO_INCLUDE_DIR="$DDP_GLOO_INCLUDE_DIR")
if $demo; then
  # Configure as the full build does (a later scripts/test.sh then reuses every object), except
  # that tests are off until googletest is there; build only the two programs the demo runs.
  tests=OFF
  [ -f "$build/CMakeCache.txt" ] && grep -q '^DDP_BUILD_TESTS:BOOL=ON' "$build/CMakeCache.txt" &&
    tests=ON
  echo "setup: building the library, ddprun and the example into $build/"
  cmake -S . -B "$build" "${configure[@]}" -DDDP_BUILD_TESTS=$tests >/dev/null
  cmake --build "$build" -j"$(nproc)" --target ddprun fashion_mnist
else
  cmake -S . -B "$build" "${configure[@]}" -DDDP_BUILD_TESTS=ON >/dev/null
  cmake --build "$build" -j"$(nproc)" ${1:+--target "$@"}
fi
