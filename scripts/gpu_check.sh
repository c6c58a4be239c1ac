#!/usr/bin/env bash
# On a machine with a GPU and a pytorch.org / pip libtorch 2.x built with CUDA: builds ddp-cpp
# against that libtorch (only what it runs: the library, ddprun, the multi-process tests and
# ddp_bench), runs the CUDA tests and says which ran, passed, failed and were not run (a test
# that needs two GPUs on a one-GPU machine), then the GPU benchmark: DDP's step overhead over no
# DDP on one GPU, ours against PyTorch's own DDP, both measured here in this run, NCCL at world
# size 1 with every bucket's collective issued. Sized for one device call: on 1 GPU and 16 cores
# about 5 minutes to build and 3 to run. Logs and JSON go to OUT_DIR (configure, build, CUDA
# tests, benchmark JSON and its table; with ALL_TESTS=1 also every other test's log).
#
#   scripts/gpu_check.sh [OUT_DIR]          (default: $DDP_BUILD_DIR, build-gpu/)
#
# Environment:
#   PYTHON               a Python whose `import torch` is the CUDA torch to build against and
#                        to compare with (default: python3)
#   DDP_GLOO_INCLUDE_DIR a folder holding gloo/, where the libtorch has no gloo headers (pip and
#                        pytorch.org trees lack them; Debian's libgloo-dev has them)
#   GTEST_SOURCE_DIR     a googletest source tree, built here, where GoogleTest is not installed
#                        (Debian: /usr/src/googletest)
#   PEERS_DIR            the peer benchmark's folder (default: ../shared/peers)
#   JOBS                 build jobs (default: all cores)
#   MODELS, STEPS, WARMUP, BENCH_REPS  the benchmark's (mlp cnn resnet, 50, 10, 3)
#   SKIP_TESTS=1, SKIP_BENCH=1  leave a part out; ALL_TESTS=1 adds every other test (longer);
#   REQUIRE_NCCL=0 goes on with a CPU libtorch
# Exits non-zero when a step fails; every step's log is kept in OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
python=${PYTHON:-python3}
build=$(mkdir -p "${DDP_BUILD_DIR:-build-gpu}" && cd "${DDP_BUILD_DIR:-build-gpu}" && pwd)
out=$(mkdir -p "${1:-$build}" && cd "${1:-$build}" && pwd)
jobs=${JOBS:-$(nproc)}
peers=${PEERS_DIR:-$root/../shared/peers}
log() { echo "== gpu_check $(date +%T): $*"; }

torch_dir=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
# The CUDA toolkit that libtorch's CMake config looks for.
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
python_path=$(command -v "$python")
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
  "gpus", torch.cuda.device_count(),
  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'

prefixes="$torch_dir/share/cmake"
: >"$out/build.log"
if [ -n "${GTEST_SOURCE_DIR:-}" ]; then
  log "building GoogleTest from $GTEST_SOURCE_DIR"
  cmake -S "$GTEST_SOURCE_DIR" -B "$build/googletest-build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$build/googletest" -DBUILD_GMOCK=OFF \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 >>"$out/build.log" 2>&1
  cmake --build "$build/googletest-build" -j"$jobs" --target install >>"$out/build.log" 2>&1
  prefixes="$prefixes;$build/googletest"
fi

log "configuring against $torch_dir"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefixes" -DDDP_BUILD_EXAMPLES=OFF \
  ${DDP_GLOO_INCLUDE_DIR:+-DDDP_GLOO_INCLUDE_DIR="$DDP_GLOO_INCLUDE_DIR"} 2>&1 |
  tee "$out/configure.log" | grep -E "ddp-cpp|Error|error" || true
[ -f "$build/CMakeCache.txt" ] || { log "configure failed: $out/configure.log"; exit 1; }
if [ "${REQUIRE_NCCL:-1}" = 1 ] && ! grep -q "DDP_WITH_NCCL:BOOL=ON" "$build/CMakeCache.txt"; then
  log "NCCL is off: is this torch built with CUDA? (REQUIRE_NCCL=0 goes on without it)"
  exit 1
fi
log "building with $jobs jobs"
start=$(date +%s)
targets=(ddprun ddp_distributed_tests ddp_bench)
[ "${ALL_TESTS:-0}" != 1 ] || targets=(all)
cmake --build "$build" -j"$jobs" --target "${targets[@]}" >>"$out/build.log" 2>&1 ||
  { tail -n 60 "$out/build.log"; exit 1; }
