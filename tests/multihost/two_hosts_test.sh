#!/usr/bin/env bash
# Two hosts of the namespace test bed (hosts.sh: own network, hostname and /dev/shm each, a
# 1 Gbit/s link), 2 ranks each, started as on two machines: `ddprun --nnodes 2 --node-rank i
# --master-addr <host 0>` on each. The Fashion-MNIST example trains on a synthetic set:
#   - on gloo, the 2x2 job ends bit-identical to 4 ranks on one host (gloo's sums do not depend
#     on where the ranks are);
#   - on "auto" (the hierarchy: shared memory inside a host, gloo between the hosts' leaders),
#     bit-identical to 4 ranks on one host that say they are on two (DDP_CPP_HOST_ID), which
#     the other tests check against one process.
# And allreduce_bench checks every element of hierarchical all_reduces across the link. Then a
# rank of host 1 is killed under --max-restarts 1 on both hosts: both restart together, resume
# from the last checkpoint and end bit-identical to the uninterrupted run; host 1's cable is
# pulled for 3 s, less than the timeout: training goes on and ends as if nothing happened. Then a
# host is lost in the middle of training, its ranks killed or its cable pulled for good: the other
# host's ranks raise, naming the lost host and its ranks, and its ddprun exits within the group
# timeout + 10 s.
# Skips (exit 77) where namespaces cannot be made (not root, no veth or tbf).
# Usage: two_hosts_test.sh DDPRUN FASHION_MNIST ALLREDUCE_BENCH
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ddprun=$1
example=$2
allreduce_bench=$3
python=${DDP_TEST_PYTHON:-/usr/bin/python3}
export DDP_TESTBED=ddp-tb$$
bed=$here/hosts.sh
"$bed" check || { echo "SKIP: the namespace test bed cannot be made here"; exit 77; }
work=$(mktemp -d /tmp/two_hosts_XXXXXX)
trap '"$bed" down; rm -rf "$work"' EXIT
# ddprun keeps a failed attempt's flight records under TMPDIR: here, removed with the rest.
export TMPDIR="$work"
"$bed" up 2 1gbit
cd "$work"
"$python" "$here/../examples/synthetic_fashion_mnist.py" data

# No GLOO_SOCKET_IFNAME: the hostnames resolve to nothing, and gloo must still find eth0.

train=(--data "$work/data" --epochs 2 --batch-size 16 --log-every 100)

# Runs `ddprun ... PROGRAM ARGS` as host HOST of the two, 2 ranks, host 0 the rendezvous.
ddprun_on() {
  local host=$1
  shift
  timeout 180 "$bed" exec "$host" "$ddprun" --nnodes 2 --node-rank "$host" \
    --master-addr 198.18.0.1 --master-port 29500 --nproc-per-node 2 "$@"
}

# Runs `ddprun ... PROGRAM ARGS` on both hosts at once; fails if either fails.
on_two_hosts() {
  local i pids=()
  for i in 1 0; do
    ddprun_on $i "$@" > "host$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || { cat host0.log host1.log; return 1; }; done
}

compare() {  # compare A.pt B.pt: the same parameters, to the bit
  "$python" - "$@" <<'PY'
import sys, torch
safe = int(torch.__version__.split(".")[0]) >= 2
a, b = (torch.load(p, weights_only=safe) for p in sys.argv[1:3])
for name, tensor in a["model"].items():
    other = b["model"][name]
    assert torch.equal(tensor, other), \
        f"{name}: differs by up to {(tensor - other).abs().max().item()}"
print(sys.argv[1], "and", sys.argv[2], "are equal")
PY
}

for backend in gloo auto; do
  # shellcheck disable=SC2016  # expanded by each rank's shell
  timeout 180 "$ddprun" --standalone --nproc-per-node 4 sh -c \
    'DDP_CPP_HOST_ID=pretend$((RANK / 2)) exec "$0" "$@"' "$example" "${train[@]}" \
    --backend $backend --checkpoint "$work/one-$backend.pt" > "one-$backend.log"
  on_two_hosts "$example" "${train[@]}" --backend $backend --checkpoint "$work/two-$backend.pt"
  [ -f "two-$backend.pt" ] || { echo "host 0 wrote no checkpoint"; cat host0.log; exit 1; }
  compare "one-$backend.pt" "two-$backend.pt"
done

# shellcheck source=../support/worker_pid.sh
source "$here/../support/worker_pid.sh"

