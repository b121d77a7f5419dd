"""Memory amplification of ``goodput serve``: requests of empty OTLP messages (issue 38).

Two parts:

- ``serve`` (default): a real ``goodput serve`` (default limits, loopback, ``--wal-dir`` or
  ``--wal-dir off``) gets one request of empty ``ResourceSpans`` messages (protobuf: two
  bytes each, ``0a 00``; OTLP/JSON: ``{}``, three bytes each) of each ``--sizes`` MiB,
  protobuf over gRPC and over HTTP, JSON over HTTP. Meanwhile a healthy job exports a
  small request every 0.1 s over HTTP. Per request: its status, serve's peak resident
  memory above its level before (the kernel's ``VmHWM``, reset through
  ``/proc/PID/clear_refs`` before each request), the write-ahead log's growth, how long
  the request took, and the longest a healthy export waited meanwhile.
- ``--huge``: the write-ahead log that 11 spans with a 12 MiB attribute each leave.
- ``--bound``: for each of the worst request shapes known (empty messages of each kind,
  spans of no kind, minimal valid spans, many attributes), a fresh Python process takes
  one request of ``--bound-mib`` MiB into a ``LiveStore`` with a write-ahead log, and
  its peak memory above the level before is compared with what
  :func:`goodput_processor.serve.receiver.parse_cost` estimated before the parse (the
  bytes taken from ``--max-inflight-bytes``). Exits 1 if any peak is over its estimate.

    python benchmarks/serve_amplification.py --sizes 1,4,16
    python benchmarks/serve_amplification.py --bound --bound-mib 2
    python benchmarks/serve_amplification.py --huge
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

MiB = 1 << 20
_TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


# --- request shapes --------------------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _w(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


def _rep(unit: bytes, size: int) -> bytes:
    return unit * max(1, size // len(unit))


_RES = _w(0x0A, _w(0x0A, _w(0x0A, b"service.name") + _w(0x12, _w(0x0A, b"amp"))))
_OWN = _w(0x0A, _w(0x0A, b"goodput"))
_STEP = _w(0x0A, b"\x01" * 16) + _w(0x12, b"\x02" * 8) + _w(0x2A, b"goodput.step")


def shape(name: str, size: int) -> bytes:
    """A protobuf ``ExportTraceServiceRequest`` (``log_*``: ``ExportLogsServiceRequest``)
    of about ``size`` bytes (see SHAPES)."""
    if name == "resource_spans":
        return _rep(b"\x0a\x00", size)
    if name == "scope_spans":
        return _w(0x0A, _RES + _rep(b"\x12\x00", size))
    if name == "spans":
        return _w(0x0A, _RES + _w(0x12, _OWN + _rep(b"\x12\x00", size)))
    if name == "spans_other_scope":
        return _w(0x0A, _RES + _w(0x12, _rep(b"\x12\x00", size)))
    if name == "spans_one_each":  # a ResourceSpans per empty span
        return _rep(_w(0x0A, _w(0x12, b"\x12\x00")), size)
    if name == "own_spans_one_each":
        return _rep(_w(0x0A, _w(0x12, _OWN + b"\x12\x00")), size)
    if name == "scopes_one_each":  # a ScopeSpans per empty span
        return _w(0x0A, _RES + _rep(_w(0x12, b"\x12\x00"), size))
    if name == "named_spans":  # spans of no kind
        return _w(0x0A, _RES + _w(0x12, _OWN + _rep(_w(0x12, _w(0x2A, b"x")), size)))
    if name == "step_spans":  # the smallest valid spans
        return _w(0x0A, _RES + _w(0x12, _OWN + _rep(_w(0x12, _STEP), size)))
    if name == "resource_attributes":
        return _w(0x0A, _w(0x0A, _rep(b"\x0a\x00", size)) + _w(0x12, _OWN + b"\x12\x00"))
    if name == "span_attributes":
        return _w(0x0A, _RES + _w(0x12, _OWN + _w(0x12, _STEP + _rep(b"\x4a\x00", size))))
    if name == "custom_types":  # a custom badput span with many type attributes
        kv = _w(0x4A, _w(0x0A, b"goodput.badput.type") + _w(0x12, _w(0x0A, b"t")))
        sp = _w(0x0A, b"\x01" * 16) + _w(0x12, b"\x02" * 8) + _w(0x2A, b"goodput.custom_badput")
        return _w(0x0A, _RES + _w(0x12, _OWN + _w(0x12, sp + _rep(kv, size))))
    if name == "log_records":  # an ExportLogsServiceRequest of empty log records
        return _w(0x0A, _RES + _w(0x12, _rep(b"\x12\x00", size)))
    if name == "log_attributes":
        return _w(0x0A, _RES + _w(0x12, _w(0x12, _rep(b"\x32\x00", size))))
    if name == "links":
        return _w(0x0A, _RES + _w(0x12, _OWN + _w(0x12, _rep(b"\x6a\x00", size))))
    if name == "status":
        return _w(0x0A, _RES + _w(0x12, _OWN + _rep(_w(0x12, _STEP + b"\x7a\x00"), size)))
    raise ValueError(f"no shape {name!r}")


SHAPES = ("resource_spans", "scope_spans", "spans", "spans_other_scope", "spans_one_each",
          "own_spans_one_each", "scopes_one_each",
          "named_spans", "step_spans", "resource_attributes", "span_attributes",
          "custom_types", "links", "status", "log_records", "log_attributes")


def json_shape(name: str, size: int) -> bytes:
    """An OTLP/JSON request of about ``size`` bytes (see JSON_SHAPES)."""
    res = b'"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"amp"}}]}'
    own = b'"scope":{"name":"goodput"}'
    if name == "json_resource_spans":
        return empty_json(size)
    if name == "json_spans":
        return (b'{"resourceSpans":[{' + res + b',"scopeSpans":[{' + own + b',"spans":['
                + _rep(b"{},", size)[:-1] + b"]}]}]}")
    if name == "json_spans_other_scope":
        return (b'{"resourceSpans":[{' + res + b',"scopeSpans":[{"spans":['
                + _rep(b"{},", size)[:-1] + b"]}]}]}")
    if name == "json_spans_one_each":
        return (b'{"resourceSpans":[' + _rep(b'{"scopeSpans":[{"spans":[{}]}]},', size)[:-1]
                + b"]}")
    if name == "json_step_spans":
        sp = (b'{"traceId":"01010101010101010101010101010101","spanId":"0202020202020202",'
              b'"name":"goodput.step","startTimeUnixNano":"1","endTimeUnixNano":"2"},')
        return (b'{"resourceSpans":[{' + res + b',"scopeSpans":[{' + own + b',"spans":['
                + _rep(sp, size)[:-1] + b"]}]}]}")
    raise ValueError(f"no JSON shape {name!r}")


JSON_SHAPES = ("json_resource_spans", "json_spans", "json_spans_other_scope",
               "json_spans_one_each", "json_step_spans")


def empty_json(size: int) -> bytes:
    """OTLP/JSON of about ``size`` bytes: ``{"resourceSpans":[{},{},...]}``."""
    n = max(1, (size - 19) // 3)
    return b'{"resourceSpans":[' + b"{}," * (n - 1) + b"{}]}"


# --- the bound check -------------------------------------------------------------------

_BOUND_CHILD = r"""
import gc, json, os, sys, tempfile
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from serve_amplification import json_shape, shape
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from goodput_processor.serve import LiveStore
from goodput_processor.serve.limits import Limits
from goodput_processor.serve.receiver import parse_cost
from goodput_processor.serve.wal import WriteAheadLog

