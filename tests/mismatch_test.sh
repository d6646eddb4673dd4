#!/usr/bin/env bash
# A real collective mismatch: on 2 gloo ranks, rank 1 all-reduces one element
# fewer at step 5. Gloo aborts rank 1 (SIGABRT) and fails rank 0's all-reduce.
# Expected evidence: both flight-recorder dumps, rank 1's from the fatal-signal
# handler; the summary names sequence 6 and both counts, and exits 1.
set -euo pipefail
trainer=$1 cli=$2 work=$3
rm -rf "$work"
out=$(bash "$(dirname "$0")/../examples/cpp/launch.sh" --ranks 2 --steps 20 --trainer "$trainer" --cli "$cli" \
        --dir "$work" -- --mismatch-rank 1 --mismatch-step 5 --timeout 10 2>&1) && {
  echo "expected the run to fail"; echo "$out"; exit 1; }
echo "$out" | tail -12
run=$(ls -d "$work"/*/)
for r in 0 1; do [[ -f "$run/rank-$r.flight.json" ]] || { echo "no flight dump for rank $r"; exit 1; }; done
grep -q '"reason":"signal SIGABRT"' "$run/rank-1.flight.json" || { echo "rank 1 dump not from SIGABRT"; exit 1; }
grep -q '"state":"issued"' "$run/rank-1.flight.json" || { echo "rank 1 dump lacks the in-flight collective"; exit 1; }
set +e
summary=$("$cli" summary "$run"); rc=$?
set -e
[[ $rc == 1 ]] || { echo "summary exit $rc, expected 1 (findings)"; exit 1; }
grep -q "MISMATCH at seq 6" <<<"$summary" || { echo "no mismatch reported: $summary"; exit 1; }
grep -q "rank 1: all_reduce count=101385 float32 (in flight)" <<<"$summary" || { echo "rank 1 detail missing"; exit 1; }
grep -q "rank 0: all_reduce count=101386 float32" <<<"$summary" || { echo "rank 0 detail missing"; exit 1; }
set +e
tri=$("$cli" triage "$run"); rc=$?
set -e
[[ $rc == 1 ]] || { echo "triage exit $rc, expected 1"; exit 1; }
grep -q "\[collective_mismatch\] ranks issued different collectives at seq 6 on 'world'" <<<"$tri" ||
  { echo "triage did not name the mismatch: $tri"; exit 1; }
# Two ranks, no majority: the history breaks the tie (rank 0's all-reduce is the one of seqs 1-5).
grep -q "the one that changed: rank 1" <<<"$tri" || { echo "triage did not break the tie by history: $tri"; exit 1; }
grep -q "rank 1's all_reduce count=101385 float32 was never issued on 'world' before seq 6; rank 0's had been, 5 time(s)" \
  <<<"$tri" || { echo "no history evidence: $tri"; exit 1; }
echo "mismatch test: ok"
