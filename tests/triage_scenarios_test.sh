#!/usr/bin/env bash
# Triage scenarios: the example trainer on 4 real gloo ranks with one injected
# fault each; `rankscope triage --json` must name the right rank and cause as
# its first finding. (One rank with another sampler seed, and one that skips a
# batch, are the same kind of 4-rank scenario in invariants_test.sh.)
#   clean                      -> no fault (findings that cost only time may be the host's)
#   stops before a collective  -> hang, the blocked rank, the phase it is in
#   killed (SIGKILL)           -> dead_rank, the killed rank (also with SIGPIPE's default action)
#   the whole job SIGTERMed    -> stopped, every rank, at once
#   straggler in forward       -> straggler, the slow rank, from the step it began
#   mismatched collective      -> collective_mismatch, the odd rank
#   stall in checkpoint save   -> stall (recovered), the rank in checkpoint_save
#   restores that leak the old process group -> resource_growth, every rank
#   a NaN loss on one rank    -> numerics, that rank, the step; the others followed
# Every wait is for an event of the run (tests/wait.sh), never for a time.
set -euo pipefail
source "$(dirname "$0")/wait.sh"
trainer=$1 cli=$2 work=$3
launch="$(dirname "$0")/../examples/cpp/launch.sh"
py=python3
rm -rf "$work"; mkdir -p "$work"
export RANKSCOPE_HEARTBEAT_INTERVAL=0.25 RANKSCOPE_STALL_TIMEOUT=1.5
pids_of() { for f in "$1"/rank-*.heartbeat.json; do grep -o '"pid":[0-9]*' "$f" | cut -d: -f2; done; }
fail() { echo "triage scenario $name: $*"; [[ -n ${tri:-} ]] && echo "$tri"; tail -20 "$work/$name.log" || true; exit 1; }

