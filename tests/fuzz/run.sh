#!/usr/bin/env bash
# A short libFuzzer run of the run-log reader and triage (CI runs it for
# $1 seconds, default 30): starts from the seed run directories in corpus/
# (synthetic runs with a hang, a mismatch, a dead rank, corrupt lines, and a
# real 4-rank mismatch with its flight dump), keeps what it learns in a
# scratch corpus, and fails on any crash, leak, sanitizer report or timeout.
# The line fuzzer (rankscope_fuzz_line, one run-log line per input) starts
# from every line of those run logs instead.
set -euo pipefail
seconds=${1:-30}
fuzzer=${2:-build-fuzz/tests/fuzz/rankscope_fuzz_triage}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/artifacts" "$work/seeds"
seeds="$here/corpus"
if [[ $(basename "$fuzzer") == *_line ]]; then
  /usr/bin/python3 - "$here/corpus" "$work/seeds" <<'PY'
import os, sys
src, dst = sys.argv[1:]
n = 0
for name in sorted(os.listdir(src)):
    parts = open(os.path.join(src, name), "rb").read().split(b"\xff")
    for part in parts[0:1] + parts[2:3]:
        for line in part.split(b"\n"):
            if line:
                open(os.path.join(dst, f"{n:05d}"), "wb").write(line)
                n += 1
PY
  seeds="$work/seeds"
fi
TMPDIR="$work" ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$fuzzer" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "$work/corpus" "$seeds" 2>"$work/log" || {
  tail -60 "$work/log"
  for a in "$work"/artifacts/*; do [[ -f $a ]] && { echo "crashing input (base64):"; base64 -w0 "$a"; echo; }; done
  exit 1
}
grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|cov:' "$work/log" | tail -3
echo "fuzz: ok ($seconds s, no crash)"
