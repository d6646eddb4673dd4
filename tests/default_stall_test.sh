#!/usr/bin/env bash
# A hang with the DEFAULT settings (nothing RANKSCOPE_STALL_* set): 2 gloo ranks
# of the example trainer, rank 1 blocks forever in "forward" at step 40, so
# rank 0 waits in the all-reduce. The learned timeout is max(15 s, 5 x p99
# step) = 15 s here; both ranks must report the stall within that plus two
# heartbeat intervals of slack, and triage must blame rank 1.
# Prints the detection latency (progress age when the stall was reported).
set -euo pipefail
source "$(dirname "$0")/ranks.sh"
trainer=$1 cli=$2 work=$3
rm -rf "$work"; mkdir -p "$work"
unset RANKSCOPE_STALL_TIMEOUT RANKSCOPE_STALL_FLOOR RANKSCOPE_STALL_WARMUP RANKSCOPE_HEARTBEAT_INTERVAL
launch_ranks "default stall test" "$work" 2 "$trainer" -- --block-rank 1 --block-step 40 --block-phase forward --timeout 300

run=""
for _ in $(seq 1 240); do  # 60 s at most: 15 s timeout + start-up
  run=$(ls -d "$work"/*/ 2>/dev/null | head -1 || true)
  if [[ -n "$run" ]] && grep -q '"kind":"stall"' "$run/rank-0.jsonl" 2>/dev/null &&
     grep -q '"kind":"stall"' "$run/rank-1.jsonl" 2>/dev/null; then
    break
  fi
  sleep 0.25
done
[[ -n "$run" ]] || fail "no run directory"
for r in 0 1; do
  line=$(grep '"kind":"stall"' "$run/rank-$r.jsonl" | head -1) || fail "rank $r reported no stall within 60 s"
  timeout=$(grep -o '"timeout_ns":[0-9]*' <<<"$line" | cut -d: -f2)
  age=$(grep -o '"progress_age_ns":[0-9]*' <<<"$line" | cut -d: -f2)
  echo "rank $r: stall reported at progress age $((age / 1000000)) ms (learned timeout $((timeout / 1000000)) ms)"
  (( timeout == 15000000000 )) || fail "rank $r: learned timeout $timeout ns, expected the 15 s floor"
  (( age > timeout && age <= timeout + 2000000000 )) || fail "rank $r: reported at progress age $age ns"
done
tri=$("$cli" triage "$run" || true)
echo "$tri"
grep -q "HANG: rank 1 .*forward" <<<"$tri" || fail "triage did not blame rank 1 in forward"
echo "default stall test: ok"
