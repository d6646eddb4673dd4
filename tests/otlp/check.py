"""Checks what receiver.py recorded against the known output of rankscope's OTLP
test program (tests/otlp_emitter.cpp: rank 1 of a world of 2).

    python check.py FILE [--encoding protobuf|json] [--expect-gzip]

Only requests answered with 200 are inspected, except that any request the
receiver flagged as malformed ("error") is a failure by itself. Prints one line
per failed assertion and exits 1, or a one-line summary and exits 0. Bodies are
OTLP/JSON-shaped whichever encoding was used; OTLP/JSON allows int64 as numbers
or strings, so every integer goes through to_int() and every double through
as_number().
"""
import argparse
import json
import math
import re
import sys

failures = []
precision_warnings = set()


def fail(msg):
    failures.append(msg)


def expect(cond, msg):
    if not cond:
        fail(msg)
    return bool(cond)


MIN_TIME_NS = 1600000000000000000  # 2020-09-13; anything older is not a real clock
INT_RE = re.compile(r"-?[0-9]+")
NUM_RE = re.compile(r"NaN|-?Infinity|-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def to_int(v, what):
    """An int64/uint64/int32 field as int, or None if invalid. A JSON number counts
    if it is integral (JSON does not tell 1.0 or 1e3 apart from 1 and 1000)."""
    if isinstance(v, str) and INT_RE.fullmatch(v):
        return int(v)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, int) and not isinstance(v, bool):
        if abs(v) >= 2**53:  # beyond JavaScript's safe integers: most consumers round it
            precision_warnings.add(what)
        return v
    return None


def as_number(v):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str) and NUM_RE.fullmatch(v):
        return float(v.replace("Infinity", "inf"))
    return None


def time_or_zero(obj, key, what):
    """An absent proto3 scalar means its default; a present one (even null) must be valid."""
    return 0 if key not in obj else to_int(obj[key], what)


def is_id(v, pattern):
    """Lowercase hex of the right length and not all zero."""
    return isinstance(v, str) and bool(pattern.fullmatch(v)) and set(v) != {"0"}


def describe(v):
    return json.dumps(v)


def as_list(v, where):
    """A repeated field: absent means empty, anything but an array is a failure."""
    if v is None:
        return []
    return v if expect(isinstance(v, list), f"{where} is not an array: {describe(v)}") else []


# ---------------------------------------------------------------- attributes

def attr_map(obj, where):
    """obj's attributes (KeyValue list) as key -> AnyValue. Duplicate keys are invalid in OTLP."""
    out = {}
    if "attributes" not in obj:
        return out
    lst = obj["attributes"]
    if not expect(isinstance(lst, list), f"{where}: attributes is not an array: {describe(lst)}"):
        return out
    for kv in lst:
        if kv.get("key") in out:
            fail(f"{where}: duplicate attribute key {describe(kv.get('key'))}")
        out[kv.get("key")] = kv.get("value") or {}
    return out


_MISSING = object()


def typed_attr(attrs, key, kind, where):
    if key not in attrs:
        fail(f"{where}: missing attribute {key}")
        return _MISSING
    value = attrs[key]
    if list(value) != [kind]:
        fail(f"{where}: attribute {key} should be a {kind}, got {describe(value)}")
        return _MISSING
    return value[kind]


def _match(v, expected, what):
    """expected is a value to equal, or a function that makes its own assertions."""
    if callable(expected):
        expected(v)
    else:
        expect(v == expected, f"{what} = {describe(v)}, expected {describe(expected)}")


def expect_string_attr(attrs, key, expected, where):
    v = typed_attr(attrs, key, "stringValue", where)
    if v is not _MISSING:
        _match(v, expected, f"{where}: {key}")


def expect_int_attr(attrs, key, expected, where):
    v = typed_attr(attrs, key, "intValue", where)
    if v is _MISSING:
        return
    n = to_int(v, f"{where} {key}")
    if expect(n is not None, f"{where}: {key} intValue is not an integer: {describe(v)}"):
        _match(n, expected, f"{where}: {key}")


