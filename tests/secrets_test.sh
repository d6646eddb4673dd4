#!/usr/bin/env bash
# Credentials stay in the process: 2 ranks of the example trainer start with a password
# where launch scripts and users put them -
#   MASTER_ADDR=trainer:<pw>@127.0.0.1 (the run id, hence the run directory, comes from it),
#   OTEL_EXPORTER_OTLP_ENDPOINT=http://otel:<pw>@127.0.0.1:PORT (a receiver records every body),
#   OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer <token>,
# with Prometheus (/metrics and textfiles) on; rank 1 then blocks, both stall (stacks, flight
# dumps), and are stopped with SIGTERM. Neither secret may appear in any file or file name the
# run wrote (run directory, ring files, textfiles), in the ranks' console, on /metrics, in the
# OTLP bodies, or in what the CLI prints (status, triage, stacks, summary, timeline, report,
# goodput). The OTLP requests themselves still carry the credentials: the user sent them there.
set -euo pipefail
trainer=$1 cli=$2 work=$3 py=$4
here=$(cd "$(dirname "$0")" && pwd)
source "$here/wait.sh"
rm -rf "$work"; mkdir -p "$work/shm" "$work/prom"
fail() { echo "secrets test: $*"; exit 1; }
pw="Pa55w0rd-$$-planted" token="T0ken-$$-planted"

"$py" "$here/otlp/receiver.py" --port 0 --out "$work/otlp.jsonl" --mode ok >"$work/recv.out" 2>&1 &
recv=$!
pids=()
cleanup() {
  # Only what still runs (jobs -p): a pid already waited for may be another process's now.
  for p in $(jobs -p); do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
wait_for "the OTLP receiver" has "$work/recv.out" '^listening' || fail "receiver did not start"
port=$(awk '/^listening/{print $2}' "$work/recv.out")
base=$((24000 + ($$ % 1500) * 4))

cd "$work"  # the default run directory: ./rankscope-runs/<run id>
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 GROUP_RANK=0 OMP_NUM_THREADS=1 \
  MASTER_ADDR="trainer:$pw@127.0.0.1" MASTER_PORT=29533 \
  OTEL_EXPORTER_OTLP_ENDPOINT="http://otel:$pw@127.0.0.1:$port" \
  OTEL_EXPORTER_OTLP_HEADERS="Authorization=Bearer%20$token" \
  RANKSCOPE_PROMETHEUS_PORT=$base RANKSCOPE_PROMETHEUS_TEXTFILE_DIR="$work/prom" RANKSCOPE_SHM_DIR="$work/shm" \
  RANKSCOPE_STALL_TIMEOUT=2 RANKSCOPE_HEARTBEAT_INTERVAL=0.25 \
    "$trainer" --store "$work/store" --steps 100000 --block-rank 1 --block-step 20 --timeout 600 \
    >"$work/console-$r.log" 2>&1 &
  pids+=($!)
done

page_has_step() {  # both ranks' /metrics, saved once each shows a step
  for r in 0 1; do
    curl -sf "http://127.0.0.1:$((base + r))/metrics" >"$work/metrics-$r.txt" 2>/dev/null || return 1
    grep -q '^rankscope_global_step{' "$work/metrics-$r.txt" || return 1
  done
}
wait_for "both ranks' /metrics with a step" page_has_step || fail "no /metrics pages"
run=""
stalled() {
  run=$(ls -d "$work"/rankscope-runs/*/ 2>/dev/null | head -1 || true)
  [[ -n "$run" ]] && has "$run/rank-0.flight.json" '"reason":"stall"' && has "$run/rank-1.flight.json" '"reason":"stall"' &&
    has "$run/rank-1.jsonl" '"kind":"stacks"'
}
wait_for "both ranks' stall dumps" stalled || fail "the ranks did not stall"
"$cli" status "$run" >"$work/out-status.txt" 2>&1 || true
"$cli" triage "$run" >"$work/out-triage-live.txt" 2>&1 || true
"$cli" stacks "$run" >"$work/out-stacks.txt" 2>&1 || true
kill -TERM "${pids[@]}"
for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
"$cli" summary "$run" >"$work/out-summary.txt" 2>&1 || true
"$cli" triage --json "$run" >"$work/out-triage.json" 2>&1 || true
"$cli" timeline "$run" -o "$work/out-trace.json" >"$work/out-timeline.txt" 2>&1 || true
"$cli" report "$run" -o "$work/out-report.html" >"$work/out-report.txt" 2>&1 || true
"$cli" goodput "$run" >"$work/out-goodput.txt" 2>&1 || true
kill "$recv" 2>/dev/null || true

# The checks mean something only if the run did what they read.
grep -q '"kind":"run_start"' "$run/rank-0.jsonl" || fail "no run_start"
[[ $(grep -c '"path":"/v1/' "$work/otlp.jsonl") -gt 0 ]] || fail "the receiver got no OTLP request"
ls "$work"/prom/*.prom >/dev/null 2>&1 || fail "no Prometheus textfile"
grep -q "127.0.0.1" <<<"$(basename "$run")" || fail "the run id did not come from MASTER_ADDR: $(basename "$run")"

leaks=""
for secret in "$pw" "$token"; do
  hits=$(grep -rlF -- "$secret" "$work" || true)
  names=$(find "$work" -name "*$secret*" || true)
  [[ -z "$hits$names" ]] || leaks+="'$secret' in: $hits $names"$'\n'
done
[[ -z "$leaks" ]] || fail "secrets left the process:
$leaks"
echo "secrets test: ok (run $(basename "$run"); checked $(find "$work" -type f | wc -l) files)"
