#!/usr/bin/env node
// Checks what receiver.js recorded against the known output of rankscope's
// OTLP test program (rank 1 of a world of 2).
//
//   node check.js FILE [--encoding protobuf|json] [--expect-gzip]
//
// Only requests answered with 200 are inspected, except that any request the
// receiver flagged as malformed ("error" field) is a failure by itself.
// Prints one line per failed assertion and exits 1, or prints a one-line
// summary and exits 0.
//
// Bodies are OTLP/JSON-shaped whichever wire encoding was used, but OTLP/JSON
// allows int64 values as numbers or strings (and receiver.js emits strings),
// so every integer is read through toBigInt() and every double through
// asNumber().

'use strict';

const fs = require('fs');

const failures = [];
function fail(msg) {
  failures.push(msg);
}
// Returns the condition so callers can skip dependent checks.
function expect(cond, msg) {
  if (!cond) fail(msg);
  return !!cond;
}

// ---------------------------------------------------------------- arguments

function parseArgs(argv) {
  const opts = { file: null, encoding: 'protobuf', expectGzip: false };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--encoding') opts.encoding = argv[++i];
    else if (arg === '--expect-gzip') opts.expectGzip = true;
    else if (!arg.startsWith('--') && opts.file === null) opts.file = arg;
    else usage(`unexpected argument ${arg}`);
  }
  if (!opts.file) usage('FILE is required');
  if (opts.encoding !== 'protobuf' && opts.encoding !== 'json') usage('--encoding must be protobuf or json');
  return opts;
}

function usage(msg) {
  process.stderr.write(`check.js: ${msg}\n` +
    'usage: node check.js FILE [--encoding protobuf|json] [--expect-gzip]\n');
  process.exit(2);
}

// ------------------------------------------------------------ normalisation

const MIN_TIME_NS = 1600000000000000000n; // 2020-09-13; anything older is not a real clock
const INT_RE = /^-?\d+$/;

// Unsafe JSON numbers were already rounded by JSON.parse, so an emitter that
// writes nanosecond timestamps as numbers loses precision in most consumers.
// That is allowed by ProtoJSON, hence a warning rather than a failure.
const precisionWarnings = new Set();

// Integer (int64/uint64/fixed64 or int32) as BigInt, or null if absent/invalid.
function toBigInt(v, what) {
  if (typeof v === 'string' && INT_RE.test(v)) return BigInt(v);
  if (typeof v === 'number' && Number.isInteger(v)) {
    if (!Number.isSafeInteger(v)) precisionWarnings.add(what);
    return BigInt(v);
  }
  return null;
}

// ProtoJSON writes non-finite doubles as "NaN"/"Infinity"/"-Infinity".
function asNumber(v) {
  if (typeof v === 'number') return v;
  if (typeof v === 'string' && /^(NaN|-?Infinity|-?\d+(\.\d+)?([eE][-+]?\d+)?)$/.test(v)) return Number(v);
  return null;
}

// Absent proto3 scalars mean their default value (receiver.js records only
// fields present on the wire; OTLP/JSON emitters may omit defaults too).
const timeOrZero = (v, what) => (v === undefined ? 0n : toBigInt(v, what));
const idOrEmpty = (v) => (v === undefined ? '' : v);

function describe(v) {
  return JSON.stringify(v);
}

// ------------------------------------------------------------- attributes

// KeyValue list -> Map(key -> AnyValue). Duplicate keys are invalid in OTLP.
function attrMap(list, where) {
  const map = new Map();
  if (list === undefined) return map;
  if (!expect(Array.isArray(list), `${where}: attributes is not an array: ${describe(list)}`)) return map;
  for (const kv of list) {
    if (map.has(kv.key)) fail(`${where}: duplicate attribute key ${describe(kv.key)}`);
    map.set(kv.key, kv.value || {});
  }
  return map;
}

// Returns the attribute's payload if it is set with exactly the expected
// AnyValue kind, otherwise records a failure and returns undefined.
function typedAttr(attrs, key, kind, where) {
  if (!attrs.has(key)) {
    fail(`${where}: missing attribute ${key}`);
    return undefined;
  }
  const value = attrs.get(key);
  const kinds = Object.keys(value);
  if (kinds.length !== 1 || kinds[0] !== kind) {
    fail(`${where}: attribute ${key} should be a ${kind}, got ${describe(value)}`);
    return undefined;
  }
  return value[kind];
}

