#!/usr/bin/env bash
# Side-by-side all_reduce benchmark: the shm backend against gloo, 2 ranks on this host, in one
# run. Alternates `allreduce_bench --backend gloo` and `--backend shm` REPS times (via
# `ddprun --standalone`), over the sizes 8 B, 16 B, ... 32 MiB (factor 2, so 4 KiB and 8 MiB are
# rows), and prints a markdown table of the median over the runs of each size's time and busbw,
# with shm's speed-up over gloo.
#
#   bench/run_allreduce_bench.sh [OUT.jsonl]   (default: $BUILD_DIR/bench/allreduce_results.jsonl)
#
# Environment: BUILD_DIR (default <repo>/build), PYTHON (default /usr/bin/python3, for the table
# only), REPS (3), ITERS (200), WARMUP (20), NPROC (2). Large sizes get fewer calls (at most 1 GiB
# per size: see bench/README.md, "Iteration scaling"); every JSON line says how many.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
PYTHON="${PYTHON:-/usr/bin/python3}"
REPS="${REPS:-3}"
ITERS="${ITERS:-200}"
WARMUP="${WARMUP:-20}"
NPROC="${NPROC:-2}"
OUT="${1:-$BUILD_DIR/bench/allreduce_results.jsonl}"

BENCH="$BUILD_DIR/bench/allreduce_bench"
DDPRUN="$BUILD_DIR/tools/ddprun/ddprun"
for f in "$BENCH" "$DDPRUN"; do
  [[ -x "$f" ]] || { echo "missing $f: cmake --build build --target allreduce_bench ddprun" >&2; exit 1; }
done

export OMP_NUM_THREADS=1
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
mkdir -p "$(dirname "$OUT")"
: > "$OUT"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

start=$(date +%s)
for ((rep = 1; rep <= REPS; rep++)); do
  for backend in gloo shm; do
    timeout 300 "$DDPRUN" --standalone --nproc-per-node "$NPROC" "$BENCH" --backend "$backend" \
      --min-bytes 8 --max-bytes 32M --step-factor 2 --iters "$ITERS" --warmup "$WARMUP" \
      > "$TMP/out" 2> "$TMP/err" || { cat "$TMP/err" >&2; exit 1; }
    sed -n 's/^\[0\]: {/{"rep": '"$rep"', /p' "$TMP/out" >> "$OUT"
    echo "== rep $rep $backend done (load average $(cut -d" " -f1-3 /proc/loadavg))" >&2
  done
done
echo "== done in $(( $(date +%s) - start )) s; JSON lines in $OUT" >&2

"$PYTHON" - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(backend, size, key):
    return statistics.median(r[key] for r in rows if r["backend"] == backend and r["bytes"] == size)
wrong = sum(r["wrong"] for r in rows)
print(f"| bytes | gloo us | shm us | gloo busbw GB/s | shm busbw GB/s | shm speed-up |  (wrong: {wrong})")
print("|---:|---:|---:|---:|---:|---:|")
for size in sorted({r["bytes"] for r in rows}):
    g, s = med("gloo", size, "time_us"), med("shm", size, "time_us")
    print(f"| {size} | {g:.1f} | {s:.1f} | {med('gloo', size, 'busbw_gbps'):.3f} | "
          f"{med('shm', size, 'busbw_gbps'):.3f} | {g / s:.1f}x |")
PY
