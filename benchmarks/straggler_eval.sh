#!/usr/bin/env bash
# How well triage finds subtle stragglers, and how often it cries wolf.
#  1. Synthetic runs (benchmarks/synth_run.cpp), 8 ranks, every rank's compute
#     log-normal per step with sigma NOISE:
#     - false alarms: straggler findings on clean runs of 10,000 steps, from the
#       whole log and as a live monitor triaging every 30 steps would raise them;
#     - detection: a rank 1.2x slower in forward from step 1,000, the log cut
#       30, 60 and 120 steps later (a live run triaged mid-way): found? onset?
#  2. Real runs of the C++ example (libtorch + gloo, 2 ranks on this 2-core
#     machine): one clean run of 5,000 steps and RUNS of 600 steps with
#     --hidden 1024 (forward ~15 % of a step), and RUNS with --slow-factor 1.2
#     on rank 1 from step 300 (a busy-wait as long as 20 % of its forward).
# Prints one line per case; the numbers go into benchmarks/README.md.
#   benchmarks/straggler_eval.sh [BUILD_DIR] [CLEAN_RUNS_REAL]
set -euo pipefail
build=${1:-build} real_runs=${2:-2}
synth="$build/benchmarks/rankscope_synth_run" cli="$build/lib/rankscope"
trainer="$build/examples/cpp/rankscope_example_train"
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# findings DIR: "kind ranks step" of each straggler finding, one per line
findings() {
  { "$cli" triage --json "$1" || true; } | /usr/bin/python3 -c '
import json, sys
for f in json.load(sys.stdin)["findings"]:
    if f["kind"] == "straggler":
        print(f["ranks"][0], f["step"], f["summary"].split(": ", 1)[1][:60])'
}

# live RUN_DIR EVERY: how many straggler findings a live monitor would have raised,
# triaging the log as it stood every EVERY steps (benchmarks/live_triage.py)
live() { /usr/bin/python3 "$here/live_triage.py" --cli "$cli" --every "$2" "$1" | grep -oE '[0-9]+ finding' | cut -d' ' -f1; }

echo "== synthetic, 8 ranks (forward 30 ms, backward 40 ms per step, each x lognormal(sigma))"
for noise in 0.05 0.1 0.2; do
  alarms=0 live_alarms=0
  for seed in 1 2; do
    rm -rf "$work/s"
    "$synth" --dir "$work/s" --ranks 8 --steps 10000 --noise "$noise" --noise-seed "$seed"
    alarms=$((alarms + $(findings "$work/s" | wc -l)))
    live_alarms=$((live_alarms + $(live "$work/s" 30)))
  done
  echo "noise $noise: $alarms false alarm(s) in 2 clean runs of 10,000 steps; $live_alarms triaged live every 30 steps"
  for after in 30 60 120; do
    found=0 onsets=""
    for seed in 1 2 3 4 5; do
      rm -rf "$work/s"
      "$synth" --dir "$work/s" --ranks 8 --steps $((1000 + after)) --noise "$noise" --noise-seed "$seed" \
        --straggler 5:1000 --straggler-factor 1.2
      if f=$(findings "$work/s" | grep '^5 '); then
        found=$((found + 1)) onsets="$onsets $(cut -d' ' -f2 <<<"$f" | head -1)"
      fi
    done
    echo "noise $noise: 1.2x straggler, log cut $after steps after it began: found in $found/5 runs, onset step(s):$onsets"
  done
done

# The log of a real run cut N steps after step S (rank 0's step_end time): a live run triaged then.
until_step() {  # RUN_DIR STEP -> wall-clock ns of rank 0's step_end of STEP
  /usr/bin/python3 - "$1" "$2" <<'PY'
import glob, json, sys
step = int(sys.argv[2])
for line in open(sorted(glob.glob(sys.argv[1] + "/rank-0*.jsonl"))[0]):
    if '"step_end"' in line and json.loads(line)["step"] == step:
        print(json.loads(line)["t"]); break
PY
}
cut_findings() {  # RUN_DIR -> "30:found 60:found ..." for the log cut 30/60/120 steps after step 300
  local out="" t f
  for after in 30 60 120; do
    t=$(until_step "$1" $((300 + after)))
    f=$({ "$cli" triage --json --until "$t" "$1" || true; } | /usr/bin/python3 -c '
import json, sys
hits = ["rank%d@%d" % (f["ranks"][0], f["step"]) for f in json.load(sys.stdin)["findings"] if f["kind"] == "straggler"]
print(hits[0] if hits else "-")')
    out="$out $after:$f"
  done
  echo "$out"
}

# Unbound: both ranks float over both cores with each other's threads. Bound
# (--bind, as Slurm's --cpu-bind or a launcher's numactl would): one core each.
for bind in "" --bind; do
  echo "== real: the C++ example, 2 ranks ${bind:-(not bound to cores)}"
  rm -rf "$work/r"
  bash "$here/../examples/cpp/launch.sh" --ranks 2 --steps 5000 $bind --trainer "$trainer" --dir "$work/r" >/dev/null 2>&1
  echo "clean, 5,000 steps: $(findings "$work/r"/*/ | wc -l) straggler finding(s); live (every 15 steps):"
  /usr/bin/python3 "$here/live_triage.py" --cli "$cli" --every 15 "$work/r"/*/
  for i in $(seq 1 "$real_runs"); do
    rm -rf "$work/r"
    bash "$here/../examples/cpp/launch.sh" --ranks 2 --steps 600 $bind --trainer "$trainer" --dir "$work/r" -- \
      --hidden 1024 >/dev/null 2>&1
    echo "clean run $i, 600 steps, --hidden 1024: $(findings "$work/r"/*/ | wc -l) straggler finding(s)"
    rm -rf "$work/r"
    bash "$here/../examples/cpp/launch.sh" --ranks 2 --steps 600 $bind --trainer "$trainer" --dir "$work/r" -- \
      --hidden 1024 --slow-rank 1 --slow-from-step 300 --slow-factor 1.2 >/dev/null 2>&1
    echo "1.2x from step 300, run $i: whole log: $(findings "$work/r"/*/ | head -1); cut after:$(cut_findings "$work/r"/*/)"
  done
done
