#!/usr/bin/env bash
# End-to-end overhead as instructions, not seconds: the example trainer under
# valgrind's callgrind, rankscope on (default settings) against
# RANKSCOPE_ENABLED=0, each at two run lengths; the difference between the
# lengths removes start-up, so what is left is instructions per training step.
# Instruction counts repeat for the same binary and inputs whatever else the
# machine does: they resolve the 0.1 % that a wall-clock A/B on this shared
# 2-core VM cannot (its A/A control moves by +-0.5 %).
#
#   benchmarks/instr_overhead.sh python            # examples/python/train_ddp.py (.venv, pip-installed package)
#   benchmarks/instr_overhead.sh cpp BUILD_DIR     # examples/cpp/train.cpp
#   benchmarks/instr_overhead.sh ddp               # plain DDP against rst.instrument_ddp (python/ddp_steps.py)
#   benchmarks/instr_overhead.sh nocode            # an unmodified loop (python/plain_steps.py): RANKSCOPE_AUTO=1
#                                                  # (on) and instrumented by hand (hand) against as is (off)
#
# One rank (world size 1 over gloo: valgrind runs threads one at a time, and
# a peer under valgrind only adds waiting). Periodic work that depends on the
# wall clock (heartbeat every 1 s, metrics every 10 s, resources every 30 s)
# would run ~50x more often per step under valgrind, so it is stretched here
# and reported from the idle measurement instead (benchmarks/README.md: an
# idle process costs 0.21 ms of CPU per second). Four runs, two at a time:
# ~10 minutes for python, ~4 for cpp.
set -euo pipefail
what=${1:?usage: instr_overhead.sh python | cpp BUILD_DIR | ddp | nocode}
here=$(cd "$(dirname "$0")/.." && pwd)
short=${SHORT:-100} long=${LONG:-600}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PYTHONHASHSEED=0 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 OMP_NUM_THREADS=1
export RANKSCOPE_HEARTBEAT_INTERVAL=600 RANKSCOPE_METRICS_INTERVAL=3600 RANKSCOPE_RESOURCE_INTERVAL=0 RANKSCOPE_CONSOLE=none
# At valgrind's pace the end of a run (interpreter teardown) outlasts the learned stall timeout:
# a stall dump there is not per-step work.
export RANKSCOPE_STALL_TIMEOUT=100000
# The background thread wakes at least every 20 ms: at valgrind's pace that is dozens of nearly
# empty drains per step where a real run drains ~7 steps' records at once. 1 s (the longest
# allowed) brings the records per drain back near a real run's.
export RANKSCOPE_DRAIN_INTERVAL_MS=${RANKSCOPE_DRAIN_INTERVAL_MS:-1000}

command_for() {  # ARM STEPS -> the trainer's command line
  case $what in
    python) echo "$here/.venv/bin/python $here/examples/python/train_ddp.py --epochs 1 --samples $(($2 * 64)) --check-replicas 1000000000" ;;
    cpp) echo "${BUILD:?cpp needs BUILD_DIR}/examples/cpp/rankscope_example_train --steps $2 --checkpoint-every 0 --no-online-checks" ;;
    ddp) echo "$here/.venv/bin/python $here/benchmarks/python/ddp_steps.py $2 $([[ $1 == on ]] && echo --instrument)" ;;
    nocode) echo "$here/.venv/bin/python $here/benchmarks/python/plain_steps.py $2 $([[ $1 == hand ]] && echo --by-hand)" ;;
    *) echo "unknown trainer '$what'" >&2; exit 2 ;;
  esac
}
run() {  # ARM STEPS PORT
  local arm=$1 steps=$2
  local enabled=1  # ddp: rankscope on in both arms; the arms differ in instrument_ddp
  [[ $arm == off && $what != ddp ]] && enabled=0
  # shellcheck disable=SC2046
  local auto=""  # nocode: the no-code mode is the on arm; off runs the script as is, hand by hand
  [[ $what == nocode && $arm == on ]] && auto=1
  RANKSCOPE_AUTO=$auto RANKSCOPE_ENABLED=$enabled RANKSCOPE_DIR="$work/run-$arm-$steps" MASTER_PORT=$3 \
    valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$work/$arm-$steps.out" $(command_for "$arm" "$steps") \
    > "$work/$arm-$steps.log" 2>&1 || { echo "run $arm $steps failed:"; tail -5 "$work/$arm-$steps.log"; exit 1; }
}
BUILD=${2:-}
arms="on off"
[[ $what == nocode ]] && arms="on off hand"
for steps in "$short" "$long"; do
  pids=()
  for arm in $arms; do run "$arm" "$steps" $((29860 + RANDOM % 100)) & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || exit 1; done  # a failed run stops the measurement
