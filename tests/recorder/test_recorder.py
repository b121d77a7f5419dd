"""The training side with the real OpenTelemetry SDK: spans, spool, lifecycle, bad input."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import goodput
from goodput import schema

ROOT = Path(__file__).resolve().parents[2]


def finished(exporter) -> list:
    """The exporter's spans without the recorder's ``goodput.open`` records."""
    return [s for s in exporter.get_finished_spans() if not s.attributes.get(schema.ATTR_OPEN)]


def spool_spans(run_dir, open_records: bool = False) -> list[dict]:
    """All spans in a run directory's spool files, each with its resource attributes
    (without ``goodput.open`` records unless ``open_records``)."""
    out = []
    for path in sorted(Path(run_dir).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            req = json.loads(line)
            for rs in req["resourceSpans"]:
                res = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        attrs = {a["key"]: a["value"] for a in span.get("attributes", [])}
                        if schema.ATTR_OPEN in attrs and not open_records:
                            continue
                        out.append({**span, "attrs": attrs, "res": res, "file": path.name})
    return out


@pytest.fixture
def memory(tmp_path):
    """A configured recorder that also exports to an in-memory exporter."""
    exporter = InMemorySpanExporter()
    rec = goodput.configure(
        "unit", run_dir=tmp_path / "run", exporters=[exporter], flush_interval_s=0.05,
        handle_signals=False, start_time=time.time(),
    )
    yield rec, exporter, tmp_path / "run"
    goodput.shutdown()


def test_phases_become_spans_with_schema_attributes(memory):
    rec, exporter, run_dir = memory
    with goodput.accelerator_init():
        pass
    with goodput.training_prep():
        pass
    with goodput.checkpoint_restore(step=7):
        pass
    with goodput.program_startup():
        pass
    with goodput.data_loading():
        pass
    with goodput.step(8):
        time.sleep(0.002)
    with goodput.checkpoint_save(step=8, blocking=False):
        pass
    with goodput.custom_badput("eval"):
        pass
    goodput.flush()
    spans = {s.name: s for s in finished(exporter)}
    assert set(spans) >= {schema.JOB_START, *schema.PHASES}
    assert spans[schema.STEP].attributes[schema.ATTR_STEP] == 8
    assert spans[schema.STEP].end_time - spans[schema.STEP].start_time >= 2_000_000
    assert spans[schema.CHECKPOINT_RESTORE].attributes[schema.ATTR_CHECKPOINT_STEP] == 7
    assert spans[schema.CHECKPOINT_SAVE].attributes[schema.ATTR_BLOCKING] is False
    assert spans[schema.CUSTOM_BADPUT].attributes[schema.ATTR_BADPUT_TYPE] == "eval"
    res = spans[schema.STEP].resource.attributes
    assert res[schema.RES_JOB_NAME] == "unit" and res[schema.RES_SERVICE_NAME] == "unit"
    assert res[schema.RES_ATTEMPT] == 0 and res[schema.RES_SCHEMA_VERSION] == schema.SCHEMA_VERSION
    # one trace per attempt
    assert len({s.context.trace_id for s in exporter.get_finished_spans()}) == 1
    # the spool holds the same spans, in OTLP JSON
    names = [s["name"] for s in spool_spans(run_dir)]
    assert names.count(schema.STEP) == 1 and schema.JOB_START in names


def test_decorators_explicit_times_and_step_start(memory):
    rec, exporter, _ = memory

    @goodput.data_loading
    def load():
        return 1

    @goodput.step()
    def train():
        return 2

    assert load() == 1 and train() == 2 and train() == 2
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
    goodput.step(100, start=t0, end=t0 + dt.timedelta(seconds=2.5))
    goodput.custom_badput("sdc_check", start=1_700_000_000.0, end=1_700_000_001.5)
    goodput.step_start(200)
    goodput.step_start(201)
    goodput.flush()
    steps = sorted(
        (s.attributes[schema.ATTR_STEP], s.start_time, s.end_time)
        for s in finished(exporter)
        if s.name == schema.STEP
    )
    assert [s[0] for s in steps] == [0, 1, 100, 200]
    back = steps[2]
    assert back[1] == int(t0.timestamp()) * 10**9 and back[2] - back[1] == 2_500_000_000
    custom = [s for s in finished(exporter) if s.name == schema.CUSTOM_BADPUT][0]
    assert custom.end_time - custom.start_time == 1_500_000_000
    goodput.job_end()  # closes step 201 at the end marker
    goodput.flush()  # job_end writes the spool; it never waits for other exporters
    steps = [s for s in finished(exporter) if s.name == schema.STEP]
    assert steps[-1].attributes[schema.ATTR_STEP] == 201


def test_decorators_with_attributes_record_and_write_the_call_in_flight(memory):
    rec, exporter, _ = memory

    @goodput.checkpoint_save(step=3)
    def save():
        time.sleep(0.15)  # over a flush interval (0.05 s): written as in flight first
        return "saved"

    @goodput.custom_badput("eval")
    def evaluate():
        return "evaluated"

    assert save() == "saved" and evaluate() == "evaluated"
    goodput.flush()
    spans = exporter.get_finished_spans()
    done = [s for s in finished(exporter) if s.name == schema.CHECKPOINT_SAVE]
    assert len(done) == 1 and done[0].attributes[schema.ATTR_CHECKPOINT_STEP] == 3
    opened = [s for s in spans if s.attributes.get(schema.ATTR_OPEN)]
    assert [s.name for s in opened] == [schema.CHECKPOINT_SAVE]
    assert opened[0].start_time == done[0].start_time
    assert [s.attributes[schema.ATTR_BADPUT_TYPE] for s in finished(exporter)
            if s.name == schema.CUSTOM_BADPUT] == ["eval"]
    assert rec.stats()["errors"] == 0


def test_bad_input_is_counted_never_raised(memory):
    rec, exporter, _ = memory
    goodput.step(1, start="yesterday", end=5)
    goodput.step(2, start=float("nan"), end=1.0)
    goodput.custom_badput("eval", start=10.0, end=5.0)  # end before start
    goodput.checkpoint_save(step=3, end=10.0)  # end without start
    with pytest.raises(ZeroDivisionError):  # the user's own error passes through ...
        with goodput.step(4):
            raise ZeroDivisionError("user code")
    goodput.flush()
    assert rec.stats()["errors"] == 4
    failed = [s for s in exporter.get_finished_spans() if s.name == schema.STEP]
    assert len(failed) == 1 and failed[0].status.description == "ZeroDivisionError"


def test_compat_recorder_has_the_incumbents_methods(tmp_path):
    run_dir = tmp_path / "mgm"
    rec = goodput.GoodputRecorder(
        job_name="mgm-run", logger_name="goodput_mgm-run", logging_enabled=True,
        run_dir=run_dir, handle_signals=False,
    )
    t = dt.datetime(2026, 3, 1, 8, 0, 0)
    s = dt.timedelta(seconds=1)
    rec.record_job_start_time(t)
    rec.record_tpu_init_start_time(t + s)
    rec.record_tpu_init_end_time(t + 2 * s)
    rec.record_training_preparation_start_time(t + 2 * s)
    rec.record_training_preparation_end_time(t + 3 * s)
    rec.record_data_loading_start_time(t + 3 * s)
    rec.record_data_loading_end_time(t + 4 * s)
    rec.record_step_start_time(0, t + 4 * s)
    rec.record_custom_badput_event_start_time(t + 6 * s, custom_badput_event_type="eval_step")
    rec.record_custom_badput_event_end_time(t + 7 * s, custom_badput_event_type="eval_step")
    rec.record_step_start_time(1, t + 7 * s)
    rec.record_job_end_time(t + 9 * s)
    rec.record_job_start_time(t + 20 * s)  # a second attempt, in a new file
    rec.record_job_end_time(t + 21 * s)
    goodput.shutdown()
    spans = spool_spans(run_dir)
    by_name = {}
    for sp in spans:
        by_name.setdefault(sp["name"], []).append(sp)
    start0 = int(by_name[schema.JOB_START][0]["startTimeUnixNano"])
    assert start0 == int(t.timestamp()) * 10**9
    step_ends = [int(x["endTimeUnixNano"]) - start0 for x in by_name[schema.STEP]]
    assert step_ends == [7 * 10**9, 9 * 10**9]  # measured between step starts
    assert by_name[schema.CUSTOM_BADPUT][0]["attrs"][schema.ATTR_BADPUT_TYPE] == {
        "stringValue": "eval_step"
    }
    files = sorted({sp["file"] for sp in spans})  # a new file per attempt, and per process
    assert [f.split("-")[:4] for f in files] == [["spans", "p00000", "a0000", str(os.getpid())],
                                                 ["spans", "p00000", "a0001", str(os.getpid())]]
    disabled = goodput.GoodputRecorder(job_name="x", logger_name="y", logging_enabled=False)
    disabled.record_job_start_time()  # records nothing, configures nothing
    assert goodput.api._RECORDER is None


def test_unwritable_run_dir_counts_failures_and_training_continues(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    rec = goodput.configure("ro", run_dir=blocker / "run", handle_signals=False)
    for n in range(3):
        with goodput.step(n):
            pass
    goodput.flush()
    stats = rec.stats()
    goodput.shutdown()
    assert stats["export_failures"] >= 1 and stats["errors"] >= 1


def _run_child(tmp_path, body: str, **kwargs) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    return subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, text=True, **kwargs)


CHILD = """
    import sys, time, goodput
    goodput.configure("child", run_dir="run", flush_interval_s=0.1)
    n = 0
    print("ready", flush=True)
    while True:
        with goodput.step(n):
            time.sleep(0.01)
        n += 1
        if n == 20 and "raise" in sys.argv[0]:
            raise RuntimeError("boom")