def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key))

name, size, wal = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "on"
kind = "json" if name.startswith("json") else "protobuf"
body = json_shape(name, size) if kind == "json" else shape(name, size)
est = parse_cost(kind, body)
logs = name.startswith("log_")
d = tempfile.mkdtemp()
store = LiveStore(limits=Limits(max_job_spans_per_s=1e12),
                  wal=WriteAheadLog(d) if wal else None)
if wal:
    store.replay()
gc.collect()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
r0 = status("VmRSS")
if kind == "json":
    store.ingest_json(json.loads(body), ("bound", 1))
elif logs:
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsServiceRequest)
    req = ExportLogsServiceRequest()
    req.ParseFromString(body)
    store.ingest_logs(req)
else:
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    store.ingest_request(req)
wal_bytes = sum(os.path.getsize(os.path.join(a, f)) for a, _, fs in os.walk(d) for f in fs)
print(json.dumps({"shape": name, "bytes": len(body), "peak": status("VmHWM") - r0,
                  "estimate": est, "wal": wal_bytes}))
"""


def bound(mib: float, shapes=SHAPES + JSON_SHAPES, wal: bool = True) -> list[dict]:
    """Each shape's peak above the level before vs its estimate (one process each)."""
    out = []
    for name in shapes:
        r = subprocess.run([sys.executable, "-c", _BOUND_CHILD, os.path.abspath(__file__),
                            name, str(int(mib * MiB)), "on" if wal else "off"],
                           capture_output=True, text=True, timeout=600)
        if r.returncode:
            raise RuntimeError(f"{name}: {r.stderr[-2000:]}")
        out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


