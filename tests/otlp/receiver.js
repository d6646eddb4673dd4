#!/usr/bin/env node
// Minimal OTLP/HTTP receiver for rankscope's exporter tests.
//
//   node receiver.js --port P --out FILE [--mode MODE]
//
// Every request is appended to FILE as one JSON line:
//   {"path","contentType","contentEncoding","status","body","ms"[,"error"]}
// "status" is the HTTP status sent back (null in `slow` mode, where no
// response is ever sent). "error" is present only when the request itself was
// malformed (wrong path/method/content type, undecodable payload), so check.js
// can tell emitter bugs apart from failures injected by --mode.
//
// Protobuf payloads are decoded with the OpenTelemetry project's own generated
// code (from @opentelemetry/otlp-transformer) rather than a hand-written
// decoder, so the test is independent of rankscope's encoder. The decoded
// object is shaped like OTLP/JSON (camelCase names, hex ids, int64 as decimal
// strings) so check.js can treat both encodings alike.
//
// Modes:
//   ok          200 with an empty Export*ServiceResponse (default)
//   fail503:N   first N requests get 503 + Retry-After: 1, then as `ok`
//   fail429:N   first N requests get 429 + Retry-After: 1, then as `ok`
//   status500   every request gets 500
//   slow        body is read and recorded, but no response is ever sent

'use strict';

const fs = require('fs');
const http = require('http');
const zlib = require('zlib');

const root = require('@opentelemetry/otlp-transformer/build/src/generated/root.js');

const collector = root.opentelemetry.proto.collector;
const SIGNALS = {
  '/v1/traces': {
    Request: collector.trace.v1.ExportTraceServiceRequest,
    Response: collector.trace.v1.ExportTraceServiceResponse,
  },
  '/v1/logs': {
    Request: collector.logs.v1.ExportLogsServiceRequest,
    Response: collector.logs.v1.ExportLogsServiceResponse,
  },
  '/v1/metrics': {
    Request: collector.metrics.v1.ExportMetricsServiceRequest,
    Response: collector.metrics.v1.ExportMetricsServiceResponse,
  },
};

// defaults:false keeps only fields that were actually on the wire, so the
// record shows what the emitter sent. oneofs:false avoids protobufjs adding
// virtual discriminator properties (e.g. AnyValue.value = "stringValue") that
// OTLP/JSON does not have. bytes:String yields base64, which is what OTLP/JSON
// uses for non-id bytes (AnyValue.bytesValue); ids are turned into hex below.
// json:true renders NaN/Infinity doubles as strings, as ProtoJSON does,
// instead of letting JSON.stringify turn them into null.
const TO_OBJECT_OPTIONS = {
  longs: String,
  enums: Number,
  bytes: String,
  defaults: false,
  arrays: false,
  objects: false,
  oneofs: false,
  json: true,
};

// OTLP/JSON encodes exactly these bytes fields as hex instead of base64
// (spans, span links, log records and exemplars all use these names).
const HEX_ID_FIELDS = new Set(['traceId', 'spanId', 'parentSpanId']);

function idsToHex(value) {
  if (Array.isArray(value)) {
    value.forEach(idsToHex);
  } else if (value !== null && typeof value === 'object') {
    for (const [key, field] of Object.entries(value)) {
      if (HEX_ID_FIELDS.has(key) && typeof field === 'string') {
        value[key] = Buffer.from(field, 'base64').toString('hex');
      } else {
        idsToHex(field);
      }
    }
  }
  return value;
}

function parseArgs(argv) {
  const opts = { port: null, out: null, mode: 'ok' };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) usage(`missing value for ${arg}`);
      return argv[++i];
    };
    if (arg === '--port') opts.port = Number(next());
    else if (arg === '--out') opts.out = next();
    else if (arg === '--mode') opts.mode = next();
    else usage(`unknown argument ${arg}`);
  }
  if (!Number.isInteger(opts.port) || opts.port < 0 || opts.port > 65535) usage('--port must be 0..65535');
  if (!opts.out) usage('--out is required');
  opts.policy = parseMode(opts.mode);
  return opts;
}

function parseMode(mode) {
  if (mode === 'ok' || mode === 'status500' || mode === 'slow') return { kind: mode };
  const m = /^fail(503|429):(\d+)$/.exec(mode);
  if (m) return { kind: 'fail', status: Number(m[1]), remaining: Number(m[2]) };
  usage(`unknown mode ${mode}`);
}

function usage(msg) {
  process.stderr.write(`receiver.js: ${msg}\n` +
    'usage: node receiver.js --port P --out FILE [--mode ok|fail503:N|fail429:N|status500|slow]\n');
  process.exit(2);
}

