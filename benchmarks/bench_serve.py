"""Ingest throughput and per-batch latency of ``goodput serve`` (one core, in-process).

Builds protobuf ``ExportTraceServiceRequest`` batches of 512 step spans (with a data
loading span every step, as a recorder exports them) and times
:meth:`LiveStore.ingest_request` (decode + append), batch by batch, over a long job. Prints
spans/s, p50/p99 per-batch latency for the first and the last 10% of batches (the cost must
not grow with history), the bytes held per step, and the time of one full accounting
(:meth:`LiveStore.results`) at the end. The same batches are then taken in again with the
write-ahead log on (encode to OTLP JSON lines + ``write()``, fsync every second as by
default), side by side in the same run, and the log's bytes per span are printed. Also
times the same batches through the real gRPC receiver on loopback (client and server on
this machine). The per-job rate limit is lifted for the benchmark.

    python benchmarks/bench_serve.py [--batches 2000] [--batch 512]

``--source NAME`` instead compares, side by side in one run, the same job (``--batches`` x
``--batch`` steps, one span a step) sent as this project's own ``goodput.step`` spans and
as a foreign producer's spans read through source NAME (``goodput serve``'s intake of
foreign OTLP, :mod:`goodput_processor.serve.foreign`), without and with the write-ahead
log, and prints the cost per span of each (the best of ``--rounds``). ``megatron``: Megatron-
LM's ``megatron.train.iteration`` spans on the resource of the real run in
``tests/data/sources/megatron/otlp.jsonl``; ``fwtool``: the test-only source of
``tests/fw_source.py``.

    python benchmarks/bench_serve.py --source megatron --batches 200 --rounds 5
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from goodput import schema
from goodput_processor.serve import GoodputServer, LiveStore
from goodput_processor.serve.limits import Limits
from goodput_processor.serve.wal import WriteAheadLog

#: No rate limit: the benchmark sends a month of spans in seconds.
UNLIMITED = Limits(max_job_spans_per_s=1e12)

T0 = 1_700_000_000_000_000_000


def _kv(key, **v):
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(**v))


def batch(i: int, size: int, job: str = "bench") -> bytes:
    """Serialized request ``i``: size/2 steps, each with a data loading span before it."""
    res = [_kv(schema.RES_SERVICE_NAME, string_value=job),
           _kv(schema.RES_JOB_NAME, string_value=job), _kv(schema.RES_ATTEMPT, int_value=0),
           _kv(schema.RES_PROCESS_INDEX, int_value=0),
           _kv(schema.RES_SCHEMA_VERSION, string_value="1")]
    spans = []
    for k in range(size // 2):
        n = i * (size // 2) + k
        t = T0 + n * 100_000_000
        spans.append(trace_pb2.Span(trace_id=b"\x01" * 16, span_id=(2 * n + 1).to_bytes(8, "big"),
                                    name=schema.DATA_LOADING, start_time_unix_nano=t,
                                    end_time_unix_nano=t + 5_000_000,
                                    attributes=[_kv(schema.ATTR_BLOCKING, bool_value=True)]))
        spans.append(trace_pb2.Span(trace_id=b"\x01" * 16, span_id=(2 * n + 2).to_bytes(8, "big"),
                                    name=schema.STEP, start_time_unix_nano=t + 5_000_000,
                                    end_time_unix_nano=t + 100_000_000,
                                    attributes=[_kv(schema.ATTR_STEP, int_value=n)]))
    scope = trace_pb2.ScopeSpans(scope=common_pb2.InstrumentationScope(name="goodput"),
                                 spans=spans)
    rs = trace_pb2.ResourceSpans(resource={"attributes": res}, scope_spans=[scope])
    return trace_service_pb2.ExportTraceServiceRequest(resource_spans=[rs]).SerializeToString()


def _foreign_batch(source: str, i: int, size: int, resource) -> bytes:
    """Request ``i`` of the foreign job: ``size`` step spans of ``source``."""
    spans = []
    for k in range(size):
        n = i * size + k
        t = T0 + n * 100_000_000
        if source == "megatron":
            name, attrs = "megatron.train.iteration", [
                _kv("is_goodput_span", bool_value=True), _kv("megatron.iteration", int_value=n),
                _kv("megatron.skipped", bool_value=False)]
        else:
            name, attrs = "fw.iteration", [_kv("fw.iteration", int_value=n)]
        spans.append(trace_pb2.Span(trace_id=b"\x02" * 16, span_id=(n + 1).to_bytes(8, "big"),
                                    parent_span_id=(1 << 62).to_bytes(8, "big"), name=name,
                                    start_time_unix_nano=t, end_time_unix_nano=t + 95_000_000,
                                    attributes=attrs))
    scope = trace_pb2.ScopeSpans(scope=common_pb2.InstrumentationScope(
        name="nemo.lens" if source == "megatron" else "fwtool"), spans=spans)
    rs = trace_pb2.ResourceSpans(resource=resource, scope_spans=[scope])
    return trace_service_pb2.ExportTraceServiceRequest(resource_spans=[rs]).SerializeToString()


def _own_steps(i: int, size: int) -> bytes:
    """Request ``i`` of the same job in this project's own schema: ``size`` step spans."""
    req = trace_service_pb2.ExportTraceServiceRequest.FromString(batch(i, 2 * size))
    ss = req.resource_spans[0].scope_spans[0]
    keep = [sp for sp in ss.spans if sp.name == schema.STEP]
    for sp in keep:  # one step every 100 ms, as the foreign job's
        n = sp.attributes[0].value.int_value
        sp.start_time_unix_nano, sp.end_time_unix_nano = (T0 + n * 100_000_000,
                                                          T0 + n * 100_000_000 + 95_000_000)
    del ss.spans[:]
    ss.spans.extend(keep)
    return req.SerializeToString()