def huge_attributes(n: int = 11, attr_bytes: int = 12 * MiB) -> int:
    """Bytes of write-ahead log that ``n`` custom badput spans, each with a string
    attribute of ``attr_bytes`` and a type of ``attr_bytes // 8`` (issue 38's case, the
    body of ``benchmarks/abuse/bodies.py``), leave in a store with default limits."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from abuse.bodies import huge_attribute_request  # noqa: PLC0415 - a sibling module
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: PLC0415
        ExportTraceServiceRequest,
    )

    from goodput_processor.serve import LiveStore  # noqa: PLC0415
    from goodput_processor.serve.wal import WriteAheadLog  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as d:
        store = LiveStore(wal=WriteAheadLog(d))
        store.replay()
        for i in range(n):
            store.ingest_request(ExportTraceServiceRequest.FromString(
                huge_attribute_request("huge", i, attr_bytes)), "otlp-grpc")
        store.wal.close()
        return _du(d)


# --- a real goodput serve --------------------------------------------------------------

def _proc_status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(a, f)) for a, _, fs in os.walk(path) for f in fs)


def _start(tmp: str, wal: bool):
    cmd = [sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port", "0",
           "--http-port", "0", "--format", "json", "--report-file",
           os.path.join(tmp, "report.jsonl"),
           "--wal-dir", os.path.join(tmp, "wal") if wal else "off"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "listening" in line:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, dict(re.findall(r"(\w+)=(\S+)", line))
    proc.kill()
    raise RuntimeError("goodput serve did not start: " + " ".join(cmd))


def _post(url: str, body: bytes, ctype: str) -> int:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _healthy_body(i: int) -> bytes:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_serve import batch  # noqa: PLC0415 - a sibling benchmark

    return batch(i, 8, job="healthy")


class Healthy(threading.Thread):
    """A healthy job exporting 8 spans every 0.1 s over HTTP; ``worst_s`` since
    :meth:`reset`."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.stop, self.worst_s, self.failed, self.i = url, threading.Event(), 0.0, 0, 0

    def reset(self) -> None:
        self.worst_s, self.failed = 0.0, 0

    def run(self) -> None:
        while not self.stop.wait(0.1):
            t0 = time.monotonic()
            status = _post(self.url, _healthy_body(self.i), "application/x-protobuf")
            self.worst_s = max(self.worst_s, time.monotonic() - t0)
            self.failed += status != 200
            self.i += 1


def _send(how: str, addr: dict, body: bytes) -> str:
    if how == "grpc":
        import grpc

        ch = grpc.insecure_channel(addr["grpc"], options=[
            ("grpc.max_send_message_length", 64 * MiB)])
        call = ch.unary_unary(_TRACES, request_serializer=None, response_deserializer=None)
        try:
            call(body, timeout=300)
            return "OK"
        except grpc.RpcError as e:
            return e.code().name
        finally:
            ch.close()
    ctype = "application/json" if how == "http-json" else "application/x-protobuf"
    return str(_post(addr["http"] + "/v1/traces", body, ctype))


