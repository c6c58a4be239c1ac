# Shared by scripts/trixie_env.sh and scripts/fresh_machine_demo.sh: the Debian mirror of this
# machine, and bind mounts into the chroot at $root that are undone however the script ends.
# Source it; set `root` before calling bind.

# The Debian mirror this machine's apt uses (deb822 .sources or a classic sources.list line).
debian_mirror() {
  local uri
  uri=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null |
          awk '{print $2}' | grep -v security | head -n 1 || true)
  [ -n "$uri" ] || uri=$(grep -h '^deb ' /etc/apt/sources.list 2>/dev/null |
                           awk '{print $2}' | grep -v security | head -n 1 || true)
  [ -n "$uri" ] || { echo "no Debian mirror found in /etc/apt" >&2; exit 1; }
  echo "$uri"
}

mounts=()
unmount_all() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
  mounts=()
}
bind() {  # bind SOURCE TARGET_IN_ROOT
  mkdir -p "$root$2"
  mount --bind "$1" "$root$2"
  mounts+=("$root$2")
}

# Undoes every mount below a folder (a run killed before its trap could), so that removing the
# folder can never reach into the host's /proc, /dev or the checkout.
unmount_under() {
  local target
  awk -v prefix="$1/" 'index($2, prefix) == 1 {print $2}' /proc/mounts | sort -r |
    while read -r target; do umount -l "$target" 2>/dev/null || true; done
}

