#!/usr/bin/env bash
# all_reduce (or, with COLLECTIVE=reduce_scatter, reduce_scatter_tensor) across two hosts of the
# namespace test bed (tests/multihost/hosts.sh: own network,
# hostname and /dev/shm each, one link shaped to RATE), NPROC ranks per host started by ddprun
# on each: the hierarchy ("auto": shared memory inside a host, gloo between the two leaders)
# against flat gloo, per size, as allreduce_bench's JSON lines, then a markdown table with the
# link's share (what each leader sends across the link per call, over the time and the link
# rate). Root needed.
#
#   bench/run_two_hosts_bench.sh [RATE]      (default 1gbit)
#
# Environment: BUILD_DIR (default <repo>/build), NPROC (2), MIN_BYTES (4K), MAX_BYTES (64M),
# ITERS (10), COLLECTIVE (all_reduce or reduce_scatter).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
RATE="${1:-1gbit}"
NPROC="${NPROC:-2}"
COLLECTIVE="${COLLECTIVE:-all_reduce}"
export DDP_TESTBED=ddp-bench$$
bed="$ROOT/tests/multihost/hosts.sh"
"$bed" check
out=$(mktemp -d /tmp/two_hosts_bench_XXXXXX)
trap '"$bed" down; rm -rf "$out"' EXIT
"$bed" up 2 "$RATE"

for backend in auto gloo; do
  for i in 1 0; do
    "$bed" exec $i "$BUILD_DIR/tools/ddprun/ddprun" --nnodes 2 --node-rank $i \
      --master-addr 198.18.0.1 --master-port 29500 --nproc-per-node "$NPROC" \
      "$BUILD_DIR/bench/allreduce_bench" --backend $backend --collective "$COLLECTIVE" --min-bytes "${MIN_BYTES:-4K}" \
      --max-bytes "${MAX_BYTES:-64M}" --iters "${ITERS:-10}" > "$out/$backend.host$i" 2>&1 &
  done
  wait
  grep -o '{.*}' "$out/$backend.host0" | tee -a "$out/all.jsonl"
done

# The link's rate in bytes per second, from tc's notation (1gbit, 500mbit, ...).
rate_bytes=$(echo "$RATE" | awk '{ n = $0 + 0; u = tolower($0); sub(/^[0-9.]+/, "", u)
  m = (u ~ /^g/) ? 1e9 : (u ~ /^m/) ? 1e6 : (u ~ /^k/) ? 1e3 : 1; print n * m / 8 }')
echo
echo "| size | hierarchical | gloo | hierarchical / gloo | link use (hierarchical) |"
echo "|---:|---:|---:|---:|---:|"
/usr/bin/python3 - "$out/all.jsonl" "$rate_bytes" "$COLLECTIVE" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
rate = float(sys.argv[2])
# What each of the two leaders sends across the link per call: the whole buffer for an all-reduce
# (and receives it back), the other host's half of the input for a reduce-scatter.
sent = 0.5 if sys.argv[3] == "reduce_scatter" else 1.0
by = {}
for r in rows:
    by.setdefault(r["bytes"], {})[r["backend"]] = r["time_us"]
def size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
for n in sorted(by):
    h, g = by[n].get("hierarchical"), by[n].get("gloo")
    if h is None or g is None:
        continue
    use = sent * n / (h * 1e-6) / rate
    print(f"| {size(n)} | {h / 1000:.2f} ms | {g / 1000:.2f} ms | {h / g:.2f} | {100 * use:.0f}% |")
PY
