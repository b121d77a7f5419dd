"""Fuzzing the spool reader and the OTLP receiver with malformed, truncated and hostile input.

Hypothesis strategies (seeded, bounded) plus a list of hand-written hostile cases, on the
real reader (``read_run_dir`` over files) and the real ``goodput serve`` receivers (gRPC and
HTTP servers on loopback). Checked: no crash (only the documented errors), a clear error that
names the input (``file:line`` for the reader, a ``google.rpc.Status`` for the receiver), the
refusal is counted, and nothing that was valid is lost. Memory bounds are measured in
``benchmarks/fuzz_memory.py``, not here (no timed or sized assertions in tests).
"""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import math
import re
import socket

import grpc
import pytest
from google.rpc import status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from otlp_fixtures import T0_NS, Timeline, otlp_span, request_line, resource

from goodput import schema
from goodput_processor import read_run_dir, report_run_dir, to_json, to_json_dict
from goodput_processor.read.reader import RunDirError, SpoolFormatError
from goodput_processor.serve import GoodputServer, LiveStore

NS = 1_000_000_000
NOW = T0_NS + 10**6 * NS
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.large_base_example])
GOOD_JOB, JUNK_JOB = "good-alpha", "zz"
_WHERE = re.compile(r"^(/.+\.jsonl:\d+|attempt \d+ process \d+|[\w-]+:.+?): ")


def _good(path):
    """The valid input whose result must survive anything written next to it."""
    t = Timeline(GOOD_JOB).job_start(0).span("training_prep", 0, 2).steps(1, 20, 2, 1)
    t.save(22, 23, step=20).custom("eval", 23, 25).job_end(25)
    return t.write(path)


def _doc(results, job=GOOD_JOB) -> dict:
    (doc,) = [j for j in to_json_dict(results)["jobs"] if j["job"] == job]
    doc.pop("skipped_examples")
    return doc


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    d = tmp_path_factory.mktemp("baseline")
    _good(d)
    return _doc(report_run_dir(d, now_ns=NOW))


# --- hostile values ---------------------------------------------------------------------

_KEYS = ["resourceSpans", "resource", "attributes", "key", "value", "intValue", "stringValue",
         "doubleValue", "boolValue", "arrayValue", "scopeSpans", "scope", "name", "spans",
         "startTimeUnixNano", "endTimeUnixNano", "spanId", "traceId", "status", "code",
         schema.RES_JOB_NAME, schema.RES_ATTEMPT, schema.ATTR_STEP, schema.ATTR_BADPUT_TYPE]
_scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
            | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
            | st.sampled_from(["-1", "NaN", "1e400", "9" * 30, "0x10", "", "\udcff"]))
hostile = st.recursive(_scalars, lambda c: st.lists(c, max_size=4)
                       | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=6), c,
                                         max_size=4), max_leaves=25)


def _maybe(draw, valid, p=4):
    """``valid`` most of the time, else a hostile value."""
    return draw(hostile) if draw(st.integers(0, p)) == 0 else valid


@st.composite
def otlp_shaped(draw):
    """A JSON request that is nearly valid, with hostile values in random places."""
    spans = []
    for i in range(draw(st.integers(0, 4))):
        start = T0_NS + draw(st.integers(-(10**19), 10**12))
        spans.append({
            "traceId": _maybe(draw, "ab" * 16), "spanId": _maybe(draw, f"{i + 1:016x}"),
            "name": _maybe(draw, draw(st.sampled_from(schema.SPAN_NAMES))),
            "startTimeUnixNano": _maybe(draw, str(start)),
            "endTimeUnixNano": _maybe(draw, str(start + draw(st.integers(-5, 10**10)))),
            "attributes": _maybe(draw, [{"key": _maybe(draw, draw(st.sampled_from(_KEYS))),
                                         "value": _maybe(draw, {"intValue": str(i)})}]),
            "status": _maybe(draw, {"code": 2}),
        })
    res = {"attributes": _maybe(draw, [{"key": schema.RES_JOB_NAME,
                                        "value": {"stringValue": JUNK_JOB}}])}
    return {"resourceSpans": _maybe(draw, [{
        "resource": _maybe(draw, res),
        "scopeSpans": _maybe(draw, [{"scope": _maybe(draw, {"name": schema.SCOPE_NAME}),
                                     "spans": _maybe(draw, spans)}])}])}