const opts = parseArgs(process.argv.slice(2));
// Create the file up front so "no requests arrived" reads as an empty file
// rather than a missing one.
fs.appendFileSync(opts.out, '');

function record(entry) {
  fs.appendFileSync(opts.out, JSON.stringify({ ...entry, ms: Date.now() }) + '\n');
}

// Turns the raw request into {body} or {status, error}. Never throws.
function decodeRequest(req, raw) {
  const path = new URL(req.url, 'http://receiver').pathname;
  const signal = SIGNALS[path];
  if (!signal) return { status: 404, error: `unknown path ${path}` };
  if (req.method !== 'POST') return { status: 405, error: `method ${req.method} not allowed` };

  let payload = raw;
  const encoding = (req.headers['content-encoding'] || 'identity').trim().toLowerCase();
  if (encoding === 'gzip') {
    try {
      payload = zlib.gunzipSync(raw);
    } catch (e) {
      return { status: 400, error: `gunzip failed: ${e.message}` };
    }
  } else if (encoding !== 'identity') {
    return { status: 415, error: `unsupported content-encoding ${encoding}` };
  }

  const mediaType = (req.headers['content-type'] || '').split(';')[0].trim().toLowerCase();
  if (mediaType === 'application/x-protobuf') {
    try {
      const message = signal.Request.decode(payload);
      return { mediaType, signal, body: idsToHex(signal.Request.toObject(message, TO_OBJECT_OPTIONS)) };
    } catch (e) {
      return { status: 400, error: `protobuf decode failed: ${e.message}` };
    }
  }
  if (mediaType === 'application/json') {
    try {
      return { mediaType, signal, body: JSON.parse(payload.toString('utf8')) };
    } catch (e) {
      return { status: 400, error: `JSON parse failed: ${e.message}` };
    }
  }
  return { status: 415, error: `unsupported content-type ${req.headers['content-type']}` };
}

// Status injected by --mode, or null to answer normally. Every request counts
// towards a failN budget, whatever its content, matching "the first N".
function injectedStatus() {
  const policy = opts.policy;
  if (policy.kind === 'status500') return 500;
  if (policy.kind === 'fail' && policy.remaining > 0) {
    policy.remaining--;
    return policy.status;
  }
  return null;
}

function handle(req, res, raw) {
  const decoded = decodeRequest(req, raw);
  const entry = {
    path: req.url,
    contentType: req.headers['content-type'] || null,
    contentEncoding: req.headers['content-encoding'] || null,
    status: null,
    body: decoded.body === undefined ? null : decoded.body,
  };
  if (decoded.error) entry.error = decoded.error;

  if (opts.policy.kind === 'slow') {
    // Leave the request hanging so the client's timeout path is exercised.
    record(entry);
    return;
  }

  const injected = injectedStatus();
  const status = injected || decoded.status || 200;
  entry.status = status;
  record(entry);

  const headers = {};
  let responseBody = Buffer.alloc(0);
  if (status === 503 || status === 429) headers['Retry-After'] = '1';
  if (status === 200) {
    // An empty Export*ServiceResponse (no partial_success) in the request's encoding.
    if (decoded.mediaType === 'application/json') {
      responseBody = Buffer.from('{}');
    } else {
      responseBody = Buffer.from(decoded.signal.Response.encode({}).finish());
    }
    headers['Content-Type'] = decoded.mediaType;
  }
  headers['Content-Length'] = responseBody.length;
  res.writeHead(status, headers);
  res.end(responseBody);
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    try {
      handle(req, res, Buffer.concat(chunks));
    } catch (e) {
      // A receiver crash would look like an exporter failure; keep serving.
      process.stderr.write(`receiver.js: internal error: ${e.stack}\n`);
      if (!res.headersSent) {
        res.writeHead(500);
        res.end();
      }
    }
  });
  req.on('error', () => {}); // client went away mid-body; nothing to record
});

// Node's default requestTimeout (5 min) would answer 408 on its own; the
// `slow` mode must never answer, and other modes have no reason to time out.
server.requestTimeout = 0;
server.on('clientError', (err, socket) => socket.destroy());

server.listen(opts.port, '127.0.0.1', () => {
  // Report the bound port so callers can pass --port 0.
  process.stdout.write(`listening ${server.address().port}\n`);
});

function shutdown() {
  server.close();
  // `slow` mode holds connections open forever; don't wait for them.
  server.closeAllConnections();
  process.exit(0);
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
