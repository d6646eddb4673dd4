#!/usr/bin/env bash
# Triage on synthetic run directories (benchmarks/synth_run.cpp) with more
# ranks than this machine can run: 64 ranks on 8 "hosts", one fault each.
# Asserts the first finding's kind and rank, clock-skew estimation, the
# --since/--until window, warnings for corrupt input, and exit codes.
set -euo pipefail
synth=$1 cli=$2 work=$3
py=python3
rm -rf "$work"; mkdir -p "$work"
fail() { echo "triage synth test ($name): $*"; echo "${tri:-}" | head -c 3000; exit 1; }

# case NAME PYTHON-ASSERTIONS -- synth args
case_() {
  name=$1 check=$2; shift 3
  "$synth" --dir "$work/$name" --ranks 64 --steps 60 "$@"
  tri=$("$cli" triage --json "$work/$name") && rc=0 || rc=$?
  RC=$rc "$py" -c "
import json, os, sys
r = json.load(sys.stdin); rc = int(os.environ['RC'])
f = r['findings'][0] if r['findings'] else {}
$check" <<<"$tri" || fail "assertion failed: $check"
  echo "  $name: $(grep -o '"headline":"[^"]*"' <<<"$tri" | cut -c13- | head -c 200)"
}

case_ clean 'assert rc == 0 and r["healthy"] and r["findings"] == [] and r["warnings"] == [], r' --
case_ straggler 'assert f["kind"] == "straggler" and f["ranks"] == [37] and f["step"] == 20 and f["lines"], f' \
  -- --straggler 37:20
case_ hang 'assert f["kind"] == "hang" and f["ranks"] == [12] and "checkpoint_save" in f["summary"] and "seq 31" in f["summary"], f' \
  -- --hang 12:30
# A rank slow from step 10 and another that hangs at step 40: the hang is the headline (a job
# that stopped before one that is slow), the straggler is still listed.
case_ straggler_then_hang 'k = [x["kind"] for x in r["findings"]]; assert k[0] == "hang" and f["ranks"] == [12], k
s = [x for x in r["findings"] if x["kind"] == "straggler"]; assert s and s[0]["ranks"] == [37] and s[0]["t_ns"] < f["t_ns"], r["findings"]' \
  -- --straggler 37:10 --hang 12:40
case_ dead 'assert f["kind"] == "dead_rank" and f["ranks"] == [50], f; assert any("torn" in w for w in r["warnings"])' \
  -- --dead 50:25
case_ comm_hang 'assert f["kind"] == "hang" and len(f["ranks"]) == 64 and "communication-level hang" in f["summary"] and "seq 16" in f["summary"], f' \
  -- --comm-hang 15
case_ mismatch 'assert f["kind"] == "collective_mismatch" and f["ranks"] == [5] and "seq 41" in f["summary"], f' \
  -- --mismatch 5:40
case_ seed 'assert f["kind"] == "desync" and f["ranks"] == [9] and "seed" in f["summary"], f' -- --seed-rank 9
# Host node-3 (ranks 24-31) runs 40 ms ahead: estimated from collective ends, and findings
# are ordered on the reference clock (rank 0's).
case_ skew 'k = r["clock_skew"]; assert len(k) == 1 and k[0]["host"] == "node-3" and abs(k[0]["offset_ms"] - 40) < 1 and k[0]["ranks"] == 8, k
assert f["kind"] == "straggler" and f["ranks"] == [26]
row = [x for x in r["ranks"] if x["rank"] == 26][0]; assert abs(row["clock_offset_ms"] - 40) < 1, row' \
  -- --skew 3:40 --straggler 26:10
case_ corrupt 'assert rc == 0 and any("rank 7: " in w and "corrupt" in w for w in r["warnings"]), r["warnings"]' -- --corrupt 7

# The window: a straggler from step 40 is invisible before it (steps are 100 ms from
# run start; step 40 begins at +4 s), and seen with --since.
"$synth" --dir "$work/window" --ranks 16 --steps 60 --straggler 3:40
name=window
tri=$("$cli" triage --json --until +3s "$work/window") || fail "--until +3s: exit $? (expected healthy)"
tri=$("$cli" triage --json --since +3500ms "$work/window") && fail "--since: expected findings" || true
grep -q '"kind":"straggler","ranks":\[3\]' <<<"$tri" || fail "--since +3500ms: no straggler"
"$cli" triage --since yesterday "$work/window" 2>/dev/null && fail "a bad --since was accepted"
rc=0; "$cli" triage "$work/nonexistent" 2>/dev/null || rc=$?
[[ $rc == 2 ]] || fail "a missing run directory must exit 2 (got $rc)"

# Subtle: 16 ranks, 5 % per-step noise on every rank's compute; a clean run stays healthy, a
# rank 1.2x slower in forward from step 400 is named from that step (benchmarks/straggler_eval.sh
# measures the rates).
"$synth" --dir "$work/noisy" --ranks 16 --steps 1000 --noise 0.05
name=noisy
tri=$("$cli" triage --json "$work/noisy") || fail "a clean noisy run: exit $? (expected healthy)"
"$synth" --dir "$work/subtle" --ranks 16 --steps 500 --noise 0.05 --straggler 9:400 --straggler-factor 1.2
name=subtle
tri=$("$cli" triage --json "$work/subtle") && fail "expected the 1.2x straggler" || true
"$py" -c 'import json,sys; f=json.load(sys.stdin)["findings"][0]; assert f["kind"] == "straggler" and f["ranks"] == [9] and 398 <= f["step"] <= 405, f' <<<"$tri" ||
  fail "1.2x straggler"
echo "  subtle: $(grep -o '"headline":"[^"]*"' <<<"$tri" | cut -c13- | head -c 200)"

# Scale smoke: 256 ranks x 100 steps, every rank in the table, one finding.
"$synth" --dir "$work/scale" --ranks 256 --steps 100 --straggler 200:50
tri=$("$cli" triage --json "$work/scale") || true
name=scale
"$py" -c 'import json,sys; r=json.load(sys.stdin); assert len(r["ranks"]) == 256 and [f["kind"] for f in r["findings"]] == ["straggler"], r["findings"]' <<<"$tri" ||
  fail "256 ranks"
echo "triage synth test: ok"
