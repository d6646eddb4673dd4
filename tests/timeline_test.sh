#!/usr/bin/env bash
# `rankscope timeline` on a real 2-rank run: the trace is valid Chrome trace
# JSON with a track per rank and thread, every step, phase and collective, and
# one flow per collective between the ranks (tests/check_trace.py).
set -euo pipefail
trainer=$1 cli=$2 work=$3
rm -rf "$work"; mkdir -p "$work"
bash "$(dirname "$0")/../examples/cpp/launch.sh" --ranks 2 --steps 20 --trainer "$trainer" --dir "$work" \
  >"$work/launch.log" 2>&1 || { cat "$work/launch.log"; exit 1; }
run=$(ls -d "$work"/*/)
"$cli" timeline "$run" -o "$work/trace.json"
python3 "$(dirname "$0")/check_trace.py" "$work/trace.json" 2 20
# A corrupt line and a torn tail are skipped, not fatal.
printf '{"kind":"phase",garbage\n{"kind":"pha' >>"$run/rank-1.jsonl"
"$cli" timeline "$run" -o - >"$work/trace2.json"
python3 "$(dirname "$0")/check_trace.py" "$work/trace2.json" 2 20
set +e
"$cli" timeline "$work/nope" -o "$work/x.json" 2>"$work/err.txt"; rc=$?
set -e
[[ $rc == 2 ]] && grep -q "is not a run directory" "$work/err.txt" || { echo "bad dir: exit $rc"; exit 1; }
echo "timeline test: ok"