def serve_run(sizes, wals, hows=("grpc", "http-pb", "http-json"),
              pb_shape: str = "resource_spans", json_name: str = "json_resource_spans"
              ) -> list[dict]:
    rows = []
    for wal in wals:
        with tempfile.TemporaryDirectory() as tmp:
            proc, addr = _start(tmp, wal)
            healthy = Healthy(addr["http"] + "/v1/traces")
            healthy.start()
            time.sleep(1.0)
            try:
                for mib in sizes:
                    for how in hows:
                        size = int(mib * MiB)
                        body = (json_shape(json_name, size) if how == "http-json" else
                                shape(pb_shape, size))
                        with open(f"/proc/{proc.pid}/clear_refs", "w") as f:
                            f.write("5")
                        time.sleep(0.3)
                        base, wal0 = _proc_status(proc.pid, "VmRSS"), _du(tmp)
                        healthy.reset()
                        t0 = time.monotonic()
                        status = _send(how, addr, body)
                        took = time.monotonic() - t0
                        time.sleep(0.3)
                        rows.append({"wal": wal, "how": how, "mib": mib, "status": status,
                                     "peak_mib": (_proc_status(proc.pid, "VmHWM") - base) / MiB,
                                     "x": (_proc_status(proc.pid, "VmHWM") - base) / len(body),
                                     "wal_mb": (_du(tmp) - wal0) / 1e6, "seconds": took,
                                     "healthy_worst_s": healthy.worst_s,
                                     "healthy_failed": healthy.failed,
                                     "rss_mib": _proc_status(proc.pid, "VmRSS") / MiB})
                        print(_fmt(rows[-1]), flush=True)
            finally:
                healthy.stop.set()
                proc.terminate()
                proc.wait(60)
    return rows


def _fmt(r: dict) -> str:
    return (f"wal={'on ' if r['wal'] else 'off'} {r['how']:9s} {r['mib']:5g} MiB: "
            f"{r['status']:18s} peak +{r['peak_mib']:7.1f} MiB ({r['x']:5.1f}x)  "
            f"WAL +{r['wal_mb']:6.1f} MB  {r['seconds']:6.2f} s  healthy export worst "
            f"{r['healthy_worst_s']:5.2f} s ({r['healthy_failed']} failed)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1,4,16", help="MiB, comma-separated")
    ap.add_argument("--wal", choices=("both", "on", "off"), default="both")
    ap.add_argument("--how", default="grpc,http-pb,http-json")
    ap.add_argument("--shape", default="resource_spans", choices=SHAPES,
                    help="the protobuf requests' shape")
    ap.add_argument("--json-shape", default="json_resource_spans", choices=JSON_SHAPES)
    ap.add_argument("--bound", action="store_true", help="the estimate check instead")
    ap.add_argument("--bound-mib", type=float, default=2.0)
    ap.add_argument("--huge", action="store_true",
                    help="the log bytes of 11 spans with a 12 MiB attribute each instead")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    if a.huge:
        n = huge_attributes()
        print(f"11 custom badput spans with a 12 MiB attribute and a 1.5 MiB type each: "
              f"{n:,} bytes of write-ahead log ({n / 11:,.0f} a span)")
        return 0
    if a.bound:
        rows, bad = bound(a.bound_mib), 0
        for r in rows:
            over = r["peak"] > r["estimate"]
            bad += over
            n = r["bytes"]
            print(f"{r['shape']:20s} {n / MiB:5.2f} MiB: peak {r['peak'] / n:6.1f}x  estimate "
                  f"{r['estimate'] / n:6.1f}x  WAL {r['wal'] / n:5.2f}x  "
                  f"{'OVER' if over else 'ok'}")
    else:
        wals = {"both": (True, False), "on": (True,), "off": (False,)}[a.wal]
        rows, bad = serve_run([float(s) for s in a.sizes.split(",")], wals,
                              tuple(a.how.split(",")), a.shape, a.json_shape), 0
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