function expectStringAttr(attrs, key, expected, where) {
  const v = typedAttr(attrs, key, 'stringValue', where);
  if (v === undefined) return;
  if (typeof expected === 'function') expected(v);
  else expect(v === expected, `${where}: ${key} = ${describe(v)}, expected ${describe(expected)}`);
}

function expectIntAttr(attrs, key, expected, where) {
  const v = typedAttr(attrs, key, 'intValue', where);
  if (v === undefined) return;
  const n = toBigInt(v, `${where} ${key}`);
  if (!expect(n !== null, `${where}: ${key} intValue is not an integer: ${describe(v)}`)) return;
  if (typeof expected === 'function') expected(n);
  else expect(n === BigInt(expected), `${where}: ${key} = ${n}, expected ${expected}`);
}

function expectDoubleAttr(attrs, key, check, where) {
  const v = typedAttr(attrs, key, 'doubleValue', where);
  if (v === undefined) return;
  const d = asNumber(v);
  if (!expect(d !== null, `${where}: ${key} doubleValue is not a number: ${describe(v)}`)) return;
  check(d);
}

function expectBoolAttr(attrs, key, expected, where) {
  const v = typedAttr(attrs, key, 'boolValue', where);
  if (v === undefined) return;
  expect(v === expected, `${where}: ${key} = ${describe(v)}, expected ${expected}`);
}

// ----------------------------------------------------------------- requests

const SIGNALS = {
  '/v1/traces': { resources: 'resourceSpans', scopes: 'scopeSpans', items: 'spans' },
  '/v1/logs': { resources: 'resourceLogs', scopes: 'scopeLogs', items: 'logRecords' },
  '/v1/metrics': { resources: 'resourceMetrics', scopes: 'scopeMetrics', items: 'metrics' },
};
const RESOURCE_KEYS = Object.values(SIGNALS).map((s) => s.resources);

function loadRecords(file) {
  let text;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    usage(`cannot read ${file}: ${e.message}`);
  }
  const records = [];
  text.split('\n').forEach((line, i) => {
    if (line.trim() === '') return;
    try {
      records.push(JSON.parse(line));
    } catch (e) {
      fail(`${file}:${i + 1}: not valid JSON: ${e.message}`);
    }
  });
  return records;
}

function checkResource(resource, where) {
  if (!expect(resource && typeof resource === 'object', `${where}: resource is missing`)) return;
  const attrs = attrMap(resource.attributes, where);
  expectStringAttr(attrs, 'service.name', 'trainer-test', where);
  expectIntAttr(attrs, 'rankscope.rank', 1, where);
  expectIntAttr(attrs, 'rankscope.local_rank', 1, where);
  expectIntAttr(attrs, 'rankscope.world_size', 2, where);
  expectStringAttr(attrs, 'host.name', (v) => expect(v !== '', `${where}: host.name is empty`), where);
  expectStringAttr(attrs, 'rankscope.run_id', 'otlp-test', where);
  // These two come from OTEL_RESOURCE_ATTRIBUTES and test percent-decoding.
  expectStringAttr(attrs, 'deployment.environment', 'ci', where);
  expectStringAttr(attrs, 'team', 'ml infra', where);
}

// Validates transport-level properties and resources of one request and
// returns its items (spans / logRecords / metrics) in order.
function checkRequest(rec, index, opts) {
  const where = `request #${index} (${rec.path})`;
  const path = String(rec.path).split('?')[0];
  const signal = SIGNALS[path];
  if (!expect(signal, `${where}: unexpected path`)) return { path, items: [] };

  const mediaType = String(rec.contentType || '').split(';')[0].trim().toLowerCase();
  const wantType = opts.encoding === 'json' ? 'application/json' : 'application/x-protobuf';
  expect(mediaType === wantType, `${where}: Content-Type ${describe(rec.contentType)}, expected ${wantType}`);
  if (opts.expectGzip) {
    expect(String(rec.contentEncoding || '').toLowerCase() === 'gzip',
      `${where}: Content-Encoding ${describe(rec.contentEncoding)}, expected gzip`);
  }

  const body = rec.body;
  if (!expect(body && typeof body === 'object', `${where}: no decoded body`)) return { path, items: [] };
  for (const key of RESOURCE_KEYS) {
    if (key !== signal.resources) expect(!(key in body), `${where}: body of ${path} contains ${key}`);
  }
  const resources = body[signal.resources];
  if (!expect(Array.isArray(resources) && resources.length > 0,
    `${where}: body has no ${signal.resources}`)) return { path, items: [] };

  const items = [];
  resources.forEach((r, ri) => {
    checkResource(r.resource, `${where} ${signal.resources}[${ri}].resource`);
    for (const scope of r[signal.scopes] || []) items.push(...(scope[signal.items] || []));
  });
  return { path, items };
}