"""


def test_sigterm_is_left_alone_and_the_step_in_flight_is_in_the_spool(tmp_path):
    """No handler: SIGTERM kills at once (default disposition), no end marker is written,
    and the step the process was in is in the spool as a ``goodput.open`` record."""
    proc = _run_child(tmp_path, CHILD)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == -signal.SIGTERM
    spans = spool_spans(tmp_path / "run", open_records=True)
    assert schema.JOB_END not in {s["name"] for s in spans}
    opened = [s for s in spans if schema.ATTR_OPEN in s["attrs"]]
    assert opened and all(s["name"] == schema.STEP for s in opened)


def test_unhandled_exception_is_the_end_reason(tmp_path):
    script = tmp_path / "raise_child.py"
    script.write_text(textwrap.dedent(CHILD))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "boom" in out.stderr
    spans = spool_spans(tmp_path / "run")
    ends = [s for s in spans if s["name"] == schema.JOB_END]
    assert ends[0]["attrs"][schema.ATTR_END_REASON] == {"stringValue": "exception"}
    assert sum(s["name"] == schema.STEP for s in spans) == 20  # open records left out


def test_sigkill_loses_at_most_one_flush_interval(tmp_path):
    proc = _run_child(tmp_path, CHILD)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    killed_at = time.time_ns()
    proc.kill()
    proc.wait(20)
    spans = spool_spans(tmp_path / "run")
    names = [s["name"] for s in spans]
    assert names[0] == schema.JOB_START and schema.JOB_END not in names
    last_seen = max(int(s["endTimeUnixNano"]) for s in spans)
    # flush interval 0.1 s; allow scheduling noise on a shared 2-core machine
    assert 0 <= killed_at - last_seen < 0.6e9
    # the attempt starts when the OS process started, before goodput was imported
    start = int(spans[0]["startTimeUnixNano"])
    first_step = min(int(s["startTimeUnixNano"]) for s in spans if s["name"] == schema.STEP)
    assert start < first_step


def test_spool_lines_are_valid_otlp(memory):
    """Each spool line parses as an ExportTraceServiceRequest with the official protobufs."""
    import base64

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    rec, _, run_dir = memory
    with goodput.step(1):
        pass
    with goodput.checkpoint_save(step=1):
        pass
    goodput.job_end()
    lines = [ln for p in Path(run_dir).glob("*.jsonl") for ln in p.read_text().splitlines()]
    assert lines
    for line in lines:
        req = json.loads(line)
        for rs in req["resourceSpans"]:  # OTLP/JSON ids are hex; protobuf JSON wants base64
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in span:
                            span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
        msg = json_format.ParseDict(req, ExportTraceServiceRequest())
        for span in msg.resource_spans[0].scope_spans[0].spans:
            assert len(span.trace_id) == 16 and len(span.span_id) == 8
            assert span.kind == span.SPAN_KIND_INTERNAL
            assert span.end_time_unix_nano >= span.start_time_unix_nano > 0


def test_otel_traces_exporter_adds_an_sdk_exporter_next_to_the_spool(tmp_path):
    """OTEL_TRACES_EXPORTER=console loads the SDK's console exporter by entry point."""
    script = tmp_path / "console_child.py"
    script.write_text(textwrap.dedent("""
        import goodput
        goodput.configure("console-job", run_dir="run")
        with goodput.step(3):
            pass
    """))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OTEL_TRACES_EXPORTER="console")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"name": "goodput.step"' in out.stdout  # the console exporter's JSON
    assert any(s["name"] == schema.STEP for s in spool_spans(tmp_path / "run"))


