"""gRPC admission of ``goodput serve`` against hostile clients (issue 38, items 1b and 1c).

Starts ``goodput serve`` as a real subprocess on loopback (``python -m goodput_processor.cli
serve --grpc-port 0 --http-port 0 --token-file ...`` with the default limits unless given),
sends one healthy export with the OpenTelemetry SDK's gRPC exporter, then:

1. ``flood``: ``--flood`` concurrent ``TraceService/Export`` calls of ``--flood-bytes`` each
   (a valid request carrying one long attribute) with a **wrong** token (``--flood-token
   right``: the right one), ``--rounds`` times;
   the serve process's peak RSS (``VmHWM``) against the ceiling of ``docs/serve.md``
   ("Limits"; ``baseline + max_inflight_bytes + max_connections x 256 KiB + 96 MiB``, as
   ``benchmarks/serve_abuse.py`` checks it);
2. ``stall``: ``--stalled`` calls opened on one channel that never send their message, held
   for ``--hold`` seconds; meanwhile the SDK exporter exports every second (its result and
   time are counted), and at the end serve's ``refused_timeout`` counter (the stalled calls
   ended by ``--request-timeout`` or to make room).

Prints one line per figure; exit status 0 when the exports all succeeded and the peak is
under the ceiling.

    python benchmarks/grpc_admission.py [--flood 96] [--flood-bytes 15728640]
        [--flood-token wrong] [--stalled 300] [--hold 40] [--request-timeout 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import grpc

METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def proc_mem(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out


def start_serve(tmp: str, token: str, extra: list[str]):
    """``goodput serve`` on free ports: (process, grpc address, http base URL)."""
    tok = os.path.join(tmp, "token")
    with open(tok, "w") as f:
        f.write(token)
    p = subprocess.Popen([sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port",
                          "0", "--http-port", "0", "--token-file", tok, "--report-interval",
                          "3600", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        m = re.search(r"listening grpc=(\S+) http=(\S+)", line)
        if m:
            threading.Thread(target=p.stderr.read, daemon=True).start()  # drain
            return p, m.group(1), m.group(2)
    p.kill()
    raise RuntimeError("goodput serve did not say where it listens")


def exporter(addr: str, token: str):
    """The OpenTelemetry SDK's OTLP/gRPC span exporter with the token, and a span to send."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    mem = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"service.name": "legit",
                                                  "goodput.job.name": "legit"}))
    tp.add_span_processor(SimpleSpanProcessor(mem))
    with tp.get_tracer("legit").start_as_current_span("x"):
        pass
    exp = OTLPSpanExporter(endpoint=addr, insecure=True, timeout=10,
                           headers={"authorization": f"Bearer {token}"})
    return exp, mem.get_finished_spans()


