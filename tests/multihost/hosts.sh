#!/usr/bin/env bash
# A test bed of N "hosts" on this machine: each a network namespace (its own interface and
# address), run with its own hostname (UTS namespace) and its own /dev/shm (mount namespace),
# all joined through a switch (a bridge in a namespace of its own) by links shaped to RATE.
#
#   tests/multihost/hosts.sh up N RATE      # e.g. up 2 1gbit: hosts 0..N-1, 198.18.0.1 ... .N
#   tests/multihost/hosts.sh exec I CMD...  # runs CMD on host I (hostname ddp-host-I)
#   tests/multihost/hosts.sh link I down|up # unplugs (plugs back) host I's cable at the switch
#   tests/multihost/hosts.sh down           # removes everything `up` made
#   tests/multihost/hosts.sh check          # exit 0 where namespaces can be made (root, ip, tc)
#
# DDP_TESTBED=NAME names the namespaces (default ddp-tb), so that two beds can coexist.
# Addresses come from the benchmarking range 198.18.0.0/15 (RFC 2544), never a real network, and
# live only inside the namespaces. Each link is shaped in both directions with a token bucket
# (tc tbf; this kernel has no netem, so no added delay). Root needed. The hostnames resolve to
# nothing, as on many real clusters: programs must find their address another way.
set -euo pipefail
prefix=${DDP_TESTBED:-ddp-tb}  # the namespaces' names start with it: one bed per prefix
hub=$prefix-switch

host_ns() { echo "$prefix-host$1"; }
address() { echo "198.18.0.$(($1 + 1))"; }

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-" || true); do
    ip netns delete "$ns" 2>/dev/null || true
  done
}

check() {
  [ "$(id -u)" -eq 0 ] || { echo "hosts.sh: needs root (network namespaces)"; return 1; }
  command -v ip >/dev/null && command -v tc >/dev/null && command -v unshare >/dev/null ||
    { echo "hosts.sh: needs ip, tc (iproute2) and unshare (util-linux)"; return 1; }
  local probe=$prefix-probe$$
  ip netns add "$probe" 2>/dev/null || { echo "hosts.sh: cannot make network namespaces here"; return 1; }
  local ok=0
  ip -n "$probe" link add probe0 type veth peer name probe1 2>/dev/null &&
    ip netns exec "$probe" tc qdisc add dev probe0 root tbf rate 1gbit burst 256kb latency 50ms \
      2>/dev/null || ok=1
  ip netns delete "$probe"
  [ $ok -eq 0 ] || echo "hosts.sh: this kernel cannot make veth links or shape them (tc tbf)"
  return $ok
}

# Shapes DEV's egress in namespace NS to RATE. The bucket holds a few milliseconds at the rate
# (at least 64 KB), enough for TCP's bursts without letting a burst run far above the rate.
shape() {
  local ns=$1 dev=$2 rate=$3
  ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst 512kb latency 20ms
}

up() {
  local count=$1 rate=$2 i ns
  [ "$count" -ge 2 ] && [ "$count" -le 200 ] || { echo "hosts.sh: N must be 2..200" >&2; exit 2; }
  down
  ip netns add "$hub"
  ip -n "$hub" link add switch0 type bridge
  ip -n "$hub" link set switch0 up
  for ((i = 0; i < count; i++)); do
    ns=$(host_ns $i)
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "tbh$i" netns "$ns" type veth peer name "tbs$i" netns "$hub"
    ip -n "$ns" link set "tbh$i" name eth0
    ip -n "$ns" addr add "$(address $i)/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$hub" link set "tbs$i" master switch0
    ip -n "$hub" link set "tbs$i" up
    shape "$ns" eth0 "$rate"      # what the host sends
    shape "$hub" "tbs$i" "$rate"  # what it receives
  done
}

run_on() {
  local i=$1
  shift
  ip netns list | grep -q "^$(host_ns "$i")\b" || { echo "hosts.sh: no host $i (run up first)" >&2; exit 2; }
  # Its own hostname and /dev/shm, as on a machine of its own.
  exec ip netns exec "$(host_ns "$i")" unshare --uts --mount --propagation private \
    sh -c 'hostname "$0" && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"' \
    "ddp-host-$i" "$@"
}

# The switch's port of host I goes down (or up): host I keeps its address and routes, as when a
# cable or a switch port fails, and its packets are lost until the port is up again.
link() {
  local i=$1 state=$2
  [ "$state" = up ] || [ "$state" = down ] || { echo "hosts.sh: link I up|down" >&2; exit 2; }
  ip -n "$hub" link set "tbs$i" "$state"
}

case "${1:-}" in
  up) up "${2:?N}" "${3:?RATE, e.g. 1gbit}" ;;
  link) link "${2:?I}" "${3:?up or down}" ;;
  down) down ;;
  exec) shift; run_on "$@" ;;
  check) check ;;
  *) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