def expect_double_attr(attrs, key, check, where):
    v = typed_attr(attrs, key, "doubleValue", where)
    if v is _MISSING:
        return
    d = as_number(v)
    if expect(d is not None, f"{where}: {key} doubleValue is not a number: {describe(v)}"):
        check(d)


def expect_bool_attr(attrs, key, expected, where):
    v = typed_attr(attrs, key, "boolValue", where)
    if v is not _MISSING:
        expect(v is expected, f"{where}: {key} = {describe(v)}, expected {describe(expected)}")


# ------------------------------------------------------------------ requests

SIGNALS = {
    "/v1/traces": ("resourceSpans", "scopeSpans", "spans"),
    "/v1/logs": ("resourceLogs", "scopeLogs", "logRecords"),
    "/v1/metrics": ("resourceMetrics", "scopeMetrics", "metrics"),
}
RESOURCE_KEYS = [s[0] for s in SIGNALS.values()]


def load_records(path):
    try:
        with open(path) as f:
            lines = f.read().split("\n")
    except OSError as e:
        sys.exit(f"check.py: cannot read {path}: {e}")
    records = []
    for i, line in enumerate(lines):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError as e:
                fail(f"{path}:{i + 1}: not valid JSON: {e}")
    return records


def check_resource(resource, where):
    if not expect(isinstance(resource, dict), f"{where}: resource is missing"):
        return
    attrs = attr_map(resource, where)
    expect_string_attr(attrs, "service.name", "trainer-test", where)
    expect_int_attr(attrs, "rankscope.rank", 1, where)
    expect_int_attr(attrs, "rankscope.local_rank", 1, where)
    expect_int_attr(attrs, "rankscope.world_size", 2, where)
    expect_string_attr(attrs, "host.name", lambda v: expect(v != "", f"{where}: host.name is empty"), where)
    expect_string_attr(attrs, "rankscope.run_id", "otlp-test", where)
    # These two come from OTEL_RESOURCE_ATTRIBUTES and test percent-decoding.
    expect_string_attr(attrs, "deployment.environment", "ci", where)
    expect_string_attr(attrs, "team", "ml infra", where)


def check_request(rec, index, opts):
    """Transport-level properties and resources of one request; returns (path, items)."""
    where = f"request #{index} ({rec.get('path')})"
    path = str(rec.get("path")).split("?")[0]
    if not expect(path in SIGNALS, f"{where}: unexpected path"):
        return path, []
    resources_key, scopes_key, items_key = SIGNALS[path]
    media = str(rec.get("contentType") or "").split(";")[0].strip().lower()
    want = "application/json" if opts.encoding == "json" else "application/x-protobuf"
    expect(media == want, f"{where}: Content-Type {describe(rec.get('contentType'))}, expected {want}")
    if opts.expect_gzip:
        expect(str(rec.get("contentEncoding") or "").lower() == "gzip",
               f"{where}: Content-Encoding {describe(rec.get('contentEncoding'))}, expected gzip")
    body = rec.get("body")
    if not expect(isinstance(body, dict), f"{where}: no decoded body"):
        return path, []
    for key in RESOURCE_KEYS:
        if key != resources_key:
            expect(key not in body, f"{where}: body of {path} contains {key}")
    resources = body.get(resources_key)
    if not expect(isinstance(resources, list) and resources, f"{where}: body has no {resources_key}"):
        return path, []
    items = []
    for ri, r in enumerate(resources):
        check_resource(r.get("resource"), f"{where} {resources_key}[{ri}].resource")
        for si, scope in enumerate(as_list(r.get(scopes_key), f"{where} {resources_key}[{ri}].{scopes_key}")):
            items += as_list(scope.get(items_key), f"{where} {resources_key}[{ri}].{scopes_key}[{si}].{items_key}")
    return path, items


# -------------------------------------------------------------------- traces