def _dumps(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode("utf-8", "surrogateescape")


_VALID_JUNK = request_line(resource(JUNK_JOB), [otlp_span(
    schema.STEP, T0_NS, T0_NS + NS, {schema.ATTR_STEP: 1}, trace_id="cd" * 16, span_id=1)])
junk_lines = st.one_of(
    st.binary(max_size=120),
    hostile.map(_dumps),
    otlp_shaped().map(_dumps),
    st.integers(0, len(_VALID_JUNK)).map(lambda n: _VALID_JUNK.encode()[:n]),  # truncated
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),  # deep nesting
    st.integers(1, 3000).map(lambda n: b'{"resourceSpans":' + b"[" * n + b"]" * n + b"}"),
)


# --- the spool reader ---------------------------------------------------------------------

@FUZZ
@given(lines=st.lists(junk_lines, max_size=12), newline_at_end=st.booleans())
def test_reader_survives_hostile_lines_and_keeps_valid_input(tmp_path_factory, baseline, lines,
                                                             newline_at_end):
    d = tmp_path_factory.mktemp("fuzz")
    _good(d)
    body = b"\n".join([_VALID_JUNK.encode(), *lines]) + (b"\n" if newline_at_end else b"")
    (d / "junk.jsonl").write_bytes(body)
    spans = read_run_dir(d)  # the junk file starts with a valid line: no error at all
    results = report_run_dir(d, now_ns=NOW)
    to_json(results)  # the report can always be written (no NaN/infinity, no bad types)
    assert _doc(results) == baseline  # nothing valid is lost, nothing leaks into it
    for job in spans.jobs.values():
        assert all(v >= 0 for v in job.skipped.values())
        for ex in job.examples:
            assert _WHERE.match(ex), ex  # every example names the file:line (or process)
    # the live service takes the same lines one by one without raising
    store = LiveStore(min_interval_s=0)
    for n, line in enumerate(body.split(b"\n"), 1):
        store.ingest_line(line, ("junk.jsonl", n))
    for r in store.results(now_ns=NOW):
        assert sum(r.buckets_ns.values()) == r.total_ns and 0 <= r.goodput <= 1
    to_json(store.results(now_ns=NOW))


def _span_line(**over) -> bytes:
    sp = otlp_span(schema.STEP, T0_NS + 30 * NS, T0_NS + 31 * NS, {schema.ATTR_STEP: 99},
                   trace_id="ef" * 16, span_id=7)
    sp.update(over)
    return request_line(resource(JUNK_JOB), [sp]).encode()


HOSTILE_LINES = [  # (id, line, reason it is counted under, part of the message)
    ("not-json", b"hello", "malformed", "invalid JSON"),
    ("invalid-utf8", b'{"resourceSpans":[{"x":"\xff\xfe"}]}', "malformed", "invalid JSON"),
    ("json-array", b"[1,2,3]", "malformed", "got list"),
    ("no-resourceSpans", b'{"a":1}', "malformed", "with keys ['a']"),
    ("resourceSpans-int", b'{"resourceSpans":5}', "malformed", "bad OTLP structure"),
    ("resource-list", b'{"resourceSpans":[{"resource":[1]}]}', "malformed", "bad OTLP"),
    ("deep-nesting", b"[" * 100_000 + b"]" * 100_000, "malformed", "invalid JSON"),
    ("huge-number", b'{"resourceSpans":[' + b"9" * 5000 + b"]}", "malformed", "invalid JSON"),
    ("nan-time", _span_line(startTimeUnixNano=float("nan")), "invalid_span", "ValueError"),
    ("negative-time", _span_line(startTimeUnixNano="-5"), "invalid_span", "negative time"),
    ("time-over-int64", _span_line(endTimeUnixNano=str(2**64)), "invalid_span", "int64"),
    ("end-before-start", _span_line(endTimeUnixNano=str(T0_NS)), "invalid_span", "end before"),
    ("time-as-list", _span_line(startTimeUnixNano=[1]), "invalid_span", "TypeError"),
    ("short-span-id", _span_line(spanId="01"), "invalid_span", "16 hex digits"),
    ("long-trace-id", _span_line(traceId="ab" * 20), "invalid_span", "16 hex digits"),
    ("non-hex-id", _span_line(spanId="zz" * 8), "invalid_span", "ValueError"),
    ("name-dict", _span_line(name={"a": 1}), "invalid_span", "unhashable"),
    ("step-not-int", _span_line(attributes=[{"key": schema.ATTR_STEP,
                                            "value": {"stringValue": "x"}}]),
     "invalid_span", "ValueError"),
    ("step-huge", _span_line(attributes=[{"key": schema.ATTR_STEP,
                                         "value": {"intValue": str(2**80)}}]),
     "invalid_span", "int64"),
    ("attributes-str", _span_line(attributes="abc"), "invalid_span", "TypeError"),
    ("status-str", _span_line(status="x"), "invalid_span", "AttributeError"),
]