done

total() { grep -o 'refs: *[0-9,]*' "$work/$1.log" | tr -d ', ' | cut -d: -f2; }
per_step() { echo $(( ($(total "$1-$long") - $(total "$1-$short")) / (long - short) )); }
# The training thread and rankscope's own threads only (one profile per thread): torch's
# helper threads (gloo, the TCP store) poll on timers and differ between the arms by a few
# thousand instructions per step, which would drown the third digit.
ours() {  # RUN -> instructions of the main thread and of rankscope's threads
  local sum=0 f n
  for f in "$work/$1.out"-*; do
    if [[ $f == *-01 ]] || grep -qE 'run_background|Sampler::loop|StoreDumpChannel::run' "$f"; then
      n=$(grep -m1 -E '^(summary|totals):' "$f" | awk '{print $2}')
      sum=$((sum + n))
    fi
  done
  echo "$sum"
}
ours_per_step() { echo $(( ($(ours "$1-$long") - $(ours "$1-$short")) / (long - short) )); }
echo "all threads, instructions per step: on $(per_step on), off $(per_step off)"
on=$(ours_per_step on) off=$(ours_per_step off)
echo "training thread + rankscope's threads, instructions per step ($what, $((long - short)) steps): on $on, off $off, on - off $((on - off)) = $(python3 -c "print(f'{100 * ($on - $off) / $off:.3f}')") %"
if [[ $what == nocode ]]; then
  hand=$(ours_per_step hand)
  echo "by hand (the README's lines): $hand, hand - off $((hand - off)) = $(python3 -c "print(f'{100 * ($hand - $off) / $off:.3f}')") %; no-code - by hand: $((on - hand))"
fi
# Where rankscope's share goes: the functions of its libraries, per step (inclusive).
for arm in on; do
  for n in "$short" "$long"; do
    for f in "$work/$arm-$n.out"-*; do callgrind_annotate --inclusive=yes --threshold=100 "$f" 2>/dev/null; done > "$work/$arm-$n.incl"
  done
done
python3 - "$work/on-$short.incl" "$work/on-$long.incl" $((long - short)) $((on - off)) "$off" <<'EOF'
import re, sys
def load(path):
    d = {}
    for line in open(path):
        m = re.match(r'\s*([\d,]+) \([^)]*\)\s+\S*?:(.*?) \[(.*)\]$', line.rstrip())
        # rankscope's own functions (the std:: ones its libraries export are bound by other
        # libraries' calls too); the extension modules carry no symbols: by address.
        if m and ('rankscope' in m.group(2) or ('rankscope/_' in m.group(3) and m.group(2).startswith('0x'))):
            d[m.group(2)] = d.get(m.group(2), 0) + int(m.group(1).replace(',', ''))
    return d
a, b, n, delta, off = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rows = sorted(((v - a.get(k, 0)) / n, k) for k, v in b.items())[::-1]
# Work on timers, not per event: at valgrind's pace it runs far more often per step than in a
# real run (where it costs ~0.2 ms of CPU per second in all: the idle benchmark).
timed = ("Watchdog::tick(", "export_metrics_now(", "StoreDumpChannel::run(", "DumpRequests::poll[", "Sampler::loop(")
on_timers = sum(d for d, k in rows if any(t in k for t in timed))  # none calls another
print(f"of which on timers (heartbeat, dump-request polls, metrics, resources; inflated here): {on_timers:.0f} per step")
print(f"per-step work without them: {delta - on_timers:.0f} instructions per step = {100 * (delta - on_timers) / off:.3f} %")
print("rankscope functions in the on arm, instructions per step (inclusive: callers count their callees too):")
for d, k in rows[:15]:
    if d >= 50:
        print(f"  {d:9.0f}  {k[:110]}")
EOF
