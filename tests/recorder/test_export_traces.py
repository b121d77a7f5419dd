"""Spans out: the real exporters (Cloud Trace, OTLP gRPC, OTLP/HTTP, Google's telemetry
endpoint) against loopback services that record what they receive."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import pytest
from fake_trace_services import (
    FakeCloudTrace,
    FakeOtlpGrpc,
    FakeOtlpHttp,
    otlp_json_lines,
    otlp_spans,
)

import goodput
from goodput import export, schema

ROOT = Path(__file__).resolve().parents[2]
CLOUD_TRACE_LIMITS = {"attributes": 32, "key_bytes": 128, "value_bytes": 256, "name_bytes": 128}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("OTEL_TRACES_EXPORTER", "GOODPUT_TRACES_EXPORTER", "OTEL_SERVICE_NAME",
                "GOODPUT_JOB_NAME", "GOODPUT_ATTEMPT", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(var, raising=False)
    yield
    goodput.shutdown()


def train(steps: int, *, save_every: int = 5) -> None:
    """A small training loop with every kind of phase."""
    with goodput.accelerator_init():
        pass
    with goodput.training_prep():
        pass
    with goodput.checkpoint_restore(step=0):
        pass
    with goodput.program_startup():
        pass
    for n in range(steps):
        with goodput.data_loading():
            pass
        with goodput.step(n):
            time.sleep(0.001)
        if n % save_every == save_every - 1:
            with goodput.checkpoint_save(step=n):
                pass
    with goodput.custom_badput("eval"):
        pass


def check_structure(spans: list[dict]) -> dict:
    """Each trace has exactly one root, a ``goodput.window``, parent of every other span,
    covering them in time. Returns ``{trace_id: (root, children)}``."""
    traces = defaultdict(list)
    for s in spans:
        traces[s["trace_id"]].append(s)
    out = {}
    for tid, members in traces.items():
        roots = [s for s in members if not s["parent"]]
        assert len(roots) == 1, f"trace {tid}: {len(roots)} roots"
        (root,) = roots
        assert root["name"] == schema.WINDOW
        children = [s for s in members if s is not root]
        assert children and all(c["parent"] == root["span_id"] for c in children)
        assert root["start"] == min(c["start"] for c in children)
        assert root["end"] == max(c["end"] for c in children)
        assert root["attrs"][schema.ATTR_WINDOW_SPANS] == len(children)
        out[tid] = (root, children)
    return out


def test_cloud_trace_gets_windows_as_traces_within_its_limits(tmp_path):
    fake = FakeCloudTrace()
    try:
        exporter = export.cloud_trace_exporter(project_id="proj-1", client=fake.client())
        goodput.configure("ct-job", run_dir=tmp_path / "run", exporters=[exporter],
                          trace_window_spans=10, handle_signals=False, start_time=time.time())
        train(12)
        goodput.shutdown()  # ends the attempt, closes the last window, flushes the exporter
        spans = fake.spans
    finally:
        fake.stop()
    assert fake.requests and all(r.name == "projects/proj-1" for r in fake.requests)
    flat = []
    for s in spans:
        parts = s.name.split("/")  # projects/<p>/traces/<trace id>/spans/<span id>
        assert parts[:2] == ["projects", "proj-1"] and parts[4:5] == ["spans"]
        assert parts[5] == s.span_id
        labels = s.attributes.attribute_map
        attrs = {}
        for k, v in labels.items():
            kind = v._pb.WhichOneof("value")
            attrs[k] = v.string_value.value if kind == "string_value" else getattr(v, kind)
            assert len(k.encode()) <= CLOUD_TRACE_LIMITS["key_bytes"]
            if kind == "string_value":
                assert len(v.string_value.value.encode()) <= CLOUD_TRACE_LIMITS["value_bytes"]
                assert v.string_value.truncated_byte_count == 0
        assert len(labels) <= CLOUD_TRACE_LIMITS["attributes"]
        assert s.attributes.dropped_attributes_count == 0
        assert len(s.display_name.value.encode()) <= CLOUD_TRACE_LIMITS["name_bytes"]
        flat.append({
            "name": s.display_name.value, "trace_id": parts[3], "span_id": s.span_id,
            "parent": s.parent_span_id, "start": s.start_time.timestamp_pb().ToNanoseconds(),
            "end": s.end_time.timestamp_pb().ToNanoseconds(), "attrs": attrs,
            "links": [(ln.trace_id, ln.span_id) for ln in s.links.link],
        })
    names = [s["name"] for s in flat if schema.ATTR_OPEN not in s["attrs"]]
    assert names.count(schema.STEP) == 12 and names.count(schema.JOB_END) == 1
    assert {schema.JOB_START, *schema.PHASES} <= set(names)
    traces = check_structure(flat)
    # 5 + 12 * 2 + 2 + 1 + 1 = 33 phase/marker spans, at most 10 per window
    assert len(traces) == 4 and all(len(ch) <= 10 for _, ch in traces.values())
    roots = sorted((r for r, _ in traces.values()), key=lambda r: r["attrs"][
        schema.ATTR_WINDOW_INDEX])
    assert [r["attrs"][schema.ATTR_WINDOW_INDEX] for r in roots] == [0, 1, 2, 3]
    assert roots[0]["links"] == []
    for prev, cur in zip(roots, roots[1:], strict=False):  # each window links to the one before
        assert cur["links"] == [(prev["trace_id"], prev["span_id"])]
    # the goodput resource arrives as labels on every span (the exporter makes them strings)
    for s in flat:
        a = s["attrs"]
        assert a[schema.RES_JOB_NAME] == "ct-job" and a[schema.RES_SERVICE_NAME] == "ct-job"
        assert a[schema.RES_ATTEMPT] == "0" and a[schema.RES_PROCESS_INDEX] == "0"
        assert a[schema.RES_SCHEMA_VERSION] == schema.SCHEMA_VERSION and "g.co/agent" in a
    steps = sorted(s["attrs"][schema.ATTR_STEP] for s in flat
                   if s["name"] == schema.STEP and schema.ATTR_OPEN not in s["attrs"])
    assert steps == list(range(12))


def test_schema_attributes_survive_cloud_trace_no_floats():
    """Cloud Trace turns floats into "%.4f" strings: the schema must use none."""
    int_attrs = {schema.ATTR_STEP, schema.ATTR_STEP_COUNT, schema.ATTR_CHECKPOINT_STEP,
                 schema.ATTR_HEARTBEAT_INTERVAL_MS,
                 schema.ATTR_RECORDER_ERRORS, schema.ATTR_RECORDER_DROPPED,
                 schema.ATTR_WINDOW_INDEX, schema.ATTR_WINDOW_SPANS,
                 schema.ATTR_SLICES_ACTIVE, schema.ATTR_SLICES_AVAILABLE,
                 schema.ATTR_SLICES_TOTAL, schema.ATTR_LAUNCHER_WORKER_PID,
                 schema.ATTR_LAUNCHER_EXIT_CODE, schema.ATTR_LAUNCHER_RESTART_COUNT,
                 schema.ATTR_LAUNCHER_GLOBAL_RANK}
    names = {v for k, v in vars(schema).items() if k.startswith("ATTR_")}
    assert names == int_attrs | {schema.ATTR_BLOCKING, schema.ATTR_OPEN, schema.ATTR_BADPUT_TYPE,
                                 schema.ATTR_END_REASON, schema.ATTR_PROFILE_SESSION,
                                 schema.ATTR_PROFILE_DIR, schema.ATTR_PROFILE_TRIGGER,
                                 schema.ATTR_ELASTIC_EVENT_TYPE, schema.ATTR_LAUNCHER_EVENT}
    assert all(len(n.encode()) <= 128 for n in names | set(schema.SPAN_NAMES))


@pytest.fixture
def otlp_grpc(monkeypatch):
    fake = FakeOtlpGrpc()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", fake.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    yield fake
    fake.stop()


def test_otlp_grpc_by_name_one_trace_per_attempt(tmp_path, otlp_grpc):
    goodput.configure("grpc-job", run_dir=tmp_path / "run", traces_exporter="otlp",
                      handle_signals=False, start_time=time.time())
    train(3)
    goodput.job_start()  # a restart in the same process: attempt 1
    train(2)
    goodput.shutdown()
    spans = otlp_spans(otlp_grpc.requests)
    assert all(s["scope"] == schema.SCOPE_NAME for s in spans)
    traces = check_structure(spans)
    assert len(traces) == 2  # short attempts: one window, so one trace, each
    by_attempt = {root["res"][schema.RES_ATTEMPT]: (root, ch) for root, ch in traces.values()}
    assert sorted(by_attempt) == [0, 1]
    for attempt, (root, children) in by_attempt.items():
        assert root["attrs"][schema.ATTR_WINDOW_INDEX] == 0 and root["links"] == []
        names = [c["name"] for c in children]
        assert names[0] == schema.JOB_START and names[-1] == schema.JOB_END
        assert names.count(schema.STEP) == (3, 2)[attempt]
        assert {c["res"][schema.RES_ATTEMPT] for c in children} == {attempt}
    res = spans[0]["res"]
    assert res[schema.RES_JOB_NAME] == "grpc-job" and res[schema.RES_PROCESS_COUNT] == 1
    assert schema.RES_HOST_NAME in res and schema.RES_SERVICE_INSTANCE_ID in res


def test_otlp_http_protobuf_with_standard_variables(tmp_path, monkeypatch):
    fake = FakeOtlpHttp()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", fake.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team-a")
        monkeypatch.setenv("GOODPUT_TRACES_EXPORTER", "otlp_proto_http")
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")  # GOODPUT_ wins
        goodput.configure("http-job", spool=False, handle_signals=False, start_time=time.time())
        train(4)
        goodput.shutdown()
    finally:
        fake.stop()
    assert fake.requests
    for path, headers, _ in fake.requests:
        assert path == "/v1/traces" and headers["content-type"] == "application/x-protobuf"
        assert headers["x-tenant"] == "team-a"
    spans = otlp_spans([r for _, _, r in fake.requests])
    check_structure(spans)
    assert [s["attrs"][schema.ATTR_STEP] for s in spans if s["name"] == schema.STEP] == [0, 1,
                                                                                       2, 3]


def test_gcp_otlp_sends_google_auth_and_project(tmp_path):
    from google.oauth2.credentials import Credentials

    fake = FakeOtlpHttp()
    try:
        exporter = export.gcp_otlp_exporter(
            project_id="proj-9", credentials=Credentials(token="test-token"), endpoint=fake.url)
        goodput.configure("gcp-otlp-job", run_dir=tmp_path / "run", exporters=[exporter],
                          handle_signals=False, start_time=time.time())
        train(2)
        goodput.shutdown()
    finally:
        fake.stop()
    assert fake.requests
    for _, headers, _ in fake.requests:
        assert headers["authorization"] == "Bearer test-token"
        assert headers["x-goog-user-project"] == "proj-9"
    spans = otlp_spans([r for _, _, r in fake.requests])
    assert {s["res"]["gcp.project_id"] for s in spans} == {"proj-9"}
    assert {s["res"][schema.RES_JOB_NAME] for s in spans} == {"gcp-otlp-job"}
    check_structure(spans)


def test_bad_exporter_names_and_window_settings_are_warned_about_never_raised(
        tmp_path, monkeypatch, caplog):
    """Never raises (issue 36): each bad setting is one warning naming it and what is used."""
    with caplog.at_level(logging.WARNING, logger="goodput"):
        rec = goodput.configure("bad", run_dir=tmp_path, traces_exporter="zipkn")
        assert rec._forward.forwarders == []
        rec = goodput.configure("bad", run_dir=tmp_path, trace_window_s=0)
        assert rec._window_ns == int(60e9)
        rec = goodput.configure("bad", run_dir=tmp_path, trace_window_spans=-3)
        assert rec._window_spans == 500
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
        monkeypatch.setenv("OTEL_EXPORTER_GCP_TRACE_PROJECT_ID", "p")
        goodput.configure("bad", run_dir=tmp_path, traces_exporter="gcp_trace")
    assert "traces_exporter: unknown traces exporter 'zipkn'" in caplog.text
    assert "ignoring trace_window_s=0: not a finite number > 0; using the default 60" \
        in caplog.text
    assert "ignoring trace_window_spans=-3: not an integer >= 1; using the default 500" \
        in caplog.text
    assert re.search(r"cannot create traces exporter 'gcp_trace'.*missing", caplog.text)
    # from the environment: logged with the variable's name, and the spool still works
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkn")
    with caplog.at_level(logging.WARNING, logger="goodput.export"):
        goodput.configure("env-bad", run_dir=tmp_path / "run", handle_signals=False)
    assert "OTEL_TRACES_EXPORTER: unknown traces exporter 'zipkn'" in caplog.text
    with goodput.step(1):
        pass
    goodput.shutdown()
    assert any(p.read_text() for p in (tmp_path / "run").glob("*.jsonl"))


def spool_spans(run_dir) -> list[dict]:
    """Spool spans in the shape of :func:`otlp_spans` (enough for :func:`check_structure`)."""
    out = []
    for path in sorted(Path(run_dir).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        attrs = {a["key"]: int(a["value"]["intValue"])
                                 if "intValue" in a["value"] else a["value"]
                                 for a in sp.get("attributes", [])}
                        out.append({"name": sp["name"], "trace_id": sp["traceId"],
                                    "span_id": sp["spanId"], "parent": sp.get("parentSpanId", ""),
                                    "start": int(sp["startTimeUnixNano"]),
                                    "end": int(sp["endTimeUnixNano"]), "attrs": attrs})
    return out


CHILD = textwrap.dedent("""
    import sys, time
    import goodput
    goodput.configure("child-job", run_dir=sys.argv[1], flush_interval_s=0.05,
                      trace_window_s=0.3)
    with goodput.training_prep():
        time.sleep(0.02)
    for n in range(int(sys.argv[2])):
        with goodput.data_loading():
            time.sleep(0.002)
        with goodput.step(n):
            time.sleep(0.01)
        if n % 10 == 9:
            with goodput.checkpoint_save(step=n):
                time.sleep(0.005)
    print("trained", flush=True)
    if sys.argv[3] == "hang":
        time.sleep(60)
