"""goodput serve takes foreign producers' OTLP (traces and logs) through the sources.

Real servers on loopback, the real OTel SDK exporters (OTLP gRPC and HTTP, spans and log
records) as clients, a test-only source (tests/fw_source.py) registered for the test. The
job's live report equals ``goodput report`` of the same records translated offline and
written with ``write_spool``; a restart on the same write-ahead log (a real ``goodput serve``
process, in which the test source is not even registered: the log holds the translated
spans) gives the same report; malformed foreign records are skipped and counted, and serve
keeps serving.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from fw_source import SCOPE, register
from instr_util import child_env

pytest.importorskip("grpc")

from google.protobuf import json_format  # noqa: E402
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk._logs import LoggerProvider  # noqa: E402
from opentelemetry.sdk._logs.export import (  # noqa: E402
    InMemoryLogRecordExporter,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

from goodput_processor import report_run_dir, to_json_dict  # noqa: E402
from goodput_processor.importers.sources.driver import (  # noqa: E402
    OtlpTranslation,
    write_spool,
)
from goodput_processor.serve import GoodputServer, LiveStore  # noqa: E402
from goodput_processor.serve.wal import WriteAheadLog  # noqa: E402

JOB = "fwjob"
T0 = 1_750_000_000 * 10**9
S = 10**9


def _resource(run: str) -> Resource:
    return Resource.create({"fw.job_id": JOB, "fw.run_id": run, "fw.rank": 0,
                            "fw.restart": int(run[-1]) - 1, "service.name": "fw-trainer"})


def _attempt_spans(tracer, t0: int, first: int, steps: int, restore: bool, end: bool):
    """One incarnation's spans: start, init, [restore], steps, a save every 5, [end]."""
    def span(name, start, stop, **attrs):
        tracer.start_span(name, start_time=start, attributes={
            k.replace("_", "."): v for k, v in attrs.items()} or None).end(end_time=stop)

    span("fw.start", t0, t0)
    span("fw.init", t0, t0 + 2 * S)
    t = t0 + 2 * S
    if restore:
        span("fw.load", t, t + S, fw_iteration=first)
        t += S
    for i in range(first, first + steps):
        span("fw.iteration", t, t + S, fw_iteration=i)
        t += S
        if i % 5 == 4:
            span("fw.save", t, t + S // 2, fw_iteration=i + 1)
            t += S // 2
    if end:
        span("fw.end", t, t)
    return t


class _Producer:
    """The foreign tool's two incarnations, exported by the real OTel SDK with ``exporters``
    (``{"traces": SpanExporter, "logs": LogExporter}``, or None to only keep the records):
    attempt 1 (run-1) sends spans and is cut off after step 11; attempt 2 (run-2) restores
    step 10, sends its steps as log records and ends with ``fw.end``."""

    def __init__(self, exporters=None):
        self.spans, self.logs = InMemorySpanExporter(), InMemoryLogRecordExporter()
        self.exporters = exporters or {}

    def _tracer(self, run: str):
        tp = TracerProvider(resource=_resource(run))
        tp.add_span_processor(SimpleSpanProcessor(self.spans))
        if "traces" in self.exporters:
            tp.add_span_processor(SimpleSpanProcessor(self.exporters["traces"]))
        return tp

    def run(self, log_duration: bool = True):
        tp = self._tracer("run-1")
        t = _attempt_spans(tp.get_tracer(SCOPE), T0, 0, 12, False, False)
        tp.force_flush()  # (not shut down: that would shut the shared exporter down)
        tp = self._tracer("run-2")
        tracer = tp.get_tracer(SCOPE)
        t = _attempt_spans(tracer, t + 30 * S, 10, 0, True, False)
        lp = LoggerProvider(resource=_resource("run-2"))
        lp.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        if "logs" in self.exporters:
            lp.add_log_record_processor(SimpleLogRecordProcessor(self.exporters["logs"]))
        logger = lp.get_logger(SCOPE)
        for i in range(10, 20):
            t += S
            attrs = {"fw.iteration": i, **({"fw.duration_ms": 900} if log_duration else {})}
            logger.emit(timestamp=t, observed_timestamp=t, body="fw.iteration",
                        attributes=attrs)
        tracer.start_span("fw.end", start_time=t + S).end(end_time=t + S)
        tp.shutdown()
        lp.shutdown()

    def offline_report(self, tmp_path) -> dict:
        """``goodput report`` of the same records, translated offline, as spool files."""
        tr = OtlpTranslation()
        own, spans = tr.traces(encode_spans(self.spans.get_finished_spans()).resource_spans,
                               "offline")
        logs = tr.logs(encode_logs(self.logs.get_finished_logs()).resource_logs, "offline")
        assert own == [] and not tr.problems.counts
        written = write_spool(spans + logs, tmp_path / "offline")
        return _job(to_json_dict(report_run_dir(written[JOB]["run_dir"])))


def _hex_json(msg) -> dict:
    """OTLP JSON of a protobuf request (ids as hex, as the OTLP JSON encoding has them)."""
    doc = json_format.MessageToDict(msg)

    def fix(o):
        if isinstance(o, dict):
            for k, v in o.items():
                if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str):
                    o[k] = base64.b64decode(v).hex()
                else:
                    fix(v)
        elif isinstance(o, list):
            for v in o:
                fix(v)
    fix(doc)
    return doc


