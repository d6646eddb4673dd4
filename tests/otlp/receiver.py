"""Minimal OTLP/HTTP receiver for rankscope's exporter tests.

    python receiver.py --port P --out FILE [--mode ok|fail503:N|fail429:N|status500|slow]

Every request is appended to FILE as one JSON line:
  {"path","contentType","contentEncoding","status","body","ms"[,"error"]}
"status" is the HTTP status sent back (null in `slow` mode, where no response is
ever sent). "error" is present only when the request itself was malformed (wrong
path/method/content type, undecodable payload), so check.py can tell emitter bugs
apart from failures injected by --mode.

Payloads are decoded with the OpenTelemetry project's own generated code (the
opentelemetry-proto package), not a hand-written decoder, so the test does not
depend on rankscope's encoder being right. Protobuf bodies are turned into the
OTLP/JSON shape (camelCase names, hex ids, int64 as decimal strings); JSON bodies
must parse into the same message types (unknown or mistyped fields are errors)
and are recorded as sent, so check.py treats both encodings alike.

Modes: ok (200 with an empty Export*ServiceResponse), fail503:N / fail429:N (the
first N requests get that status and Retry-After: 1), status500 (every request),
slow (the body is read and recorded, no response is ever sent).
"""
import argparse
import base64
import gzip
import http.server
import json
import re
import sys
import threading
import time
from urllib.parse import urlsplit

from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

SIGNALS = {
    "/v1/traces": (trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
    "/v1/logs": (logs_service_pb2.ExportLogsServiceRequest, logs_service_pb2.ExportLogsServiceResponse),
    "/v1/metrics": (metrics_service_pb2.ExportMetricsServiceRequest, metrics_service_pb2.ExportMetricsServiceResponse),
}
# OTLP/JSON encodes exactly these bytes fields as hex instead of base64.
HEX_ID_FIELDS = {"traceId", "spanId", "parentSpanId"}


def ids_to_hex(value):
    if isinstance(value, list):
        for v in value:
            ids_to_hex(v)
    elif isinstance(value, dict):
        for key, field in value.items():
            if key in HEX_ID_FIELDS and isinstance(field, str):
                value[key] = base64.b64decode(field).hex()
            else:
                ids_to_hex(field)
    return value


def decode(method, url, headers, raw):
    """(media_type, signal, body) or (status, error); never raises."""
    path = urlsplit(url).path
    if path not in SIGNALS:
        return {"status": 404, "error": f"unknown path {path}"}
    if method != "POST":
        return {"status": 405, "error": f"method {method} not allowed"}
    request_type, response_type = SIGNALS[path]
    encoding = (headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding == "gzip":
        try:
            raw = gzip.decompress(raw)
        except Exception as e:
            return {"status": 400, "error": f"gunzip failed: {e}"}
    elif encoding != "identity":
        return {"status": 415, "error": f"unsupported content-encoding {encoding}"}
    media = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if media == "application/x-protobuf":
        try:
            msg = request_type.FromString(raw)
            # Only fields on the wire (proto3 defaults are omitted), enums as numbers,
            # int64 as strings, non-finite doubles as "NaN"/"Infinity": OTLP/JSON's shape.
            body = json_format.MessageToDict(msg, use_integers_for_enums=True)
            return {"media": media, "response": response_type, "body": ids_to_hex(body)}
        except Exception as e:
            return {"status": 400, "error": f"protobuf decode failed: {e}"}
    if media == "application/json":
        try:
            text = raw.decode("utf-8")
            json_format.Parse(text, request_type())  # must be a valid message of this signal
            return {"media": media, "response": response_type, "body": json.loads(text)}
        except Exception as e:
            return {"status": 400, "error": f"JSON parse failed: {e}"}
    return {"status": 415, "error": f"unsupported content-type {headers.get('Content-Type')}"}


def main():
    p = argparse.ArgumentParser(prog="receiver.py")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--mode", default="ok")
    a = p.parse_args()
    if not 0 <= a.port <= 65535:
        p.error("--port must be 0..65535")
    m = re.fullmatch(r"fail(503|429):(\d+)", a.mode)
    if a.mode not in ("ok", "status500", "slow") and not m:
        p.error(f"unknown mode {a.mode}")
    budget = {"status": int(m.group(1)), "remaining": int(m.group(2))} if m else None
    lock = threading.Lock()
    open(a.out, "a").close()  # "no requests arrived" reads as an empty file, not a missing one

    def record(entry):
        entry["ms"] = int(time.time() * 1000)
        with lock, open(a.out, "a") as f:
            f.write(json.dumps(entry, separators=(",", ":")) + "\n")

    def injected_status():
        # Every request counts towards a failN budget, whatever its content: "the first N".
        if a.mode == "status500":
            return 500
        with lock:
            if budget and budget["remaining"] > 0:
                budget["remaining"] -= 1
                return budget["status"]
        return None

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _body(self):
            if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline().strip():  # trailers
                pass
            return b"".join(chunks)

        def _handle(self):
            try:
                raw = self._body()
            except (OSError, ValueError):  # client went away mid-body or sent a bad length: nothing to record
                self.close_connection = True
                return
            try:
                self._answer(raw)
            except ConnectionError:
                self.close_connection = True
            except Exception as e:  # a receiver crash would look like an exporter failure: keep serving
                sys.stderr.write(f"receiver.py: internal error: {e!r}\n")
                self.close_connection = True
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()

        def _answer(self, raw):
            d = decode(self.command, self.path, self.headers, raw)
            entry = {"path": self.path, "contentType": self.headers.get("Content-Type"),
                     "contentEncoding": self.headers.get("Content-Encoding"), "status": None,
                     "body": d.get("body")}
            if "error" in d:
                entry["error"] = d["error"]
            if a.mode == "slow":
                record(entry)  # leave the request hanging: the client's timeout path is exercised
                threading.Event().wait()
            status = injected_status() or d.get("status") or 200
            entry["status"] = status
            record(entry)
            body = b""
            self.send_response(status)
            if status in (503, 429):
                self.send_header("Retry-After", "1")
            if status == 200:  # an empty Export*ServiceResponse in the request's encoding
                body = b"{}" if d["media"] == "application/json" else d["response"]().SerializeToString()
                self.send_header("Content-Type", d["media"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _handle

    server = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True  # `slow` holds connections forever: do not wait for them at exit
    print(f"listening {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