def big_request(n: int) -> bytes:
    """A valid ``ExportTraceServiceRequest`` of about ``n`` bytes (one long attribute)."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2

    req = trace_service_pb2.ExportTraceServiceRequest()
    req.resource_spans.add().resource.attributes.add(
        key="pad", value=common_pb2.AnyValue(string_value="x" * max(0, n - 32)))
    return req.SerializeToString()


async def flood(addr: str, n: int, body: bytes, token: str,
                timeout_s: float = 60) -> dict[str, int]:
    """``n`` concurrent unary calls of ``body`` with ``token`` (each with a deadline of
    ``timeout_s``): their status codes, counted."""
    async with grpc.aio.insecure_channel(addr, options=[
            ("grpc.max_send_message_length", len(body) + 1024)]) as ch:
        call = ch.unary_unary(METHOD)
        md = (("authorization", f"Bearer {token}"),)

        async def one():
            try:
                await call(body, metadata=md, timeout=timeout_s)
                return "OK"
            except grpc.aio.AioRpcError as e:
                return e.code().name

        codes = await asyncio.gather(*(one() for _ in range(n)))
    out: dict[str, int] = {}
    for c in codes:
        out[c] = out.get(c, 0) + 1
    return out


async def stall(addr: str, n: int, token: str, hold_s: float, opened: threading.Event):
    """Open ``n`` stream-unary calls on one channel that never send their message; hold
    them ``hold_s`` seconds (or until they end); their final status codes, counted."""
    async with grpc.aio.insecure_channel(addr) as ch:
        m = ch.stream_unary(METHOD)
        md = (("authorization", f"Bearer {token}"),)
        calls = [m(metadata=md, timeout=hold_s + 30) for _ in range(n)]
        await asyncio.gather(*(c.wait_for_connection() for c in calls))
        opened.set()
        end = time.monotonic() + hold_s
        while time.monotonic() < end and not all(c.done() for c in calls):
            await asyncio.sleep(0.1)
        out: dict[str, int] = {}
        for c in calls:
            code = (await c.code()).name if c.done() else "still open"
            out[code] = out.get(code, 0) + 1
        for c in calls:
            c.cancel()
        return out


def counter(http: str, token: str, reason: str) -> float:
    req = urllib.request.Request(http + "/metrics",
                                 headers={"Authorization": f"Bearer {token}"})
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    m = re.search(r'goodput_serve_refused_total\{[^}]*goodput_serve_reason="' + reason
                  + r'"[^}]*\} (\S+)', text)
    return float(m.group(1)) if m else 0.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flood", type=int, default=96)
    p.add_argument("--flood-bytes", type=int, default=15 << 20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--flood-token", choices=("wrong", "right"), default="wrong",
                   help="flood with a wrong token (refused unread) or the right one (read "
                   "within the byte budget)")
    p.add_argument("--stalled", type=int, default=300)
    p.add_argument("--hold", type=float, default=40.0)
    p.add_argument("--request-timeout", type=float, default=30.0)
    p.add_argument("--max-connections", type=int, default=256)
    p.add_argument("--max-inflight-bytes", type=int, default=256 << 20)
    p.add_argument("--margin", type=int, default=96 << 20)
    a = p.parse_args(argv)
    token = "right-token"
    with tempfile.TemporaryDirectory() as tmp:
        proc, addr, http = start_serve(tmp, token, [
            "--request-timeout", str(a.request_timeout), "--max-connections",
            str(a.max_connections), "--max-inflight-bytes", str(a.max_inflight_bytes)])
        try:
            from opentelemetry.sdk.trace.export import SpanExportResult

            exp, spans = exporter(addr, token)
            assert exp.export(spans) == SpanExportResult.SUCCESS
            base = proc_mem(proc.pid)["VmRSS"]
            ceiling = (base + a.max_inflight_bytes + a.max_connections * (256 << 10)
                       + a.margin)
            body = big_request(a.flood_bytes)
            print(f"baseline RSS {base / 2**20:.0f} MiB; ceiling {ceiling / 2**20:.0f} MiB")
            t = time.monotonic()
            for r in range(a.rounds):
                codes = asyncio.run(flood(addr, a.flood, body, token if a.flood_token == "right"
                                          else "wrong-token"))
                mem = proc_mem(proc.pid)
                print(f"flood round {r + 1}: {a.flood} x {len(body) / 2**20:.1f} MiB "
                      f"{a.flood_token} token -> {codes}; RSS {mem['VmRSS'] / 2**20:.0f} MiB, peak "
                      f"{mem['VmHWM'] / 2**20:.0f} MiB ({time.monotonic() - t:.1f} s)")
            peak = proc_mem(proc.pid)["VmHWM"]
            opened, box = threading.Event(), []
            th = threading.Thread(target=lambda: box.append(asyncio.run(stall(
                addr, a.stalled, token, a.hold, opened))), daemon=True)
            th.start()
            opened.wait(60)
            ok = fail = 0
            worst = 0.0
            t0 = time.monotonic()
            while th.is_alive() and time.monotonic() - t0 < a.hold:
                t = time.monotonic()
                res = exp.export(spans)
                worst = max(worst, time.monotonic() - t)
                ok, fail = (ok + 1, fail) if res == SpanExportResult.SUCCESS else (ok, fail + 1)
                time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
            th.join(a.hold + 60)
            print(f"stall: {a.stalled} calls with no message on one channel, held {a.hold:g} s "
                  f"-> {box[0] if box else 'no answer'}; SDK exports meanwhile: {ok} ok, "
                  f"{fail} failed, slowest {worst:.2f} s; refused_timeout="
                  f"{counter(http, token, 'timeout'):g}, refused_unauthenticated="
                  f"{counter(http, token, 'unauthenticated'):g}")
            peak = max(peak, proc_mem(proc.pid)["VmHWM"])
            print(f"peak RSS {peak / 2**20:.0f} MiB of ceiling {ceiling / 2**20:.0f} MiB")
            return 0 if fail == 0 and ok > 0 and peak <= ceiling else 1
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