class _JsonPoster:
    """A span / log exporter stand-in that POSTs OTLP JSON (the SDK has no JSON exporter)."""

    def __init__(self, url: str, logs: bool):
        self.url, self.logs = url, logs

    def export(self, batch):
        msg = encode_logs(batch) if self.logs else encode_spans(batch)
        status, _ = _post(self.url, json.dumps(_hex_json(msg)).encode())
        assert status == 200

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=0):
        return True


def _post(url: str, body: bytes, ctype="application/json"):
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def _job(doc: dict) -> dict:
    (job,) = [j for j in doc["jobs"] if j["job"] == JOB]
    job.pop("skipped_examples")
    return job


def _exporters(protocol: str, addr: dict) -> dict:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return {"traces": OTLPSpanExporter(endpoint=addr["grpc"], insecure=True),
                "logs": OTLPLogExporter(endpoint=addr["grpc"], insecure=True)}
    if protocol == "http-protobuf":
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return {"traces": OTLPSpanExporter(endpoint=addr["http"] + "/v1/traces"),
                "logs": OTLPLogExporter(endpoint=addr["http"] + "/v1/logs")}
    return {"traces": _JsonPoster(addr["http"] + "/v1/traces", logs=False),
            "logs": _JsonPoster(addr["http"] + "/v1/logs", logs=True)}


