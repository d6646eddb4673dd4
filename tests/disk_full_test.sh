#!/usr/bin/env bash
# The run directory on a full filesystem (a small tmpfs; needs root to mount).
#  A: the disk fills and stays full: training finishes (exit 0); the console
#     says once that the run log stopped and why; the heartbeat carries it;
#     `rankscope triage` says "run log truncated: no space left on device at
#     step N" and nothing about torn lines or dead ranks.
#  B: space comes back mid-run: the log resumes (log_resumed, lines lost
#     counted) and triage says so.
set -euo pipefail
helper=$1 cli=$2 work=$3
if [[ $(id -u) -ne 0 ]]; then echo "disk full test: skipped (needs root to mount a small tmpfs)"; exit 77; fi
rm -rf "$work"; mkdir -p "$work/mnt"
mount -t tmpfs -o size=8m tmpfs "$work/mnt"
trap 'umount "$work/mnt" 2>/dev/null || true' EXIT
fail() { echo "disk full test: $*"; exit 1; }
count() { grep -c -- "$1" "$2" || true; }

# A: 7.5 of 8 MiB taken; ~1.2 KiB per step fills the rest within ~400 steps.
head -c $((7680 * 1024)) /dev/zero >"$work/mnt/filler"
"$helper" "$work/mnt/a" 1500 0 >"$work/a.out" 2>"$work/a.err" || fail "A: the trainer failed (exit $?): $(cat "$work/a.err")"
grep -q "trained 1500 steps" "$work/a.out" || fail "A: training did not finish"
[[ $(count "run log .* stopped at step" "$work/a.err") == 1 ]] || fail "A: console should say once that the log stopped: $(cat "$work/a.err")"
grep -q "No space left on device" "$work/a.err" || fail "A: the console should say why"
grep -q '"run_log":{"error":"No space left on device"' "$work/mnt/a/rank-0.heartbeat.json" ||
  fail "A: heartbeat does not carry it: $(cat "$work/mnt/a/rank-0.heartbeat.json")"
tail -1 "$work/mnt/a/rank-0.jsonl" | grep -q '"kind":"run_end"' || fail "A: run_end should close the log"
set +e
"$cli" triage "$work/mnt/a" >"$work/a.triage"; rc=$?
set -e
cat "$work/a.triage"
[[ $rc == 1 ]] || fail "A: triage should exit 1 (a finding), got $rc"
grep -Eq "run log truncated: no space left on device at step [0-9]+ \(nothing after it was recorded\)" "$work/a.triage" ||
  fail "A: triage does not name the truncation"
grep -Eiq "torn|dead|still running" "$work/a.triage" && fail "A: triage misreads the truncated log"

# B: space is freed once the log has stopped; the sink retries every 5 s.
rm -f "$work/mnt/a/"*.jsonl
head -c $((7680 * 1024)) /dev/zero >"$work/mnt/filler"
"$helper" "$work/mnt/b" 4000 3 >"$work/b.out" 2>"$work/b.err" &
pid=$!
# The helper sleeps 3 ms a step: slower steps on a loaded machine only leave more of the run for
# the retry (every 5 s) after the space comes back.
source "$(dirname "$0")/wait.sh"
wait_for "the log to stop" has "$work/b.err" "stopped at step" || { kill "$pid"; fail "B: the log never stopped"; }
rm -f "$work/mnt/filler"
wait "$pid" || fail "B: the trainer failed: $(cat "$work/b.err")"
grep -q "resumed at step" "$work/b.err" || fail "B: the log did not resume: $(cat "$work/b.err")"
grep -q '"kind":"log_resumed"' "$work/mnt/b/rank-0.jsonl" || fail "B: no log_resumed line"
set +e
"$cli" triage "$work/mnt/b" >"$work/b.triage"
set -e
cat "$work/b.triage"
grep -Eq "run log truncated: no space left on device at step [0-9]+ \(resumed later; [0-9]+ lines lost\)" "$work/b.triage" ||
  fail "B: triage does not say it resumed"
echo "disk full test: ok"
