#!/usr/bin/env bash
# Slow is not stalled: 2 gloo ranks; from step 15 rank 1 sleeps 60 ms in
# forward (its ~3-10 ms step gets 5x+ slower even on a loaded machine; rank 0
# waits for it in the all-reduce).
# Expected: slow_step events, the phase that grew (forward on rank 1, the
# collective on rank 0), and no stall.
# Then a subtle one with default settings: ranks bound to a core each, rank 1's
# forward 1.2x as long from step 300 of 600 (a busy-wait): triage names it with
# the step it began, from the whole log and from the log as it was 60 steps in
# (benchmarks/straggler_eval.sh measures the rates). This host has slow spells
# of its own: a core that runs a rank's backward 1.2-1.8x slower for a hundred
# steps is a real straggler that triage names too, and can hide the injected one
# in a 60-step cut; so up to 4 runs are made, the first that names it passes.
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
subtle() {  # -> "" when named as expected, else why not
  rm -rf "$work"
  bash "$(dirname "$0")/../examples/cpp/launch.sh" --ranks 2 --steps 600 --bind --trainer "$trainer" --cli "$cli" \
    --dir "$work" -- --hidden 1024 --slow-rank 1 --slow-from-step 300 --slow-factor 1.2 >/dev/null
  local run t
  run=$(ls -d "$work"/*/)
  t=$(grep '"kind":"step_end"' "$run/rank-0.jsonl" | grep '"step":360,' | grep -o '"t":[0-9]*' | cut -d: -f2)
  for until in "" "$t"; do
    "$cli" triage --json ${until:+--until "$until"} "$run" | python3 -c '
import json, sys
f = [x for x in json.load(sys.stdin)["findings"] if x["kind"] == "straggler"]
ok = any(x["ranks"] == [1] and 285 <= x["step"] <= 315 and " in forward: " in x["summary"] for x in f)
print("" if ok else "%s: %s" % (sys.argv[1], "; ".join("%s (step %d)" % (x["summary"], x["step"]) for x in f) or "no straggler"))
' "$([[ -n $until ]] && echo "60 steps in" || echo "whole log")"
  done | grep -v '^$' || true
}
for attempt in 1 2 3 4; do
  why=$(subtle)
  [[ -n "$why" ]] || break
  echo "slow test: run $attempt: the 1.2x straggler was not named as expected ($why)"
  [[ $attempt -lt 4 ]] || fail "the 1.2x straggler was not named in 4 runs"
done
echo "slow test: ok"