HEX32 = re.compile(r"[0-9a-f]{32}")
HEX16 = re.compile(r"[0-9a-f]{16}")


def check_traces(spans):
    seen = set()
    for i, s in enumerate(spans):
        where = f"span {describe(s.get('name'))} (#{i})"
        trace_id, span_id, parent = s.get("traceId", ""), s.get("spanId", ""), s.get("parentSpanId", "")
        expect(is_id(trace_id, HEX32),
               f"{where}: traceId {describe(trace_id)} is not 32 lowercase hex chars / is all zero")
        expect(is_id(span_id, HEX16),
               f"{where}: spanId {describe(span_id)} is not 16 lowercase hex chars / is all zero")
        expect(parent == "" or (isinstance(parent, str) and HEX16.fullmatch(parent)),
               f"{where}: parentSpanId {describe(parent)} is malformed")
        expect(span_id not in seen, f"{where}: spanId {span_id} is not unique")
        seen.add(span_id)
        start = time_or_zero(s, "startTimeUnixNano", "span startTimeUnixNano")
        end = time_or_zero(s, "endTimeUnixNano", "span endTimeUnixNano")
        if expect(start is not None and end is not None,
                  f"{where}: bad timestamps {describe(s.get('startTimeUnixNano'))} / {describe(s.get('endTimeUnixNano'))}"):
            expect(start > MIN_TIME_NS, f"{where}: startTimeUnixNano {start} is not > 1.6e18")
            expect(end > MIN_TIME_NS, f"{where}: endTimeUnixNano {end} is not > 1.6e18")
            expect(start <= end, f"{where}: startTimeUnixNano {start} > endTimeUnixNano {end}")

    steps = [s for s in spans if str(s.get("name", "")).startswith("step ")]
    expect(len(steps) == 3, f"traces: expected exactly 3 step spans, got {len(steps)}: "
                            f"{describe([s.get('name') for s in steps])}")
    step_trace_ids = set()
    for n in range(3):
        name = f"step {n}"
        matches = [s for s in steps if s.get("name") == name]
        if not expect(len(matches) == 1, f'traces: expected exactly one span named "{name}", got {len(matches)}'):
            continue
        step = matches[0]
        where = f'span "{name}"'
        expect(step.get("parentSpanId", "") == "",
               f"{where}: parentSpanId should be empty, got {describe(step.get('parentSpanId'))}")
        expect(to_int(step.get("kind"), "kind") == 1, f"{where}: kind {describe(step.get('kind'))}, expected 1 (SPAN_KIND_INTERNAL)")
        expect_int_attr(attr_map(step, where), "rankscope.step", n, where)
        expect(step.get("traceId") not in step_trace_ids, f"{where}: traceId {step.get('traceId')} is shared with another step")
        step_trace_ids.add(step.get("traceId"))
        children = [s for s in spans
                    if s.get("traceId") == step.get("traceId") and s.get("parentSpanId", "") == step.get("spanId")]
        for child in ("forward", "backward", "all_reduce"):
            found = [s for s in children if s.get("name") == child]
            expect(len(found) == 1, f'{where}: expected exactly one child "{child}" (same traceId, '
                                    f"parentSpanId = step spanId), got {len(found)}")
        all_reduce = next((s for s in children if s.get("name") == "all_reduce"), None)
        if all_reduce:
            check_all_reduce(all_reduce, n)
        # The rank's wait for it at the end of backward (on the collective's event, as DDP's is
        # recorded): a phase span of the collective kind, nested in backward, ending with it.
        waits = [s for s in children if s.get("name") == "ddp_all_reduce_wait"]
        if expect(len(waits) == 1, f'{where}: expected exactly one child "ddp_all_reduce_wait", got {len(waits)}') \
                and all_reduce:
            w = waits[0]
            attrs = attr_map(w, f'span "ddp_all_reduce_wait" under "{name}"')
            expect_string_attr(attrs, "rankscope.phase_kind", "collective", "ddp_all_reduce_wait")
            expect_string_attr(attrs, "rankscope.parent_phase", "backward", "ddp_all_reduce_wait")
            expect(to_int(w.get("endTimeUnixNano"), "end") == to_int(all_reduce.get("endTimeUnixNano"), "end"),
                   f"{where}: the wait does not end with the all-reduce")
            expect(to_int(w.get("startTimeUnixNano"), "start") > to_int(all_reduce.get("startTimeUnixNano"), "start"),
                   f"{where}: the wait does not start after the all-reduce's issue")


