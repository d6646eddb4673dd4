#!/usr/bin/env bash
# Triage at scale: a synthetic run of RANKS x STEPS (about 10 events per rank
# per step; default 1,024 x 1,000 = 10 M lines, 1.7 GB) with a straggler, a
# 40 ms clock skew on one host and the other hosts clean; then
# `rankscope triage --json` timed with its peak RSS (GNU time), and checked:
# the straggler named, the skew estimated. Target on this 2-core machine:
# <= 30 s and <= 2 GB. Numbers go into benchmarks/README.md.
#   benchmarks/triage_scale.sh [RANKS] [STEPS] [BUILD_DIR]
set -euo pipefail
ranks=${1:-1024} steps=${2:-1000} build=${3:-build}
dir=$(mktemp -d)  # under $TMPDIR or /tmp
trap 'rm -rf "$dir"' EXIT
echo "generating $ranks ranks x $steps steps into $dir ..."
t0=$(date +%s.%N)
"$build/benchmarks/rankscope_synth_run" --dir "$dir" --ranks "$ranks" --steps "$steps" \
  --straggler "$((ranks / 3)):$((steps / 2))" --skew 3:40
t1=$(date +%s.%N)
size=$(du -sb "$dir" | cut -f1)
lines=$(cat "$dir"/rank-*.jsonl | wc -l)
echo "generated $lines lines, $((size / 1000000)) MB in $(/usr/bin/python3 -c "print(round($t1 - $t0, 1))") s"
sync
/usr/bin/time -q -f '%e %M' -o "$dir/.time" "$build/lib/rankscope" triage --json "$dir" >"$dir/.triage.json" || true
read -r secs kb <"$dir/.time"
/usr/bin/python3 - "$dir/.triage.json" "$((ranks / 3))" "$secs" "$kb" "$size" "$ranks" "$lines" <<'PY'
import json, sys
path, straggler, secs, kb, size, ranks, lines = sys.argv[1:]
r = json.load(open(path))
assert r["findings"][0]["kind"] == "straggler" and r["findings"][0]["ranks"] == [int(straggler)], r["findings"][:2]
assert r["clock_skew"] and r["clock_skew"][0]["host"] == "node-3", r["clock_skew"]
k = r["clock_skew"][0]
print(f"verdict: {r['headline']}; clock skew: {k['host']} {k['offset_ms']:+.1f} ms")
secs = float(secs)
print(f"triage: {secs:.2f} s, peak RSS {int(kb) / 1024:.0f} MB ({ranks} ranks, {lines} lines, "
      f"{int(size) / 1e6 / secs:.0f} MB/s)")
PY
