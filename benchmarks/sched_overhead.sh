#!/usr/bin/env bash
# What the background thread's CPU costs the training, measured by the kernel's
# scheduler: the example trainer on 2 ranks (one core each with BIND=1, the
# default) under `perf record` of the scheduler tracepoints, then
# benchmarks/sched_cost.py over the steady steps (step 200 to the end).
#   benchmarks/sched_overhead.sh BUILD_DIR [STEPS=4000] [trainer args...]
#   EXAMPLE=python benchmarks/sched_overhead.sh BUILD_DIR [STEPS=4096]   # examples/python/train_ddp.py
#     (its default batch, 64: 128 steps per epoch of 16384 samples; extra
#     arguments go to the trainer, so do not change --batch there)
# It reports how long the background threads ran and how much of that time a
# training thread was runnable and waiting for the same core, the only way the
# thread's work can hold training up (its cache footprint aside). Compare
# RANKSCOPE_YIELD_EVERY=0 (never yield) with the default (64).
# Needs perf (Debian linux-perf) and the right to trace the scheduler
# (root, or kernel.perf_event_paranoid <= -1). Tracing slows context switches,
# so step times here are ~5 % longer than untraced.
set -euo pipefail
build=${1:?usage: sched_overhead.sh BUILD_DIR [STEPS] [trainer args...]}
steps=${2:-4000}
((steps > 400)) || { echo "sched_overhead.sh: STEPS must be above 400 (steps before 200 are warm-up)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
command -v perf >/dev/null || { echo "sched_overhead.sh: perf is not installed (apt-get install linux-perf)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bind=(--bind)
[[ "${BIND:-1}" == 0 ]] && bind=()
if [[ "${EXAMPLE:-cpp}" == python ]]; then
  # 16384 samples / 2 ranks / batch 64 = 128 steps per epoch.
  # torchrun from the project's .venv (the package pip-installed there), run in $work/runs.
  mkdir -p "$work/runs"
  run=(env -C "$work/runs" OMP_NUM_THREADS=1 "$here/../.venv/bin/torchrun" --standalone --nproc-per-node 2
       "$here/../examples/python/train_ddp.py" --samples 16384 --epochs $(((steps + 127) / 128)) "${bind[@]}" "${@:3}")
else
  run=(bash "$here/../examples/cpp/launch.sh" --ranks 2 --steps "$steps" "${bind[@]}"
       --trainer "$build/examples/cpp/rankscope_example_train" --dir "$work/runs" -- --checkpoint-every 0 "${@:3}")
fi
perf record -q -k CLOCK_MONOTONIC -a -o "$work/sched.data" \
  -e sched:sched_switch -e sched:sched_waking -e sched:sched_wakeup_new -e sched:sched_migrate_task -- \
  "${run[@]}" > "$work/out.txt" 2>&1 || { cat "$work/out.txt" >&2; exit 1; }
grep -E "^cost:" "$work/out.txt" || true
log=$(find "$work/runs" -name rank-0.jsonl | head -n 1)
read -r t0 t1 n ms < <(grep '"kind":"step_end"' "$log" | python3 -c '
import json, sys
ends = [json.loads(l) for l in sys.stdin]
ends = [e for e in ends if e["step"] >= 200]
print(ends[0]["mono"] / 1e9, ends[-1]["mono"] / 1e9, len(ends) - 1, (ends[-1]["mono"] - ends[0]["mono"]) / 1e6 / (len(ends) - 1))')
echo "steps: $n per rank in the window, $(printf %.3f "$ms") ms per step (traced)"
perf script -i "$work/sched.data" -F comm,pid,tid,cpu,time,event,trace 2>/dev/null |
  python3 "$here/sched_cost.py" --from "$t0" --to "$t1" --steps "$n" --ranks 2
