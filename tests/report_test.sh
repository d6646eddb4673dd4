#!/usr/bin/env bash
# rankscope diff, goodput and report on real runs, and report at 1,024 ranks:
#  - two real 2-rank runs: A clean, B with rank 1 20 ms slower in forward, NCCL_ALGO=Tree
#    and a GPU's XID; `diff A B` names the straggler and the XID as new in B and the
#    changed knob (exit 1); both directions' findings and exit codes are what the runs'
#    own triage says (a real run on a shared host may have a straggler of the host's
#    making: A is checked for faults, not for slowdowns); goodput's categories sum to
#    the wall time;
#  - `report` pages open in headless Chromium (Debian's package) with every chart
#    rendered (resources too: B samples them through a fake NVML) and no script or console
#    error; the screenshot shows the heat
#    map's straggler row and Chart.js's plots;
#  - a synthetic 1,024-rank run with a straggler and resource snapshots: the page renders,
#    the rank is visible; goodput sums up there, and diff against a clean 1,024-rank run names it;
#  - bad input: a missing run directory and an unwritable output say so (exit 2).
set -euo pipefail
trainer=$1 cli=$2 synth=$3 work=$4 py=$5 fake_nvml=$6
here=$(dirname "$0")
rm -rf "$work"; mkdir -p "$work"
fail() { echo "report test: $*"; exit 1; }
browser=$(command -v chromium || command -v chromium-browser || true)
[[ -n "$browser" ]] || fail "no chromium (bash .ci/setup.sh installs Debian's)"

