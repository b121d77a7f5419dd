"""Abuse of ``goodput serve``: does its memory stay under a ceiling, does it stay up?

Starts ``goodput serve`` as a real subprocess on loopback (``python -m goodput_processor.cli
serve --grpc-port 0 --http-port 0`` with the limit flags; a ``python -c`` GoodputServer
when this checkout's CLI has no limit flags yet), posts one healthy job and keeps its
report, then, all at once from this process, for ``--duration`` seconds:

- ``slowloris``: ``--slowloris`` HTTP connections, each announcing a body of
  ``--slowloris-bytes`` (Content-Length), then a third trickle 1 KiB a second, a third hold
  the body back and a third send all of it but the last byte; each reconnects when the
  server answers or drops it;
- ``flood-http``, ``flood-grpc``: up to ``--jobs`` distinct job names, ``--jobs-per-request``
  per small OTLP request (protobuf, every 4th HTTP one OTLP/JSON), as fast as they go;
- ``bigattr``: custom badput spans (``goodput.custom_badput``) of a new type each time, the
  type and another string attribute ``--attr-bytes`` long (MiBs), over HTTP and gRPC;
- ``bomb``: gzip bombs (``--bomb-bytes`` of zeros, a few hundred KiB on the wire).

It samples the serve process's RSS (``VmRSS`` of ``/proc/PID/status``) every 0.2 s, reads
its kernel peak (``VmHWM``) at the end, counts each kind's answers by status, and checks
that ``/healthz`` still answers and that the healthy job's report is unchanged. Prints a
table; ``run(Config(...))`` returns a :class:`Result` (``tests/test_serve_limits.py``
runs a short one).

The ceiling it checks (:meth:`Result.ceiling_bytes`), from the limits:
``baseline + max_inflight_bytes + max_connections x 256 KiB + margin`` (the RSS after
start and the healthy job; request bodies, their inflated and parsed forms held at once;
a thread's stack and buffers per connection; ``--margin``, default 96 MiB, for what the
store keeps of at most ``--max-jobs`` jobs with attributes cut to ``--max-attribute-bytes``,
gRPC's own buffers and the allocator's slack).

    python benchmarks/serve_abuse.py [--duration 20] [--slowloris 200] [--jobs 100000]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter, deque
from dataclasses import asdict, dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from goodput import schema

T0 = 1_700_000_000_000_000_000
MiB = 1 << 20
#: Limits fields -> the ``goodput serve`` flags that set them.
FLAGS = {"max_connections": "--max-connections", "max_inflight_bytes": "--max-inflight-bytes",
         "max_message_bytes": "--max-message-bytes", "request_timeout_s": "--request-timeout",
         "max_jobs": "--max-jobs", "max_custom_types": "--max-custom-types",
         "max_attribute_bytes": "--max-attribute-bytes",
         "max_job_spans_per_s": "--max-job-spans-per-second"}

# The fallback when the CLI has no limit flags: GoodputServer in a child, same stderr line.
_SERVE_PY = r"""
import json, signal, sys, threading
from goodput_processor.serve import GoodputServer, LiveStore
from goodput_processor.serve.limits import Limits
kw = json.loads(sys.argv[1])
limits = Limits(**{k: v for k, v in kw.items() if k in Limits.__dataclass_fields__})
try:
    store = LiveStore(limits=limits)
except TypeError:
    store = LiveStore()
srv = GoodputServer(store, grpc_port=0, http_port=0, limits=limits,
                    max_message_bytes=limits.max_message_bytes)