@pytest.mark.parametrize("line,reason,why", [c[1:] for c in HOSTILE_LINES],
                         ids=[c[0] for c in HOSTILE_LINES])
def test_reader_hand_written_hostile_lines(tmp_path, baseline, line, reason, why):
    _good(tmp_path)
    path = tmp_path / "junk.jsonl"
    path.write_bytes(_VALID_JUNK.encode() + b"\n" + line + b"\n")
    spans = read_run_dir(tmp_path)
    junk = spans.jobs[JUNK_JOB]
    assert junk.skipped[reason] == 1, dict(junk.skipped)
    assert sum(junk.skipped.values()) == 1
    (example,) = junk.examples
    assert example.startswith(f"{path}:2: ") and why in example, example
    assert _doc(report_run_dir(tmp_path, now_ns=NOW)) == baseline


def test_reader_huge_attribute_value_and_nan_run_attributes(tmp_path):
    """A 4 MB custom badput type is kept whole; NaN/infinite run attributes are dropped, so
    the JSON report can still be written."""
    big = "x" * (4 << 20)
    t = Timeline("big").job_start(0).custom(big, 0, 5).steps(1, 5, 5, 1).job_end(10)
    t.write(tmp_path)
    line = request_line({**resource("nanrun"), schema.RES_FLOPS_PER_STEP: float("nan"),
                         schema.RES_PEAK_FLOPS: float("inf"), schema.RES_DEVICE_COUNT: 8},
                        [otlp_span(schema.STEP, T0_NS, T0_NS + NS, {schema.ATTR_STEP: 1},
                                   trace_id="12" * 16)])
    assert "NaN" in line and "Infinity" in line
    (tmp_path / "nan.jsonl").write_text(line + "\n")
    results = {r.job: r for r in report_run_dir(tmp_path, now_ns=NOW)}
    assert results["big"].buckets_ns[schema.custom_bucket(big)] == 5 * NS
    assert results["nanrun"].run == {schema.RES_DEVICE_COUNT: 8}
    assert results["nanrun"].mfu is None
    doc = json.loads(to_json(list(results.values())))
    assert {j["job"] for j in doc["jobs"]} == {"big", "nanrun"}


def test_reader_errors_name_the_input(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b"\x00\x01garbage\n")
    with pytest.raises(SpoolFormatError, match=rf"^{re.escape(str(tmp_path / 'a.jsonl'))}:1: "
                       "not an OTLP JSON lines file"):
        read_run_dir(tmp_path)
    (tmp_path / "a.jsonl").write_text(_span_line(spanId="1").decode() + "\n")
    with pytest.raises(RunDirError, match=r"holds no goodput spans \(1 file\(s\) read; "
                       r"skipped invalid_span: 1\)"):
        read_run_dir(tmp_path)


def test_reader_garbage_after_a_jobless_first_line_is_counted_not_kept(tmp_path, baseline):
    """Lines that cannot be tied to a job are counted by reason with a few examples; the
    reader keeps no per-line record of them (memory: benchmarks/fuzz_memory.py)."""
    _good(tmp_path)
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(b'{"resourceSpans":[]}\n' + b"garbage\n" * 5000)
    spans = read_run_dir(tmp_path)
    assert spans.skipped["malformed"] == 5000
    assert len(spans.examples) == 20 and spans.examples[0].startswith(f"{junk}:2: ")
    (r,) = report_run_dir(tmp_path, now_ns=NOW)
    assert r.skipped["malformed"] == 5000  # not tied to a job: shown in every job
    doc = _doc([r])
    doc["skipped"]["malformed"] = 0
    assert doc == baseline


