#!/usr/bin/env bash
# Fails when a test of the last ctest run skipped for a reason other than a missing GPU.
#
#   scripts/lib/check_skips.sh BUILD_DIR CTEST_OUTPUT_FILE
#
# ctest lists the skipped tests but not why: each is run again alone, verbosely (a skip returns
# at once), and its reason must say "no GPU" or "needs N GPUs", the words of the CUDA tests.
set -euo pipefail
build=$1
log=$2
skipped=$(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Skipped)$/\1/p' "$log")
[ -n "$skipped" ] || { echo "check_skips: no test skipped"; exit 0; }
bad=0
while read -r name; do
  reason=$(cd "$build" && ctest -R "^${name//./\\.}\$" -V 2>&1 | grep -iE -A2 "Skipped|skip" |
           grep -vE "^\s*$|SKIPPED \]|Skipped$" | head -n 3 | tr '\n' ' ')
  if grep -qiE "no GPU|needs [0-9]+ GPUs" <<<"$reason"; then
    echo "check_skips: $name skipped: ${reason:0:160}"
  else
    echo "check_skips: $name skipped for another reason than a missing GPU: ${reason:0:300}" >&2
    bad=1
  fi
done <<<"$skipped"
exit "$bad"
