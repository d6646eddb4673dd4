#!/usr/bin/env bash
# A real hang: 3 gloo ranks; at step 5 rank 1 blocks forever inside
# "checkpoint_save" before the all-reduce, so ranks 0 and 2 wait in it.
# Short watchdog settings (stall 2 s, heartbeat 0.25 s). Expected:
#  - every rank reports one stall, never before the timeout, and dumps (how soon
#    after it: benchmarks/hang_latency.sh; the rule itself: unit/ watchdog tests);
#  - rank 1's dump names checkpoint_save, the others' the all-reduce in flight;
#  - `rankscope status` says alive-no-progress and blames rank 1;
#  - SIGUSR1 dumps and the rank keeps running;
#  - after SIGKILL of rank 1, `status` says rank 1 is not alive.
# Every wait is for an event of the run (tests/wait.sh), never for a time.
set -euo pipefail
source "$(dirname "$0")/ranks.sh"
source "$(dirname "$0")/wait.sh"
trainer=$1 cli=$2 work=$3 fake_nvml=$4
rm -rf "$work"; mkdir -p "$work"
export RANKSCOPE_STALL_TIMEOUT=2 RANKSCOPE_HEARTBEAT_INTERVAL=0.25
# Resource snapshots through the fake NVML: the waiting ranks' GPUs (0 and 2)
# busy at 70 W, the blocked rank's at 350 W (what a computing GPU draws).
export RANKSCOPE_NVML_LIBRARY=$fake_nvml RANKSCOPE_RESOURCE_INTERVAL=0.2 FAKE_NVML_POWER_W=70,350,70
launch_ranks "hang test" "$work" 3 "$trainer" -- --block-rank 1 --block-step 5 --timeout 300

run=""
hang_seen() {
  run=$(ls -d "$work"/*/ 2>/dev/null | head -1 || true)
  # Read whole, then searched: status exits 1 on findings, and under pipefail so would `status | grep`.
  [[ -n "$run" ]] && grep -q '"verdict":"HANG' <<<"$("$cli" status --json "$run" 2>/dev/null || true)"
}
wait_for "status HANG" hang_seen || fail "status never said HANG (run directory: '${run}')"
status=$("$cli" status "$run" || true)
echo "$status"
grep -q "HANG: alive, no progress" <<<"$status" || fail "status did not see the hang"
grep -q "rank 1 is blocked in checkpoint_save" <<<"$status" || fail "status did not blame rank 1"
grep -q "ranks 0,2 wait in all_reduce seq 6 on 'world'" <<<"$status" || fail "status did not see ranks 0,2 waiting"

for r in 0 1 2; do
  log="$run/rank-$r.jsonl"
  wait_for "rank $r's stall line" has "$log" '"kind":"stall"' || fail "rank $r: no stall event"
  [[ $(grep -c '"kind":"stall"' "$log") == 1 ]] || fail "rank $r: expected exactly one stall event"
  age=$(grep '"kind":"stall"' "$log" | grep -o '"progress_age_ns":[0-9]*' | cut -d: -f2)
  (( age >= 2000000000 )) || fail "rank $r: stall reported at progress age $age ns, before the 2 s timeout"
  echo "  rank $r: stall reported at progress age $((age / 1000000)) ms (timeout 2000 ms)"
  wait_for "rank $r's stall dump" has "$run/rank-$r.flight.json" '"reason":"stall"' || fail "rank $r: no stall dump"
done
grep -q '"name":"checkpoint_save"' "$run/rank-1.flight.json" || fail "rank 1's dump does not name checkpoint_save"
for r in 0 2; do
  grep -q '"state":"issued","op":"all_reduce","comm":"world","comm_id":0,"seq":6' "$run/rank-$r.flight.json" ||
    fail "rank $r's dump does not show all_reduce seq 6 in flight"
done

tri=$("$cli" triage "$run" || true)
echo "$tri"
grep -q "\[hang\] HANG: rank 1 did not reach all_reduce seq 6 on 'world' while ranks 0,2 wait in it: it is blocked in .*checkpoint_save" <<<"$tri" ||
  fail "triage did not blame rank 1"
grep -q "GPUs busy at low power when the ranks stopped (a computing GPU of this run: 350 W): rank 0 (100 % at 70 W), rank 2 (100 % at 70 W)" <<<"$tri" ||
  fail "triage did not see the waiting ranks' GPUs spinning"
# Stacks: rank 1's main thread in the injected fault, the others' in the all-reduce.
stacks=$("$cli" stacks "$run")
echo "$stacks"
grep -qE "main thread \(native\), [a-z ]+ - rank 1   <- the odd one out" <<<"$stacks" || fail "stacks: rank 1 is not the odd one out"
grep -q "block_before_all_reduce" <<<"$stacks" || fail "stacks: rank 1's frame is not named"
grep -qE "main thread \(native\), [a-z ]+ - ranks 0,2$" <<<"$stacks" || fail "stacks: ranks 0 and 2 are not grouped"
grep -q "where the main threads were at the last stack capture: rank 1: block_before_all_reduce" <<<"$tri" ||
  fail "triage does not say where rank 1's main thread was"
# The stacks line carries the same rank/step/reason: wait for the resources line itself.
stall_snapshot='"kind":"resources","t":[0-9]*,"mono":[0-9]*,"rank":1,"step":5,"reason":"stall"'
wait_for "rank 1's stall snapshot" has "$run/rank-1.jsonl" "$stall_snapshot" || fail "rank 1: no resource snapshot at its stall"

pid0=$(grep -o '"pid":[0-9]*' "$run/rank-0.heartbeat.json" | cut -d: -f2)
kill -USR1 "$pid0"
wait_for "rank 0's SIGUSR1 dump" has "$run/rank-0.flight.json" '"reason":"signal SIGUSR1"' || fail "SIGUSR1 did not dump"
kill -0 "$pid0" || fail "rank 0 died after SIGUSR1"

pid1=$(grep -o '"pid":[0-9]*' "$run/rank-1.heartbeat.json" | cut -d: -f2)
kill -9 "$pid1"
# Its heartbeat ages from the kill on: "not alive" at 3 intervals (0.75 s). A live rank's
# heartbeat is rewritten every interval, so this waits for the kill, not for a time.
rank1_dead() { grep -q "rank 1 is NOT ALIVE" <<<"$("$cli" status "$run" 2>/dev/null || true)"; }
wait_for "status: rank 1 NOT ALIVE" rank1_dead || fail "status did not see rank 1 die: $("$cli" status "$run")"
"$cli" status "$run" || true
echo "hang test: ok"