def test_reseeding_the_global_random_module_does_not_repeat_span_ids(memory):
    import random

    rec, exporter, _ = memory
    for _ in range(3):
        random.seed(42)  # what transformers.set_seed / seed_everything do
        with goodput.step():
            pass
    goodput.flush()
    ids = [s.context.span_id for s in exporter.get_finished_spans()]
    assert len(ids) == len(set(ids))
    random.seed(7)
    expected = random.random()
    random.seed(7)
    with goodput.step():
        pass
    goodput.flush()
    assert random.random() == expected  # the recorder draws nothing from the job's sequence


def test_extra_resource_attributes_ride_on_every_span(tmp_path):
    goodput.configure("res", run_dir=tmp_path / "run", handle_signals=False,
                      resource_attributes={"ml.run.name": "sweep-7", "goodput.attempt": 99})
    with goodput.step(1):
        pass
    goodput.shutdown()
    spans = spool_spans(tmp_path / "run")
    assert spans and all(s["res"]["ml.run.name"] == {"stringValue": "sweep-7"} for s in spans)
    assert all(s["res"][schema.RES_ATTEMPT] == {"intValue": "0"} for s in spans)  # ours win


def test_rank_from_jax_distributed_is_written_as_an_identity_marker(tmp_path):
    """After ``jax.distributed.initialize`` the recorder writes the rank and size JAX gave,
    without ever calling ``jax.process_index()`` itself (before init that breaks start-up)."""
    pytest.importorskip("jax")
    script = tmp_path / "jax_child.py"
    script.write_text(textwrap.dedent("""
        import socket, time, goodput
        goodput.configure("jx", run_dir="run", flush_interval_s=0.05)
        import jax
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1,
                                   process_id=0)
        time.sleep(0.3)
        jax.distributed.shutdown()
    """))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    ident = [s for s in spool_spans(tmp_path / "run") if s["name"] == schema.IDENTITY]
    assert ident and ident[0]["attrs"][schema.RES_PROCESS_INDEX] == {"intValue": "0"}
    assert ident[0]["attrs"][schema.RES_PROCESS_COUNT] == {"intValue": "1"}