# start NAME STEPS -- trainer args: launches 4 ranks in the background.
start() {
  name=$1 steps=$2; shift 3
  mkdir -p "$work/$name"
  bash "$launch" --ranks 4 --steps "$steps" --trainer "$trainer" --dir "$work/$name" -- --timeout 20 "$@" \
    >"$work/$name.log" 2>&1 &
  launcher=$!
  run=""
  wait_for "4 heartbeats" four_heartbeats || fail "the ranks did not start"
}
four_heartbeats() {
  run=$(ls -d "$work/$name"/*/ 2>/dev/null | head -1 || true)
  [[ -n $run && $(ls "$run" | grep -c 'heartbeat.json$') == 4 ]]
}
finish() { wait "$launcher" 2>/dev/null || true; }
# SIGKILL to rank 2 once its heartbeat shows step 10 or later.
kill_rank_2_midrun() {
  wait_for "rank 2 at step 10" has "$run/rank-2.heartbeat.json" '"step":[1-9][0-9]' || fail "rank 2 never reached step 10"
  kill -9 "$(grep -o '"pid":[0-9]*' "$run/rank-2.heartbeat.json" | cut -d: -f2)"
}
# Every rank's log has its stall line (the culprit's and the waiters', written
# on the watchdog's tick that also set the heartbeats' HANG).
all_stalled() {
  for r in 0 1 2 3; do has "$run/rank-$r.jsonl" '"kind":"stall"' || return 1; done
}
# Read whole, then searched: status exits 1 on findings, and under pipefail so would `status | grep`.
hang_seen() { grep -q '"verdict":"HANG' <<<"$("$cli" status --json "$run" 2>/dev/null || true)"; }
# expect KIND RANKS [TEXT]: the first finding's kind, ranks and a summary substring
# (tests/triage_expect.py; "expect clean": no fault).
expect() {
  tri=$("$cli" triage --json "$run") && rc=0 || rc=$?
  if [[ $1 == clean ]]; then
    "$py" "$(dirname "$0")/triage_expect.py" "$rc" clean <<<"$tri" || fail "expected no fault"
  else
    "$py" "$(dirname "$0")/triage_expect.py" "$rc" "$1" "$2" "${3:-}" <<<"$tri" ||
      fail "expected first finding $1 on ranks [$2] ${3:+saying '$3'}"
  fi
  echo "  $name: $(grep -o '"headline":"[^"]*"' <<<"$tri" | cut -c13-)"
}

start clean 20 --
finish
expect clean

# Rank 1 blocks in 'preprocess' before step 6's all-reduce; the others wait in it.
start stop 100000 -- --block-rank 1 --block-step 6 --block-phase preprocess
wait_for "status HANG" hang_seen || fail "status never said HANG"
wait_for "every rank's stall line" all_stalled || fail "not every rank logged its stall"
expect hang 1 "did not reach all_reduce seq 7 on 'world'"
grep -q preprocess <<<"$tri" || fail "the hang does not say where rank 1 is blocked"
kill -9 $(pids_of "$run") 2>/dev/null || true
finish

# Rank 2 is killed mid-run; the others' all-reduce fails.
start killed 100000 --
kill_rank_2_midrun
finish
sleep 1  # heartbeat older than 3 intervals
expect dead_rank 2 "its position file)"  # its exact last step (in a step, or between two: "(<time>; its position file)")
# ... and its log is whole up to it: what its rings held when it was killed was
# recovered - or, killed just after its background thread wrote everything out
# (the heartbeat this script waits for is written on the same wake-up), there
# was nothing left to recover and its log already reaches that step.
if ! grep -q "record(s) recovered from its rings after it died" <<<"$tri"; then
  step=$(grep -o -E 'it (was in|had finished) step [0-9]+' <<<"$tri" | head -1 | grep -o -E '[0-9]+$')
  [[ -n $step ]] && grep -q "\"rank\":2,\"step\":$step," "$run/rank-2.jsonl" ||
    fail "rank 2's log does not reach step ${step:-?} (its position file) and nothing was recovered"
  echo "  killed: nothing was left in its rings; its log reaches step $step"
fi

# The same with SIGPIPE at its default action, as in a C++ trainer that never
# set it: a rank sending to the dead one dies of SIGPIPE (when it happens to
# be sending, not receiving), leaves a dump saying so, and is evidence.
start killed_sigpipe 100000 -- --default-sigpipe
kill_rank_2_midrun
finish
sleep 1
expect dead_rank 2 "rank died"
echo "  killed_sigpipe: $(grep -l 'signal SIGPIPE' "$run"/rank-*.flight.json 2>/dev/null | wc -l) rank(s) died of SIGPIPE"

# The whole job SIGTERMed at once (a time limit): stopped, nobody's fault, said at once -
# the ranks' last heartbeats say so, triage needs no heartbeat to age.
start stopped 100000 --
wait_for "rank 3 at step 10" has "$run/rank-3.heartbeat.json" '"step":[1-9][0-9]' || fail "rank 3 never reached step 10"
kill -TERM $(pids_of "$run")
finish
expect stopped 0,1,2,3 "the job was stopped by SIGTERM at step"
grep -q '"verdict":"stopped: all 4 ranks by SIGTERM' <<<"$("$cli" status --json "$run" || true)" || fail "status: $("$cli" status "$run")"

start straggler 40 -- --slow-rank 3 --slow-from-step 10 --slow-ms 40
finish
expect straggler 3 "straggler in forward"

# Rank 1 all-reduces one element fewer at step 5 (gloo aborts or times out).
start mismatch 100000 -- --mismatch-rank 1 --mismatch-step 5 --timeout 5
finish
expect collective_mismatch 1 "different collectives at seq 6"

# Rank 2's checkpoint save takes 3 s at step 8: a stall that recovers.
start ckpt 20 -- --block-rank 2 --block-step 8 --block-ms 3000 --block-phase checkpoint_save
finish
expect stall 2 "checkpoint_save"
grep -q 'recovered after' <<<"$tri" || fail "the stall does not say it recovered"
# An in-process restore every 15 steps that keeps the old process group alive:
# threads and live communicators grow with each restore (stats every 20 ms).
RANKSCOPE_METRICS_INTERVAL=0.02 start leak 60 -- --restore-every 15 --leak-pg
finish
expect resource_growth 0,1,2,3 "grow with every in-process restore"
# Rank 2's loss is NaN at step 12; the all-reduce carries it to the others.
start nan 30 -- --nan-rank 2 --nan-step 12
finish
expect numerics 2 "rank 2: loss is NaN from step 12; ranks 0,1,3 followed"
echo "triage scenarios: ok"
