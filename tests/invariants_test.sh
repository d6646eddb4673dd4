#!/usr/bin/env bash
# Invariant checks on real multi-process gloo runs of the example trainer, each
# fault caught with the right rank and values, in the run log (violation
# events) and in `rankscope triage`:
#   clean run of several epochs: no violation;
#   one rank with another sampler seed (warn: the run completes);
#   one rank that skips a batch in epoch 1 (a swallowed loader error; fail);
#   resume where one rank loads an older checkpoint (fail, every rank stops);
#   resume on 2 ranks from a 4-rank checkpoint, batch math unchanged (fail);
#   an exchange one rank never joins: reported after the timeout, not hung.
set -euo pipefail
trainer=$1 cli=$2 work=$3
rm -rf "$work"; mkdir -p "$work"
launch() { bash "$(dirname "$0")/../examples/cpp/launch.sh" --trainer "$trainer" --cli "$cli" "$@"; }
fail() { echo "invariants test: $*"; exit 1; }
# run NAME RANKS STEPS EXPECT_OK -- trainer args: runs, then prints triage --json of the run.
run() {
  local name=$1 ranks=$2 steps=$3 expect=$4; shift 5
  local rc=0
  launch --ranks "$ranks" --steps "$steps" --dir "$work/$name" -- --ckpt-dir "$work/ckpt" --timeout 60 "$@" \
    >"$work/$name.log" 2>&1 || rc=$?
  if [[ $expect == ok && $rc != 0 ]]; then cat "$work/$name.log"; fail "$name: the run failed"; fi
  if [[ $expect == fail && $rc == 0 ]]; then cat "$work/$name.log"; fail "$name: the run should have stopped"; fi
  dir=$(ls -d "$work/$name"/*/)
  tri=$("$cli" triage --json "$dir" || true)
}
expect_violation() {  # NAME PATTERN: some rank's log has a violation line matching PATTERN
  grep -q -- "$2" <<<"$(grep -h '"kind":"violation"' "$dir"/rank-*.jsonl)" ||
    { grep -h '"kind":"violation"' "$dir"/rank-*.jsonl; fail "$1: no violation matching $2"; }
}
expect_triage() {
  grep -q -- "$2" <<<"$tri" || { echo "$tri"; fail "$1: triage does not say $2"; }
}

# Clean: 4 ranks x 16 batches per epoch, 70 steps = 4 full epochs and a part,
# checkpoints at 25 and 50 (used by the resume cases below).
run clean 4 70 ok --
if grep -qh '"kind":"violation"' "$dir"/rank-*.jsonl; then fail "clean run recorded a violation"; fi
n=$(grep -ch '"name":"epoch_batches"' "$dir"/rank-1.jsonl)
[[ $n == 4 ]] || fail "clean: rank 1 recorded $n epoch_batches facts, expected 4"
grep -q '"kind":"desync"' <<<"$tri" && fail "clean: triage reported a desync: $tri"

run seed 4 40 ok -- --seed-rank 2 --seed-value 99 --on-violation warn
expect_violation seed '"check":"sampler","what":"seed","ranks":\[2\],"values":{"seed":{"1234":\[0,1,3\],"99":\[2\]}}'
expect_triage seed '"kind":"desync","ranks":\[2\],"summary":"sampler: rank 2 disagrees on seed'

run skip 4 40 fail -- --skip-rank 1 --skip-epoch 1 --skip-batch 3
expect_violation skip '"check":"epoch_batches","what":"skipped_batch","ranks":\[1\]'
expect_violation skip 'rank 1 skipped batch 3 of epoch 1 (got batch 4) at step 19'
expect_triage skip '"findings":\[{"kind":"desync","ranks":\[1\],"summary":"epoch_batches: rank 1 skipped batch 3'

run stale 4 60 fail -- --resume latest --stale-rank 2
expect_violation stale '"check":"resume","what":"id,step,consumed_samples,optimizer_step","ranks":\[2\]'
for r in 0 1 2 3; do
  grep -q '"check":"resume"' "$dir/rank-$r.jsonl" || fail "stale: rank $r did not record the resume violation"
done
expect_triage stale 'rank 2 disagrees on id (rank 2 has step-25; ranks 0,1,3 have step-50), step (rank 2 has 25'

run world 2 60 fail -- --resume latest
expect_violation world '"check":"batch_math","what":"global_batch"'
expect_triage world '"kind":"desync","ranks":\[0,1\],"summary":"batch_math: micro-batch 64 x grad-accum 1 x data-parallel 2 = 128, but the global batch is configured as 256'

# The exchange's own 3 s timeout ends ranks 0-2, not gloo's (60 s here): none of their collectives
# failed or timed out (rank 3's next all-reduce does fail, once they are gone).
run absent 4 40 fail -- --no-check-rank 3 --no-check-epoch 1 --exchange-timeout-ms 3000 --on-violation fail
expect_violation absent '"check":"sampler","what":"exchange_timeout","ranks":\[3\]'
expect_triage absent "exchange 'sampler/1' timed out after 3000 ms: rank 3 did not arrive"
! grep -qE '"kind":"collective".*"result":"(failed|timed_out)"' "$dir"/rank-[012].jsonl ||
  fail "absent: a collective failed: something waited for gloo's timeout instead of the exchange's"
echo "invariants test: ok"
