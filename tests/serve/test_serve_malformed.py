"""goodput serve refuses what is not OTLP, whole, and keeps what no job owns out of jobs.

A real :class:`GoodputServer` with a write-ahead log, on loopback: bodies that are not
OTLP get ``400`` (HTTP) or ``INVALID_ARGUMENT`` (gRPC) and leave no job, no log line and
no skip in any job's report. For the records serve does take in (span-level faults
included), its ``skipped`` equals ``goodput report``'s of the same job's write-ahead log
directory, and of the same spool when serve tails it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from otlp_fixtures import T0_NS, Timeline, otlp_span, request_line

from goodput import schema
from goodput_processor import report_run_dir
from goodput_processor.serve import GoodputServer, LiveStore, SpoolTailer
from goodput_processor.serve.wal import WriteAheadLog, job_slug

NOW = T0_NS + 10**15
S = 10**9
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _post(url, body: bytes, ctype="application/json"):
    req = urllib.request.Request(url + "/v1/traces", data=body, method="POST",
                                 headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _server(tmp_path) -> GoodputServer:
    store = LiveStore(min_interval_s=0, wal=WriteAheadLog(tmp_path / "wal"))
    return GoodputServer(store, grpc_port=0, http_port=0)


def _lines(job: str, trace: str) -> list[str]:
    """Request lines of ``job``: 4 steps, a step ending before it starts (invalid_span), a
    span with a bad id (invalid_span), a step sent twice (duplicate), and two spans of
    another instrumentation scope (unknown)."""
    tl = Timeline(job=job).job_start(0).steps(0, 4, start=0, step_time=1)
    res = tl.resource
    spans = [otlp_span(*s[:4], trace_id=trace) for s in tl.spans]
    bad_time = otlp_span(schema.STEP, T0_NS + 9 * S, T0_NS + 8 * S, {schema.ATTR_STEP: 9},
                         trace_id=trace)
    bad_id = {**otlp_span(schema.STEP, T0_NS + 5 * S, T0_NS + 6 * S, {schema.ATTR_STEP: 5},
                          trace_id=trace), "spanId": "not-hex-at-all!!"}
    other = [otlp_span("http.get", T0_NS, T0_NS + S, trace_id=trace) for _ in range(2)]
    return [request_line(res, spans[:3]),
            request_line(res, [spans[3], bad_time, bad_id, spans[1]]),
            request_line(res, other, scope="someone.else"),
            request_line(res, spans[4:])]


def _pb(job: str, trace: str) -> bytes:
    """A protobuf request of ``job``: a good step 7, a step ending before it starts and a
    step with a 4-byte span id (two invalid_span)."""
    req = trace_service_pb2.ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for key, value in Timeline(job=job).resource.items():
        any_value = (common_pb2.AnyValue(string_value=value) if isinstance(value, str)
                     else common_pb2.AnyValue(int_value=value))
        rs.resource.attributes.append(common_pb2.KeyValue(key=key, value=any_value))
    ss = rs.scope_spans.add()
    ss.scope.name = schema.SCOPE_NAME
    step = common_pb2.KeyValue(key=schema.ATTR_STEP, value=common_pb2.AnyValue(int_value=7))
    for sid, start, end in ((b"\0" * 7 + b"\x77", 7, 8), (b"\0" * 7 + b"\x78", 9, 8),
                            (b"\x79" * 4, 10, 11)):
        ss.spans.append(trace_pb2.Span(trace_id=bytes.fromhex(trace), span_id=sid,
                                       name=schema.STEP, start_time_unix_nano=T0_NS + start * S,
                                       end_time_unix_nano=T0_NS + end * S, attributes=[step]))
    return req.SerializeToString()


def _not_otlp(valid: dict) -> list[bytes]:
    """Bodies that are not OTLP, each about one place; ``valid`` is a good ResourceSpans."""
    rs = valid["resourceSpans"][0]
    ss = rs["scopeSpans"][0]
    bodies = [
        {"resourceSpans": 5},
        {"resourceSpans": {"0": rs}},
        {"resourceSpans": [rs, 7]},  # a good part first: nothing of it is taken either
        {"resourceSpans": [{**rs, "resource": [rs["resource"]]}]},
        {"resourceSpans": [{**rs, "resource": {"attributes": {"a": 1}}}]},
        {"resourceSpans": [{**rs, "resource": {"attributes": [{"key": 5, "value": {}}]}}]},
        {"resourceSpans": [{**rs, "resource": {"attributes": [
            *rs["resource"]["attributes"], {"key": "n", "value": {"intValue": "abc"}}]}}]},
        {"resourceSpans": [{**rs, "scopeSpans": {"spans": []}}]},
        {"resourceSpans": [{**rs, "scopeSpans": [ss, "x"]}]},
        {"resourceSpans": [{**rs, "scopeSpans": [{**ss, "scope": ["goodput"]}]}]},
        {"resourceSpans": [{**rs, "scopeSpans": [{**ss, "spans": {"a": 1}}]}]},
        {"resourceSpans": [{**rs, "scopeSpans": [{**ss, "spans": [*ss["spans"], 5]}]}]},
        {"resourceSpans": [{**rs, "scopeSpans": [{**ss, "spans": [None]}]}]},
        # a span's members of the wrong JSON type (benchmarks/abuse/bodies.py's case 6)
        {"resourceSpans": [{**rs, "scopeSpans": [{**ss, "spans": [
            {**ss["spans"][0], "spanId": 7}]}]}]},
        {"resourceSpans": [{**rs, "scopeSpans": [{**ss, "spans": [
            {**ss["spans"][0], "startTimeUnixNano": "x"}]}]}]},
        {"resourceSpans": [{**rs, "scopeSpans": [{**ss, "spans": [
            {**ss["spans"][0], "attributes": 5}]}]}]},
        {"resourceSpans": [{**rs, "scopeSpans": [{**ss, "spans": [
            {**ss["spans"][0], "events": [3]}]}]}]},
        [rs],
        {"resourcespans": [rs]},
    ]
    return [json.dumps(b).encode() for b in bodies]


def test_not_otlp_is_refused_whole_and_touches_no_job(tmp_path):
    srv = _server(tmp_path)
    url, wal = srv.addresses()["http"], tmp_path / "wal" / "jobs"
    try:
        first = _lines("a", "a" * 32)
        for line in first:
            assert _post(url, line.encode())[0] == 200
        before = {p.name: p.stat().st_size for p in wal.rglob("seg-*")}
        (was,) = srv.store.results(now_ns=NOW, job="a")
        intruder = json.loads(_lines("intruder", "b" * 32)[0])
        bodies = _not_otlp(intruder)
        for body in bodies:
            status, answer = _post(url, body)
            assert status == 400, (body, answer)
            assert b"expected" in answer  # says what is wrong, and where
        assert _post(url, b"\x0a\xff\xff", "application/x-protobuf")[0] == 400
        with grpc.insecure_channel(srv.addresses()["grpc"]) as ch:
            try:
                ch.unary_unary(EXPORT)(b"\x0a\xff\xff", timeout=10)
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        store = srv.store
        assert store.stats["refused_malformed"] == len(bodies) + 2
        assert store.jobs() == ["a"]  # nothing of the intruder's requests
        assert {p.name: p.stat().st_size for p in wal.rglob("seg-*")} == before
        assert [p.name for p in wal.iterdir()] == [job_slug("a")]
        (r,) = store.results(now_ns=NOW, job="a")
        live = {k: v for k, v in r.skipped.items() if v}
        assert live == {"invalid_span": 2, "duplicate": 1, "unknown": 2}
        assert "malformed" not in live
        assert r.skipped_examples == was.skipped_examples  # nothing of the other client's
        assert not any("intruder" in ex or "resourceSpans" in ex for ex in r.skipped_examples)
    finally:
        srv.stop(5, final=False)


def test_serve_and_goodput_report_count_the_same_skips(tmp_path):
    """The same records, two ways in: POSTed to serve as OTLP/JSON and protobuf (its
    write-ahead log reported by ``goodput report``), and written to a spool that serve
    tails and ``goodput report`` reads. A garbage line inside a file counts for the job
    the file named last, both ways; one before any job line is serve's own (never a
    job's)."""
    lines = _lines("m", "c" * 32)
    srv = _server(tmp_path)
    try:
        url = srv.addresses()["http"]
        for line in lines:
            assert _post(url, line.encode())[0] == 200
        assert _post(url, _pb("m", "c" * 32), "application/x-protobuf")[0] == 200
        assert _post(url, b'{"resourceSpans": 5}')[0] == 400
        (live,) = srv.store.results(now_ns=NOW, job="m")
    finally:
        srv.stop(5, final=False)
    (offline,) = report_run_dir(tmp_path / "wal" / "jobs" / job_slug("m"), now_ns=NOW)
    assert live.skipped == offline.skipped
    assert {k: v for k, v in live.skipped.items() if v} == {
        "invalid_span": 4, "duplicate": 1, "unknown": 2}
    assert live.step_time.count == offline.step_time.count

    run = tmp_path / "spool"
    run.mkdir()
    (run / "spans-p0-a0-1-x.jsonl").write_text(
        "\n".join([*lines[:2], "this is not json", '{"resourceSpans": 5}', *lines[2:]]) + "\n")
    store = LiveStore(min_interval_s=0)
    tailer = SpoolTailer(store, [run])
    tailer.poll()
    (tailed,) = store.results(now_ns=NOW)
    (read,) = report_run_dir(run, now_ns=NOW)
    assert tailed.skipped == read.skipped and tailed.skipped["malformed"] == 2
    assert {k: v for k, v in tailed.skipped.items() if v} == {
        "invalid_span": 2, "duplicate": 1, "unknown": 2, "malformed": 2}

    # a file whose first line names no job: serve's to count, in no job's report
    (run / "spans-p1-a0-2-y.jsonl").write_text("garbage before any job\n")
    tailer.poll()
    (tailed,) = store.results(now_ns=NOW)
    assert tailed.skipped["malformed"] == 2
    assert store.stats["skipped_malformed"] == 1
    assert store.serve_skips.counts() == {"malformed": 1}
    assert not any("spans-p1" in ex for ex in tailed.skipped_examples)
