"""Memory under hostile input: the spool reader and the ``goodput serve`` receivers.

Each scenario runs in a fresh Python process and reports its peak resident memory
(``VmHWM``) above the same process's resident memory after imports and setup (``base``),
so the figure is what the hostile input costs. Scenarios:

reader (``read_run_dir`` on a run directory of one valid job plus a hostile file)
  garbage-jobless   N lines of garbage after a first line that names no job
  garbage-job       N lines of garbage after a valid line (skips tied to that job)
  huge-line         one span whose attribute value is M MiB (one line of ~M MiB)
  invalid-spans     N well-formed spans that are all invalid (negative times)

receiver (a real ``GoodputServer``, gRPC + HTTP on loopback, max message 16 MiB)
  gzip-bombs        N HTTP requests of 1 GiB of zeros gzipped (~1 MiB each on the wire)
  big-values        N protobuf requests near the limit: one 15 MiB attribute value each
  garbage-requests  N protobuf bodies that do not parse (gRPC and HTTP alternately)
  bad-token         N requests with a wrong bearer token
  many-jobs         N requests each naming a new job (one span each): memory per job
  keepalive         latency of N requests on one keep-alive HTTP connection, per answer kind
                    (JSON 200, protobuf 200, protobuf 400): ms per request

    python benchmarks/fuzz_memory.py [--scale 1.0] [--only NAME ...]

``--scale`` multiplies N and M (1.0: about 2 minutes on a 2-core machine).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
T0 = 1_700_000_000_000_000_000
NS = 1_000_000_000


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_hwm() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _good(d: Path) -> None:
    from otlp_fixtures import Timeline

    Timeline("good").job_start(0).steps(1, 100, 0, 1).job_end(100).write(d)


def _span_line(job: str, **over) -> bytes:
    from otlp_fixtures import otlp_span, request_line, resource

    from goodput import schema

    sp = otlp_span(schema.STEP, T0, T0 + NS, {schema.ATTR_STEP: 1}, trace_id="ab" * 16,
                   span_id=1)
    sp.update(over)
    return request_line(resource(job), [sp]).encode()


# --- reader scenarios: build the files, then measure read_run_dir only -------------------

def reader_scenario(name: str, scale: float) -> dict:
    from goodput_processor import read_run_dir

    d = Path(tempfile.mkdtemp(prefix="fuzzmem-"))
    _good(d)
    n = int(1_000_000 * scale)
    mib = max(1, int(64 * scale))
    with open(d / "hostile.jsonl", "wb") as f:
        if name == "garbage-jobless":
            f.write(b'{"resourceSpans":[]}\n')
            f.write(b"this line is not JSON at all\n" * n)
        elif name == "garbage-job":
            f.write(_span_line("junk") + b"\n")
            f.write(b"this line is not JSON at all\n" * n)
        elif name == "huge-line":
            from goodput import schema

            attrs = [{"key": schema.ATTR_STEP, "value": {"intValue": "1"}},
                     {"key": "x", "value": {"stringValue": "x" * (mib << 20)}}]
            f.write(_span_line("junk", attributes=attrs) + b"\n")
            n = mib
        elif name == "invalid-spans":
            from otlp_fixtures import otlp_span, request_line, resource

            from goodput import schema

            per = 512
            for i in range(0, n, per):
                spans = [otlp_span(schema.STEP, -5, 1, {schema.ATTR_STEP: j}, trace_id="ab" * 16,
                                   span_id=i + j + 1) for j in range(per)]
                f.write(request_line(resource("junk"), spans).encode() + b"\n")
        else:
            raise SystemExit(f"unknown reader scenario {name!r}")
    size = sum(p.stat().st_size for p in d.iterdir())
    base = _status("VmRSS")
    _reset_hwm()
    t = time.perf_counter()
    spans = read_run_dir(d, workers=1)
    dt = time.perf_counter() - t
    peak = _status("VmHWM")
    skipped = dict(spans.skipped)
    for job in spans.jobs.values():
        for k, v in job.skipped.items():
            if v:
                skipped[k] = skipped.get(k, 0) + v
    good = spans.jobs["good"].processes[(0, 0, "")].data.shape[0]
    shutil.rmtree(d, ignore_errors=True)
    return {"scenario": name, "n": n, "input_mib": round(size / 2**20, 1),
            "peak_over_base_mib": round((peak - base) / 2**20, 1), "seconds": round(dt, 2),
            "good_spans_kept": good, "skipped": {k: v for k, v in skipped.items() if v}}


# --- receiver scenarios: server and clients in this process -------------------------------

def _pb(job: str, n: int = 1, extra_value: str | None = None):
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    from goodput import schema

    req = trace_service_pb2.ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key=schema.RES_JOB_NAME,
                               value=common_pb2.AnyValue(string_value=job))
    if extra_value is not None:
        rs.resource.attributes.add(key="x.big", value=common_pb2.AnyValue(
            string_value=extra_value))
    ss = rs.scope_spans.add()
    ss.scope.name = schema.SCOPE_NAME
    for i in range(n):
        ss.spans.append(trace_pb2.Span(
            trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"), name=schema.STEP,
            start_time_unix_nano=T0 + i * NS, end_time_unix_nano=T0 + (i + 1) * NS,
            attributes=[common_pb2.KeyValue(key=schema.ATTR_STEP,
                                            value=common_pb2.AnyValue(int_value=i))]))
    return req


def receiver_scenario(name: str, scale: float) -> dict:
    import http.client

    import grpc

    from goodput_processor.serve import GoodputServer, LiveStore

    token = "s3cret"
    srv = GoodputServer(LiveStore(), grpc_port=0, http_port=0, token=token)
    auth = {"Authorization": f"Bearer {token}"}
    md = [("authorization", f"Bearer {token}")]
    channel = grpc.insecure_channel(srv.addresses()["grpc"], options=[
        ("grpc.max_send_message_length", 64 << 20)])
    export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
    conn = http.client.HTTPConnection(srv.http.host, srv.http.port, timeout=60)

    def post(body: bytes, headers: dict) -> int:
        nonlocal conn
        conn.request("POST", "/v1/traces", body=body, headers={
            "Content-Type": "application/x-protobuf", **headers})
        r = conn.getresponse()
        r.read()
        if r.getheader("Connection") == "close":
            conn.close()
            conn = http.client.HTTPConnection(srv.http.host, srv.http.port, timeout=60)
        return r.status

    def grpc_call(body: bytes, metadata) -> str:
        try:
            export(body, metadata=metadata, timeout=60)
            return "OK"
        except grpc.RpcError as e:
            return e.code().name

    # warm both paths once, so that first-use allocations are in the base
    post(_pb("warm").SerializeToString(), auth)
    grpc_call(_pb("warm").SerializeToString(), md)
    statuses: dict = {}
    n = max(1, int({"gzip-bombs": 20, "big-values": 20, "garbage-requests": 20000,
                    "bad-token": 20000, "many-jobs": 20000, "keepalive": 200}[name] * scale))
    if name == "keepalive":
        ms = {}
        for kind, body, ctype in (
                ("json-200", b'{"resourceSpans":[]}', "application/json"),
                ("protobuf-200", _pb("k").SerializeToString(), "application/x-protobuf"),
                ("protobuf-400", b"\xff\xfe" * 64, "application/x-protobuf")):
            t = time.perf_counter()
            for _ in range(n):
                statuses[post(body, {**auth, "Content-Type": ctype})] = 1
            ms[kind] = round((time.perf_counter() - t) / n * 1000, 2)
        srv.stop(5, final=False)
        return {"scenario": name, "n": n, "ms_per_request": ms, "answers": sorted(statuses)}
    bomb = gzip.compress(b"\x00" * (1 << 30), 9) if name == "gzip-bombs" else b""
    big = _pb("big", 1, "v" * (15 << 20)).SerializeToString() if name == "big-values" else b""
    base = _status("VmRSS")
    _reset_hwm()
    t = time.perf_counter()
    for i in range(n):
        if name == "gzip-bombs":
            s = post(bomb, {**auth, "Content-Encoding": "gzip"})
        elif name == "big-values":
            s = grpc_call(big, md) if i % 2 else post(big, auth)
        elif name == "garbage-requests":
            s = grpc_call(b"\xff\xfe" * 64, md) if i % 2 else post(b"\xff\xfe" * 64, auth)
        elif name == "bad-token":
            bad = [("authorization", "Bearer wrong")]
            s = grpc_call(b"", bad) if i % 2 else post(b"", {"Authorization": "Bearer no"})
        elif name == "many-jobs":
            s = grpc_call(_pb(f"job-{i:07d}").SerializeToString(), md)
        else:
            raise SystemExit(f"unknown receiver scenario {name!r}")
        statuses[s] = statuses.get(s, 0) + 1
    dt = time.perf_counter() - t
    peak, now = _status("VmHWM"), _status("VmRSS")
    stats = {k: v for k, v in srv.store.stats.items() if v}
    jobs = len(srv.store.jobs())
    channel.close()
    conn.close()
    srv.stop(5, final=False)
    out = {"scenario": name, "n": n, "peak_over_base_mib": round((peak - base) / 2**20, 1),
           "retained_mib": round((now - base) / 2**20, 1), "seconds": round(dt, 2),
           "answers": statuses, "stats": stats, "jobs": jobs}
    if name == "gzip-bombs":
        out["bomb_wire_kib"] = round(len(bomb) / 1024)
    if name == "many-jobs":
        out["retained_bytes_per_job"] = round((now - base) / n)
    return out


READER = ("garbage-jobless", "garbage-job", "huge-line", "invalid-spans")
RECEIVER = ("gzip-bombs", "big-values", "garbage-requests", "bad-token", "many-jobs",
            "keepalive")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        fn = reader_scenario if args.child in READER else receiver_scenario
        print(json.dumps(fn(args.child, args.scale)))
        return
    for name in args.only or (READER + RECEIVER):
        r = subprocess.run([sys.executable, __file__, "--child", name, "--scale",
                            str(args.scale)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if r.returncode:
            print(json.dumps({"scenario": name, "error": r.stderr.strip()[-2000:]}))
        else:
            print(r.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
