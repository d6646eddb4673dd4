#!/usr/bin/env bash
# OTLP export against a receiver that decodes with the OpenTelemetry project's
# own generated protobuf code (tests/otlp/receiver.py: the opentelemetry-proto
# package from PyPI, pinned in requirements/dev.txt):
#  - traces, logs and metrics checked field by field (tests/otlp/check.py) in
#    protobuf, protobuf+gzip and JSON encodings;
#  - reliability: endpoint down, slow (accepts, never answers), returning 500s,
#    returning 503/429 with Retry-After then recovering. Every time: no run-log
#    event lost, no ring drop, memory bounded, flush() and shutdown() return
#    without waiting for the collector, lost batches counted; retries deliver
#    once the endpoint recovers;
#  - an unsupported OTEL_EXPORTER_OTLP_PROTOCOL is a clear error.
set -euo pipefail
emitter=$1 work=$2 python=${3:-python3}
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"; mkdir -p "$work"
fail() { echo "otlp test: $*"; exit 1; }
recv_pid="" n=0
start_receiver() {  # MODE -> sets port, recv_pid, rec (a fresh file per receiver)
  n=$((n + 1))
  rec="$work/rec-$n.jsonl"
  "$python" "$here/otlp/receiver.py" --port 0 --out "$rec" --mode "$1" >"$work/recv.out" 2>&1 &
  recv_pid=$! t0=$SECONDS
  # Until it listens or dies: importing protobuf on a busy machine takes as long as it takes
  # (300 s is a hang guard, not a measurement).
  for _ in $(seq 1 6000); do
    grep -q '^listening' "$work/recv.out" 2>/dev/null && break
    kill -0 "$recv_pid" 2>/dev/null || break
    sleep 0.05
  done
  port=$(awk '/^listening/{print $2}' "$work/recv.out")
  [[ -z "$port" ]] || return 0
  # Why it is gone, for the message: its exit status (128 + N: killed by signal N). In this
  # shell, not in a $(...): only the shell that started it can wait for it.
  local state="still running" rc=0
  if ! kill -0 "$recv_pid" 2>/dev/null; then
    wait "$recv_pid" || rc=$?
    state="exit status $rc"
  fi
  fail "receiver ($1) did not start: $state after $((SECONDS - t0)) s: $(cat "$work/recv.out")"
}
# Once stopped, its pid is forgotten: the EXIT trap must not kill whatever process has that number next.
stop_receiver() {
  [[ -n "$recv_pid" ]] || return 0
  kill "$recv_pid" 2>/dev/null || true
  wait "$recv_pid" 2>/dev/null || true
  recv_pid=""
}
trap stop_receiver EXIT
export OTEL_SERVICE_NAME=trainer-test OTEL_RESOURCE_ATTRIBUTES='deployment.environment=ci,team=ml%20infra'

for enc in protobuf gzip json; do
  start_receiver ok
  proto=http/protobuf comp=none args=()
  [[ $enc == json ]] && proto=http/json && args=(--encoding json)
  [[ $enc == gzip ]] && comp=gzip && args=(--expect-gzip)
  OTEL_EXPORTER_OTLP_PROTOCOL=$proto OTEL_EXPORTER_OTLP_COMPRESSION=$comp \
    OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$port" "$emitter" "$work/run-$enc" 2>/dev/null
  stop_receiver
  "$python" "$here/otlp/check.py" "$rec" "${args[@]}" || fail "$enc: content check failed"
done

# load MODE TIMEOUT_MS FLUSH_MS SHUTDOWN_MS: a 4000-step load with the receiver in MODE ("down":
# nothing listens), OTLP requests timing out after TIMEOUT_MS. Nothing here asserts a duration:
# each deadline is chosen so that the call returning at all (ctest's TIMEOUT is far shorter than
# 10 minutes) proves what is checked, and the durations are printed.
ten_min=600000
load() {
  local mode=$1 url
  if [[ $mode == down ]]; then url="http://127.0.0.1:9"; else start_receiver "$mode"; url="http://127.0.0.1:$port"; fi
  rm -rf "$work/load-$mode"
  out=$(OTEL_EXPORTER_OTLP_TIMEOUT=$2 OTEL_EXPORTER_OTLP_ENDPOINT=$url "$emitter" "$work/load-$mode" --load 4000 "$3" "$4" \
        2>"$work/load-$mode.err")
  [[ $mode == down ]] || stop_receiver
  echo "$mode (request timeout $2 ms, flush $3 ms, shutdown $4 ms): $out"
  val() { grep -oE "$1=-?[0-9.]+" <<<"$out" | cut -d= -f2; }
  [[ $(grep -c '"kind":"step_end"' "$work/load-$mode/rank-1.jsonl") == 4000 ]] || fail "$mode: run log lost steps"
  [[ $(val dropped_events) == 0 ]] || fail "$mode: events dropped from the rings (the background thread blocked?)"
  (($(val rss_growth_kib) < 24576)) || fail "$mode: memory grew by $(val rss_growth_kib) KiB"
}
# A collector down, never answering, or failing: batches are dropped and counted, the run log
# keeps everything. flush() is given 10 minutes: it returns because it gives up on a failing
# collector after one failed attempt (a 1 s request timeout), not at its deadline.
for mode in down slow status500; do
  load $mode 1000 $ten_min 2000
  (($(val otlp_dropped) > 0)) || fail "$mode: no dropped batches counted"
  # ... and the console says so, once: the counter alone is seen by nobody.
  [[ $(grep -c "OTLP endpoint http://127.0.0.1:[0-9]*/v1/traces is not accepting data" "$work/load-$mode.err") == 1 ]] ||
    fail "$mode: the console did not say once that the collector is not accepting data: $(cat "$work/load-$mode.err")"
done
# shutdown() keeps its deadline (2 s) while a request hangs: the collector never answers and
# requests would time out only after 10 minutes.
load slow $ten_min 0 2000
(($(val otlp_dropped) > 0)) || fail "slow, 10-minute requests: what shutdown() abandoned is not counted"
# A collector refusing with Retry-After, then recovering: everything is delivered once it
# recovers (shutdown given 10 minutes: it returns once the queue is empty), nothing dropped.
# The queue (64 requests) holds a whole run's requests (~32 trace batches, a few log batches,
# a metrics export a second), however fast or slowly the machine runs it.
for mode in fail503:2 fail429:1; do
  load $mode 1000 $ten_min $ten_min
  (($(val otlp_retries) >= 1 && $(val otlp_sent) > 0)) || fail "$mode: retries did not deliver"
  [[ $(val otlp_dropped) == 0 ]] || fail "$mode: batches dropped although the endpoint recovered"
  grep -q '"status":503\|"status":429' "$rec" || fail "$mode: the receiver never refused"
done

set +e
err=$(OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9 "$emitter" "$work/bad" 2>&1); rc=$?
set -e
[[ $rc == 1 ]] && grep -q "OTEL_EXPORTER_OTLP_PROTOCOL='grpc' is not supported" <<<"$err" || fail "grpc: $err"
echo "otlp test: ok"
