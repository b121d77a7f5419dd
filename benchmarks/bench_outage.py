"""Step time and loss with an OTLP endpoint that is healthy, dead, slow or erroring.

The training loop (a ~2 ms CPU-bound step, recorded with ``goodput.step`` and
``goodput.data_loading``) runs in this process with the real OTLP/gRPC exporter; the
endpoint is a separate OS process (an OTLP/gRPC receiver on loopback that appends every
received span id to a file), so its work does not share our GIL. Scenarios run in
interleaved rounds; the table gives the median step time of each and its ratio to the
healthy endpoint. Then the long outage: the endpoint is down for ``--outage-s`` seconds
while training goes on, comes back, and the script measures how long the backlog takes to
arrive, the step time while it is replayed, and whether any span is missing
(spool span ids minus received span ids) or counted as dropped.

    .venv/bin/python benchmarks/bench_outage.py                 # 120 s outage
    .venv/bin/python benchmarks/bench_outage.py --outage-s 10 --steps 1000 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

SERVER = "serve"


def serve(port: int, mode: str, ids_path: str) -> None:
    """The endpoint: ``ok``, ``slow`` (0.5 s per request) or ``error`` (UNAVAILABLE)."""
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    out = open(ids_path, "a", encoding="ascii")  # noqa: SIM115

    class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802
            if mode == "error":
                context.abort(grpc.StatusCode.UNAVAILABLE, "injected")
            if mode == "slow":
                time.sleep(0.5)
            ids = [sp.span_id.hex() for rs in request.resource_spans
                   for ss in rs.scope_spans for sp in ss.spans]
            out.write("".join(i + "\n" for i in ids))
            out.flush()
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("up", flush=True)
    server.wait_for_termination()


def start_server(port: int, mode: str, ids_path: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, __file__, SERVER, str(port), mode, ids_path],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert p.stdout.readline().strip() == "up"
    return p


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def work(n: int = 80000) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def steps(goodput, count: int, first: int = 0) -> list[float]:
    times = []
    for n in range(first, first + count):
        t0 = time.perf_counter()
        with goodput.data_loading():
            pass
        with goodput.step(n):
            work()
        times.append(time.perf_counter() - t0)
    return times


def spool_ids(run_dir) -> set[str]:
    out = set()
    for path in Path(run_dir).glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                req = json.loads(line)
            except ValueError:
                continue
            out |= {sp["spanId"] for rs in req["resourceSpans"] for ss in rs["scopeSpans"]
                    for sp in ss["spans"]}
    return out


def scenario(goodput, mode: str, n_steps: int, tmp: str) -> float:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    port = free_port()
    ids = os.path.join(tmp, f"ids-{mode}-{port}")
    server = start_server(port, mode, ids) if mode != "dead" else None
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
    try:
        rec = goodput.configure(f"bench-{mode}", run_dir=os.path.join(tmp, f"run-{mode}-{port}"),
                                exporters=[exporter], handle_signals=False,
                                flush_interval_s=0.1)
        steps(goodput, 50)  # warm up
        times = steps(goodput, n_steps)
        rec._forward.shutdown(0.5)  # don't wait for a dead endpoint at shutdown
        goodput.shutdown()
    finally:
        if server is not None:
            server.kill()
            server.wait()
    return statistics.median(times)


def long_outage(goodput, outage_s: float, tmp: str) -> dict:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    port = free_port()
    ids_path = os.path.join(tmp, "ids-outage")
    run = os.path.join(tmp, "run-outage")
    server = start_server(port, "ok", ids_path)
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
    rec = goodput.configure("bench-outage", run_dir=run, exporters=[exporter],
                            handle_signals=False, flush_interval_s=1.0)
    before = steps(goodput, 500)
    server.kill()
    server.wait()
    t_down = time.monotonic()
    during, n = [], 500
    while time.monotonic() - t_down < outage_s:
        during += steps(goodput, 100, n)
        n += 100
    rec.flush(exporters=False)
    backlog = rec.stats()["exporters"]["OTLPSpanExporter"]["pending_bytes"]
    server = start_server(port, "ok", ids_path)
    t_up = time.monotonic()
    replay = []
    while rec.stats()["exporters"]["OTLPSpanExporter"]["pending_bytes"] > 0 and \
            time.monotonic() - t_up < 600:
        replay += steps(goodput, 20, n)
        n += 20
    drain_s = time.monotonic() - t_up
    goodput.shutdown()
    server.kill()
    server.wait()
    received = set(Path(ids_path).read_text().split())
    spooled = spool_ids(run)
    stats = rec.stats()
    med = statistics.median
    return {
        "outage_s": round(outage_s, 1), "steps": n, "spans_spooled": len(spooled),
        "backlog_bytes": backlog, "drain_s": round(drain_s, 2),
        "missing": len(spooled - received), "dropped": stats["dropped"],
        "failed_exports": stats["exporters"]["OTLPSpanExporter"]["failures"],
        "step_ms_before": round(med(before) * 1e3, 3),
        "step_ms_during_outage": round(med(during) * 1e3, 3),
        "step_ms_during_replay": round(med(replay) * 1e3, 3) if replay else None,
        "replay_steps": len(replay),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000, help="steps per scenario and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--outage-s", type=float, default=120.0)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import logging

    logging.disable(logging.ERROR)  # the exporters log every failed attempt
    import goodput

    modes = ["healthy", "dead", "slow", "error"]
    results: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for mode in modes:
                results[mode].append(scenario(goodput, "ok" if mode == "healthy" else mode,
                                              args.steps, tmp))
        base = statistics.median(results["healthy"])
        print(f"step time, median of {args.rounds} rounds x {args.steps} steps (~2 ms CPU)")
        print(f"{'endpoint':<10}{'ms/step':>10}{'ratio':>8}")
        for mode in modes:
            m = statistics.median(results[mode])
            print(f"{mode:<10}{m * 1e3:>10.3f}{m / base:>8.3f}")
        out = long_outage(goodput, args.outage_s, tmp)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == SERVER:
        serve(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        main()