// ------------------------------------------------------------------- traces

const HEX32 = /^[0-9a-f]{32}$/;
const HEX16 = /^[0-9a-f]{16}$/;
const ALL_ZERO = /^0+$/;

function checkTraces(spans) {
  const seenSpanIds = new Set();
  spans.forEach((s, i) => {
    const where = `span ${describe(s.name)} (#${i})`;
    const traceId = idOrEmpty(s.traceId);
    const spanId = idOrEmpty(s.spanId);
    const parent = idOrEmpty(s.parentSpanId);
    expect(HEX32.test(traceId) && !ALL_ZERO.test(traceId),
      `${where}: traceId ${describe(traceId)} is not 32 lowercase hex chars / is all zero`);
    expect(HEX16.test(spanId) && !ALL_ZERO.test(spanId),
      `${where}: spanId ${describe(spanId)} is not 16 lowercase hex chars / is all zero`);
    expect(parent === '' || HEX16.test(parent), `${where}: parentSpanId ${describe(parent)} is malformed`);
    expect(!seenSpanIds.has(spanId), `${where}: spanId ${spanId} is not unique`);
    seenSpanIds.add(spanId);

    const start = timeOrZero(s.startTimeUnixNano, 'span startTimeUnixNano');
    const end = timeOrZero(s.endTimeUnixNano, 'span endTimeUnixNano');
    if (expect(start !== null && end !== null,
      `${where}: bad timestamps ${describe(s.startTimeUnixNano)} / ${describe(s.endTimeUnixNano)}`)) {
      expect(start > MIN_TIME_NS, `${where}: startTimeUnixNano ${start} is not > 1.6e18`);
      expect(end > MIN_TIME_NS, `${where}: endTimeUnixNano ${end} is not > 1.6e18`);
      expect(start <= end, `${where}: startTimeUnixNano ${start} > endTimeUnixNano ${end}`);
    }
  });

  const steps = spans.filter((s) => /^step /.test(s.name || ''));
  expect(steps.length === 3,
    `traces: expected exactly 3 step spans, got ${steps.length}: ${describe(steps.map((s) => s.name))}`);
  const stepTraceIds = new Set();

  for (let n = 0; n < 3; n++) {
    const name = `step ${n}`;
    const matches = steps.filter((s) => s.name === name);
    if (!expect(matches.length === 1, `traces: expected exactly one span named "${name}", got ${matches.length}`)) continue;
    const step = matches[0];
    const where = `span "${name}"`;
    expect(idOrEmpty(step.parentSpanId) === '', `${where}: parentSpanId should be empty, got ${describe(step.parentSpanId)}`);
    expect(toBigInt(step.kind, 'kind') === 1n, `${where}: kind ${describe(step.kind)}, expected 1 (SPAN_KIND_INTERNAL)`);
    expectIntAttr(attrMap(step.attributes, where), 'rankscope.step', n, where);
    expect(!stepTraceIds.has(step.traceId), `${where}: traceId ${step.traceId} is shared with another step`);
    stepTraceIds.add(step.traceId);

    const children = spans.filter((s) => s.traceId === step.traceId && idOrEmpty(s.parentSpanId) === step.spanId);
    for (const childName of ['forward', 'backward', 'all_reduce']) {
      const found = children.filter((s) => s.name === childName);
      expect(found.length === 1,
        `${where}: expected exactly one child "${childName}" (same traceId, parentSpanId = step spanId), got ${found.length}`);
    }
    const allReduce = children.find((s) => s.name === 'all_reduce');
    if (allReduce) checkAllReduce(allReduce, n);
  }
}

