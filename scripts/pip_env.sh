#!/usr/bin/env bash
# Runs a command of this checkout against pip's torch: its libtorch (built with CUDA; what
# pytorch.org's libtorch zip holds, the libtorch most C++ users build against) to build against,
# and its Python as the tests' PyTorch peer.
#
#   scripts/pip_env.sh                         # the README's test command, against pip's libtorch
#   scripts/pip_env.sh bash                    # a shell with that environment, in the checkout
#   scripts/pip_env.sh bench/run_ddp_bench.sh  # anything else
#
# The torch version is pinned in scripts/pip_torch_requirements.txt. The first run makes a virtual
# environment outside the checkout, $DDP_PIP_VENV (default /var/tmp/ddp-cpp-pip-torch), and
# installs the pin there (about 2 minutes and 5 GB here); later runs reuse it, and install again
# when the pin has moved. Building against a CUDA libtorch needs the CUDA toolkit of torch's CUDA
# major ($CUDA_HOME, default /usr/local/cuda), not a GPU: without one the CUDA tests skip and the
# rest runs on the CPU. Builds go to build-pip/ (DDP_BUILD_DIR), beside the other legs' folders.
#
# gloo's headers: pip's torch carries gloo inside but not its headers, which c10d's include and
# ddp-cpp reads gloo::Context through; they must be those of the gloo release inside libtorch
# (gloo::Context lost its vtable in 2025, so Debian 12's headers compile but read wrong fields).
# Debian's unstable suite has a libgloo-dev of that release (2025-09, checked against 2.15 by the
# build, which stops naming the folder if they differ): its headers are unpacked into the venv,
# once, without installing the package.
#
# What it sets for the command: DDP_TORCH_CMAKE_PREFIX (setup.sh configures with it and installs
# no Debian libtorch), DDP_GLOO_INCLUDE_DIR, DDP_TEST_PYTHON (the peer), DDP_BUILD_DIR, and
# DDP_ONLY_GPU_SKIPS=1: in this leg a test that skips for any reason but a missing GPU fails the
# run (test.sh).
set -euo pipefail
checkout=$(cd "$(dirname "$0")/.." && pwd)
venv=${DDP_PIP_VENV:-/var/tmp/ddp-cpp-pip-torch}
requirements=$checkout/scripts/pip_torch_requirements.txt
python=$venv/bin/python
fail() { echo "pip_env: $*" >&2; exit 1; }

exec 9>"$venv.lock"
flock 9
if ! { [ -x "$python" ] && cmp -s "$requirements" "$venv/ddp-cpp-requirements.txt"; }; then
  echo "pip_env: installing $(grep -v '^#' "$requirements" | xargs) into $venv"
  [ -x "$python" ] || python3 -m venv "$venv" || fail "python3 -m venv failed (python3-venv?)"
  log=$(mktemp /tmp/ddp-pip-install.XXXXXX)
  "$python" -m pip install --disable-pip-version-check -r "$requirements" >"$log" 2>&1 ||
    { tail -n 20 "$log" >&2; fail "pip install failed (all of it is in $log)"; }
  rm -f "$log"
  cp "$requirements" "$venv/ddp-cpp-requirements.txt"
fi
gloo_headers=$venv/gloo-headers
if [ ! -f "$gloo_headers/usr/include/gloo/context.h" ]; then
  # shellcheck source=lib/chroot.sh
  source "$checkout/scripts/lib/chroot.sh"  # debian_mirror
  work=$(mktemp -d /tmp/ddp-gloo-headers.XXXXXX)  # apt's lists (apt empties their folder)
  mkdir -p "$work/lists/partial" "$gloo_headers.partial"
  echo "deb $(debian_mirror) sid main" >"$work/sources.list"
  apt=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
       -o Dir::State::Lists="$work/lists" -o Dir::Cache::Archives="$work")
  { apt-get "${apt[@]}" update -qq &&
    (cd "$gloo_headers.partial" && apt-get "${apt[@]}" download libgloo-dev); } >"$work/log" 2>&1 ||
    { tail -n 5 "$work/log" >&2; fail "could not fetch Debian's libgloo-dev for gloo's headers"; }
  dpkg-deb -x "$gloo_headers.partial"/libgloo-dev_*.deb "$gloo_headers.partial"
  echo "pip_env: gloo headers of $(basename "$gloo_headers.partial"/libgloo-dev_*.deb .deb) in $gloo_headers"
  rm -rf "$work" "$gloo_headers" "$gloo_headers.partial"/*.deb
  mv "$gloo_headers.partial" "$gloo_headers"
fi
exec 9>&-

read -r torch_version torch_cuda cmake_prefix < <("$python" -W ignore -c \
  'import torch; print(torch.__version__, torch.version.cuda or "none", torch.utils.cmake_prefix_path)' 2>/dev/null)
# libtorch's CMake config enables CUDA with the toolkit's nvcc; a toolkit of another major would
# link a second CUDA runtime beside the one torch loads.
if [ "$torch_cuda" != none ]; then
  cuda_home=${CUDA_HOME:-/usr/local/cuda}
  [ -x "$cuda_home/bin/nvcc" ] ||
    fail "torch $torch_version is built with CUDA $torch_cuda: building against its libtorch needs a CUDA $torch_cuda toolkit (nvcc; no GPU needed), in /usr/local/cuda or \$CUDA_HOME"
  toolkit=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
  [ "${toolkit%%.*}" = "${torch_cuda%%.*}" ] ||
    fail "torch $torch_version is built with CUDA $torch_cuda, but the toolkit in $cuda_home is CUDA $toolkit: use a toolkit of CUDA ${torch_cuda%%.*} (CUDA_HOME), or a torch built for CUDA ${toolkit%%.*}"
  export PATH="$cuda_home/bin:$PATH"
  echo "pip_env: torch $torch_version (CUDA $torch_cuda), CUDA toolkit $toolkit in $cuda_home"
else
  echo "pip_env: torch $torch_version (CPU)"
fi

export DDP_TORCH_CMAKE_PREFIX=$cmake_prefix
export DDP_GLOO_INCLUDE_DIR=${DDP_GLOO_INCLUDE_DIR:-$gloo_headers/usr/include}
export DDP_TEST_PYTHON=$python
export DDP_BUILD_DIR=${DDP_BUILD_DIR:-build-pip}
export DDP_ONLY_GPU_SKIPS=1
cd "$checkout"
[ $# -gt 0 ] || set -- scripts/test.sh
exec "$@"
