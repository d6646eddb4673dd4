#!/usr/bin/env bash
# The fault-injection suite with the DEFAULT settings (no RANKSCOPE_STALL_* or heartbeat
# setting): each fault in a 2-rank job of its own, on real processes, all jobs at once
# (they mostly wait: the learned stall timeout is 15 s, 60 s inside init_process_group).
#   C++ example (launch.sh, gloo), rank 1: blocks forever in forward (compute; both ranks
#     report, at the learned 15 s timeout and never before it), in loader_wait at step 2 (in the warm-up: it
#     reports at 15 s too), in checkpoint_save, in an
#     all_reduce phase (a collective); never joins init_process_group; is SIGKILLed at step
#     40 (its exact last step comes from its position file); is SIGTERMed at step 40; ends at
#     its first epoch's end, between two collectives while rank 0 waits for it in the epoch
#     check's store exchange, by SIGTERM and by an uncaught exception.
#   Python DDP example (torchrun), rank 1: stuck in its Dataset's __getitem__ (the stacks
#     show that frame); never calls init_process_group. And a clean run with DataLoader
#     workers, a 20 s checkpoint save and a 22 s evaluation pass: no stall, no fault.
# Each job's triage (while the hung jobs still hang) must name rank 1 and where it was (or
# find no fault). Every wait is for an event of the jobs (tests/wait.sh), never for a time;
# how soon each hang is reported is measured by benchmarks/hang_latency.sh.
set -euo pipefail
trainer=$1 cli=$2 work=$3 py=${4:-}   # without the venv's Python: the C++ jobs only
here=$(cd "$(dirname "$0")/.." && pwd)
torchrun=$(dirname "${py:-/nonexistent/python}")/torchrun
[[ -x "$torchrun" ]] || echo "default faults test: no torchrun next to '$py': the Python jobs are skipped"
source "$here/tests/ranks.sh"  # kill_ranks
source "$here/tests/wait.sh"
rm -rf "$work"; mkdir -p "$work"
unset RANKSCOPE_STALL_TIMEOUT RANKSCOPE_STALL_FLOOR RANKSCOPE_STALL_WARMUP RANKSCOPE_HEARTBEAT_INTERVAL RANKSCOPE_DIR
export OMP_NUM_THREADS=1
jobs_started=()
cleanup() {
  # A job's group while its leader still runs (jobs -p): a finished job's number may be another
  # process group's now. Ranks left behind by a finished leader: kill_ranks.
  local live=" $(jobs -p | tr '\n' ' ') "
  for p in "${jobs_started[@]}"; do
    [[ $live == *" $p "* ]] && kill -9 -- -"$p" 2>/dev/null || true
  done
  for d in "$work"/*/; do kill_ranks "$d" "$d/run"; done
}
trap cleanup EXIT
fail() { echo "default faults test: $*"; exit 1; }
run_of() { ls -d "$work/$1"/*/ 2>/dev/null | head -1 || true; }   # the C++ jobs' run directory
pid_of() { grep -o '"pid":[0-9]*' "$1/rank-$2.heartbeat.json" 2>/dev/null | cut -d: -f2 || true; }

cpp() {  # NAME TRAINER-ARGS...: a job in a session of its own
  local name=$1; shift
  mkdir -p "$work/$name"
  setsid bash "$here/examples/cpp/launch.sh" --ranks 2 --steps 100000 --trainer "$trainer" --cli "$cli" \
    --dir "$work/$name" -- --timeout 600 --checkpoint-every 0 "$@" >"$work/$name.log" 2>&1 &
  jobs_started+=($!)
}
python_job() {  # NAME SCRIPT ARGS...
  local name=$1; shift
  mkdir -p "$work/$name"
  (cd "$work/$name" && RANKSCOPE_DIR="$work/$name/run" exec setsid "$torchrun" --standalone --nproc-per-node 2 \
    "$@" >"$work/$name.log" 2>&1) &
  jobs_started+=($!)
}

cat >"$work/init_hang.py" <<'EOF'
import os, time
import torch.distributed as dist
import rankscope
rankscope.init()
if int(os.environ["RANK"]) == 1:
    while True:
        time.sleep(1)        # never reaches init_process_group: rank 0 waits for it there
dist.init_process_group("gloo")
EOF
example=$here/examples/python/train_ddp.py
clean_job=""
if [[ -x "$torchrun" ]]; then
  python_job py_loader "$example" --epochs 100 --fault-rank 1 --fault-step 40 --hang loader
  python_job py_init "$work/init_hang.py"
  python_job py_clean "$example" --epochs 3 --workers 2 --save-seconds 20 --eval-seconds 22
  clean_job=${jobs_started[-1]}
