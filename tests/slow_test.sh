#!/usr/bin/env bash
# Slow is not stalled: 2 gloo ranks; from step 15 rank 1 sleeps 60 ms in
# forward (its ~3-10 ms step gets 5x+ slower even on a loaded machine; rank 0
# waits for it in the all-reduce).
# Expected: slow_step events, the phase that grew (forward on rank 1, the
# collective on rank 0), and no stall.
# Then a subtle one with default settings: ranks bound to a core each, rank 1's
# forward 1.2x as long from step 300 of 600 (a busy-wait): triage names it with
# the step it began, from the whole log and from the log as it was 60 steps in
# (benchmarks/straggler_eval.sh measures the rates). This host's vCPUs change
# speed 1.3-2x for tens of steps at a time, which hides a 1.2x rank: such runs
# are told apart by their own logs (tests/subtle_straggler.py) and made again,
# up to 6 runs; two misses on quiet runs fail.
set -euo pipefail
trainer=$1 cli=$2 work=$3
rm -rf "$work"
RANKSCOPE_SLOW_FACTOR=3 RANKSCOPE_STALL_TIMEOUT=5 \
  bash "$(dirname "$0")/../examples/cpp/launch.sh" --ranks 2 --steps 45 --trainer "$trainer" --cli "$cli" \
  --dir "$work" -- --slow-rank 1 --slow-ms 60 --slow-from-step 15 --checkpoint-every 0 >/dev/null
run=$(ls -d "$work"/*/)
fail() { echo "slow test: $*"; exit 1; }
grep -q '"kind":"slow_step".*"grown_phase":"forward"' "$run/rank-1.jsonl" || fail "rank 1: no slow step in forward"
grep -q '"kind":"slow_step".*"grown_phase":"collective"' "$run/rank-0.jsonl" || fail "rank 0: no slow step in the collective"
! grep -q '"kind":"stall"' "$run"/rank-*.jsonl || fail "a slow rank was reported as stalled"
"$cli" status "$run" | grep -q "finished: all 2 ranks exited cleanly" || fail "status after the run"
tri=$("$cli" triage "$run" || true)
grep -q "\[straggler\] rank 1 is a straggler in forward" <<<"$tri" || fail "triage did not find the straggler: $tri"
subtle() {  # -> "ok", "miss: why" or "disturbed X: why"
  rm -rf "$work"
  bash "$(dirname "$0")/../examples/cpp/launch.sh" --ranks 2 --steps 600 --bind --trainer "$trainer" --cli "$cli" \
    --dir "$work" -- --hidden 1024 --slow-rank 1 --slow-from-step 300 --slow-factor 1.2 >/dev/null
  python3 "$(dirname "$0")/subtle_straggler.py" "$cli" "$(ls -d "$work"/*/)"
}
misses=0
for attempt in 1 2 3 4 5 6; do
  verdict=$(subtle)
  [[ $verdict != ok ]] || { echo "slow test: ok (the 1.2x straggler named in run $attempt)"; exit 0; }
  echo "slow test: run $attempt: $verdict"
  [[ $verdict != miss:* ]] || misses=$((misses + 1))
  [[ $misses -lt 2 ]] || fail "the 1.2x straggler was missed in 2 runs the host did not disturb"
done
echo "slow test: ok; the 1.2x straggler not judged: the host disturbed every run (see above)"
