"""goodput serve: real OTLP exporters and raw requests on loopback, spool tailing, shutdown.

Live results are compared with ``goodput report`` of the same spans (the spool files the
same recorders wrote), given the same ``now_ns``.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from otlp_fixtures import T0_NS, Timeline

from goodput import schema
from goodput_processor import report_run_dir, to_json_dict
from goodput_processor.serve import GoodputServer, LiveStore, SpoolTailer

HERE = Path(__file__).resolve().parents[1]  # tests/
NOW = T0_NS + 10**15  # far after every fixture: attempts without end marker are "killed"


def _same(live, reported, ignore=()):
    """Compare JSON reports, leaving out skip examples (they name files vs requests)."""
    a, b = to_json_dict(live), to_json_dict(reported)
    for doc in (a, b):
        for j in doc["jobs"]:
            for key in ("skipped_examples", *ignore):
                j.pop(key)
    assert a == b


@pytest.fixture
def server():
    srv = GoodputServer(LiveStore(min_interval_s=0), grpc_port=0, http_port=0)
    yield srv
    srv.stop(5, final=False)


def _post(url, body, ctype="application/x-protobuf", headers=None):
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": ctype, **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def _pb_request(job="raw", n=3, t0=T0_NS, pad=0):
    res = [common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(**v)) for k, v in (
        (schema.RES_SERVICE_NAME, {"string_value": job}),
        (schema.RES_JOB_NAME, {"string_value": job}),
        (schema.RES_ATTEMPT, {"int_value": 0}),
        (schema.RES_SCHEMA_VERSION, {"string_value": "1"}))]
    spans = [trace_pb2.Span(
        trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"), name=schema.STEP,
        start_time_unix_nano=t0 + i * 10**9, end_time_unix_nano=t0 + (i + 1) * 10**9,
        attributes=[common_pb2.KeyValue(key=schema.ATTR_STEP,
                                        value=common_pb2.AnyValue(int_value=i))])
        for i in range(n)]
    scope = trace_pb2.ScopeSpans(scope=common_pb2.InstrumentationScope(name="goodput"),
                                 spans=spans)
    rs = trace_pb2.ResourceSpans(resource={"attributes": res}, scope_spans=[scope])
    req = trace_service_pb2.ExportTraceServiceRequest(resource_spans=[rs])
    if pad:
        req.resource_spans[0].resource.attributes.add(
            key="pad", value=common_pb2.AnyValue(string_value="x" * pad))
    return req


def _record(run_dir, exporter, job="live"):
    from serve_util import train

    sys.path.insert(0, str(HERE))
    train(job, str(run_dir), None, 0, 1, 12, exporter=exporter)


@pytest.mark.parametrize("protocol", ["grpc", "http-gzip"])
def test_real_recorder_over_otlp_equals_report(server, tmp_path, protocol):
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=server.addresses()["grpc"], insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=server.addresses()["http"] + "/v1/traces",
                                    compression=Compression.Gzip)
    _record(tmp_path / "run", exporter)
    assert server.store.stats["spans"] > 12
    now = time.time_ns()
    live = server.store.results(now_ns=now)
    assert [r.job for r in live] == ["live"] and live[0].step_time.count == 12
    assert live[0].attempts[0].end_reason == "exit"
    _same(live, report_run_dir(tmp_path / "run", now_ns=now))
    # the HTTP report endpoint serves the same document
    with urllib.request.urlopen(server.addresses()["http"] + "/v1/report?job=live") as r:
        doc = json.loads(r.read())
    assert doc["jobs"][0]["job"] == "live" and doc["jobs"][0]["step_time"]["count"] == 12


def test_json_body_and_spool_lines_count_once(server, tmp_path):
    """OTLP/JSON over HTTP (the spool's own lines) and the same spans tailed are deduplicated."""
    tl = Timeline(job="j").job_start(0).steps(0, 9, start=1, step_time=2).job_end(25)
    path = tl.write(tmp_path / "run")
    for line in path.read_text().splitlines():
        status, body, _ = _post(server.addresses()["http"] + "/v1/traces", line.encode(),
                                "application/json")
        assert status == 200 and json.loads(body) == {}
    tailer = SpoolTailer(server.store, [tmp_path / "run"])
    assert tailer.poll() == 1
    live = server.store.results(now_ns=NOW)
    _same(live, report_run_dir(tmp_path / "run", now_ns=NOW), ignore=["skipped"])
    assert live[0].skipped["duplicate"] == 12 and live[0].step_time.count == 10


def test_raw_grpc_edge_cases(tmp_path):
    srv = GoodputServer(grpc_port=0, http_port=None, token="s3cret", max_message_bytes=4096)
    try:
        channel = grpc.insecure_channel(srv.addresses()["grpc"])
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Export(_pb_request(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "bearer token" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            stub.Export(_pb_request(), metadata=[("authorization", "Bearer wrong")], timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        auth = [("authorization", "Bearer s3cret")]
        with pytest.raises(grpc.RpcError) as e:
            stub.Export(_pb_request(pad=8000), metadata=auth, timeout=10)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert srv.store.stats["requests"] == 0
        stub.Export(_pb_request(n=3), metadata=auth, timeout=10)
        (r,) = srv.store.results(now_ns=NOW)
        assert r.job == "raw" and r.step_time.count == 3 and r.total_ns == 3 * 10**9
        channel.close()
    finally:
        srv.stop(5)


def test_raw_http_edge_cases():
    srv = GoodputServer(grpc_port=None, http_port=0, token="s3cret", max_message_bytes=4096)
    url = srv.addresses()["http"] + "/v1/traces"
    auth = {"Authorization": "Bearer s3cret"}
    try:
        body = _pb_request().SerializeToString()
        status, err, headers = _post(url, body)
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
        from google.rpc import status_pb2

        assert "bearer token" in status_pb2.Status.FromString(err).message
        status, err, _ = _post(url, _pb_request(pad=8000).SerializeToString(), headers=auth)
        assert status == 413 and b"over the limit of 4096 bytes" in err
        bomb = gzip.compress(b"\x0a" * 100_000)  # small on the wire, too big inflated
        status, err, _ = _post(url, bomb, headers={**auth, "Content-Encoding": "gzip"})
        assert status == 413 and b"inflates" in err
        status, err, _ = _post(url, b"\xff\xff\xff", headers=auth)
        assert status == 400 and b"not a protobuf ExportTraceServiceRequest" in err
        status, err, _ = _post(url, b"[1, 2]", "application/json", headers=auth)
        assert status == 400 and json.loads(err)["code"] == 3
        assert "resourceSpans" in json.loads(err)["message"]
        status, err, _ = _post(url, b"{", "application/json", headers=auth)
        assert status == 400
        status, err, _ = _post(url, body, "text/plain", headers=auth)
        assert status == 415 and b"Content-Type" in err
        status, _, _ = _post(srv.addresses()["http"] + "/v1/metrics", body, headers=auth)
        assert status == 404
        assert srv.store.stats["requests"] == 0
        status, out, _ = _post(url, gzip.compress(body), headers={**auth,
                                                                "Content-Encoding": "gzip"})
        assert status == 200 and out == b""  # an empty ExportTraceServiceResponse
        req = urllib.request.Request(srv.addresses()["http"] + "/v1/report")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 401
        req.add_header("Authorization", "Bearer s3cret")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())["jobs"][0]["step_time"]["count"] == 3
    finally:
        srv.stop(5)


def test_spool_tailing_torn_lines_new_attempts_several_jobs(tmp_path):
    """A training-like writer appends lines (the last one torn), then a new attempt."""
    run = tmp_path / "runs"
    store = LiveStore(min_interval_s=0)
    tailer = SpoolTailer(store, [run])
    assert tailer.poll() == 0  # the directory does not exist yet
    a0 = Timeline(job="a", attempt=0).job_start(0).steps(0, 9, start=1, step_time=2)
    path = a0.write(run / "a", spans_per_line=4)
    text = path.read_bytes()
    path.write_bytes(text[:-20])  # torn: the last line is being written
    n = tailer.poll()
    assert n == text.count(b"\n") - 1
    with open(path, "ab") as f:
        f.write(text[-20:])  # the rest of the line arrives
    assert tailer.poll() == 1
    Timeline(job="b").job_start(0).steps(0, 4, start=0, step_time=1).job_end(6).write(run / "b")
    before = store.results(now_ns=NOW, job="a")
    a1 = Timeline(job="a", attempt=1).job_start(30).restore(30, 31, step=5)
    a1.steps(6, 12, start=31, step_time=2).job_end(50)
    a1.write(run / "a")
    assert tailer.poll() == 2  # job b and a's attempt 1
    for job in ("a", "b"):
        _same(store.results(now_ns=NOW, job=job), report_run_dir(run / job, now_ns=NOW))
    assert store.results(now_ns=NOW, job="a")[0].disruptions == 1
    assert before[0].disruptions == 0  # job a alone, before
    # job b's result does not depend on job a: account it in a store holding only b
    only_b = LiveStore()
    SpoolTailer(only_b, [run / "b"]).poll()
    _same(only_b.results(now_ns=NOW), store.results(now_ns=NOW, job="b"))
    with pytest.raises(KeyError, match="no job named 'c'"):
        store.results(job="c")


def test_spool_tailer_lists_a_directory_again_only_when_it_changed(tmp_path, monkeypatch):
    """A directory's listing is kept while its mtime stays (appends still read), and taken
    again when a file or a subdirectory is added; a directory made to look unchanged
    (its mtime put back) is not listed again, which shows the listing was kept."""
    from goodput_processor.serve import tail

    monkeypatch.setattr(tail, "_SETTLE_NS", 0)  # (no coarse-mtime margin in this test)
    run = tmp_path / "run"
    store = LiveStore(min_interval_s=0)
    tailer = SpoolTailer(store, [run])
    Timeline(job="t").job_start(0).steps(0, 2, start=0, step_time=1).write(run)
    first = tailer.poll()
    assert first > 0 and tailer.poll() == 0
    journal = next(run.glob("*.jsonl"))
    with open(journal, "ab") as f:  # an append: the directory is not listed again
        f.write(journal.read_bytes().splitlines(keepends=True)[-1])
    assert tailer.poll() == 1
    mtime = os.stat(run).st_mtime_ns
    hidden = run / "spans-hidden.jsonl"
    hidden.write_bytes(journal.read_bytes())
    os.utime(run, ns=(mtime, mtime))
    assert tailer.poll() == 0  # the kept listing: the new file is not seen
    (run / "later").mkdir()  # a new attempt's directory: listed, with the file seen now
    Timeline(job="t", attempt=1).job_start(10).steps(3, 4, start=10, step_time=1).write(
        run / "later")
    assert tailer.poll() > first
    assert set(tailer.positions()) == {str(journal), str(hidden),
                                       str(next((run / "later").glob("*.jsonl")))}


def test_malformed_spool_line_counted(tmp_path):
    run = tmp_path / "run"
    path = Timeline(job="m").job_start(0).steps(0, 2, start=0, step_time=1).write(run)
    with open(path, "a") as f:
        f.write("this is not json\n")
    store = LiveStore()
    SpoolTailer(store, [run]).poll()
    (r,) = store.results(now_ns=NOW)
    assert r.skipped["malformed"] == 1 and r.step_time.count == 3
    assert any("not an OTLP JSON line" in ex for ex in r.skipped_examples)


def _listening(proc) -> dict:
    line = proc.stderr.readline()
    assert "listening" in line, line + proc.stderr.read()
    return dict(re.findall(r"(\w+)=(\S+)", line))


def test_cli_serve_graceful_shutdown(tmp_path):
    run = tmp_path / "run"
    Timeline(job="cli").job_start(0).steps(0, 4, start=0, step_time=1).job_end(6).write(run)
    proc = subprocess.Popen(
        [sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port", "0",
         "--http-port", "0", "--spool-dir", str(run), "--format", "json",
         "--report-interval", "0.2", "--shutdown-timeout", "5", "--wal-dir", "off"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        addr = _listening(proc)
        stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(addr["grpc"]))
        stub.Export(_pb_request("grpc-job", n=4), timeout=10)
        first = json.loads(proc.stdout.readline())
        assert first["final"] is False
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    final = json.loads(out.strip().splitlines()[-1])
    assert final["final"] is True
    assert [j["job"] for j in final["jobs"]] == ["cli", "grpc-job"]
    assert final["jobs"][1]["step_time"]["count"] == 4
    assert "stopped" in err


def test_cli_serve_usage_errors(tmp_path):
    from goodput_processor.cli import main

    assert main(["serve", "--grpc-port", "off", "--http-port", "off"]) == 2
    assert main(["serve", "--grpc-port", "99999"]) == 2
    assert main(["serve", "--tls-cert", "c.pem"]) == 2
    assert main(["serve", "--token-file", str(tmp_path / "missing")]) == 2


def _train(run, endpoint, job, index, count, steps, attempt, hang=False):
    env = {**os.environ, "GOODPUT_ATTEMPT": str(attempt), "PYTHONPATH": str(HERE)}
    cmd = [sys.executable, str(HERE / "serve_util.py"), job, str(run), endpoint, str(index),
           str(count), str(steps)] + (["--hang"] if hang else [])
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)


def test_acceptance_multiprocess_restart_converges(tmp_path):
    """Two jobs, three training processes; job 'mp' (2 ranks) is killed and restarted."""
    srv = GoodputServer(LiveStore(min_interval_s=0), grpc_port=0, http_port=0)
    ep = srv.addresses()["grpc"]
    try:
        runs = {"mp": tmp_path / "mp", "solo": tmp_path / "solo"}
        solo = _train(runs["solo"], ep, "solo", 0, 1, 30, 0)
        first = [_train(runs["mp"], ep, "mp", i, 2, 12, 0, hang=True) for i in range(2)]
        for p in first:
            assert p.stdout.readline().strip() == "FLUSHED"
            p.send_signal(signal.SIGKILL)
            p.wait(10)
        second = [_train(runs["mp"], ep, "mp", i, 2, 10, 1) for i in range(2)]
        for p in [solo, *second]:
            assert p.wait(60) == 0
        deadline = time.monotonic() + 20
        while True:  # converge: what was exported has arrived (it has: exit flushed)
            now = time.time_ns()
            live = {r.job: r for r in srv.store.results(now_ns=now)}
            want = {j: report_run_dir(d, now_ns=now)[0] for j, d in runs.items()}
            try:
                for j in runs:
                    _same([live[j]], [want[j]])
                break
            except (AssertionError, KeyError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        mp = live["mp"]
        assert mp.disruptions == 1 and [a.end_reason for a in mp.attempts] == ["killed", "exit"]
        assert mp.attempts[0].processes == 2 and mp.badput_s["wasted_progress"] > 0
        assert live["solo"].step_time.count == 30
        # the HTTP endpoint gives the same accounting
        with urllib.request.urlopen(srv.addresses()["http"] + "/v1/report?job=mp") as r:
            assert json.loads(r.read())["jobs"][0]["disruptions"] == 1
        # and so do the live metrics, wired to the store as `goodput serve` wires them
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        from goodput_processor.exporters.metrics import GoodputMetrics

        reader = InMemoryMetricReader()
        GoodputMetrics(lambda: [srv.store.snapshot(n) for n in srv.store.jobs()],
                       MeterProvider(metric_readers=[reader]), windows_s=(60,))
        points = {}
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for dp in m.data.data_points:
                        attrs = dict(dp.attributes)
                        points[(m.name, attrs.get("goodput.job.name"),
                                attrs.get("goodput.badput.bucket"))] = dp.value
        for j in runs:
            # the metrics are accounted at collection time; the jobs have ended, so the
            # report's numbers hold then too
            assert points[("goodput.goodput", j, None)] == pytest.approx(want[j].goodput)
            for bucket, seconds in want[j].badput_s.items():
                assert points[("goodput.badput_time", j, bucket)] == pytest.approx(seconds)
        assert points[("goodput.disruptions", "mp", None)] == 1
    finally:
        final = srv.stop(10)
    assert final is not None and [r.job for r in final] == ["mp", "solo"]


@pytest.fixture
def tls_cert(tmp_path):
    """A self-signed certificate for 127.0.0.1 (openssl), as (cert, key) paths."""
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )
    return str(cert), str(key)


def test_tls_and_token_with_the_real_exporters(tmp_path, tls_cert, monkeypatch):
    """Both receivers over TLS with a bearer token; the real OTLP exporters trust the cert."""
    # requests lets these override the exporter's certificate_file (session.verify)
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    cert, key = tls_cert
    srv = GoodputServer(LiveStore(min_interval_s=0), grpc_port=0, http_port=0,
                        token="s3cret", tls=(cert, key))
    try:
        addrs = srv.addresses()
        assert addrs["http"].startswith("https://")
        auth = {"authorization": "Bearer s3cret"}
        with open(cert, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        _record(tmp_path / "a", GrpcExporter(endpoint=addrs["grpc"], credentials=creds,
                                              headers=auth), job="tls-grpc")
        _record(tmp_path / "b", HttpExporter(endpoint=addrs["http"] + "/v1/traces",
                                              certificate_file=cert, headers=auth),
                job="tls-http")
        now = time.time_ns()
        live = {r.job: r for r in srv.store.results(now_ns=now)}
        assert sorted(live) == ["tls-grpc", "tls-http"]
        for job, run in (("tls-grpc", "a"), ("tls-http", "b")):
            (reported,) = report_run_dir(tmp_path / run, now_ns=now)
            _same([live[job]], [reported])
        # plain text to a TLS port is refused: nothing more is taken in
        spans_before = srv.store.stats["spans"]
        status = None
        try:
            _post(addrs["http"].replace("https://", "http://") + "/v1/traces", b"")
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            status = type(exc).__name__
        assert status is not None and srv.store.stats["spans"] == spans_before
    finally:
        srv.stop(5, final=False)


def _scrape(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items()
                                  if k.startswith("goodput_")))
            out[(s.name, labels)] = s.value
    return out


def test_cli_serve_prometheus_metrics_equal_the_report(tmp_path):
    """goodput serve --prometheus-port: the scraped gauges are the report's numbers."""
    run = tmp_path / "run"
    (Timeline(job="prom").job_start(0).restore(0, 2, step=0).steps(2, 11, start=1, step_time=2)
     .save(22, 24, step=10).job_end(25).write(run))
    proc = subprocess.Popen(
        [sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port", "0",
         "--http-port", "0", "--spool-dir", str(run), "--prometheus-port", "0",
         "--wal-dir", str(tmp_path / "wal")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        samples = _scrape(_listening(proc)["prometheus"])
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    (job,) = report_run_dir(run)
    job_label = (("goodput_job_name", "prom"),)
    assert samples[("goodput_goodput", job_label)] == pytest.approx(job.goodput)
    for bucket, seconds in job.badput_s.items():
        key = ("goodput_badput_time_seconds",
               tuple(sorted((("goodput_badput_bucket", bucket), *job_label))))
        assert samples[key] == pytest.approx(seconds), bucket
    assert job.badput_s["checkpoint_save"] == pytest.approx(2.0)
