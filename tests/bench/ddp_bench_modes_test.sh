#!/usr/bin/env bash
# ddp_bench's modes on a few steps: DDP (with and without gradient_as_bucket_view, with gradients
# set to none or zeroed), lockstep and paired at 2 ranks, and one process without DDP, each print
# a JSON line that names the mode and times the phases (paired also the lockstep steps and the
# pairs' differences); --lockstep without ranks or with --no-ddp, a DDP option without DDP, a
# switch given a value, an unknown --zero-grad and an unknown --device fail with a message that
# says what to do. Every line names the device (cpu here).
# Usage: ddp_bench_modes_test.sh DDPRUN DDP_BENCH
set -euo pipefail
ddprun=$1
bench=$2
work=$(mktemp -d /tmp/ddp_bench_modes_test_XXXXXX)
trap 'rm -rf "$work"' EXIT
# ddprun keeps a failed attempt's flight records under TMPDIR: here, removed with the rest.
export TMPDIR="$work"
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
few_steps=(--model mlp --steps 3 --warmup 1 --batch 8 --threads 1)
phases='"forward_ms_median": [0-9.]+, "backward_ms_median": [0-9.]+, "optimizer_ms_median": [0-9.]+'
cpu='"device": "cpu"}'

fail() { echo "FAIL: $1"; shift; cat "$@"; exit 1; }

# expect_line NAME REGEX FILE: FILE has exactly one JSON line and it matches REGEX.
expect_line() {
  [[ $(grep -c '{' "$3") -eq 1 ]] || fail "$1: not exactly one JSON line" "$3"
  grep -Eq "$2" "$3" || fail "$1: the JSON line does not match $2" "$3"
}

timeout 120 "$ddprun" --standalone --nproc-per-node 2 "$bench" "${few_steps[@]}" \
  > "$work/ddp" 2>&1 || fail "ddp mode exited $?" "$work/ddp"
expect_line ddp "\"world_size\": 2, .*\"mode\": \"ddp\", $phases, \"backend\": \"shm\", $cpu" \
  "$work/ddp"

timeout 120 "$ddprun" --standalone --nproc-per-node 2 "$bench" "${few_steps[@]}" \
  --gradient-as-bucket-view > "$work/view" 2>&1 || fail "ddp, bucket views: exited $?" "$work/view"
expect_line view "\"mode\": \"ddp\", .*\"gradient_as_bucket_view\": true, $cpu" "$work/view"

timeout 120 "$ddprun" --standalone --nproc-per-node 2 "$bench" "${few_steps[@]}" \
  --zero-grad zero > "$work/zeroed" 2>&1 || fail "ddp, zeroed grads: exited $?" "$work/zeroed"
expect_line zeroed "\"mode\": \"ddp\", .*\"zero_grad\": \"zero\", $cpu" "$work/zeroed"

# Every comm hook it names trains and is named in the line (PowerSGD compressing from step 2).
for hook in allreduce fp16 bf16 fp16-hosts bf16-hosts powersgd; do
  timeout 120 "$ddprun" --standalone --nproc-per-node 2 "$bench" "${few_steps[@]}" --steps 4 \
    --comm-hook $hook --powersgd-start-iter 2 > "$work/hook" 2>&1 || fail "ddp, $hook: exited $?" "$work/hook"
  expect_line "$hook" "\"mode\": \"ddp\", .*\"comm_hook\": \"$hook\", $cpu" "$work/hook"
done

timeout 120 "$ddprun" --standalone --nproc-per-node 2 "$bench" "${few_steps[@]}" --lockstep \
  > "$work/lockstep" 2>&1 || fail "lockstep mode exited $?" "$work/lockstep"
expect_line lockstep \
  "\"world_size\": 2, .*\"mode\": \"lockstep\", $phases, \"backend\": \"shm\", $cpu" \
  "$work/lockstep"

timeout 120 "$ddprun" --standalone --nproc-per-node 2 "$bench" "${few_steps[@]}" --paired \
  > "$work/paired" 2>&1 || fail "paired mode exited $?" "$work/paired"
differences='"lockstep_step_ms_median": [0-9.]+, "ddp_minus_lockstep_ms_median": -?[0-9.]+, '
differences+='"ddp_minus_lockstep_backward_ms_median": -?[0-9.]+'
expect_line paired "\"mode\": \"paired\", $phases, $differences, \"backend\": \"shm\", $cpu" \
  "$work/paired"

timeout 120 "$bench" "${few_steps[@]}" > "$work/single" 2>&1 ||
  fail "no_ddp exited $?" "$work/single"
expect_line no_ddp "\"world_size\": 1, .*\"mode\": \"no_ddp\", $phases, $cpu" "$work/single"

# expect_error MESSAGE FLAG...: ddp_bench with the few steps and FLAGs fails, saying MESSAGE.
expect_error() {
  local message=$1
  shift
  if timeout 60 "$bench" "${few_steps[@]}" "$@" > "$work/error" 2>&1; then
    fail "$* succeeded" "$work/error"
  fi
  grep -q -- "$message" "$work/error" || fail "$*: wrong message" "$work/error"
}
expect_error "--lockstep needs ranks: start it with ddprun" --lockstep
expect_error "--no-ddp, --lockstep and --paired exclude each other" --lockstep --no-ddp
expect_error "--paired takes no value" --paired=yes
expect_error "--zero-grad must be none (set_to_none) or zero" --zero-grad keep
expect_error "--comm-hook and --gradient-as-bucket-view are DDP's" --no-ddp --comm-hook fp16
expect_error "--device must be cpu or cuda" --device gpu
expect_error "--comm-hook must be allreduce, fp16, bf16, fp16-hosts, bf16-hosts, powersgd or none" \
  --comm-hook topk
echo PASS