def check_all_reduce(span, n):
    where = f'span "all_reduce" under "step {n}"'
    attrs = attr_map(span, where)
    expect_string_attr(attrs, "rankscope.collective.op", "all_reduce", where)
    expect_string_attr(attrs, "rankscope.collective.comm", "world", where)
    expect_int_attr(attrs, "rankscope.collective.seq", n + 1, where)
    expect_int_attr(attrs, "rankscope.collective.count", 1024, where)
    expect_int_attr(attrs, "rankscope.collective.bytes", 4096, where)
    expect_string_attr(attrs, "rankscope.collective.dtype", "float32", where)
    expect_double_attr(attrs, "rankscope.collective.busbw_gbps",
                       lambda d: expect(math.isfinite(d) and d >= 0, f"{where}: busbw_gbps {d} is not a finite value >= 0"),
                       where)


# ---------------------------------------------------------------------- logs

def find_log(records, text):
    found = [r for r in records if (r.get("body") or {}).get("stringValue") == text]
    expect(len(found) == 1, f"logs: expected exactly one record with body {describe(text)}, got {len(found)}")
    return found[0] if found else None


def check_log_common(rec, number, text, where):
    expect(to_int(rec.get("severityNumber"), "severityNumber") == number,
           f"{where}: severityNumber {describe(rec.get('severityNumber'))}, expected {number}")
    expect(rec.get("severityText") == text, f"{where}: severityText {describe(rec.get('severityText'))}, expected {describe(text)}")
    t = time_or_zero(rec, "timeUnixNano", "log timeUnixNano")
    expect(t is not None and t > MIN_TIME_NS, f"{where}: timeUnixNano {describe(rec.get('timeUnixNano'))} is not > 1.6e18")


def check_logs(records):
    warn = find_log(records, "slow checkpoint write")
    if warn:
        where = 'log "slow checkpoint write"'
        check_log_common(warn, 13, "WARN", where)
        attrs = attr_map(warn, where)
        expect_string_attr(attrs, "path", "/ckpt/x", where)
        expect_int_attr(attrs, "bytes", 4096, where)
        expect_double_attr(attrs, "ratio", lambda d: expect(d == 0.5, f"{where}: ratio {d}, expected 0.5"), where)
        expect_bool_attr(attrs, "ok", False, where)
        expect_string_attr(attrs, "code.filepath", lambda v: expect(
            v.endswith("otlp_emitter.cpp"), f"{where}: code.filepath {describe(v)} does not end with otlp_emitter.cpp"), where)
        expect_int_attr(attrs, "code.lineno", lambda n: expect(n > 0, f"{where}: code.lineno {n} is not > 0"), where)
    info = find_log(records, "hello 42")
    if info:
        check_log_common(info, 9, "INFO", 'log "hello 42"')


# ------------------------------------------------------------------- metrics

METRIC_KINDS = ["sum", "gauge", "histogram", "exponentialHistogram", "summary"]


def point_value(p):
    if "asDouble" in p:
        return as_number(p["asDouble"])
    if "asInt" in p:
        n = to_int(p["asInt"], "asInt")
        return None if n is None else float(n)
    return None