def compare_source(args) -> int:
    """``--source``: see the module docstring."""
    import json
    import tempfile
    from pathlib import Path

    from google.protobuf import json_format
    from opentelemetry.proto.resource.v1 import resource_pb2

    from goodput_processor.importers import sources

    tests = Path(__file__).resolve().parent.parent / "tests"
    if args.source == "fwtool":
        sys.path.insert(0, str(tests))
        from fw_source import SOURCE

        sources._cache = {**sources.all_sources(), "fwtool": SOURCE}
        res = resource_pb2.Resource(attributes=[
            _kv("fw.job_id", string_value="bench"), _kv("fw.run_id", string_value="r1"),
            _kv("fw.rank", int_value=0)])
    elif args.source == "megatron":
        sources.get_source("megatron")  # ValueError when it is not registered
        with open(tests / "data" / "sources" / "megatron" / "otlp.jsonl") as f:
            doc = json.loads(f.readline())
        attrs = {"attributes": doc["resourceSpans"][0]["resource"]["attributes"]}
        res = json_format.ParseDict(attrs, resource_pb2.Resource())
    else:
        print(f"--source {args.source}: this benchmark knows megatron and fwtool")
        return 2
    own = [_own_steps(i, args.batch) for i in range(args.batches)]
    foreign = [_foreign_batch(args.source, i, args.batch, res) for i in range(args.batches)]
    nspans = args.batches * args.batch
    best: dict = {}
    for _ in range(args.rounds):
        for kind, payloads in (("own", own), ("foreign", foreign)):
            for wal in (False, True):
                with tempfile.TemporaryDirectory() as d:
                    log = WriteAheadLog(d).start() if wal else None
                    store = LiveStore(limits=UNLIMITED, wal=log)
                    if log is not None:
                        store.replay()
                    cpu, _ = _ingest(store, payloads)
                    if log is not None:
                        log.close()
                (r,) = store.results(now_ns=T0 + nspans * 100_000_000)
                key = (kind, wal)
                best[key] = min(best.get(key, (cpu, r))[0], cpu), r
    print(f"the same job ({args.batches} requests x {args.batch} steps, one span a step), "
          f"best of {args.rounds}; CPU per span, parse + take in:")
    for wal in (False, True):
        o, f = best[("own", wal)][0], best[("foreign", wal)][0]
        print(f"  {'with' if wal else 'without'} the write-ahead log: own schema "
              f"{o / nspans * 1e6:.2f} us, through source {args.source} {f / nspans * 1e6:.2f} us"
              f" = {f / o:.2f}x")
    ro, rf = best[("own", False)][1], best[("foreign", False)][1]
    print(f"  steps accounted: own {ro.step_time.count:,}, {args.source} "
          f"{rf.step_time.count:,}; goodput {ro.goodput:.4f} / {rf.goodput:.4f}")
    return 0