# --- the OTLP receiver: hostile protobuf and JSON into the live store ---------------------

_ATTR_KEYS = [schema.ATTR_STEP, schema.ATTR_STEP_COUNT, schema.ATTR_CHECKPOINT_STEP,
              schema.ATTR_BLOCKING, schema.ATTR_BADPUT_TYPE, schema.ATTR_END_REASON,
              schema.ATTR_RECORDER_ERRORS, schema.ATTR_HEARTBEAT_INTERVAL_MS, "other"]
_RES_KEYS = [schema.RES_SERVICE_NAME, schema.RES_JOB_NAME, schema.RES_ATTEMPT,
             schema.RES_PROCESS_INDEX, schema.RES_PROCESS_COUNT, schema.RES_SCHEMA_VERSION,
             schema.RES_FLOPS_PER_STEP, schema.RES_PEAK_FLOPS, schema.RES_DEVICE_COUNT]
any_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(lambda v: common_pb2.AnyValue(int_value=v)),
    st.floats().map(lambda v: common_pb2.AnyValue(double_value=v)),
    st.text(max_size=8).map(lambda v: common_pb2.AnyValue(string_value=v)),
    st.booleans().map(lambda v: common_pb2.AnyValue(bool_value=v)),
    st.binary(max_size=8).map(lambda v: common_pb2.AnyValue(bytes_value=v)),
    st.just(common_pb2.AnyValue(array_value=common_pb2.ArrayValue(
        values=[common_pb2.AnyValue(int_value=1)]))),
)


def _kvs(keys):
    return st.lists(st.builds(lambda k, v: common_pb2.KeyValue(key=k, value=v),
                              st.sampled_from(keys) | st.text(max_size=4), any_values),
                    max_size=4)


pb_spans = st.builds(
    lambda tid, sid, name, start, dur, attrs, code: trace_pb2.Span(
        trace_id=tid, span_id=sid, name=name, start_time_unix_nano=start,
        end_time_unix_nano=min(max(start + dur, 0), 2**64 - 1), attributes=attrs,
        status=trace_pb2.Status(code=code)),
    st.one_of(st.just(b"\x0a" * 16), st.binary(max_size=20)),
    st.one_of(st.binary(min_size=8, max_size=8), st.binary(max_size=10)),
    st.sampled_from(schema.SPAN_NAMES) | st.text(max_size=10),
    st.one_of(st.integers(T0_NS, T0_NS + 100 * NS), st.integers(0, 2**64 - 1)),
    st.integers(-(10**9), 10**11), _kvs(_ATTR_KEYS), st.integers(0, 2))
pb_requests = st.builds(
    lambda rss: trace_service_pb2.ExportTraceServiceRequest(resource_spans=rss),
    st.lists(st.builds(
        lambda res, scope, spans: trace_pb2.ResourceSpans(
            resource={"attributes": res},
            scope_spans=[trace_pb2.ScopeSpans(
                scope=common_pb2.InstrumentationScope(name=scope), spans=spans)]),
        _kvs(_RES_KEYS), st.sampled_from([schema.SCOPE_NAME, schema.SCOPE_NAME, "other"]),
        st.lists(pb_spans, max_size=6)), max_size=3))


def _check_store(store: LiveStore) -> None:
    results = store.results(now_ns=NOW)
    for r in results:
        assert all(v >= 0 for v in r.buckets_ns.values())
        assert sum(r.buckets_ns.values()) == r.total_ns and 0 <= r.goodput <= 1
        assert r.mfu is None or math.isfinite(r.mfu)
    to_json(results)


@FUZZ
@given(reqs=st.lists(pb_requests, min_size=1, max_size=3), cut=st.integers(0, 400),
       flip=st.integers(0, 255))