launch() {  # DIR [trainer args]
  local dir=$1; shift
  bash "$here/../examples/cpp/launch.sh" --ranks 2 --steps 80 --trainer "$trainer" --cli "$cli" --dir "$dir" \
    -- --checkpoint-every 0 "$@" >/dev/null 2>&1
  ls -d "$dir"/*/
}
# A, the clean baseline: no fault. (A straggler there is the host's: benchmarks/README.md, Stragglers.)
a=$(launch "$work/a")
rc=0; tri_a=$("$cli" triage --json "$a") || rc=$?
"$py" "$here/triage_expect.py" "$rc" clean <<<"$tri_a" || fail "a fault in the clean run A: $tri_a"
# B also samples resources every 0.1 s through the fake NVML, whose GPUs report one critical XID,
# and reads its host under a fake /proc whose node waits on I/O (RANKSCOPE_HOST_ROOT);
# rank 1 sleeps 20 ms in forward (its forward is ~1-3 ms: far above the host's own swings).
host=$work/host
mkdir -p "$host/proc/pressure"
printf 'some avg10=35.00 avg60=20.00 avg300=5.00 total=1\nfull avg10=9.00 avg60=4.00 avg300=1.00 total=1\n' >"$host/proc/pressure/io"
printf 'MemTotal: 16000000 kB\nMemAvailable: 8000000 kB\nDirty: 1048576 kB\nWriteback: 0 kB\n' >"$host/proc/meminfo"
printf 'procs_running 3\nprocs_blocked 2\n' >"$host/proc/stat"
b=$(NCCL_ALGO=Tree RANKSCOPE_NVML_LIBRARY=$fake_nvml RANKSCOPE_RESOURCE_INTERVAL=0.1 FAKE_NVML_XID=79 \
    RANKSCOPE_HOST_ROOT=$host launch "$work/b" --slow-rank 1 --slow-ms 20)
tri=$("$cli" triage "$b" || true)
grep -qE "\[gpu_error\] rank 1: its GPU 1 reported XID 79 at step [0-9]+: the GPU fell off the bus or its firmware stopped: reboot the node" \
  <<<"$tri" || fail "triage did not report the XID and what to do: $tri"
grep -q "\[straggler\] rank 1 is a straggler in forward" <<<"$tri" || fail "triage did not name rank 1's forward: $tri"
grep -qE "rank 1's host [^ ]+ was under I/O pressure from step [0-9]+: some task waited on I/O 35 %" <<<"$tri" ||
  fail "the straggler's node pressure is not its evidence: $tri"
tri_b=$("$cli" triage --json "$b" || true)

# diff's findings, both ways, are the two triages' findings keyed by kind and ranks.
diff_check() {  # FIRST SECOND: diff FIRST SECOND against what the runs' triage says
  local rc=0 out json
  out=$("$cli" diff "$1" "$2") || rc=$?
  json=$("$cli" diff --json "$1" "$2" || true)
  "$py" - "$rc" "$out" "$json" "$3" "$4" <<'PY' || fail "diff $5: $out"
import json, sys
rc, text, d = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
first, second = json.loads(sys.argv[4]), json.loads(sys.argv[5])
key = lambda f: (f["kind"], tuple(f["ranks"]))
in_first, in_second = {key(f) for f in first["findings"]}, {key(f) for f in second["findings"]}
new = [key(f) for f in second["findings"] if key(f) not in in_first]
gone = [key(f) for f in first["findings"] if key(f) not in in_second]
assert rc == (1 if new else 0), (rc, new)
assert [key(f) for f in d["findings"]["only_b"]] == new, (d["findings"]["only_b"], new)
assert [key(f) for f in d["findings"]["only_a"]] == gone, (d["findings"]["only_a"], gone)
for side, keys in (("B", new), ("A", gone)):
    for kind, ranks in keys:
        assert f"only in {side}: {kind}" in text, (side, kind, ranks)
PY
}
diff_check "$a" "$b" "$tri_a" "$tri_b" "A B"
diff_check "$b" "$a" "$tri_b" "$tri_a" "B A"
rc=0; out=$("$cli" diff "$a" "$b") || rc=$?
[[ $rc == 1 ]] || fail "diff A B: exit $rc, want 1 (B's XID is a finding A has not): $out"
grep -q "only in B: gpu_error (rank 1)" <<<"$out" || fail "diff did not name the new XID: $out"
grep -q "env.NCCL_ALGO: (unset) -> Tree" <<<"$out" || fail "diff did not name the changed knob: $out"
grep -q "all_reduce" <<<"$out" || fail "diff has no collective bandwidth rows: $out"
grep -qE "^ +forward +[0-9.]+ ms +[0-9.]+ ms +\+[0-9.]+ %" <<<"$out" || fail "diff has no forward delta row: $out"
grep -q "phases by name" <<<"$out" || fail "diff has no per-name phase rows: $out"
{ "$cli" diff --json "$a" "$b" || true; } | "$py" -c '
import json, sys
d = json.load(sys.stdin)
assert d["step_ms"]["b"] > d["step_ms"]["a"], d["step_ms"]
# rank 1 is 20 ms slower in forward: the median rank of two moves by half of it, at least
assert d["phase_ms"]["forward"]["b"] > d["phase_ms"]["forward"]["a"] + 5.0, d["phase_ms"]
n = d["named_phase_ms"]  # by the names the trainer gave them
assert n["forward"]["b"] > n["forward"]["a"] + 5.0 and "loader_wait" in n and "all_reduce" in n, n
assert any(c["op"] == "all_reduce" and c["algbw_gbps_a"] > 0 for c in d["collectives"]), d["collectives"]
' || fail "diff --json"

"$cli" goodput --json "$b" | "$py" -c '
import json, sys
g = json.load(sys.stdin)
assert abs(sum(g["categories"].values()) - g["wall_seconds"]) <= 0.005 * g["wall_seconds"], g
assert g["categories"]["compute"] > 0 and g["categories"]["communication"] > 0, g
' || fail "goodput --json"

# A page in headless Chromium: rendered, no errors; its screenshot has the plots.
check_page() {  # HTML PNG CHARTS
  local html=$1 png=$2 log=$1.log dom
  dom=$("$browser" --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 --dump-dom "file://$html" 2>"$log")
  grep -q "data-rendered=\"$3\"" <<<"$dom" || fail "$html: not every chart rendered ($(grep -o 'data-rendered="[0-9]*"' <<<"$dom"))"
  ! grep -q "data-errors=" <<<"$dom" || fail "$html: script errors on the page: $(grep -o '<div id="errors">[^<]*' <<<"$dom")"
  ! grep -q "Uncaught" "$log" || fail "$html: $(grep Uncaught "$log")"
  "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,2400 --screenshot="$png" \
    "file://$html" >/dev/null 2>&1
  [[ -s "$png" ]] || fail "$html: no screenshot"
}
# Screenshot pixels: the heat map's straggler red and Chart.js's blue (lines, bars) are there.
check_pixels() {  # PNG MIN-RED MIN-BLUE
  "$py" - "$@" <<'PY' || fail "screenshot $1"
import sys
from PIL import Image
img = Image.open(sys.argv[1]).convert("RGB")
px = list(img.getdata())
red = sum(1 for r, g, b in px if r > 230 and g < 130 and b < 130)
blue = sum(1 for r, g, b in px if abs(r - 31) < 30 and abs(g - 119) < 30 and abs(b - 180) < 30)
busy = sum(1 for r, g, b in px if (r, g, b) not in ((255, 255, 255), (243, 245, 248)))
print(f"  {sys.argv[1]}: {img.size[0]}x{img.size[1]}, straggler-red {red} px, chart-blue {blue} px, non-background {busy} px")
assert red >= int(sys.argv[2]), f"no straggler row in the heat map ({red} red px)"
assert blue >= int(sys.argv[3]), f"no Chart.js plot ({blue} blue px)"
assert busy > 0.15 * len(px), "the page is mostly blank"
PY
}

"$cli" report "$b" -o "$work/b.html" 2>/dev/null || fail "report B"
check_page "$work/b.html" "$work/b.png" 8   # and the resources chart
# Each finding says what to do next there too: the XID's reboot of the node.
grep -q 'class="next">Next: reboot ' <<<"$("$browser" --headless --no-sandbox --disable-gpu --dump-dom "file://$work/b.html" 2>/dev/null)" ||
  fail "the report's findings do not say what to do next"
check_pixels "$work/b.png" 2000 2000

# Hostile names in a run log: a phase named "<!--<script>" (it blanked the page when only "</"
# was escaped) and an exception message with terminal escapes (OSC retitle, CSI clear).
cp -r "$b" "$work/hostile"
"$py" - "$work/hostile" <<'PY'
import json, sys
path = sys.argv[1] + "/rank-1.jsonl"
lines = open(path).read().splitlines()
at = next(i for i, l in enumerate(lines) if '"kind":"run_end"' in l)
first = json.loads(next(l for l in lines if '"kind":"phase"' in l and '"name":"forward"' in l))
evil = dict(first, name="<!--<script>alert(1)</script>", step=first["step"])
exit_line = {"kind": "exit", "t": first["t"] + 1, "mono": first["mono"] + 1, "rank": 1, "step": first["step"],
             "level": "fatal", "cause": "exception", "exception": "RuntimeError",
             "msg": "RuntimeError: bad \u001b]0;pwned\u0007 batch\u001b[2J", "traceback": ""}
lines[at:at] = [json.dumps(evil, separators=(",", ":")), json.dumps(exit_line, separators=(",", ":"))]
open(path, "w").write("\n".join(lines) + "\n")
PY
"$cli" report "$work/hostile" -o "$work/hostile.html" 2>/dev/null || fail "report of the hostile run"
check_page "$work/hostile.html" "$work/hostile.png" 8
for out in "$("$cli" triage "$work/hostile" 2>&1 || true)" "$("$cli" diff "$a" "$work/hostile" 2>&1 || true)"; do
  ! grep -q $'\x1b' <<<"$out" || fail "a raw escape sequence reached the terminal: $(grep -a $'\x1b' <<<"$out" | cat -v)"
done
grep -q 'bad \\x1b\]0;pwned\\x07 batch' <<<"$("$cli" triage "$work/hostile" 2>&1 || true)" ||
  fail "triage does not show the escapes as text: $("$cli" triage "$work/hostile" 2>&1 | cat -v)"

# 1,024 ranks: generation time (printed, not asserted), the page with resources, the one slow rank
# visible; goodput and diff against a clean run of the same size.
"$synth" --dir "$work/s1024" --ranks 1024 --steps 200 --straggler 700:50 --noise 0.05 --resources-every 50 >/dev/null
"$synth" --dir "$work/c1024" --ranks 1024 --steps 200 --noise 0.05 --resources-every 50 >/dev/null
timed() {  # LABEL COMMAND...: runs it, prints its wall time, keeps its exit code
  local label=$1 start=$EPOCHREALTIME rc=0; shift
  "$@" || rc=$?
  echo "  $label at 1,024 ranks x 200 steps: $("$py" -c "print(round($EPOCHREALTIME - $start, 2))") s" >&2
  return $rc
}
timed report "$cli" report "$work/s1024" -o "$work/s1024.html" 2>/dev/null || fail "report at 1,024 ranks"
check_page "$work/s1024.html" "$work/s1024.png" 8   # resources at 1,024 ranks too
check_pixels "$work/s1024.png" 300 2000
timed goodput "$cli" goodput --json "$work/s1024" | "$py" -c '
import json, sys
g = json.load(sys.stdin)
assert abs(sum(g["categories"].values()) - g["wall_seconds"]) <= 0.005 * g["wall_seconds"], g
' || fail "goodput at 1,024 ranks"
rc=0; out=$(timed diff "$cli" diff "$work/c1024" "$work/s1024") || rc=$?
[[ $rc == 1 ]] && grep -q "only in B: straggler (rank 700)" <<<"$out" || fail "diff at 1,024 ranks: exit $rc: $out"
# The other way: B (the clean run, fixed noise seed: no finding) has nothing A has not: exit 0.
rc=0; out=$("$cli" diff "$work/s1024" "$work/c1024") || rc=$?
[[ $rc == 0 ]] && grep -q "only in A: straggler (rank 700)" <<<"$out" || fail "diff back at 1,024 ranks: exit $rc: $out"
rm -rf "$work/s1024" "$work/c1024"

# Bad input: clear errors, exit 2, nothing half-written.
rc=0; err=$("$cli" report "$work/nonexistent" -o "$work/x.html" 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q "is not a run directory" <<<"$err" || fail "report on a missing run: exit $rc: $err"
rc=0; err=$("$cli" report "$b" -o "/proc/x/report.html" 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q "cannot write" <<<"$err" || fail "report to an unwritable path: exit $rc: $err"
rc=0; err=$("$cli" diff "$a" "$work/nonexistent" 2>&1) || rc=$?
[[ $rc == 2 ]] || fail "diff with a missing run: exit $rc: $err"
echo "report test: ok"