# Runs the 2x2 training of the bit-identity check above on both hosts (ddprun options first,
# then `--`, then the example's extra options) while `disturb` reads host 0's output; both
# ddpruns must succeed and the result must equal the uninterrupted run's, to the bit.
disturbed_run() {
  local name=$1 disturb=$2 options=() status
  shift 2
  while [ "$1" != -- ]; do options+=("$1"); shift; done
  shift
  local run=("$example" "${train[@]}" --backend auto --checkpoint "$work/$name.pt" "$@")
  ddprun_on 1 "${options[@]}" "${run[@]}" > "$name-host1.log" 2>&1 &
  local host1=$!
  set +e
  ddprun_on 0 "${options[@]}" "${run[@]}" 2>&1 | tee "$name-host0.log" | "$disturb"
  local statuses=("${PIPESTATUS[@]}")
  wait $host1
  status=$?
  set -e
  if [ "${statuses[0]}" != 0 ] || [ "${statuses[2]}" != 0 ] || [ $status != 0 ]; then
    echo "$name: host 0's ddprun exited ${statuses[0]}, host 1's $status, the disturbance" \
      "${statuses[2]}"
    cat "$name-host0.log" "$name-host1.log"
    exit 1
  fi
  compare two-auto.pt "$name.pt"
}

# A rank of host 1 is killed early in the second epoch, under --max-restarts 1 on both hosts: host 1's
# ddprun restarts its group, host 0's ranks fail (their peer is gone) and its ddprun restarts
# too; the new attempt meets again at the rendezvous and resumes from the last checkpoint.
kill_rank3() {
  # Once the first epoch's checkpoint is written and reported: the whole second epoch is left
  # (steps take milliseconds here, the kill is seen a few later).
  grep -q -m 1 "epoch 1: train loss" || { echo "never saw the end of epoch 1" >&2; exit 1; }
  local pid
  pid=$(worker_pid "$work/restart.pt" 3)
  [ -n "$pid" ] || { echo "rank 3 not found" >&2; exit 1; }
  kill -KILL "$pid"
  cat > /dev/null
}
disturbed_run restart kill_rank3 --max-restarts 1 --
for host in 0 1; do
  grep -q "restarting (attempt 1 of 1)" "restart-host$host.log" ||
    { echo "host $host did not restart:"; cat "restart-host$host.log"; exit 1; }
done
grep -q "resumed from .* after epoch 1" restart-host0.log ||
  { echo "the restart did not resume from the checkpoint:"; cat restart-host0.log; exit 1; }

# Host 1's cable is pulled for 3 s in the first epoch, less than the group timeout: TCP
# retransmits what was lost once the link is back, the collectives in flight finish late, and
# training goes on, unchanged.
flap_link() {
  grep -q -m 1 "epoch 1/2 step 2/" || { echo "never saw epoch 1 step 2" >&2; exit 1; }
  "$bed" link 1 down
  sleep 3  # the outage itself
  "$bed" link 1 up
  cat > /dev/null
}
disturbed_run flap flap_link -- --timeout 30

on_two_hosts "$allreduce_bench" --backend auto --verify --min-bytes 4K --max-bytes 4M --iters 3
grep -q '"backend": "hierarchical"' host0.log || { cat host0.log; exit 1; }
if grep '"wrong": [1-9]' host0.log; then exit 1; fi
# Host 1 is lost once rank 0 has taken its first step: `how` kills every process of host 1
# ("kill") or sets its link down ("link"). Host 0's ddprun must fail within the timeout + 10 s.
timeout_s=10
lose_host1() {
  local how=$1 lost_at ended
  local run=("$example" "${train[@]}" --epochs 100000 --checkpoint '' --timeout $timeout_s)
  ddprun_on 1 "${run[@]}" > "lost-$how-host1.log" 2>&1 &
  local host1=$!
  set +e
  ddprun_on 0 "${run[@]}" 2>&1 | tee "lost-$how-host0.log" | {
      grep -q -m 1 "step 1/" || exit 1
      date +%s.%N > lost_at
      if [ "$how" = kill ]; then
        # Every process of host 1 (of this bed only: not another job's on this machine).
        ip netns pids "$DDP_TESTBED-host1" | xargs -r kill -KILL
      else
        "$bed" link 1 down
      fi
      cat > /dev/null
    }
  local statuses=("${PIPESTATUS[@]}")
  set -e
  ended=$(date +%s.%N)
  wait $host1 2>/dev/null || true
  [ -f lost_at ] || { echo "training never started:"; cat "lost-$how-host0.log"; exit 1; }
  lost_at=$(cat lost_at)
  rm lost_at
  [ "${statuses[0]}" != 0 ] || { echo "host 0 did not fail:"; cat "lost-$how-host0.log"; exit 1; }
  [ "${statuses[0]}" != 124 ] || { echo "host 0 hung:"; cat "lost-$how-host0.log"; exit 1; }
  grep -q "ddprun: error: worker group failed" "lost-$how-host0.log"
  # Host 0's ranks name the host they lost and its ranks.
  grep -q "lost host 1 (ranks 2, 3)" "lost-$how-host0.log" ||
    { echo "host 0 did not name the lost host:"; cat "lost-$how-host0.log"; exit 1; }
  awk -v a="$lost_at" -v b="$ended" -v bound=$((timeout_s + 10)) -v how="$how" 'BEGIN {
    printf "host 1 lost (%s): host 0 exited after %.1f s (bound %d s)\n", how, b - a, bound
    exit !(b - a <= bound) }'
}
lose_host1 kill
"$bed" up 2 1gbit  # a fresh bed, with host 1's link up again
lose_host1 link

echo "two hosts: OK"
