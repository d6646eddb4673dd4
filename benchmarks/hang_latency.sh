#!/usr/bin/env bash
# Hang detection latency with DEFAULT settings (nothing RANKSCOPE_STALL_* set),
# over injected hangs of every kind: 2-rank jobs where rank 1 blocks forever
# - C++ example trainer (launch.sh, gloo): in forward, the loader, a checkpoint save, a collective phase;
# - Python DDP example (torchrun, gloo): in the data loader (Dataset), forward, a checkpoint save;
# while rank 0 waits in the next collective. For each rank: the progress age when its
# watchdog reported the stall (how long after the last progress) and the learned timeout;
# the job's detection latency is the first rank's report. (A rank blocked inside a
# checkpoint save gets 8 x the floor, 120 s, so a slow save is not a hang: its peers,
# waiting in a collective, report the job's hang at the floor.)
#   benchmarks/hang_latency.sh [REPEATS=2] [BUILD=build]   -> a table and the distribution
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
repeats=${1:-2} build=${2:-$here/build}
work=$(mktemp -d --suffix=-rankscope-hang-latency)
trap 'pkill -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
unset RANKSCOPE_STALL_TIMEOUT RANKSCOPE_STALL_FLOOR RANKSCOPE_STALL_WARMUP RANKSCOPE_HEARTBEAT_INTERVAL
results=$work/results.txt

# Waits until a rank of RUN_DIR reported a stall (90 s at most) and 3 s more for the
# other, records both, stops the job.
collect() {  # NAME DIR PID
  local name=$1 dir=$2 pid=$3 run=""
  for _ in $(seq 1 360); do
    run=$(ls -d "$dir"/*/ 2>/dev/null | head -1 || true)
    if [[ -n "$run" ]] && grep -q '"kind":"stall"' "$run"/rank-*.jsonl 2>/dev/null; then break; fi
    sleep 0.25
  done
  sleep 3
  for r in 0 1; do
    line=$(grep -m1 '"kind":"stall"' "$run/rank-$r.jsonl" 2>/dev/null || true)
    age=$(grep -o '"progress_age_ns":[0-9]*' <<<"$line" | cut -d: -f2 || true)
    timeout=$(grep -o '"timeout_ns":[0-9]*' <<<"$line" | cut -d: -f2 || true)
    echo "$name rank$r ${age:-0} ${timeout:-0}" >>"$results"
  done
  pkill -P "$pid" 2>/dev/null || true
  kill "$pid" 2>/dev/null || true
  pkill -f "$dir" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

n=0
for rep in $(seq 1 "$repeats"); do
  for phase in forward loader_wait checkpoint_save all_reduce; do
    n=$((n + 1)); d=$work/cpp-$n
    bash "$here/examples/cpp/launch.sh" --ranks 2 --steps 100000 --trainer "$build/examples/cpp/rankscope_example_train" \
      --cli "$build/lib/rankscope" --dir "$d" -- --block-rank 1 --block-step 40 --block-phase "$phase" \
      --timeout 600 --checkpoint-every 0 >"$d.log" 2>&1 &
    collect "cpp:$phase" "$d" $!
  done
  for hang in loader forward checkpoint; do
    n=$((n + 1)); d=$work/py-$n; mkdir -p "$d"
    (cd "$d" && RANKSCOPE_DIR="$d/run/x" "$here/.venv/bin/torchrun" --standalone --nproc-per-node 2 \
      "$here/examples/python/train_ddp.py" --epochs 100 --fault-rank 1 --fault-step 40 --hang "$hang" >"$d.log" 2>&1) &
    collect "python:$hang" "$d/run" $!
  done
done

python3 - "$results" <<'PY'
import collections, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
by_hang = collections.OrderedDict()
for i in range(0, len(rows) - 1, 2):
    (name, _, a0, t0), (_, _, a1, t1) = rows[i], rows[i + 1]
    by_hang.setdefault(name, []).append((int(a0) / 1e9, int(a1) / 1e9, int(t1) / 1e9))
print(f"{'hang (rank 1 blocked in)':24} {'hangs':>5} {'job: first report':>18} {'waiting rank 0':>15} {'blocked rank 1':>15}")
first_all = []
fmt = lambda v: ", ".join(f"{x:.1f}" for x in v)
for name, hs in by_hang.items():
    first = [min(x for x in (a0, a1) if x > 0) for a0, a1, _ in hs]
    first_all += first
    r1 = [f"{a1:.1f}" if a1 > 0 else f">{60:.0f} (timeout {t1 or 120:.0f})" for _, a1, t1 in hs]
    print(f"{name:24} {len(hs):>5} {fmt(first):>18} {fmt(a0 for a0, _, _ in hs):>15} {', '.join(r1):>15}")
q = statistics.quantiles(first_all, n=10) if len(first_all) >= 2 else first_all
print(f"\n{len(first_all)} hangs, seconds from the last progress to the first report: min {min(first_all):.2f}, "
      f"median {statistics.median(first_all):.2f}, p90 {q[-1]:.2f}, max {max(first_all):.2f}")
PY