function checkAllReduce(span, n) {
  const where = `span "all_reduce" under "step ${n}"`;
  const attrs = attrMap(span.attributes, where);
  expectStringAttr(attrs, 'rankscope.collective.op', 'all_reduce', where);
  expectStringAttr(attrs, 'rankscope.collective.comm', 'world', where);
  expectIntAttr(attrs, 'rankscope.collective.seq', n + 1, where);
  expectIntAttr(attrs, 'rankscope.collective.count', 1024, where);
  expectIntAttr(attrs, 'rankscope.collective.bytes', 4096, where);
  expectStringAttr(attrs, 'rankscope.collective.dtype', 'float32', where);
  expectDoubleAttr(attrs, 'rankscope.collective.busbw_gbps',
    (d) => expect(Number.isFinite(d) && d >= 0, `${where}: busbw_gbps ${d} is not a finite value >= 0`), where);
}

// --------------------------------------------------------------------- logs

function findLog(records, bodyText) {
  const found = records.filter((r) => r.body && r.body.stringValue === bodyText);
  expect(found.length === 1, `logs: expected exactly one record with body ${describe(bodyText)}, got ${found.length}`);
  return found[0];
}

function checkLogCommon(rec, severityNumber, severityText, where) {
  expect(toBigInt(rec.severityNumber, 'severityNumber') === BigInt(severityNumber),
    `${where}: severityNumber ${describe(rec.severityNumber)}, expected ${severityNumber}`);
  expect(rec.severityText === severityText, `${where}: severityText ${describe(rec.severityText)}, expected ${describe(severityText)}`);
  const t = timeOrZero(rec.timeUnixNano, 'log timeUnixNano');
  expect(t !== null && t > MIN_TIME_NS, `${where}: timeUnixNano ${describe(rec.timeUnixNano)} is not > 1.6e18`);
}

function checkLogs(records) {
  const warn = findLog(records, 'slow checkpoint write');
  if (warn) {
    const where = 'log "slow checkpoint write"';
    checkLogCommon(warn, 13, 'WARN', where);
    const attrs = attrMap(warn.attributes, where);
    expectStringAttr(attrs, 'path', '/ckpt/x', where);
    expectIntAttr(attrs, 'bytes', 4096, where);
    expectDoubleAttr(attrs, 'ratio', (d) => expect(d === 0.5, `${where}: ratio ${d}, expected 0.5`), where);
    expectBoolAttr(attrs, 'ok', false, where);
    expectStringAttr(attrs, 'code.filepath',
      (v) => expect(v.endsWith('otlp_emitter.cpp'), `${where}: code.filepath ${describe(v)} does not end with otlp_emitter.cpp`), where);
    expectIntAttr(attrs, 'code.lineno', (n) => expect(n > 0n, `${where}: code.lineno ${n} is not > 0`), where);
  }
  const info = findLog(records, 'hello 42');
  if (info) checkLogCommon(info, 9, 'INFO', 'log "hello 42"');
}

// ------------------------------------------------------------------ metrics

const METRIC_KINDS = ['sum', 'gauge', 'histogram', 'exponentialHistogram', 'summary'];

function pointValue(p) {
  if (p.asDouble !== undefined) return asNumber(p.asDouble);
  if (p.asInt !== undefined) {
    const n = toBigInt(p.asInt, 'asInt');
    return n === null ? null : Number(n);
  }
  return null;
}