log "built in $(( $(date +%s) - start )) s; $(grep -c 'warning:' "$out/build.log" || true) warnings"

status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  export DDP_TEST_PYTHON="$python_path"
  log "CUDA tests"
  (cd "$build" && ctest -R '^Cuda\.' --output-on-failure --timeout 300 -V) >"$out/cuda_tests.log" 2>&1 ||
    status=1
  # Which ran and passed, which failed, which were not run and why (gtest's skip message).
  "$python" - "$out/cuda_tests.log" <<'PY' || status=1
import re, sys
log = open(sys.argv[1], errors="replace").read()
passed = sorted(set(re.findall(r"\[       OK \] (Cuda\.\w+)", log)))
failed = sorted(set(re.findall(r"\[  FAILED  \] (Cuda\.\w+)", log)))
skipped = {}
for name, body in re.findall(r"\[ RUN      \] (Cuda\.\w+)\n(.*?)\[  SKIPPED \]", log, re.S):
    reason = [l.strip() for l in body.splitlines() if l.strip() and "Skipped" not in l]
    skipped[name] = reason[-1] if reason else "?"
print(f"CUDA tests: {len(passed)} passed, {len(failed)} failed, {len(skipped)} not run")
for n in passed: print("  passed   ", n)
for n in failed: print("  FAILED   ", n)
for n, why in sorted(skipped.items()): print("  not run  ", n, "-", why)
# On the machine this script is for, a skip for any reason but too few GPUs is a failure.
sys.exit(1 if failed or any("needs 2 GPUs" not in w for w in skipped.values()) else 0)
PY
  if [ "${ALL_TESTS:-0}" = 1 ]; then
    log "every other test"
    (cd "$build" && ctest -E '^Cuda\.' -j"$(( jobs / 2 > 1 ? jobs / 2 : 1 ))" --timeout 300 \
       --output-on-failure) >"$out/tests.log" 2>&1 || status=1
    grep -E "tests passed|\(Failed\)|\(Timeout\)|Not Run" "$out/tests.log" | tail -n 20
  fi
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  log "GPU benchmark: ddp_bench --device cuda against PyTorch's DDP, world size 1"
  bench="$build/bench/ddp_bench"
  results="$out/gpu_bench.jsonl"
  : >"$results"
  port=29611
  for model in ${MODELS:-mlp cnn resnet}; do
    for ((rep = 1; rep <= ${BENCH_REPS:-3}; rep++)); do
      for mode in no_ddp ddp; do
        flags=(--model "$model" --device cuda --steps "${STEPS:-50}" --warmup "${WARMUP:-10}")
        [ "$mode" = no_ddp ] && flags+=(--no-ddp)
        port=$((port + 1))
        env MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 \
          "$bench" "${flags[@]}" | sed "s/^{/{\"run\": \"ours_$mode\", \"rep\": $rep, /" >>"$results"
        port=$((port + 1))
        (cd "$peers" && env MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=0 LOCAL_RANK=0 \
           WORLD_SIZE=1 "$python" pytorch_ddp_bench.py "${flags[@]}") |
          sed "s/^{/{\"run\": \"pytorch_$mode\", \"rep\": $rep, /" >>"$results"
      done
    done
  done
  "$python" - "$results" <<'PY' | tee "$out/gpu_bench.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(model, run):
    return statistics.median(r["step_ms_median"] for r in rows if r["model"] == model and r["run"] == run)
print("| model | ours no DDP | ours DDP | ours overhead | PyTorch no DDP | PyTorch DDP | PyTorch overhead | ours / PyTorch overhead |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for m in dict.fromkeys(r["model"] for r in rows):
    on, od, pn, pd = (med(m, r) for r in ("ours_no_ddp", "ours_ddp", "pytorch_no_ddp", "pytorch_ddp"))
    print(f"| {m} | {on:.2f} | {od:.2f} | {od - on:+.2f} ({(od - on) / on:+.0%}) | {pn:.2f} | {pd:.2f} | "
          f"{pd - pn:+.2f} ({(pd - pn) / pn:+.0%}) | {(od - on) / (pd - pn):.2f} |")
PY
fi
log "done (status $status)"
exit "$status"