print("goodput serve: listening " + " ".join(f"{k}={v}" for k, v in srv.addresses().items()),
      file=sys.stderr, flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
stop.wait()
srv.stop(20, final=False)
print("goodput serve: stopped", file=sys.stderr, flush=True)
"""


@dataclass
class Config:
    """One abuse run (sizes in bytes, times in seconds)."""

    duration_s: float = 20.0
    slowloris: int = 200
    slowloris_bytes: int = 15 * MiB
    jobs: int = 100_000
    jobs_per_request: int = 25
    http_flooders: int = 3
    attr_bytes: int = 4 * MiB
    bomb_bytes: int = 256 * MiB
    margin_bytes: int = 96 * MiB
    sample_s: float = 0.2
    #: ``goodput serve`` limits (Limits field names; None: the serve default).
    limits: dict = field(default_factory=lambda: {
        "max_connections": 256, "max_inflight_bytes": 256 * MiB, "max_message_bytes": 16 * MiB,
        "request_timeout_s": 10, "max_jobs": 1000, "max_custom_types": 64,
        "max_attribute_bytes": 1024})


@dataclass
class Result:
    """What one run saw (bytes, seconds)."""

    config: Config
    launcher: str = ""
    baseline_rss: int = 0
    peak_rss: int = 0  # sampled every sample_s
    hwm_rss: int = 0  # the kernel's peak (VmHWM)
    final_rss: int = 0
    samples: int = 0
    answers: dict = field(default_factory=dict)  # kind -> {status: count}
    jobs_sent: int = 0
    jobs_accepted: int = 0
    healthz_ok: bool = False
    healthy_unchanged: bool = False
    serve_metrics: dict = field(default_factory=dict)  # goodput_serve_* at the end
    exit_code: int | None = None
    stderr_tail: list = field(default_factory=list)
    wall_s: float = 0.0

    def ceiling_bytes(self) -> int:
        """``baseline + max_inflight_bytes + max_connections x 256 KiB + margin``."""
        lim = self.config.limits
        return (self.baseline_rss + lim["max_inflight_bytes"] + lim["max_connections"] * (256 << 10)
                + self.config.margin_bytes)

    @property
    def peak(self) -> int:
        return max(self.peak_rss, self.hwm_rss)


# --- requests ---------------------------------------------------------------------------


def _kv(key, **v):
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(**v))


def pb_request(jobs, n: int = 1, spans=None) -> trace_service_pb2.ExportTraceServiceRequest:
    """A request with ``n`` step spans (or the given ``spans``) for each job name in ``jobs``."""
    req = trace_service_pb2.ExportTraceServiceRequest()
    for job in jobs:
        rs = req.resource_spans.add()
        rs.resource.attributes.extend([
            _kv(schema.RES_SERVICE_NAME, string_value=job),
            _kv(schema.RES_JOB_NAME, string_value=job), _kv(schema.RES_ATTEMPT, int_value=0),
            _kv(schema.RES_SCHEMA_VERSION, string_value=schema.SCHEMA_VERSION)])
        ss = rs.scope_spans.add()
        ss.scope.name = schema.SCOPE_NAME
        ss.spans.extend(spans if spans is not None else [trace_pb2.Span(
            trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"), name=schema.STEP,
            start_time_unix_nano=T0 + i * 10**9, end_time_unix_nano=T0 + (i + 1) * 10**9,
            attributes=[_kv(schema.ATTR_STEP, int_value=i)]) for i in range(n)])
    return req


def json_request(jobs, n: int = 1) -> bytes:
    """The same as :func:`pb_request`, as OTLP/JSON (hex ids)."""
    from google.protobuf.json_format import MessageToDict

    doc = MessageToDict(pb_request(jobs, n))
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for i, s in enumerate(ss["spans"]):  # OTLP/JSON ids are hex, not base64
                s["traceId"], s["spanId"] = "01" * 16, f"{i + 1:016x}"
    return json.dumps(doc).encode()


def custom_badput_request(job: str, i: int, attr_bytes: int) -> bytes:
    """A custom badput span of a new type ``i`` whose type and note are ``attr_bytes`` long."""
    span = trace_pb2.Span(
        trace_id=b"\x02" * 16, span_id=(i + 1).to_bytes(8, "big"), name=schema.CUSTOM_BADPUT,
        start_time_unix_nano=T0 + i * 10**9, end_time_unix_nano=T0 + i * 10**9 + 10**8,
        attributes=[_kv(schema.ATTR_BADPUT_TYPE, string_value=f"t{i}-".ljust(attr_bytes, "x")),
                    _kv("note", string_value="n" * attr_bytes)])
    return pb_request([job], spans=[span]).SerializeToString()


def gzip_bomb(inflated: int) -> bytes:
    """``inflated`` bytes of zeros, gzip-compressed (about 1/1000 of it)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = bytes(MiB)
    return b"".join(z.compress(chunk) for _ in range(inflated // MiB)) + z.flush()


# --- the serve process ------------------------------------------------------------------


def _rss(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of ``pid`` in bytes ((0, 0) once it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line[:5]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out.get("VmRSS", 0), out.get("VmHWM", 0)


def start_serve(cfg: Config, tmp: str) -> tuple[subprocess.Popen, dict, str, deque]:
    """Start ``goodput serve``; returns (process, {"grpc": ..., "http": ...}, how, stderr)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    help_text = subprocess.run([sys.executable, "-m", "goodput_processor.cli", "serve", "--help"],
                               capture_output=True, text=True, env=env, timeout=120).stdout
    lim = {k: v for k, v in cfg.limits.items() if v is not None}
    if all(FLAGS[k] in help_text for k in lim):
        cmd = [sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port", "0",
               "--http-port", "0", "--format", "json", "--report-file",
               os.path.join(tmp, "report.jsonl"), "--shutdown-timeout", "30"]
        if "--wal-dir" in help_text:
            cmd += ["--wal-dir", os.path.join(tmp, "wal")]
        for k, v in lim.items():
            cmd += [FLAGS[k], str(v)]
        how = "cli"
    else:
        cmd, how = [sys.executable, "-c", _SERVE_PY, json.dumps(lim)], "python -c GoodputServer"
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stderr.readline()
    if "listening" not in line:
        proc.kill()
        raise RuntimeError(f"goodput serve did not start: {line}{proc.stderr.read()[-4000:]}")
    tail: deque = deque(maxlen=40)
    threading.Thread(target=lambda: tail.extend(proc.stderr), daemon=True).start()
    return proc, dict(re.findall(r"(\w+)=(\S+)", line)), how, tail


# --- the attackers ------------------------------------------------------------------------


class _Counts:
    def __init__(self):
        self._lock, self.by_kind = threading.Lock(), {}

    def add(self, kind: str, status, n: int = 1) -> None:
        with self._lock:
            self.by_kind.setdefault(kind, Counter())[str(status)] += n


def _status_of(data: bytes) -> str:
    m = re.match(rb"HTTP/1\.\d (\d{3})", data)
    return m.group(1).decode() if m else "garbled"


def _slowloris(cfg: Config, port: int, stop: threading.Event, counts: _Counts) -> None:
    """``cfg.slowloris`` connections in one thread (non-blocking sockets, a selector): a
    third trickle 1 KiB a second, a third hold their body back, a third send all of it but
    the last byte as fast as they can (the bytes a server would hold in memory)."""
    sel = selectors.DefaultSelector()
    head = (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {cfg.slowloris_bytes}\r\n\r\n").encode()
    left: dict = {}  # socket -> [mode, bytes of body still to send, next trickle time]
    block = b"\x0a" * (64 << 10)

    def open_one(i: int) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(head)
        except OSError as e:
            counts.add("slowloris", type(e).__name__)
            return
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
        left[s] = [("trickle", "hold", "all-but-1")[i % 3], cfg.slowloris_bytes - 1, 0.0]

    for i in range(cfg.slowloris):
        open_one(i)
    while not stop.is_set():
        for key, _ in sel.select(0.05):
            s = key.fileobj
            try:
                data = s.recv(4096)
                outcome = _status_of(data) if data else "dropped"
            except BlockingIOError:
                continue
            except OSError:
                outcome = "reset"
            counts.add("slowloris", outcome)
            sel.unregister(s)
            left.pop(s, None)
            s.close()
            if not stop.is_set():
                open_one(key.data)
        now = time.monotonic()
        for s, st in list(left.items()):
            mode, todo, when = st
            if mode == "hold" or todo <= 0 or when > now:
                continue
            try:
                st[1] -= s.send(block[:min(todo, 1024 if mode == "trickle" else len(block))])
            except OSError:
                pass  # the selector sees the close; a full window just waits
            if mode == "trickle":
                st[2] = now + 1.0
    for key in list(sel.get_map().values()):
        key.fileobj.close()


def _http_post(conn: http.client.HTTPConnection, body: bytes, ctype: str, gz=False) -> str:
    headers = {"Content-Type": ctype}
    if gz:
        headers["Content-Encoding"] = "gzip"
    try:
        conn.request("POST", "/v1/traces", body, headers)
        r = conn.getresponse()
        r.read()
        if r.getheader("Connection", "").lower() == "close":
            conn.close()
        return str(r.status)
    except (OSError, http.client.HTTPException) as e:
        conn.close()
        return type(e).__name__


def _flood_http(k: int, cfg: Config, port: int, stop, counts: _Counts, names) -> None:
    conn, i = http.client.HTTPConnection("127.0.0.1", port, timeout=30), 0
    while not stop.is_set():
        jobs = names(cfg.jobs_per_request)
        if not jobs:
            break
        if i % 4 == 3:
            status = _http_post(conn, json_request(jobs), "application/json")
        else:
            status = _http_post(conn, pb_request(jobs).SerializeToString(),
                                "application/x-protobuf")
        counts.add("flood-http", status)
        if status == "200":
            counts.add("jobs", "accepted", len(jobs))
        i += 1
    conn.close()


def _flood_grpc(cfg: Config, target: str, stop, counts: _Counts, names) -> None:
    with grpc.insecure_channel(target) as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        while not stop.is_set():
            jobs = names(cfg.jobs_per_request)
            if not jobs:
                break
            try:
                stub.Export(pb_request(jobs), timeout=30)
                counts.add("flood-grpc", "OK")
                counts.add("jobs", "accepted", len(jobs))
            except grpc.RpcError as e:
                counts.add("flood-grpc", e.code().name)


def _bigattr(cfg: Config, port: int, target: str, stop, counts: _Counts) -> None:
    conn, i = http.client.HTTPConnection("127.0.0.1", port, timeout=60), 0
    with grpc.insecure_channel(target, options=[
            ("grpc.max_send_message_length", 64 * MiB)]) as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        while not stop.is_set():
            body = custom_badput_request(f"bigattr-{i % 3}", i, cfg.attr_bytes)
            if i % 2:
                try:
                    stub.Export(trace_service_pb2.ExportTraceServiceRequest.FromString(body),
                                timeout=60)
                    status = "OK"
                except grpc.RpcError as e:
                    status = e.code().name
            else:
                status = _http_post(conn, body, "application/x-protobuf")
            counts.add("bigattr", status)
            i += 1
    conn.close()


def _bombs(cfg: Config, port: int, stop, counts: _Counts) -> None:
    bomb = gzip_bomb(cfg.bomb_bytes)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while not stop.is_set():
        counts.add("bomb", _http_post(conn, bomb, "application/x-protobuf", gz=True))
    conn.close()


def _get(base: str, path: str) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(base + path, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return 0, str(e).encode()


def _healthy_report(base: str):
    status, body = _get(base, "/v1/report?job=healthy")
    return json.loads(body)["jobs"][0] if status == 200 else None


# --- the run --------------------------------------------------------------------------------


def run(cfg: Config) -> Result:
    """One abuse run against a fresh ``goodput serve`` (see the module docstring)."""
    t_start = time.monotonic()
    res = Result(config=cfg)
    with tempfile.TemporaryDirectory(prefix="serve-abuse-") as tmp:
        proc, addr, res.launcher, tail = start_serve(cfg, tmp)
        base, target = addr["http"], addr["grpc"]
        port = int(base.rsplit(":", 1)[1])
        try:
            healthy = pb_request(["healthy"], n=20).SerializeToString()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            for _ in range(100):  # 503 while the store replays its log
                if _http_post(conn, healthy, "application/x-protobuf") == "200":
                    break
                time.sleep(0.1)
            conn.close()
            before = _healthy_report(base)
            time.sleep(1.0)
            res.baseline_rss = _rss(proc.pid)[0]
            stop, counts = threading.Event(), _Counts()
            lock, sent = threading.Lock(), [0]

            def names(n: int) -> list[str]:  # the next n distinct job names
                with lock:
                    first = sent[0]
                    sent[0] = min(cfg.jobs, first + n)
                    return [f"flood-{i:06d}" for i in range(first, sent[0])]

            threads = [threading.Thread(target=_slowloris, args=(cfg, port, stop, counts)),
                       threading.Thread(target=_flood_grpc, args=(cfg, target, stop, counts,
                                                                 names)),
                       threading.Thread(target=_bigattr, args=(cfg, port, target, stop, counts)),
                       threading.Thread(target=_bombs, args=(cfg, port, stop, counts))]
            threads += [threading.Thread(target=_flood_http, args=(k, cfg, port, stop, counts,
                                                                  names))
                        for k in range(cfg.http_flooders)]
            for t in threads:
                t.daemon = True
                t.start()
            end = time.monotonic() + cfg.duration_s
            while time.monotonic() < end:
                rss, _ = _rss(proc.pid)
                res.peak_rss, res.samples = max(res.peak_rss, rss), res.samples + 1
                time.sleep(cfg.sample_s)
            stop.set()
            for t in threads:
                t.join(60)
            time.sleep(1.0)
            res.final_rss, res.hwm_rss = _rss(proc.pid)
            res.peak_rss = max(res.peak_rss, res.final_rss)
            res.answers = {k: dict(v) for k, v in counts.by_kind.items() if k != "jobs"}
            res.jobs_sent = sent[0]
            res.jobs_accepted = counts.by_kind.get("jobs", Counter())["accepted"]
            res.healthz_ok = _get(base, "/healthz") == (200, b"ok\n")
            res.healthy_unchanged = before is not None and _healthy_report(base) == before
            status, text = _get(base, "/metrics")
            if status == 200:
                res.serve_metrics = {
                    name + (f"[{reason}]" if reason else ""): float(v)
                    for name, reason, v in re.findall(
                        r'^(goodput_serve_(?:jobs|refused_total|requests_total))'
                        r'(?:\{[^}]*reason="([^"]*)"[^}]*\}|\{[^}]*\})? (\S+)$',
                        text.decode(), re.M)}
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                res.exit_code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                res.exit_code = proc.wait(10)
            time.sleep(0.2)
            res.stderr_tail = list(tail)[-10:]
    res.wall_s = time.monotonic() - t_start
    return res


def table(res: Result) -> str:
    """The result as a text table."""
    m = lambda b: f"{b / MiB:8.1f} MiB"  # noqa: E731
    lim = res.config.limits
    out = [f"goodput serve ({res.launcher}), limits: " + ", ".join(
        f"{k}={v}" for k, v in lim.items()),
        f"abuse for {res.config.duration_s:g} s: {res.config.slowloris} slow-loris connections "
        f"({res.config.slowloris_bytes // MiB} MiB announced), {res.jobs_sent} job names sent, "
        f"attributes of {res.config.attr_bytes // MiB} MiB, gzip bombs of "
        f"{res.config.bomb_bytes // MiB} MiB",
        "", f"RSS baseline            {m(res.baseline_rss)}",
        f"RSS peak (sampled, {res.samples:4d}) {m(res.peak_rss)}",
        f"RSS peak (VmHWM)        {m(res.hwm_rss)}",
        f"RSS at the end          {m(res.final_rss)}",
        f"ceiling                 {m(res.ceiling_bytes())}   (baseline + max_inflight_bytes + "
        "max_connections x 256 KiB + margin)",
        f"under the ceiling       {res.peak <= res.ceiling_bytes()}", "",
        f"{'kind':<12} {'answers by status':<60}"]
    for kind, by in sorted(res.answers.items()):
        out.append(f"{kind:<12} " + ", ".join(f"{s}: {n}" for s, n in sorted(
            by.items(), key=lambda kv: -kv[1])))
    if res.serve_metrics:
        out += ["", "serve's own counters at the end: " + ", ".join(
            f"{k.replace('goodput_serve_', '')}={v:g}" for k, v in res.serve_metrics.items())]
    out += ["", f"job names accepted      {res.jobs_accepted} of {res.jobs_sent} sent",
            f"/healthz answers ok     {res.healthz_ok}",
            f"healthy job unchanged   {res.healthy_unchanged}",
            f"serve exit code         {res.exit_code}", f"wall time               "
            f"{res.wall_s:.1f} s"]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    c = Config()
    p.add_argument("--duration", type=float, default=c.duration_s)
    p.add_argument("--slowloris", type=int, default=c.slowloris)
    p.add_argument("--slowloris-bytes", type=int, default=c.slowloris_bytes)
    p.add_argument("--jobs", type=int, default=c.jobs)
    p.add_argument("--jobs-per-request", type=int, default=c.jobs_per_request)
    p.add_argument("--attr-bytes", type=int, default=c.attr_bytes)
    p.add_argument("--bomb-bytes", type=int, default=c.bomb_bytes)
    p.add_argument("--margin", type=int, default=c.margin_bytes, help="bytes")
    for k, v in c.limits.items():
        p.add_argument(FLAGS[k], dest=k, type=type(v), default=v)
    p.add_argument("--json", action="store_true", help="print the result as JSON too")
    a = p.parse_args(argv)
    cfg = Config(duration_s=a.duration, slowloris=a.slowloris, slowloris_bytes=a.slowloris_bytes,
                 jobs=a.jobs, jobs_per_request=a.jobs_per_request, attr_bytes=a.attr_bytes,
                 bomb_bytes=a.bomb_bytes, margin_bytes=a.margin,
                 limits={k: getattr(a, k) for k in c.limits})
    res = run(cfg)
    print(table(res))
    if a.json:
        print(json.dumps(asdict(res), indent=1))
    ok = (res.peak <= res.ceiling_bytes() and res.healthz_ok and res.healthy_unchanged)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
