"""goodput serve bounds what a request parses to, and logs what the accounting reads (issue 38,
items 1a and 4).

- A request of empty OTLP messages is estimated before it is parsed (``parse_cost``, the
  bytes taken from ``--max-inflight-bytes``) and refused when the estimate does not fit:
  ``413`` / ``RESOURCE_EXHAUSTED``, no job touched, nothing logged; one that fits is
  taken in and touches no job either (a ``ResourceSpans`` without spans is no job's).
- The estimate is an upper bound: the worst shapes known, each taken into a store with a
  write-ahead log in a fresh process, peak below it (``benchmarks/serve_amplification.py
  --bound``; two of them, small, here).
- Huge attributes are cut to ``--max-attribute-bytes`` before they are logged: the log
  line stays small, and a replay gives the same report (``over_limit`` counts included);
  odd spans (no kind, invalid ids, flags, ints as strings, error status) replay the same.

Real GoodputServer on loopback, real gRPC and HTTP clients, real files; about 10 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from otlp_fixtures import T0_NS

from goodput import schema
from goodput_processor import to_json_dict
from goodput_processor.serve import GoodputServer, LiveStore
from goodput_processor.serve.limits import Limits
from goodput_processor.serve.receiver import parse_cost
from goodput_processor.serve.wal import WriteAheadLog

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import serve_amplification as amp  # noqa: E402

MiB = 1 << 20
NOW = T0_NS + 10**15
_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _kv(key, **v):
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(**v))


def _span(name, i, attrs=(), **kw):
    return trace_pb2.Span(trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"), name=name,
                          start_time_unix_nano=T0_NS + i * 10**9,
                          end_time_unix_nano=T0_NS + i * 10**9 + 5 * 10**8,
                          attributes=list(attrs), **kw)


def _request(job, spans, resource=()):
    req = trace_service_pb2.ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([_kv(schema.RES_JOB_NAME, string_value=job),
                                   _kv(schema.RES_SERVICE_NAME, string_value=job), *resource])
    ss = rs.scope_spans.add()
    ss.scope.name = schema.SCOPE_NAME
    ss.spans.extend(spans)
    return req


def _post(url, body, ctype="application/x-protobuf"):
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _doc(store):
    doc = to_json_dict(store.results(now_ns=NOW))
    for j in doc["jobs"]:
        j.pop("skipped_examples")
    return doc


def _store(wal_dir, **limits):
    store = LiveStore(min_interval_s=0, wal=WriteAheadLog(wal_dir),
                      limits=Limits(**limits) if limits else None)
    store.replay()
    return store


def _wal_bytes(wal_dir: Path) -> int:
    return sum(p.stat().st_size for p in (wal_dir / "jobs").rglob("*.jsonl"))


def test_amplification_is_refused_before_the_parse_and_touches_no_job(tmp_path):
    wal_dir = tmp_path / "wal"
    store = _store(wal_dir)
    srv = GoodputServer(store, grpc_port=0, http_port=0, max_message_bytes=4 * MiB,
                        limits=Limits(max_inflight_bytes=32 * MiB, max_message_bytes=4 * MiB))
    http = srv.addresses()["http"] + "/v1/traces"
    try:
        spans = amp.shape("spans", MiB)  # ~92x its size: more than the whole budget
        assert len(spans) + parse_cost("protobuf", spans) > 32 * MiB
        status, err = _post(http, spans)
        assert status == 413 and b"max-inflight-bytes" in err
        ch = grpc.insecure_channel(srv.addresses()["grpc"])
        call = ch.unary_unary(_EXPORT, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as e:
            call(amp.shape("resource_spans", MiB), timeout=30)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        status, _ = _post(http, amp.empty_json(MiB), "application/json")
        assert status == 413
        assert store.stats["refused_too_large"] == 3 and store.stats["requests"] == 0
        # small enough to fit: taken in, and no job is made of messages without spans
        for body, ctype in ((amp.shape("resource_spans", 16 << 10), "application/x-protobuf"),
                            (amp.empty_json(16 << 10), "application/json")):
            assert _post(http, body, ctype)[0] == 200
        call(amp.shape("resource_spans", 16 << 10), timeout=30)
        assert store.jobs() == [] and not (wal_dir / "jobs").exists() or _wal_bytes(wal_dir) == 0
        # a healthy job is taken in, and the budget is all given back
        assert _post(http, _request("ok", [_span(schema.STEP, 1)]).SerializeToString())[0] == 200
        assert store.jobs() == ["ok"] and srv.budget.used == 0
        ch.close()
    finally:
        srv.stop(5, final=False)


def test_the_estimate_bounds_what_the_worst_shapes_take():
    """Peak resident memory above the level before, of a fresh process taking one request
    of each shape into a store with a log, is below what ``parse_cost`` took for it."""
    for r in amp.bound(0.5, ("spans", "spans_one_each")):
        assert r["peak"] <= r["estimate"], r
    # real spans are estimated at a bounded multiple of their size (a 16 MiB request of
    # them fits the default 256 MiB budget)
    body = _request("real", [_span(schema.STEP, i, [_kv(schema.ATTR_STEP, int_value=i)])
                             for i in range(512)]).SerializeToString()
    assert len(body) + parse_cost("protobuf", body) < 16 * len(body)


def test_huge_attributes_leave_a_small_log_and_the_same_report(tmp_path):
    wal_dir, big = tmp_path / "wal", "x" * (2 * MiB)
    store = _store(wal_dir, max_attribute_bytes=1024)
    spans = [_span(schema.STEP, i, [_kv(schema.ATTR_STEP, int_value=i),
                                    _kv("user.blob", string_value=big)],
                   status=trace_pb2.Status(code=2, message=big),
                   events=[trace_pb2.Span.Event(name=big)]) for i in range(5)]
    spans.append(_span(schema.CUSTOM_BADPUT, 6, [_kv(schema.ATTR_BADPUT_TYPE, string_value=big)]))
    req = _request("huge", spans, [_kv("ml.run.name", string_value=big),
                                   _kv(big[:4096], string_value="a key past the limit")])
    store.ingest_request(req, "otlp-grpc")
    # the same over OTLP/JSON (another job)
    line = json.loads(store.wal.jobs_dir.joinpath(
        next(p.name for p in store.wal.jobs_dir.iterdir())).joinpath(
        "seg-00000001.jsonl").read_bytes())
    line["resourceSpans"][0]["resource"]["attributes"][0]["value"] = {"stringValue": "huge-json"}
    line["resourceSpans"][0]["resource"]["attributes"][1]["value"] = {"stringValue": "huge-json"}
    for sp in line["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        sp.setdefault("attributes", []).append({"key": "user.blob",
                                                "value": {"stringValue": big}})
    store.ingest_json(line, ("otlp-http", "1"))
    assert _wal_bytes(wal_dir) < 16 << 10  # 2 x (11 spans, ~2 KiB of cut strings)
    before = _doc(store)
    (job,) = [j for j in before["jobs"] if j["job"] == "huge"]
    assert json.dumps(job).count("x" * 1024) and not json.dumps(job).count("x" * 1025)
    store.wal.close()
    again = _store(wal_dir, max_attribute_bytes=1024)
    assert _doc(again) == before


def _odd_spans():
    S = schema
    return [
        _span("not.a.kind", 0), _span(S.STRUCTURE[0], 1), trace_pb2.Span(),
        _span(S.STEP, 2, [_kv(S.ATTR_STEP, string_value="0" * 2000 + "5")]),
        _span(S.STEP, 3, [_kv(S.ATTR_STEP, string_value="12abc")]),
        _span(S.STEP, 4, [_kv(S.ATTR_STEP, int_value=4), _kv(S.ATTR_STEP, int_value=40)]),
        _span(S.DATA_LOADING, 5, [_kv(S.ATTR_BLOCKING, string_value="FALSE"),
                                  _kv(S.ATTR_BLOCKING, bool_value=True)]),
        _span(S.STEP, 6, [_kv(S.ATTR_STEP, int_value=6)], status=trace_pb2.Status(code=2)),
        trace_pb2.Span(trace_id=b"\x01" * 20, span_id=b"\x02" * 8, name=S.STEP),
        trace_pb2.Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name=S.STEP,
                       start_time_unix_nano=5, end_time_unix_nano=4),
        _span(S.CUSTOM_BADPUT, 7, [_kv(S.ATTR_BADPUT_TYPE, string_value="eval"),
                                   _kv(S.ATTR_BADPUT_TYPE, string_value="y" * 3000)]),
        _span(S.STEP, 8, [_kv(S.ATTR_STEP, array_value=common_pb2.ArrayValue())]),
    ]


def test_odd_spans_replay_the_same_over_both_encodings(tmp_path):
    from google.protobuf import json_format

    wal_dir = tmp_path / "wal"
    store = _store(wal_dir, max_attribute_bytes=1024)
    req = _request("odd-pb", _odd_spans(), [_kv("ml.run.name", double_value=float("nan")),
                                            _kv("ml.run.group", kvlist_value={})])
    store.ingest_request(req, "otlp-grpc")
    doc = json_format.MessageToDict(_request("odd-json", _odd_spans()))
    for rs in doc["resourceSpans"]:  # OTLP/JSON: hex ids, not base64
        for sp in rs["scopeSpans"][0]["spans"]:
            for k in ("traceId", "spanId"):
                if k in sp:
                    sp[k] = __import__("base64").b64decode(sp[k]).hex()
    store.ingest_json(doc, ("otlp-http", "1"))
    before = _doc(store)
    skipped = {j["job"]: j["skipped"] for j in before["jobs"]}
    assert skipped["odd-pb"]["invalid_span"] >= 3 and skipped["odd-pb"]["unknown"] >= 2
    store.wal.close()
    assert _doc(_store(wal_dir, max_attribute_bytes=1024)) == before


def test_the_benchmark_runs_against_a_real_serve():
    """``benchmarks/serve_amplification.py`` (the figures of docs/serve.md): a real serve,
    a 64 KiB request of each encoding, without a log."""
    r = subprocess.run([sys.executable, str(BENCH / "serve_amplification.py"), "--sizes",
                        "0.0625", "--wal", "off"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("200") + r.stdout.count(" OK ") == 3, r.stdout