function checkMetrics(metrics) {
  // name -> {kind, data, point} of the last data point seen, in arrival order.
  const last = new Map();
  metrics.forEach((m, i) => {
    const where = `metric ${describe(m.name)} (#${i})`;
    const kinds = METRIC_KINDS.filter((k) => m[k] !== undefined);
    if (!expect(kinds.length === 1, `${where}: expected exactly one data kind, got ${describe(kinds)}`)) return;
    const kind = kinds[0];
    const data = m[kind];
    const points = data.dataPoints || [];
    points.forEach((p, pi) => {
      const pw = `${where} dataPoints[${pi}]`;
      const start = timeOrZero(p.startTimeUnixNano, 'metric startTimeUnixNano');
      const time = timeOrZero(p.timeUnixNano, 'metric timeUnixNano');
      if (!expect(start !== null && time !== null,
        `${pw}: bad timestamps ${describe(p.startTimeUnixNano)} / ${describe(p.timeUnixNano)}`)) return;
      expect(time > MIN_TIME_NS, `${pw}: timeUnixNano ${time} is not > 1.6e18`);
      expect(start <= time, `${pw}: startTimeUnixNano ${start} > timeUnixNano ${time}`);
    });
    if (points.length > 0) last.set(m.name, { kind, data, point: points[points.length - 1] });
  });

  const get = (name, kind) => {
    const entry = last.get(name);
    if (!expect(entry, `metrics: no data point for "${name}"`)) return null;
    if (!expect(entry.kind === kind, `metric "${name}": is a ${entry.kind}, expected ${kind}`)) return null;
    return entry;
  };

  const samples = get('samples_total', 'sum');
  if (samples) {
    const where = 'metric "samples_total"';
    expect(samples.data.isMonotonic === true, `${where}: isMonotonic ${describe(samples.data.isMonotonic)}, expected true`);
    expect(toBigInt(samples.data.aggregationTemporality, 'aggregationTemporality') === 2n,
      `${where}: aggregationTemporality ${describe(samples.data.aggregationTemporality)}, expected 2 (CUMULATIVE)`);
    const v = pointValue(samples.point);
    expect(v === 96, `${where}: value ${describe(v)} (point ${describe(samples.point)}), expected 96`);
  }

  const loss = get('train_loss', 'gauge');
  if (loss) {
    const v = pointValue(loss.point);
    expect(v !== null && Math.abs(v - 0.3) < 1e-9, `metric "train_loss": value ${describe(v)}, expected 0.3`);
  }

  const hist = get('batch_seconds', 'histogram');
  if (hist) {
    const where = 'metric "batch_seconds"';
    const p = hist.point;
    expect(toBigInt(hist.data.aggregationTemporality, 'aggregationTemporality') === 2n,
      `${where}: aggregationTemporality ${describe(hist.data.aggregationTemporality)}, expected 2 (CUMULATIVE)`);
    const bounds = (p.explicitBounds || []).map(asNumber);
    expect(describe(bounds) === describe([0.1, 1, 10]), `${where}: explicitBounds ${describe(p.explicitBounds)}, expected [0.1,1,10]`);
    const counts = (p.bucketCounts || []).map((c) => {
      const n = toBigInt(c, 'bucketCounts');
      return n === null ? c : Number(n);
    });
    expect(describe(counts) === describe([1, 1, 1, 1]), `${where}: bucketCounts ${describe(p.bucketCounts)}, expected [1,1,1,1]`);
    expect(timeOrZero(p.count, 'count') === 4n, `${where}: count ${describe(p.count)}, expected 4`);
    const sum = p.sum === undefined ? null : asNumber(p.sum);
    expect(sum !== null && Math.abs(sum - 55.55) <= 1e-9, `${where}: sum ${describe(p.sum)}, expected 55.55`);
  }

  expect(metrics.some((m) => m.name === 'rankscope_events_dropped_total'),
    'metrics: no metric named "rankscope_events_dropped_total"');
}

// --------------------------------------------------------------------- main

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const records = loadRecords(opts.file);

  // Malformed requests are emitter bugs whatever status they got.
  records.forEach((r, i) => {
    if (r.error) fail(`request #${i} (${r.path}): receiver rejected it: ${r.error}`);
  });

  const ok = records.map((r, i) => ({ r, i })).filter(({ r }) => r.status === 200);
  expect(ok.length > 0, `${opts.file}: no request was answered with 200 (${records.length} recorded)`);

  const items = { '/v1/traces': [], '/v1/logs': [], '/v1/metrics': [] };
  for (const { r, i } of ok) {
    const { path, items: got } = checkRequest(r, i, opts);
    if (items[path]) items[path].push(...got);
  }
  checkTraces(items['/v1/traces']);
  checkLogs(items['/v1/logs']);
  checkMetrics(items['/v1/metrics']);

  for (const what of precisionWarnings) {
    process.stderr.write(`check.js: warning: ${what} sent as a JSON number beyond 2^53 (precision lost); ProtoJSON emits int64 as strings\n`);
  }
  if (failures.length > 0) {
    for (const f of failures) process.stdout.write(`FAIL: ${f}\n`);
    process.stdout.write(`${failures.length} assertion(s) failed in ${opts.file}\n`);
    process.exit(1);
  }
  const gz = opts.expectGzip ? ', gzip' : '';
  process.stdout.write(`OK: ${ok.length} request(s) (${opts.encoding}${gz}; ${records.length - ok.length} non-200 ignored): ` +
    `${items['/v1/traces'].length} spans, ${items['/v1/logs'].length} log records, ` +
    `${items['/v1/metrics'].length} metrics checked\n`);
}

main();