def _pct(xs):
    return np.percentile(np.array(xs) * 1e3, [50, 99])


def _ingest(store, payloads):
    """Take the payloads in as gRPC does (parse, then ingest); (CPU s, per-batch wall s)."""
    lat = []
    t_all = time.process_time()
    for raw in payloads:
        t = time.perf_counter()
        req = trace_service_pb2.ExportTraceServiceRequest.FromString(raw)  # as gRPC does
        store.ingest_request(req)
        lat.append(time.perf_counter() - t)
    return time.process_time() - t_all, lat


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--source", help="compare the own schema with source SOURCE's spans "
                   "(megatron, fwtool) instead; see the module docstring")
    p.add_argument("--rounds", type=int, default=3, help="--source: runs, the best kept")
    args = p.parse_args(argv)
    if args.source:
        return compare_source(args)
    payloads = [batch(i, args.batch) for i in range(args.batches)]
    store = LiveStore(limits=UNLIMITED)
    cpu, lat = _ingest(store, payloads)
    nspans = args.batches * args.batch
    tenth = max(1, args.batches // 10)
    early, late = _pct(lat[:tenth]), _pct(lat[-tenth:])
    steps = nspans // 2
    mem = store.memory_bytes()["bench"]
    t = time.perf_counter()
    (r,) = store.results(now_ns=T0 + steps * 100_000_000)
    acct = time.perf_counter() - t
    print(f"ingest (parse + decode + append), {args.batches} batches x {args.batch} spans:")
    print(f"  {nspans / cpu:,.0f} spans/s per core ({cpu:.2f} s CPU for {nspans:,} spans)")
    print(f"  per batch p50/p99: first 10% {early[0]:.2f}/{early[1]:.2f} ms, "
          f"last 10% {late[0]:.2f}/{late[1]:.2f} ms")
    print(f"  memory held: {mem / 1e6:.1f} MB for {steps:,} steps = {mem / steps:.0f} bytes/step "
          f"({mem / nspans:.1f} bytes/span)")
    print(f"  one full accounting at the end: {acct:.2f} s ({r.step_time.count:,} steps)")
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        wal = WriteAheadLog(d).start()
        logged = LiveStore(limits=UNLIMITED, wal=wal)
        logged.replay()
        cpu_wal, lat = _ingest(logged, payloads)
        wal.close()
        size = wal.size_bytes()
    p = _pct(lat)
    print(f"with the write-ahead log: {nspans / cpu_wal:,.0f} spans/s per core "
          f"({(cpu_wal - cpu) / nspans * 1e6:.2f} us more per span), per batch p50/p99 "
          f"{p[0]:.2f}/{p[1]:.2f} ms; {size / 1e6:.1f} MB logged = {size / nspans:.0f} "
          "bytes/span")

    srv = GoodputServer(LiveStore(limits=UNLIMITED), grpc_port=0, http_port=None)
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    ch = grpc.insecure_channel(srv.addresses()["grpc"])
    export = ch.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                            request_serializer=None, response_deserializer=None)
    del trace_service_pb2_grpc
    n = min(500, args.batches)
    lat = []
    t0 = time.perf_counter()
    for raw in payloads[:n]:
        t = time.perf_counter()
        export(raw, timeout=30)
        lat.append(time.perf_counter() - t)
    wall = time.perf_counter() - t0
    g = _pct(lat)
    print(f"gRPC on loopback, {n} sequential Export calls of {args.batch} spans: "
          f"{n * args.batch / wall:,.0f} spans/s, p50/p99 {g[0]:.2f}/{g[1]:.2f} ms")
    ch.close()
    srv.stop(5, final=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