def check_metrics(metrics):
    last = {}  # name -> (kind, data, last point), in arrival order
    for i, m in enumerate(metrics):
        where = f"metric {describe(m.get('name'))} (#{i})"
        kinds = [k for k in METRIC_KINDS if k in m]
        if not expect(len(kinds) == 1, f"{where}: expected exactly one data kind, got {describe(kinds)}"):
            continue
        data = m[kinds[0]]
        points = as_list(data.get("dataPoints"), f"{where} dataPoints")
        for pi, p in enumerate(points):
            pw = f"{where} dataPoints[{pi}]"
            start = time_or_zero(p, "startTimeUnixNano", "metric startTimeUnixNano")
            t = time_or_zero(p, "timeUnixNano", "metric timeUnixNano")
            if not expect(start is not None and t is not None,
                          f"{pw}: bad timestamps {describe(p.get('startTimeUnixNano'))} / {describe(p.get('timeUnixNano'))}"):
                continue
            expect(t > MIN_TIME_NS, f"{pw}: timeUnixNano {t} is not > 1.6e18")
            expect(start <= t, f"{pw}: startTimeUnixNano {start} > timeUnixNano {t}")
        if points:
            last[m.get("name")] = (kinds[0], data, points[-1])

    def get(name, kind):
        entry = last.get(name)
        if not expect(entry, f'metrics: no data point for "{name}"'):
            return None
        if not expect(entry[0] == kind, f'metric "{name}": is a {entry[0]}, expected {kind}'):
            return None
        return entry

    samples = get("samples_total", "sum")
    if samples:
        where = 'metric "samples_total"'
        _, data, point = samples
        expect(data.get("isMonotonic") is True, f"{where}: isMonotonic {describe(data.get('isMonotonic'))}, expected true")
        expect(to_int(data.get("aggregationTemporality"), "aggregationTemporality") == 2,
               f"{where}: aggregationTemporality {describe(data.get('aggregationTemporality'))}, expected 2 (CUMULATIVE)")
        v = point_value(point)
        expect(v == 96, f"{where}: value {describe(v)} (point {describe(point)}), expected 96")
    loss = get("train_loss", "gauge")
    if loss:
        v = point_value(loss[2])
        expect(v is not None and abs(v - 0.3) < 1e-9, f'metric "train_loss": value {describe(v)}, expected 0.3')
    hist = get("batch_seconds", "histogram")
    if hist:
        where = 'metric "batch_seconds"'
        _, data, p = hist
        expect(to_int(data.get("aggregationTemporality"), "aggregationTemporality") == 2,
               f"{where}: aggregationTemporality {describe(data.get('aggregationTemporality'))}, expected 2 (CUMULATIVE)")
        bounds = [as_number(b) for b in as_list(p.get("explicitBounds"), f"{where} explicitBounds")]
        expect(bounds == [0.1, 1, 10], f"{where}: explicitBounds {describe(p.get('explicitBounds'))}, expected [0.1,1,10]")
        counts = [to_int(c, "bucketCounts") for c in as_list(p.get("bucketCounts"), f"{where} bucketCounts")]
        expect(counts == [1, 1, 1, 1], f"{where}: bucketCounts {describe(p.get('bucketCounts'))}, expected [1,1,1,1]")
        expect(time_or_zero(p, "count", "count") == 4, f"{where}: count {describe(p.get('count'))}, expected 4")
        s = as_number(p["sum"]) if "sum" in p else None
        expect(s is not None and abs(s - 55.55) <= 1e-9, f"{where}: sum {describe(p.get('sum'))}, expected 55.55")
    expect(any(m.get("name") == "rankscope_events_dropped_total" for m in metrics),
           'metrics: no metric named "rankscope_events_dropped_total"')
    # The training signals, as Prometheus has them (one implementation: training_signals.hpp).
    for name, kind, want in (("rankscope_loss", "gauge", 0.3), ("rankscope_learning_rate", "gauge", 0.01),
                             ("rankscope_global_step", "gauge", 2), ("rankscope_samples_total", "sum", 96),
                             ("rankscope_checkpoint_age_seconds", "gauge", None),
                             ("rankscope_heartbeat_age_seconds", "gauge", None)):
        entry = get(name, kind)
        if entry and want is not None:
            v = point_value(entry[2])
            expect(v is not None and abs(v - want) < 1e-9, f'metric "{name}": value {describe(v)}, expected {want}')
    # Ages and rates: present and plausible (a run of well under a minute).
    for name in ("rankscope_checkpoint_age_seconds", "rankscope_heartbeat_age_seconds", "rankscope_samples_per_second"):
        entry = get(name, "gauge")
        if entry:
            v = point_value(entry[2])
            low, high = (0, 60) if "age" in name else (1e-9, 1e12)
            expect(v is not None and low <= v < high, f'metric "{name}": value {describe(v)}, expected in [{low}, {high})')
    # Resource snapshots (fake NVML: rank 1's GPU is GPU 1, 70 W, 61 C) and the process's own.
    for name, want, gpu in (("rankscope_gpu_power_watts", 70, "1"), ("rankscope_gpu_temperature_celsius", 61, "1"),
                            ("rankscope_process_resident_memory_bytes", None, None),
                            ("rankscope_host_memory_available_bytes", None, None)):
        entry = get(name, "gauge")
        if not entry:
            continue
        v = point_value(entry[2])
        attrs = {a.get("key"): a.get("value", {}).get("stringValue") for a in entry[2].get("attributes", [])}
        expect(v is not None and (v == want if want is not None else v > 0),
               f'metric "{name}": value {describe(v)}, expected {want if want is not None else "> 0"}')
        if gpu is not None:
            expect(attrs.get("gpu") == gpu, f'metric "{name}": gpu attribute {describe(attrs.get("gpu"))}, expected {gpu}')
    for name, count in (("rankscope_loader_wait_seconds", 3), ("rankscope_collective_seconds", 3),
                        ("rankscope_checkpoint_save_seconds", 1)):
        entry = get(name, "histogram")
        if entry:
            expect(time_or_zero(entry[2], "count", "count") == count,
                   f'metric "{name}": count {describe(entry[2].get("count"))}, expected {count}')


