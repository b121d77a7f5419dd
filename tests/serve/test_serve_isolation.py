"""One bad job never hurts another in goodput serve.

- The issue's poison (a step span from 1970 lasting 2^54 ns, 691 bytes of OTLP/JSON) posted
  beside 3 healthy jobs to a real ``goodput serve`` process with ``--report-interval``:
  serve stays up, the healthy jobs' reports and metrics are unchanged, the poisoned job
  carries a warning.
- A job whose accounting raises (fault injected into the accounting function for that job
  only) is reported failed, in the JSON, the table and ``goodput_job_errors_total``, while
  the other jobs are reported as before.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from instr_util import child_env
from otlp_fixtures import Timeline

pytest.importorskip("grpc")

POISON = json.dumps({"resourceSpans": [{
    "resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "poison"}},
        {"key": "goodput.job.name", "value": {"stringValue": "poison"}},
        {"key": "goodput.attempt", "value": {"intValue": "0"}},
        {"key": "goodput.process.index", "value": {"intValue": "0"}},
        {"key": "goodput.schema.version", "value": {"stringValue": "1.1"}}]},
    "scopeSpans": [{"scope": {"name": "goodput", "version": "0.1.0"}, "spans": [{
        "traceId": "0123456789abcdef0123456789abcdef", "spanId": "0123456789abcdef",
        "name": "goodput.step", "kind": 1, "startTimeUnixNano": "0",
        "endTimeUnixNano": str(2**54),
        "attributes": [{"key": "goodput.step", "value": {"intValue": "1"}}],
        "status": {}}]}]}]}, separators=(", ", ": ")).encode()


def _healthy_lines(tmp_path, job, restart):
    """A job's spool lines: one attempt, or (``restart``) a killed one and its restart."""
    if not restart:
        path = Timeline(job=job).job_start(0).steps(0, 10, start=1, step_time=1).job_end(
            12).write(tmp_path / job)
        return path.read_bytes().splitlines()
    a0 = Timeline(job=job).job_start(0).steps(0, 10, start=1, step_time=1).write(tmp_path / job)
    a1 = (Timeline(job=job, attempt=1).job_start(14).restore(14, 15, step=8)
          .steps(8, 12, start=15, step_time=1).job_end(20).write(tmp_path / job))
    return a0.read_bytes().splitlines() + a1.read_bytes().splitlines()


