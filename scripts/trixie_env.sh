#!/usr/bin/env bash
# Runs a command of this checkout inside Debian 13 ("trixie") with its libtorch 2.6, on a Debian
# machine (root needed: debootstrap, chroot and bind mounts).
#
#   scripts/trixie_env.sh                      # the README's test command, against libtorch 2.6
#   scripts/trixie_env.sh bash                 # a shell there, in the checkout
#   scripts/trixie_env.sh bench/run_ddp_bench.sh
#
# The first run makes the chroot with debootstrap and installs libtorch-dev, libgloo-dev,
# python3-torch, libgtest-dev and the build tools from trixie's main archive (about 4 minutes
# and 2 GB here); later runs reuse it. It lives outside the checkout, in $DDP_TRIXIE_ROOT (default
# /var/tmp/ddp-cpp-trixie), and the mirror is the one this machine's apt already uses. The
# checkout is bind-mounted at /work/ddp-cpp inside; builds go to build-trixie/ (DDP_BUILD_DIR),
# so that the host's build/ (libtorch 1.13) stays as it is. Runs are serialised by a lock, and
# the mounts are undone when the command ends, however it ends.
set -euo pipefail
checkout=$(cd "$(dirname "$0")/.." && pwd)
root=${DDP_TRIXIE_ROOT:-/var/tmp/ddp-cpp-trixie}
inside=/work/ddp-cpp
packages=(libtorch-dev libgloo-dev libopenblas0-pthread python3-torch libgtest-dev cmake g++ make
          zlib1g-dev dataset-fashion-mnist procps iproute2 ca-certificates)

if [ "$(id -u)" -ne 0 ]; then
  echo "trixie_env: run as root (debootstrap, chroot and mounts need it)" >&2
  exit 1
fi

# shellcheck source=lib/chroot.sh
source "$checkout/scripts/lib/chroot.sh"

create_root() {
  local mirror partial=$root.partial
  mirror=$(debian_mirror)
  command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  echo "trixie_env: creating $root from $mirror (once)"
  unmount_under "$partial"
  rm -rf --one-file-system "$partial"
  debootstrap --variant=minbase trixie "$partial" "$mirror" >"$partial.log" 2>&1 ||
    { tail -n 20 "$partial.log" >&2; exit 1; }
  echo "deb $mirror trixie main" >"$partial/etc/apt/sources.list"
  cp /etc/resolv.conf "$partial/etc/resolv.conf" 2>/dev/null || true
  local saved_root=$root
  root=$partial
  bind /proc /proc
  bind /dev /dev
  bind /sys /sys
  chroot "$root" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends \
    "${packages[@]}" >"$partial.log" 2>&1 || { tail -n 20 "$partial.log" >&2; exit 1; }
  chroot "$root" apt-get clean
  unmount_all
  root=$saved_root
  rm -f "$partial.log"
  mv "$partial" "$root"
}

exec 9>"$root.lock"
flock 9
trap unmount_all EXIT
[ -d "$root" ] || create_root
unmount_under "$root"
mountpoint -q "$root" && umount -l "$root"

# The root bound onto itself first: inside, "/" is then a mount point, which `ip netns exec`
# needs (it makes "/" a slave mount) for the test bed of tests/multihost.
bind "$root" /
bind /proc /proc
bind /dev /dev
bind /dev/shm /dev/shm
bind /dev/pts /dev/pts
bind /sys /sys
bind "$checkout" "$inside"

[ $# -gt 0 ] || set -- scripts/test.sh
# No exec: the trap must undo the mounts after the command.
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 TERM="${TERM:-dumb}" DDP_BUILD_DIR=build-trixie \
  /bin/bash -c 'cd "$0" && exec "$@"' "$inside" "$@"