def main():
    ap = argparse.ArgumentParser(prog="check.py")
    ap.add_argument("file")
    ap.add_argument("--encoding", choices=["protobuf", "json"], default="protobuf")
    ap.add_argument("--expect-gzip", action="store_true")
    opts = ap.parse_args()
    records = load_records(opts.file)
    for i, r in enumerate(records):  # malformed requests are emitter bugs whatever status they got
        if r.get("error"):
            fail(f"request #{i} ({r.get('path')}): receiver rejected it: {r['error']}")
    ok = [(i, r) for i, r in enumerate(records) if r.get("status") == 200]
    expect(ok, f"{opts.file}: no request was answered with 200 ({len(records)} recorded)")
    items = {p: [] for p in SIGNALS}
    try:
        for i, r in ok:
            path, got = check_request(r, i, opts)
            if path in items:
                items[path] += got
        check_traces(items["/v1/traces"])
        check_logs(items["/v1/logs"])
        check_metrics(items["/v1/metrics"])
    except (AttributeError, TypeError, KeyError) as e:  # a body of a shape no OTLP message has
        fail(f"unreadable body: {type(e).__name__}: {e}")
    for what in sorted(precision_warnings):
        sys.stderr.write(f"check.py: warning: {what} sent as a JSON number beyond 2^53 (precision lost); "
                         "ProtoJSON emits int64 as strings\n")
    if failures:
        for f in failures:
            print(f"FAIL: {f}")
        print(f"{len(failures)} assertion(s) failed in {opts.file}")
        return 1
    gz = ", gzip" if opts.expect_gzip else ""
    print(f"OK: {len(ok)} request(s) ({opts.encoding}{gz}; {len(records) - len(ok)} non-200 ignored): "
          f"{len(items['/v1/traces'])} spans, {len(items['/v1/logs'])} log records, "
          f"{len(items['/v1/metrics'])} metrics checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