""")


def run_child(tmp_path, run_dir, steps, mode, env):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, **env, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, str(script), str(run_dir), str(steps), mode],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def report(run_dir) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                        str(ROOT / "collectors")])}
    p = subprocess.run([sys.executable, "-m", "goodput_processor.cli", "report", str(run_dir),
                        "--format", "json"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_child_process_over_otlp_gives_the_same_report_as_its_spool(tmp_path, otlp_grpc):
    child = run_child(tmp_path, tmp_path / "spool", 40, "exit",
                      {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "100"})
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    received = otlp_spans(otlp_grpc.requests)
    traces = check_structure(received)
    assert len(traces) >= 2  # 40 steps of ~12 ms: more than one 0.3 s window
    assert all(len(ch) <= 500 for _, ch in traces.values())
    (tmp_path / "otlp").mkdir()
    otlp_json_lines(otlp_grpc.requests, tmp_path / "otlp" / "received.jsonl")
    from_spool, from_otlp = report(tmp_path / "spool"), report(tmp_path / "otlp")
    assert from_otlp == from_spool
    (job,) = from_spool["jobs"]
    assert job["step_time"]["count"] == 40 and job["attempts"][0]["end_reason"] == "exit"
    # the spool holds the same spans, in the same trace structure
    assert sorted((s["trace_id"], s["span_id"], s["parent"]) for s in received) == sorted(
        (s["trace_id"], s["span_id"], s["parent"]) for s in spool_spans(tmp_path / "spool"))


def test_sigkill_leaves_every_window_but_the_last_with_its_root(tmp_path):
    child = run_child(tmp_path, tmp_path / "spool", 80, "hang", {})
    assert child.stdout.readline().strip() == "trained"
    time.sleep(0.2)  # a few heartbeats into the last window
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    spans = spool_spans(tmp_path / "spool")
    traces = defaultdict(list)
    for s in spans:
        traces[s["trace_id"]].append(s)
    rooted = [t for t in traces.values() if any(not s["parent"] for s in t)]
    assert len(traces) >= 3 and len(rooted) >= len(traces) - 1
    check_structure([s for t in rooted for s in t])
    # orphans (the open window's children) all point at one missing parent
    orphans = [s for t in traces.values() if t not in rooted for s in t]
    assert len({s["parent"] for s in orphans}) <= 1
    assert not any(s["name"] == schema.JOB_END for s in spans)


def test_window_spans_are_ignored_by_the_processor(tmp_path):
    """Reports with and without the structure spans are equal, and none is 'unknown'."""
    child = run_child(tmp_path, tmp_path / "with", 30, "exit", {})
    _, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    (tmp_path / "without").mkdir()
    for path in (tmp_path / "with").glob("*.jsonl"):
        lines = []
        for line in path.read_text().splitlines():
            req = json.loads(line)
            for rs in req["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    ss["spans"] = [s for s in ss["spans"] if s["name"] not in schema.STRUCTURE]
            lines.append(json.dumps(req))
        (tmp_path / "without" / path.name).write_text("\n".join(lines) + "\n")
    with_windows, without = report(tmp_path / "with"), report(tmp_path / "without")
    assert with_windows["jobs"][0]["skipped"]["unknown"] == 0
    assert with_windows == without