def test_live_store_survives_hostile_protobuf(reqs, cut, flip):
    store = LiveStore(min_interval_s=0)
    store.ingest_request(_pb_good(), "good")
    for req in reqs:
        n = store.ingest_request(req, "fuzz")
        assert n == sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        data = bytearray(req.SerializeToString())[:cut]  # truncated, one byte changed
        if data:
            data[flip % len(data)] ^= 0x5A
        parsed = trace_service_pb2.ExportTraceServiceRequest()
        try:
            parsed.ParseFromString(bytes(data))
        except Exception as e:  # noqa: BLE001 - what the receivers catch and answer 400
            assert type(e).__name__ == "DecodeError"
        else:
            store.ingest_request(parsed, "mutated")
    _check_store(store)
    assert _doc(store.results(now_ns=NOW), "raw")["step_time"]["count"] == 3  # kept


@FUZZ
@given(reqs=st.lists(otlp_shaped() | hostile, min_size=1, max_size=4))
def test_live_store_survives_hostile_json(reqs):
    store, lines = LiveStore(min_interval_s=0), LiveStore(min_interval_s=0)
    for i, req in enumerate(reqs):
        before = (store.jobs(), dict(store.stats))
        try:
            store.ingest_json(req, ("fuzz", i))
        except ValueError as e:  # not OTLP (serve/malformed.py): refused whole, nothing kept
            assert "expected" in str(e)
            assert (store.jobs(), dict(store.stats)) == before
        lines.ingest_json(req, (f"spool-{i}.jsonl", 1), durable=False)  # a line: never raises
    _check_store(store)
    _check_store(lines)


# --- the receivers themselves, on loopback -------------------------------------------------

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 1 << 20


def _pb_good(job="raw", n=3, t0=T0_NS):
    req = trace_service_pb2.ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for k, v in ((schema.RES_JOB_NAME, job), (schema.RES_SCHEMA_VERSION, "1")):
        rs.resource.attributes.add(key=k, value=common_pb2.AnyValue(string_value=v))
    ss = rs.scope_spans.add()
    ss.scope.name = schema.SCOPE_NAME
    for i in range(n):
        ss.spans.append(trace_pb2.Span(
            trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"), name=schema.STEP,
            start_time_unix_nano=t0 + i * NS, end_time_unix_nano=t0 + (i + 1) * NS,
            attributes=[common_pb2.KeyValue(key=schema.ATTR_STEP,
                                            value=common_pb2.AnyValue(int_value=i))]))
    return req


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _deep_pb(depth: int) -> bytes:
    """A request whose resource has one attribute of ``depth`` nested arrays (raw protobuf)."""
    v = _field(1, b"x")  # AnyValue.string_value
    for _ in range(depth):
        v = _field(5, _field(1, v))  # AnyValue.array_value -> ArrayValue.values
    kv = _field(1, b"deep") + _field(2, v)
    return _field(1, _field(1, _field(1, kv)))  # resource_spans.resource.attributes


@pytest.fixture(scope="module")
def srv():
    s = GoodputServer(LiveStore(min_interval_s=0), grpc_port=0, http_port=0, token=TOKEN,
                      max_message_bytes=LIMIT)
    yield s
    s.stop(5, final=False)


def _http(srv, body: bytes, headers: dict, *, length=None, shut=False, send=True,
          path="/v1/traces"):
    """A raw POST (any Content-Length, optionally half-closed, optionally without sending
    the body: a refusal on the headers alone comes before it); returns (status, body, ctype)."""
    host, port = srv.http.host, srv.http.port
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.putrequest("POST", path, skip_accept_encoding=True)
        for k, v in {"Content-Length": str(len(body) if length is None else length),
                     **headers}.items():
            conn.putheader(k, v)
        conn.endheaders()
        try:
            if send:
                conn.send(body)
            if shut:
                conn.sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server refused on the headers and closed first: read its answer
            pass
        r = conn.getresponse()
        return r.status, r.read(), r.getheader("Content-Type")
    finally:
        conn.close()


def _status(body: bytes, ctype: str) -> status_pb2.Status:
    """The google.rpc.Status of an error body, in either encoding."""
    if ctype == "application/json":
        return status_pb2.Status(**json.loads(body))
    assert ctype == "application/x-protobuf"
    return status_pb2.Status.FromString(body)