fi
alive() { [[ -n "$1" && -r /proc/$1/stat ]] && [[ $(cut -d' ' -f3 "/proc/$1/stat") != Z ]]; }
for phase in forward checkpoint_save all_reduce; do
  cpp "cpp_$phase" --block-rank 1 --block-step 40 --block-phase "$phase"
done
# In the first steps (the warm-up): waiting for data gets the learned timeout, not the warm-up's 300 s.
cpp cpp_loader_wait --block-rank 1 --block-step 2 --block-phase loader_wait
cpp cpp_init --never-join-rank 1
cpp cpp_sigkill
cpp cpp_sigterm
cpp cpp_term_epoch_end --end-rank 1 --end-how term
cpp cpp_throw_epoch_end --end-rank 1 --end-how throw

# Rank 1 of cpp_sigkill / cpp_sigterm gets its signal once past step 40.
signal_at_step_40() {  # NAME SIGNAL -> prints "sent" once sent
  local run; run=$(run_of "$1")
  [[ -n "$run" ]] && has "$run/rank-1.jsonl" '"kind":"step_end".*"step":40,' || return 0
  kill -"$2" "$(pid_of "$run" 1)" && echo sent
}
killed=""; termed=""; killed_at=0; termed_at=0
all_done() {  # sends the signals on the way; true once every job has shown what it is checked for
  [[ -z "$killed" ]] && killed=$(signal_at_step_40 cpp_sigkill KILL) && [[ -n "$killed" ]] && killed_at=$SECONDS
  [[ -z "$termed" ]] && termed=$(signal_at_step_40 cpp_sigterm TERM) && [[ -n "$termed" ]] && termed_at=$SECONDS
  local done_all=1 name
  for name in cpp_forward cpp_checkpoint_save cpp_all_reduce cpp_init; do
    has "$(run_of $name)/rank-0.jsonl" '"kind":"stall"' || done_all=0
  done
  # Rank 0 gives up on the exchange after 20 s, then on its next all-reduce, and ends.
  for name in cpp_term_epoch_end cpp_throw_epoch_end; do
    has "$(run_of $name)/rank-0.jsonl" '"kind":"run_end"' || done_all=0
  done
  # cpp_loader_wait: rank 0 waits in a collective during the warm-up (a peer may be compiling): 300 s.
  for name in cpp_forward cpp_loader_wait; do has "$(run_of $name)/rank-1.jsonl" '"kind":"stall"' || done_all=0; done
  for name in py_loader py_init; do  # rank 0 stalled and asked rank 1 to dump: both stacks are in
    [[ -z "$clean_job" || $(cat "$work/$name"/run/rank-*.jsonl 2>/dev/null | grep -c '"kind":"stacks"') -ge 2 ]] ||
      done_all=0
  done
  alive "$clean_job" && done_all=0
  # The signalled ranks' heartbeats must be older than 3 intervals (1 s each) for triage:
  # a dead rank's heartbeat only ages, so this is a lower bound, not a race.
  (( killed_at > 0 && SECONDS - killed_at >= 5 && termed_at > 0 && SECONDS - termed_at >= 5 )) || done_all=0
  (( done_all ))
}
# The jobs take ~60-90 s (a 60 s wait inside init_process_group, a 42 s save and evaluation).
WAIT_BOUND_S=480 wait_for "every job's stall, end or signal" all_done || {
  for f in "$work"/*.log; do echo "== $f"; tail -5 "$f"; done
  fail "not every job got where it is checked"
}
echo "default faults test: all jobs done after ${SECONDS} s"

# C++, rank 1 blocked in forward: both ranks report at the learned 15 s.
run=$(run_of cpp_forward)
for r in 0 1; do
  line=$(grep '"kind":"stall"' "$run/rank-$r.jsonl" | head -1) || fail "cpp_forward: rank $r reported no stall"
  timeout=$(grep -o '"timeout_ns":[0-9]*' <<<"$line" | cut -d: -f2)
  age=$(grep -o '"progress_age_ns":[0-9]*' <<<"$line" | cut -d: -f2)
  echo "  cpp_forward rank $r: stall reported at progress age $((age / 1000000)) ms (learned timeout $((timeout / 1000000)) ms)"
  (( timeout == 15000000000 )) || fail "cpp_forward rank $r: learned timeout $timeout ns, expected the 15 s floor"
  (( age > timeout )) || fail "cpp_forward rank $r: reported at progress age $age ns, before its timeout"
done

# C++, rank 1 blocked in loader_wait at step 2 (the warm-up): reported at the 15 s floor too.
line=$(grep '"kind":"stall"' "$(run_of cpp_loader_wait)/rank-1.jsonl" | head -1) || fail "cpp_loader_wait: rank 1 reported no stall"
timeout=$(grep -o '"timeout_ns":[0-9]*' <<<"$line" | cut -d: -f2)
echo "  cpp_loader_wait rank 1 (step 2): learned timeout $((timeout / 1000000)) ms"
(( timeout == 15000000000 )) || fail "cpp_loader_wait rank 1: timeout $timeout ns in the warm-up, expected the 15 s floor"

expect() {  # NAME RUN_DIR PATTERN...: triage's text has every pattern
  local name=$1 dir=$2 tri; shift 2
  tri=$("$cli" triage "$dir" 2>&1 || true)
  for p in "$@"; do grep -qE -- "$p" <<<"$tri" || fail "$name: triage does not say '$p':
$tri"; done
  echo "  $name: $(sed -n 1p <<<"$tri")"
}
expect cpp_forward "$(run_of cpp_forward)" "HANG: rank 1 .*forward"
expect cpp_loader_wait "$(run_of cpp_loader_wait)" "HANG: rank 1 .*loader_wait"
expect cpp_checkpoint_save "$(run_of cpp_checkpoint_save)" "HANG: rank 1 .*checkpoint_save"
expect cpp_all_reduce "$(run_of cpp_all_reduce)" "HANG: rank 1 .*all_reduce"
expect cpp_init "$(run_of cpp_init)" "rank 1 did not reach init_process_group while rank 0 waits in it"
expect cpp_sigkill "$(run_of cpp_sigkill)" "rank died: rank 1" "its position file\)"
# What its rings held reached its log (recovered after it died, or - killed just
# after its background thread wrote everything out - nothing was left there):
# the log ends where the position file says it was.
tri=$("$cli" triage "$(run_of cpp_sigkill)" 2>&1 || true)
grep -qE "record\(s\) recovered from its rings after it died" <<<"$tri" ||
  echo "  cpp_sigkill: nothing was left in its rings to recover"
at=$(grep -oE "(in|finished) step [0-9]+" <<<"$tri" | head -1 | grep -oE "[0-9]+$")
ends=$(grep -oE "its log ends at step [0-9]+" <<<"$tri" | head -1 | grep -oE "[0-9]+$")
(( ends >= at - 1 )) || fail "cpp_sigkill: its log ends at step $ends, its position file has step $at"
expect cpp_sigterm "$(run_of cpp_sigterm)" "rank stopped by SIGTERM: rank 1"
# Rank 0's stall in the exchange is a consequence, not a finding of its own.
expect cpp_term_epoch_end "$(run_of cpp_term_epoch_end)" "^rankscope triage .*: rank stopped by SIGTERM: rank 1" \
  "rank 0 stalled meanwhile.*waiting on rank 1"
expect cpp_throw_epoch_end "$(run_of cpp_throw_epoch_end)" \
  "^rankscope triage .*: rank 1 died of an uncaught exception at step [0-9]+: .*the epoch ended badly" \
  "rank 0 stalled meanwhile.*waiting on rank 1"
for name in cpp_term_epoch_end cpp_throw_epoch_end; do
  # Read whole, then searched: under pipefail `! triage | grep` would pass on triage's exit 1 alone.
  ! grep -q "^[0-9]*\. \[stall\]" <<<"$("$cli" triage "$(run_of $name)" 2>&1 || true)" || fail "$name: rank 0's wait is a stall finding"
done
[[ -n "$clean_job" ]] || { echo "default faults test: ok (C++ only)"; exit 0; }
expect py_loader "$work/py_loader/run" "HANG: rank 1 .*blocked in loader_wait" "rank 1: File .* in hang_forever"
stacks=$("$cli" stacks "$work/py_loader/run")
for frame in "main thread (Python), whole stack - rank 1" "in __getitem__" "in __next__" "c10d::Reducer"; do
  grep -qF "$frame" <<<"$stacks" || fail "py_loader: no '$frame' in the stacks (rank 1 in its Dataset, rank 0 in DDP's reducer):
$stacks"
done
expect py_init "$work/py_init/run" "rank 1 did not reach init_process_group while rank 0 waits in it" \
  'rank 1: File ".*init_hang.py", line [0-9]+ in <module>'
cleanup
wait "$clean_job" || fail "py_clean: the clean job failed: $(tail -20 "$work/py_clean.log")"
# No stall and no fault; findings that cost only time may be this shared host's own.
rc=0; tri=$("$cli" triage --json "$work/py_clean/run") || rc=$?
"$py" "$here/tests/triage_expect.py" "$rc" clean <<<"$tri" || fail "py_clean: a fault in the clean job: $tri"
echo "  py_clean: $(grep -o '"headline":"[^"]*"' <<<"$tri")"
echo "default faults test: ok"