def _restarted_report(wal_dir, tmp_path) -> dict:
    """The report of a real ``goodput serve`` started on ``wal_dir`` (no test source)."""
    cmd = [sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port", "off",
           "--http-port", "0", "--wal-dir", str(wal_dir)]
    proc = subprocess.Popen(cmd, env=child_env(), stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    try:
        url = re.search(r"http=(\S+)", proc.stderr.readline()).group(1)
        doc = _get(url + f"/v1/report?job={JOB}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert "sources" not in doc  # nothing was translated again
    return _job(doc)


@pytest.mark.parametrize("protocol", ["grpc", "http-protobuf", "http-json"])
def test_foreign_spans_and_logs_live_equal_report_and_replay(tmp_path, monkeypatch, protocol):
    register(monkeypatch)
    wal_dir = tmp_path / "wal"
    server = GoodputServer(LiveStore(min_interval_s=0, wal=WriteAheadLog(wal_dir)),
                           grpc_port=0, http_port=0)
    try:
        producer = _Producer(_exporters(protocol, server.addresses()))
        producer.run()
        doc = _get(server.addresses()["http"] + f"/v1/report?job={JOB}")
        stats = dict(server.store.stats)
    finally:
        server.stop(10, final=False)
    live = _job(doc)
    assert live == producer.offline_report(tmp_path)
    assert [a["end_reason"] for a in live["attempts"]] == ["killed", "exit"]
    assert [a["steps_kept"] for a in live["attempts"]] == [11, 10]
    assert live["max_productive_step"] == 19 and not any(live["skipped"].values())
    assert stats["spans_translated"] == 30 == (len(producer.spans.get_finished_spans())
                                               + len(producer.logs.get_finished_logs()))
    assert stats["log_records"] == 10 and stats["log_records_ignored"] == 0
    assert doc["sources"]["spans_translated"] == stats["spans_translated"]
    assert _restarted_report(wal_dir, tmp_path) == live


def test_malformed_foreign_records_are_counted_and_serve_keeps_serving(tmp_path, monkeypatch):
    register(monkeypatch)
    server = GoodputServer(LiveStore(min_interval_s=0), grpc_port=0, http_port=0)
    try:
        url = server.addresses()["http"]
        fw = {"resource": {"attributes": [
            {"key": "fw.job_id", "value": {"stringValue": JOB}},
            {"key": "fw.run_id", "value": {"stringValue": "r"}}]}}
        bad_logs = {"resourceLogs": [
            5,  # not a ResourceLogs
            {**fw, "scopeLogs": [{"scope": {"name": SCOPE}, "logRecords": [
                {"timeUnixNano": str(T0), "body": {"stringValue": "fw.iteration"},
                 "attributes": [{"key": "fw.iteration", "value": {"stringValue": "x"}}]},
                {"timeUnixNano": str(T0 + S), "body": {"stringValue": "fw.iteration"},
                 "attributes": [{"key": "fw.iteration", "value": {"intValue": "1"}}]}]}]},
            {"scopeLogs": [{"scope": {"name": "someone.else"}, "logRecords": [{}, {}]}]},
            {**fw, "scopeLogs": [{"scope": {"name": SCOPE}, "logRecords": [7]}]}]}
        assert _post(url + "/v1/logs", json.dumps(bad_logs).encode())[0] == 200
        bad_spans = {"resourceSpans": [7, {**fw, "scopeSpans": [{"scope": {"name": SCOPE},
                                                              "spans": [
            {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "fw.iteration",
             "startTimeUnixNano": str(T0 + 2 * S), "endTimeUnixNano": str(T0 + 3 * S)},
            {"traceId": "ab" * 16, "spanId": "ce" * 8, "name": "fw.iteration",
             "startTimeUnixNano": str(T0 + 3 * S), "endTimeUnixNano": str(T0 + 4 * S),
             "attributes": [{"key": "fw.iteration", "value": {"intValue": "3"}}]}]}]}]}
        # the ResourceSpans 7 is not OTLP: the whole request is refused, nothing translated
        # (docs/serve.md, Receiving); without it, the foreign spans' faults are the source's
        assert _post(url + "/v1/traces", json.dumps(bad_spans).encode())[0] == 400
        bad_spans["resourceSpans"].remove(7)
        assert _post(url + "/v1/traces", json.dumps(bad_spans).encode())[0] == 200
        status, body = _post(url + "/v1/logs", b'{"resourceLogs": "x"}')
        assert status == 400 and b"ExportLogsServiceRequest" in body
        status, _ = _post(url + "/v1/logs", b"\x0a\xff", "application/x-protobuf")
        assert status == 400
        # still serving: the real exporters' records go on being taken in
        producer = _Producer(_exporters("http-protobuf", server.addresses()))
        producer.run(log_duration=False)
        with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
            assert r.status == 200
        doc = _get(url + f"/v1/report?job={JOB}")
        stats = dict(server.store.stats)
    finally:
        server.stop(10, final=False)
    sources = doc["sources"]
    # the record with a text step, the ResourceLogs 5, the record 7, the step span with none
    assert sources["skipped"] == {"malformed": 4}, sources
    assert stats["source_skipped"] == 4 and stats["log_records_ignored"] == 2
    assert sources["warnings"] == {"fwtool": {"fw_duration_missing": 11}}
    assert sources["job_warnings"] == {JOB: {"fwtool.fw_duration_missing": 11}}
    job = _job(doc)
    assert job["max_productive_step"] >= 10 and job["skipped"]["malformed"] == 0
    assert job["skipped"]["duplicate"] == 0  # the request's good part translated once


def test_logs_receivers_check_token_size_and_refuse_while_replaying(tmp_path, monkeypatch):
    """LogsService/Export and POST /v1/logs: the same token, size and readiness checks as
    the trace receivers."""
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs.export import LogRecordExportResult

    from goodput_processor.serve.limits import Limits

    register(monkeypatch)
    producer = _Producer()
    producer.run()
    batch = producer.logs.get_finished_logs()
    server = GoodputServer(LiveStore(min_interval_s=0), grpc_port=0, http_port=0,
                           token="s3cret", limits=Limits(max_message_bytes=4096))
    try:
        addr = server.addresses()
        no_token = OTLPLogExporter(endpoint=addr["grpc"], insecure=True, timeout=5)
        assert no_token.export(batch) == LogRecordExportResult.FAILURE
        token = OTLPLogExporter(endpoint=addr["grpc"], insecure=True,
                                headers={"authorization": "Bearer s3cret"})
        assert token.export(batch) == LogRecordExportResult.SUCCESS
        body = encode_logs(batch).SerializeToString()
        req = urllib.request.Request(addr["http"] + "/v1/logs", data=body, method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 401
        req.add_header("Authorization", "Bearer s3cret")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        req.data = json.dumps({"resourceLogs": [{"pad": "x" * 5000}]}).encode()
        req.remove_header("Content-type")
        req.add_header("Content-Type", "application/json")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 413
        stats = dict(server.store.stats)
        (result,) = server.store.results(job=JOB)
        with grpc.insecure_channel(addr["grpc"]) as ch:  # not a logs request
            export = ch.unary_unary("/opentelemetry.proto.collector.logs.v1.LogsService/Export",
                                    request_serializer=None, response_deserializer=None)
            with pytest.raises(grpc.RpcError) as e:
                export(b"\x0a\xff", timeout=10,
                       metadata=(("authorization", "Bearer s3cret"),))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        server.stop(10, final=False)
    assert stats["refused_unauthenticated"] == 2 and stats["refused_too_large"] == 1
    # the same records twice: the same goodput spans, taken once
    assert stats["log_records"] == 20 and stats["spans_translated"] == 20
    assert result.skipped["duplicate"] == 10 and result.step_time.count == 10
    # while the write-ahead log replays, nothing is translated: the client retries later
    store = LiveStore(wal=WriteAheadLog(tmp_path / "wal"))
    from goodput_processor.serve.limits import Refused

    with pytest.raises(Refused):
        store.ingest_logs(encode_logs(batch))
    assert store.sources_summary() == {} and not store.foreign.warnings


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_own_scope_beside_a_foreign_one_in_one_resource(tmp_path, monkeypatch, encoding):
    """One SDK exporting this project's spans and a foreign tool's (one ResourceSpans, two
    scopes): the source takes its scope, the own spans are read as always."""
    register(monkeypatch)
    res = {"attributes": [{"key": k, "value": {"stringValue": v}} for k, v in (
        ("fw.job_id", JOB), ("fw.run_id", "r1"), ("service.name", JOB),
        ("goodput.job.name", JOB), ("goodput.schema.version", "1.3"))]}
    fw = [{"traceId": "ab" * 16, "spanId": f"{i + 1:016x}", "name": "fw.iteration",
           "startTimeUnixNano": str(T0 + i * S), "endTimeUnixNano": str(T0 + (i + 1) * S),
           "attributes": [{"key": "fw.iteration", "value": {"intValue": str(i)}}]}
          for i in range(4)]
    own = [{"traceId": "cd" * 16, "spanId": "0f" * 8, "name": "goodput.custom_badput",
            "startTimeUnixNano": str(T0 + 4 * S), "endTimeUnixNano": str(T0 + 6 * S),
            "attributes": [{"key": "goodput.badput.type", "value": {"stringValue": "eval"}}]}]
    doc = {"resourceSpans": [{"resource": res, "scopeSpans": [
        {"scope": {"name": SCOPE}, "spans": fw}, {"scope": {"name": "goodput"}, "spans": own}]}]}
    store = LiveStore(min_interval_s=0)
    if encoding == "json":
        store.ingest_json(doc, ("test",))
    else:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        store.ingest_request(json_format.ParseDict(_b64(doc),
                                                   trace_service_pb2.ExportTraceServiceRequest()))
    (r,) = store.results(job=JOB, now_ns=T0 + 10 * S)
    # the own span is read: a second process of the attempt, whose span ends the job
    assert r.step_time.count == 4 and r.attempts[0].processes == 2
    assert r.end_ns == T0 + 6 * S
    assert store.stats["spans"] == 5 and store.stats["spans_translated"] == 4  # of any scope
    assert not any(r.skipped.values())


def _b64(doc):
    """``doc`` with its ids in base64, as protobuf's JSON mapping has them."""
    doc = json.loads(json.dumps(doc))
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for k in ("traceId", "spanId"):
                    sp[k] = base64.b64encode(bytes.fromhex(sp[k])).decode()
    return doc


def test_translated_spans_are_admitted_as_a_clients(monkeypatch):
    """What a source makes is subject to the store's admission: over --max-jobs it is
    refused (retryable) and nothing of the request is taken in."""
    from goodput_processor.serve.limits import Limits, Refused

    register(monkeypatch)
    producer = _Producer()
    producer.run()
    store = LiveStore(min_interval_s=0, limits=Limits(max_jobs=1))
    store.ingest_json({"resourceSpans": [{"resource": {"attributes": [
        {"key": "goodput.job.name", "value": {"stringValue": "first"}}]}, "scopeSpans": [
        {"scope": {"name": "goodput"}, "spans": [
            {"traceId": "ab" * 16, "spanId": "01" * 8, "name": "goodput.step",
             "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + S),
             "attributes": [{"key": "goodput.step", "value": {"intValue": "0"}}]}]}]}]},
        ("test",))
    with pytest.raises(Refused) as e:
        store.ingest_request(encode_spans(producer.spans.get_finished_spans()))
    assert e.value.reason == "over_jobs" and e.value.retryable
    assert store.jobs() == ["first"] and store.stats["spans_translated"] == 0


def test_a_retired_job_leaves_the_translators(monkeypatch):
    """A job serve retires (idle for --retention) is dropped from the sources' state too:
    a long-lived serve keeps per job only what its live jobs need."""
    register(monkeypatch)
    producer = _Producer()
    producer.run()
    store = LiveStore(min_interval_s=0, retention_s=60)
    store.ingest_request(encode_spans(producer.spans.get_finished_spans()))
    (job,) = store.jobs()
    emitter = store.foreign._tr["fwtool"][0]
    assert emitter._procs
    store.retire_idle(now_s=time.time() + 120)
    assert store.jobs() == [] and not emitter._procs