PB, JS = "application/x-protobuf", "application/json"
_GOOD = _pb_good(job="http-good").SerializeToString()
_GZ = gzip.compress(_GOOD)
HTTP_CASES = [  # (id, body, headers, kwargs, http status, rpc code, message part, counter)
    ("garbage-pb", b"\xff\xff\xff", {"Content-Type": PB}, {}, 400, 3,
     "body of 3 bytes is not a protobuf", "malformed"),
    ("invalid-utf8-pb", _GOOD.replace(b"goodput.step", b"goodput.st\xff\xfe"),
     {"Content-Type": PB}, {}, 400, 3, "not a protobuf", "malformed"),
    ("deep-nesting-pb", _deep_pb(200), {"Content-Type": PB}, {}, 400, 3, "not a protobuf",
     "malformed"),
    ("invalid-json", b"{", {"Content-Type": JS}, {}, 400, 3, "is not JSON", "malformed"),
    ("invalid-utf8-json", b'{"resourceSpans":"\xff"}', {"Content-Type": JS}, {}, 400, 3,
     "utf-8", "malformed"),
    ("deep-nesting-json", b'{"resourceSpans":' + b"[" * 5000 + b"]" * 5000 + b"}",
     {"Content-Type": JS}, {}, 400, 3, "recursion", "malformed"),
    ("json-not-otlp", b"[1, 2]", {"Content-Type": JS}, {}, 400, 3, "resourceSpans",
     "malformed"),
    ("over-limit", b"\x0a" * (LIMIT + 1), {"Content-Type": PB}, {"send": False}, 413, 8,
     f"over the limit of {LIMIT} bytes", "too_large"),
    ("gzip-bomb", gzip.compress(b"\x00" * (64 << 20)), {"Content-Type": PB,
                                                         "Content-Encoding": "gzip"}, {},
     413, 8, "inflates to more than", "too_large"),
    ("gzip-truncated", _GZ[:-9], {"Content-Type": PB, "Content-Encoding": "gzip"}, {},
     400, 3, "truncated", "malformed"),
    ("gzip-trailing-garbage", _GZ + b"garbage", {"Content-Type": PB,
                                                  "Content-Encoding": "gzip"}, {},
     400, 3, "not valid gzip", "malformed"),
    ("not-gzip", b"plain", {"Content-Type": PB, "Content-Encoding": "gzip"}, {}, 400, 3,
     "not valid gzip", "malformed"),
    ("deflate", b"x", {"Content-Type": PB, "Content-Encoding": "br"}, {}, 415, 3,
     "unsupported Content-Encoding 'br'", "unsupported"),
    ("negative-length", _GOOD, {"Content-Type": PB}, {"length": -1, "shut": True}, 411, 3,
     "Content-Length", "unsupported"),
    ("short-body", _GOOD[:10], {"Content-Type": PB}, {"length": len(_GOOD), "shut": True},
     400, 3, f"ended after 10 of {len(_GOOD)} bytes", "incomplete"),
]


@pytest.mark.parametrize("body,headers,kw,status,code,why,counter",
                         [c[1:] for c in HTTP_CASES], ids=[c[0] for c in HTTP_CASES])
def test_http_receiver_hostile_requests(srv, body, headers, kw, status, code, why, counter):
    before = srv.store.stats.copy()
    got, out, ctype = _http(srv, body, {**AUTH, **headers}, **kw)
    assert got == status
    st_ = _status(out, ctype)
    assert st_.code == code and why in st_.message, st_.message
    assert srv.store.stats[f"refused_{counter}"] == before[f"refused_{counter}"] + 1
    assert srv.store.stats["requests"] == before["requests"]  # nothing half-taken
    # the service still works, and what was valid is all there
    got, _, _ = _http(srv, _GOOD, {**AUTH, "Content-Type": PB})
    assert got == 200
    assert srv.store.results(now_ns=NOW, job="http-good")[0].step_time.count == 3


def test_http_multi_member_gzip_is_accepted(srv):
    """RFC 1952 allows several gzip members back to back; all of them are read."""
    body = gzip.compress(_GOOD[:7]) + gzip.compress(_GOOD[7:])
    got, out, _ = _http(srv, body, {**AUTH, "Content-Type": PB, "Content-Encoding": "gzip"})
    assert got == 200 and out == b""


