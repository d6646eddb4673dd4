#!/usr/bin/env bash
# Hang detection latency with DEFAULT settings (nothing RANKSCOPE_STALL_* set),
# over injected hangs of every kind: 2-rank jobs where rank 1 blocks forever
# - C++ example trainer (launch.sh, gloo): in forward, the loader, a checkpoint save, a collective phase;
# - Python DDP example (torchrun, gloo): in the data loader (Dataset), forward, a checkpoint save;
# while rank 0 waits in the next collective. For each rank: the progress age when its
# watchdog reported the stall (how long after the last progress) and the learned timeout.
#   benchmarks/hang_latency.sh [REPEATS=2] [BUILD=build]   -> a table and the distribution
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
repeats=${1:-2} build=${2:-$here/build}
work=$(mktemp -d /tmp/rankscope-hang-latency.XXXX)
trap 'pkill -f "$work" 2>/dev/null || true; rm -rf "$work"' EXIT
unset RANKSCOPE_STALL_TIMEOUT RANKSCOPE_STALL_FLOOR RANKSCOPE_STALL_WARMUP RANKSCOPE_HEARTBEAT_INTERVAL
results=$work/results.txt

# Waits until both ranks of RUN_DIR reported a stall (90 s at most), records them, stops the job.
collect() {  # NAME DIR PID
  local name=$1 dir=$2 pid=$3 run=""
  for _ in $(seq 1 360); do
    run=$(ls -d "$dir"/*/ 2>/dev/null | head -1 || true)
    if [[ -n "$run" ]] && grep -q '"kind":"stall"' "$run/rank-0.jsonl" 2>/dev/null &&
       grep -q '"kind":"stall"' "$run/rank-1.jsonl" 2>/dev/null; then break; fi
    sleep 0.25
  done
  for r in 0 1; do
    line=$(grep -m1 '"kind":"stall"' "$run/rank-$r.jsonl" 2>/dev/null || true)
    age=$(grep -o '"progress_age_ns":[0-9]*' <<<"$line" | cut -d: -f2)
    timeout=$(grep -o '"timeout_ns":[0-9]*' <<<"$line" | cut -d: -f2)
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
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
print(f"{'hang (rank 1 blocked in)':28} {'rank':>5} {'reported after':>15} {'learned timeout':>16}")
ages = []
for name, rank, age, timeout in rows:
    a, t = int(age) / 1e9, int(timeout) / 1e9
    ages.append(a)
    who = "blocked" if rank == "rank1" else "waiting"
    print(f"{name:28} {who:>7} {a:13.2f} s {t:14.1f} s" if a else f"{name:28} {who:>7}    not reported")
got = [a for a in ages if a > 0]
q = statistics.quantiles(got, n=10) if len(got) >= 2 else got
print(f"\n{len(got)}/{len(ages)} rank-hangs reported ({len(rows) // 2} hangs): min {min(got):.2f} s, median "
      f"{statistics.median(got):.2f} s, p90 {q[-1]:.2f} s, max {max(got):.2f} s")
PY
