#!/usr/bin/env bash
# Measures the README's first command as a newcomer meets it: scripts/demo.sh in a fresh Debian 12
# (a new minimal chroot made with debootstrap, with git to clone this checkout and nothing else),
# and how long each part takes until the first training step. Root needed (debootstrap, chroot,
# mounts). Extra arguments go to the demo (default: --epochs 1).
#
#   scripts/fresh_machine_demo.sh            # prints a timeline, then a JSON line of the parts
#
# The base system is made once, in $DDP_FRESH_ROOT.base (default /var/tmp/ddp-cpp-fresh12.base);
# every run copies it, so that each run starts from a machine that has never seen ddp-cpp, and
# removes its copy at the end. Packages come from the mirror this machine's apt uses.
set -euo pipefail
checkout=$(cd "$(dirname "$0")/.." && pwd)
base=${DDP_FRESH_ROOT:-/var/tmp/ddp-cpp-fresh12}.base
root=${DDP_FRESH_ROOT:-/var/tmp/ddp-cpp-fresh12}.run
[ "$(id -u)" -eq 0 ] || { echo "fresh_machine_demo: run as root" >&2; exit 1; }
# shellcheck source=lib/chroot.sh
source "$checkout/scripts/lib/chroot.sh"
[ $# -gt 0 ] || set -- --epochs 1

if [ ! -d "$base" ]; then
  mirror=$(debian_mirror)
  command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  echo "fresh_machine_demo: creating a Debian 12 base system in $base (once, a few minutes)"
  rm -rf --one-file-system "$base.partial"
  debootstrap --variant=minbase --include=ca-certificates,git bookworm "$base.partial" \
    "$mirror" >"$base.log" 2>&1 || { tail -n 20 "$base.log" >&2; exit 1; }
  echo "deb $mirror bookworm main" >"$base.partial/etc/apt/sources.list"
  mv "$base.partial" "$base"
fi

cleanup() {
  unmount_all
  unmount_under "$root"
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT
cleanup
cp -a "$base" "$root"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
bind /proc /proc
bind /dev /dev
bind /dev/shm /dev/shm
bind /dev/pts /dev/pts
bind /sys /sys
bind "$checkout" /srv/ddp-cpp-origin

# The newcomer's session: clone, then the demo, every output line stamped with the seconds since
# the clone began.
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 /bin/bash -c '
    set -o pipefail
    start=${EPOCHREALTIME/./}
    { git clone -q /srv/ddp-cpp-origin /root/ddp-cpp && cd /root/ddp-cpp && scripts/demo.sh "$@"; } 2>&1 |
      while IFS= read -r line; do
        tenths=$(( (${EPOCHREALTIME/./} - start) / 100000 ))
        printf "%5d.%d  %s\n" $((tenths / 10)) $((tenths % 10)) "$line"
      done' bash "$@" | tee "$root.timeline"

# The parts: packages (until the build starts), the build (until the example is linked), then the
# start (rendezvous, data, the first training step).
awk '
  / setup: building/ && !build { build = $1 }
  /Built target fashion_mnist/ { built = $1 }
  /step 1\// && !first { first = $1 }
  END {
    printf "{\"packages_s\": %.1f, \"build_s\": %.1f, \"start_s\": %.1f, \"first_step_s\": %.1f}\n",
           build, built - build, first - built, first
  }' "$root.timeline"
rm -f "$root.timeline"