def test_grpc_receiver_hostile_requests(srv):
    channel = grpc.insecure_channel(srv.addresses()["grpc"])
    raw = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
    auth = [("authorization", f"Bearer {TOKEN}")]
    cases = [(b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "request of 3 bytes is not"),
             (_GOOD.replace(b"goodput.step", b"goodput.st\xff\xfe"),
              grpc.StatusCode.INVALID_ARGUMENT, "not a protobuf ExportTraceServiceRequest"),
             (_deep_pb(200), grpc.StatusCode.INVALID_ARGUMENT, "not a protobuf"),
             (b"\x0a" * (LIMIT + 10), grpc.StatusCode.RESOURCE_EXHAUSTED, "")]
    try:
        for body, code, why in cases:
            malformed = srv.store.stats["refused_malformed"]
            with pytest.raises(grpc.RpcError) as e:
                raw(body, metadata=auth, timeout=10)
            assert e.value.code() == code and why in e.value.details(), e.value.details()
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                assert srv.store.stats["refused_malformed"] == malformed + 1
        # hostile but well-formed: ids of the wrong length, times past int64, NaN values
        req = _pb_good(job="grpc-hostile", n=4)
        spans = req.resource_spans[0].scope_spans[0].spans
        spans[0].span_id = b"\x01" * 3
        spans[1].start_time_unix_nano = spans[1].end_time_unix_nano = 2**64 - 1
        spans[2].attributes[0].value.double_value = float("nan")
        assert raw(req.SerializeToString(), metadata=auth, timeout=10) == b""
        (r,) = srv.store.results(now_ns=NOW, job="grpc-hostile")
        assert r.step_time.count == 1 and r.skipped["invalid_span"] == 3
        assert raw(_pb_good(job="grpc-good").SerializeToString(), metadata=auth,
                   timeout=10) == b""
        assert srv.store.results(now_ns=NOW, job="grpc-good")[0].step_time.count == 3
    finally:
        channel.close()


def test_wrong_or_missing_token_is_refused_counted_and_logged(srv, caplog):
    caplog.set_level(logging.WARNING, logger="goodput_processor.serve.receiver")
    before = srv.store.stats["refused_unauthenticated"]
    requests = srv.store.stats["requests"]
    channel = grpc.insecure_channel(srv.addresses()["grpc"])
    stub = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
    try:
        for md in ([], [("authorization", "Bearer wrong")], [("authorization", TOKEN)]):
            with pytest.raises(grpc.RpcError) as e:
                stub(_GOOD, metadata=md, timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        got, out, ctype = _http(srv, _GOOD, {"Content-Type": PB, **headers})
        assert got == 401 and _status(out, ctype).code == 16
    assert srv.store.stats["refused_unauthenticated"] == before + 6
    logged = [r.getMessage() for r in caplog.records if "bearer token" in r.getMessage()]
    assert len(logged) == 6 and "127.0.0.1" in logged[-1]
    assert srv.store.stats["requests"] == requests  # nothing was taken in


def test_receivers_bind_loopback_by_default():
    s = GoodputServer(LiveStore(), grpc_port=0, http_port=0)
    try:
        assert s.addresses()["grpc"].startswith("127.0.0.1:")
        assert s.http.httpd.socket.getsockname()[0] == "127.0.0.1"
        assert s.addresses()["http"].startswith("http://127.0.0.1:")
    finally:
        s.stop(5, final=False)


def test_extreme_but_finite_run_attributes_give_no_infinite_mfu(tmp_path):
    """flops 1e308 and peak 1e-308 are finite, their MFU is not: the JSON report of such a
    job failed with 'Out of range float values are not JSON compliant'."""
    Timeline("mfu", **{schema.RES_FLOPS_PER_STEP: 1e308, schema.RES_PEAK_FLOPS: 1e-308,
                       schema.RES_DEVICE_COUNT: 1}).job_start(0).steps(1, 5, 0, 1).job_end(5) \
        .write(tmp_path)
    (r,) = report_run_dir(tmp_path, now_ns=NOW)
    assert r.mfu is None
    assert json.loads(to_json([r]))["jobs"][0]["mfu"] is None