def _post(url, body, ctype="application/json"):
    req = urllib.request.Request(url + "/v1/traces", data=body, method="POST",
                                 headers={"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


def _get(url, path):
    with urllib.request.urlopen(url + path, timeout=30) as r:
        return r.read().decode()


def _job_metrics(text, job):
    return sorted(line for line in text.splitlines()
                  if f'goodput_job_name="{job}"' in line and not line.startswith("#"))


def _report(url, job):
    doc = json.loads(_get(url, f"/v1/report?job={job}"))
    (j,) = doc["jobs"]
    return j


def test_poison_span_beside_three_healthy_jobs(tmp_path):
    assert len(POISON) < 1024  # one small POST, as in the issue (691 bytes there)
    proc = subprocess.Popen(
        [sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port", "0",
         "--http-port", "0", "--report-interval", "0.3", "--format", "json",
         "--report-file", str(tmp_path / "reports.jsonl"), "--wal-dir", str(tmp_path / "wal")],
        env=child_env(), stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        line = proc.stderr.readline()
        url = re.search(r"http=(\S+)", line).group(1)
        healthy = ["alpha", "beta", "gamma"]
        for i, job in enumerate(healthy):
            for body in _healthy_lines(tmp_path, job, restart=i == 1):
                assert _post(url, body) == 200
        before = {j: _report(url, j) for j in healthy}
        metrics_before = {j: _job_metrics(_get(url, "/metrics"), j) for j in healthy}
        assert all(metrics_before.values())
        assert _post(url, POISON) == 200  # a valid span: taken in, and judged
        time.sleep(1.5)  # several report intervals with the poison in
        assert proc.poll() is None, proc.stderr.read()
        assert _get(url, "/healthz").strip() == "ok"
        for j in healthy:
            assert _report(url, j) == before[j]
            assert _job_metrics(_get(url, "/metrics"), j) == metrics_before[j]
        poison = _report(url, "poison")
        assert [w["code"] for w in poison["warnings"]] == ["clock_jump"]
        assert "1970" in poison["warnings"][0]["message"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    reports = [json.loads(x) for x in (tmp_path / "reports.jsonl").read_text().splitlines()]
    assert reports[-1]["final"] and len(reports) >= 3
    assert sorted(j["job"] for j in reports[-1]["jobs"]) == ["alpha", "beta", "gamma", "poison"]


def test_a_job_whose_accounting_raises_is_reported_failed(tmp_path, monkeypatch):
    import prometheus_client
    from opentelemetry.sdk.metrics import MeterProvider

    from goodput_processor.exporters import metrics as gm
    from goodput_processor.exporters.metric_readers import prometheus_reader
    from goodput_processor.serve import GoodputServer, LiveStore, live_results

    real_account, real_windows = live_results.account, gm.account_windows

    def account(job, *a, **kw):  # the fault: this job's accounting raises
        if job.name == "broken":
            raise RuntimeError("injected fault")
        return real_account(job, *a, **kw)

    def account_windows(job, *a, **kw):
        if job.name == "broken":
            raise RuntimeError("injected fault")
        return real_windows(job, *a, **kw)

    monkeypatch.setattr(live_results, "account", account)
    monkeypatch.setattr(gm, "account_windows", account_windows)
    registry = prometheus_client.CollectorRegistry()
    reader, _ = prometheus_reader(None, registry=registry)
    store = LiveStore(min_interval_s=0)
    gm.GoodputMetrics(lambda: [store.snapshot(n) for n in store.jobs()],
                      MeterProvider(metric_readers=[reader]))
    srv = GoodputServer(store, grpc_port=None, http_port=0, metrics=lambda: (
        prometheus_client.generate_latest(registry), prometheus_client.CONTENT_TYPE_LATEST))
    try:
        url = srv.addresses()["http"]
        for job in ("alpha", "broken", "gamma"):
            for body in _healthy_lines(tmp_path, job, restart=False):
                assert _post(url, body) == 200
        doc = json.loads(_get(url, "/v1/report"))
        by_job = {j["job"]: j for j in doc["jobs"]}
        assert by_job["broken"]["error"] == "accounting failed: RuntimeError: injected fault"
        assert by_job["alpha"]["error"] is None and by_job["alpha"]["step_time"]["count"] == 11
        assert by_job["gamma"]["goodput"] == by_job["alpha"]["goodput"] > 0
        assert store.job_errors["broken"] >= 1
        text = _get(url, "/metrics")
        assert re.search(r'goodput_job_errors_total\{goodput_job_name="broken"[^}]*\} [1-9]',
                         text), text
        assert _job_metrics(text, "alpha") and _job_metrics(text, "gamma")
        assert not [m for m in _job_metrics(text, "broken") if "errors" not in m]
    finally:
        srv.stop(5, final=False)
    from rich.console import Console

    from goodput_processor.results.table import render_table

    console = Console(record=True, width=200)
    render_table(store.results(), console)
    assert "Job broken   FAILED: accounting failed" in console.export_text()


def test_a_job_past_its_custom_type_limit_is_flagged_in_report_and_metrics(tmp_path):
    """--max-custom-types: spans of further types are skipped and counted; the report
    warns over_limit and the goodput.job.over_limit gauge counts them per limit."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from goodput_processor.exporters.metrics import GoodputMetrics
    from goodput_processor.serve import LiveStore
    from goodput_processor.serve.limits import Limits

    t = Timeline(job="many").job_start(0).steps(0, 5, start=1, step_time=1)
    for i, kind in enumerate(("eval", "sdc", "profile")):
        t = t.custom(kind, 10 + i, 10.5 + i)
    store = LiveStore(min_interval_s=0, limits=Limits(max_custom_types=2))
    for line in t.job_end(20).write(tmp_path / "many").read_bytes().splitlines():
        store.ingest_json(json.loads(line), ("test", 1))
    (r,) = store.results()
    assert r.over_limit == {"custom_types": 1} and r.skipped["over_limit"] == 1
    assert [w.code for w in r.warnings] == ["over_limit"]
    reader = InMemoryMetricReader()
    GoodputMetrics(lambda: [store.snapshot(n) for n in store.jobs()],
                   MeterProvider(metric_readers=[reader]))
    points = [(dict(p.attributes), p.value)
              for rm in reader.get_metrics_data().resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics
              if m.name == "goodput.job.over_limit" for p in m.data.data_points]
    assert points == [({"goodput.job.name": "many", "goodput.limit": "custom_types"}, 1)]


def test_goodput_report_isolates_a_job_whose_accounting_raises(tmp_path, monkeypatch, capsys):
    """The same isolation in goodput report: the failed job in the JSON and the table,
    the others unchanged, and --strict exits 3."""
    from goodput_processor.account import run_dir
    from goodput_processor.cli import main

    run = tmp_path / "run"
    for job in ("alpha", "broken"):
        Timeline(job=job).job_start(0).steps(0, 10, start=1, step_time=1).job_end(12).write(
            run / job)
    assert main(["report", str(run), "--format", "json"]) == 0
    before = {j["job"]: j for j in json.loads(capsys.readouterr().out)["jobs"]}
    real = run_dir.account

    def account(job, *a, **kw):  # the fault: this job's accounting raises
        if job.name == "broken":
            raise RuntimeError("injected fault")
        return real(job, *a, **kw)

    monkeypatch.setattr(run_dir, "account", account)
    assert main(["report", str(run), "--format", "json"]) == 0
    after = {j["job"]: j for j in json.loads(capsys.readouterr().out)["jobs"]}
    assert after["alpha"] == before["alpha"] and after["alpha"]["error"] is None
    assert after["broken"]["error"] == "accounting failed: RuntimeError: injected fault"
    assert after["broken"]["total_time_s"] == 0
    assert main(["report", str(run)]) == 0
    assert "Job broken   FAILED: accounting failed" in capsys.readouterr().out
    assert main(["report", str(run), "--strict"]) == 3
