"""The ``onelogger`` source against a real NVIDIA one-logger 2.3.1 + Lightning 2.5.6 run.

``tests/data/sources/onelogger/`` holds what one-logger's own ``OTelExporter`` wrote in a
real CPU training that was SIGKILLed at step 67 and restarted from its step-60 checkpoint
(``spans.jsonl``, OTLP JSON lines, the SDK's default 5 s batch delay), beside the driver's
fsync'd truth (``truth.jsonl``) and the script that made both (``regenerate.py``). The tests
on that data always run, as do those on ``ddp/`` (a real clean two-rank DDP run) and the
stored records sent to a real ``goodput serve`` over gRPC and HTTP. ``test_live_*`` run the
tool itself again (skipped, with the reason, when the tool venv of ``venv.sh`` is missing;
about 3.5 minutes on a 2-core machine).

The report must agree with the truth: attempts and max step exactly; checkpoint restore
within 0.5 s; kept steps, checkpoint save, wasted progress and infrastructure recovery
within 0.5 s plus what the kill lost (the truth's kill minus the killed attempt's last
exported record, which must itself be within the export delay plus one metrics interval),
with the loss named (``source_records_lost`` in the report, ``onelogger_tail_lost`` from the
translator).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from goodput_processor.account.run_dir import report_run_dir
from goodput_processor.importers.sources import (
    detect_file_source,
    get_source,
    translate_files,
    write_spool,
)
from goodput_processor.results.report_json import to_json_dict

DATA = Path(__file__).resolve().parents[1] / "data" / "sources" / "onelogger"
sys.path.insert(0, str(DATA))
import regenerate  # noqa: E402

JOB = f"{regenerate.JOB}/{regenerate.SESSION}"
SLACK_S = 0.5


def _truth(path: Path) -> dict:
    """The driver's truth, per attempt (by pid, in order)."""
    by_pid: dict[int, list] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        by_pid.setdefault(r["pid"], []).append(r)
    attempts = []
    for recs in by_pid.values():
        a = {"steps": [(r["step"], r["t_ns"]) for r in recs if r["ev"] == "step_end"],
             "saves": [], "restore": None, "killed": None, "app_start": None}
        opened = {}
        for r in recs:
            if r["ev"] in ("save_start", "restore_start"):
                opened[r["ev"]] = r["t_ns"]
            elif r["ev"] == "save_end":
                a["saves"].append((r["step"], opened.pop("save_start"), r["t_ns"]))
            elif r["ev"] == "restore_end":
                a["restore"] = (r["step"], opened.pop("restore_start"), r["t_ns"])
            elif r["ev"] in ("killed", "app_start"):
                a[r["ev"]] = r["t_ns"]
        attempts.append(a)
    return {"attempts": attempts}


def _report(run_dir: Path) -> dict:
    jobs = to_json_dict(report_run_dir(run_dir))["jobs"]
    assert [j["job"] for j in jobs] == [JOB]
    return jobs[0]


def check_against_truth(job: dict, truth: dict, *, export_delay_s: float) -> dict:
    """Assert the report ``job`` (JSON dict) agrees with ``truth``; returns the figures
    (seconds and counts: report, truth, allowed difference)."""
    a0, a1 = truth["attempts"]
    resume = a1["restore"][0]
    att = job["attempts"]
    assert len(att) == 2 and att[0]["end_reason"] == "killed"
    assert att[1]["end_reason"] == "explicit" and att[1]["resume_step"] == resume
    end0 = att[0]["end_unix_ns"]
    lost_s = (a0["killed"] - end0) / 1e9
    # the loss is one-logger's batch delay plus the steps since its last metrics update
    interval_s = regenerate.LOG_EVERY * regenerate.STEP_S * 1.5 + 0.25
    assert -SLACK_S <= lost_s <= export_delay_s + interval_s + SLACK_S
    assert any(w["code"] == "source_records_lost" for w in job["warnings"])
    b = job["badput_s"]

    kept_truth = sum(1 for s, _ in a0["steps"] if s <= resume) + len(a1["steps"])
    unseen = sum(1 for s, t in a0["steps"] if s <= resume and t > end0 -
                 int(interval_s * 1e9))
    kept = sum(a["steps_kept"] for a in att)
    assert kept_truth - unseen <= kept <= kept_truth
    assert job["max_productive_step"] == a1["steps"][-1][0]

    saves_seen = sum(e - s for _, s, e in a0["saves"] if e <= end0) + sum(
        e - s for _, s, e in a1["saves"])
    saves_all = sum(e - s for _, s, e in a0["saves"] + a1["saves"])
    assert abs(b["checkpoint_save"] - saves_seen / 1e9) <= SLACK_S
    assert abs(b["checkpoint_save"] - saves_all / 1e9) <= SLACK_S + max(lost_s, 0)

    restore_truth = (a1["restore"][2] - a1["restore"][1]) / 1e9
    assert abs(b["checkpoint_restore"] - restore_truth) <= SLACK_S

    save_at_resume = max(e for s, _, e in a0["saves"] if s == resume)
    step_at_resume = max(t for s, t in a0["steps"] if s == resume)
    wasted_truth = (a0["killed"] - max(save_at_resume, step_at_resume)) / 1e9
    infra_truth = (a1["app_start"] - a0["killed"]) / 1e9
    tol = SLACK_S + max(lost_s, 0)
    assert abs(b["wasted_progress"] - wasted_truth) <= tol
    assert abs(b["infrastructure_recovery"] - infra_truth) <= tol
    return {"lost_tail_s": lost_s, "kept": (kept, kept_truth),
            "checkpoint_save_s": (b["checkpoint_save"], saves_all / 1e9),
            "checkpoint_restore_s": (b["checkpoint_restore"], restore_truth),
            "wasted_progress_s": (b["wasted_progress"], wasted_truth),
            "infrastructure_recovery_s": (b["infrastructure_recovery"], infra_truth)}


# --- the stored real run ------------------------------------------------------------------

def test_detected_and_translated():
    spans = DATA / "spans.jsonl"
    assert detect_file_source(str(spans)) == "onelogger"
    run = translate_files(get_source("onelogger"), [spans])
    assert not run.problems.counts
    assert run.warnings == {"onelogger_tail_lost": 1}
    names = {}
    for rs in run.resource_spans:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                names[s["name"]] = names.get(s["name"], 0) + 1
    assert names["goodput.job_start"] == 2 and names["goodput.job_end"] == 1
    assert names["goodput.checkpoint_restore"] == 1
    assert {"goodput.accelerator_init", "goodput.training_prep", "goodput.step",
            "goodput.checkpoint_save", "goodput.custom_badput"} <= set(names)


def test_report_agrees_with_truth(tmp_path):
    run = translate_files(get_source("onelogger"), [DATA / "spans.jsonl"])
    write_spool(run.resource_spans, tmp_path)
    job = _report(tmp_path)
    figures = check_against_truth(job, _truth(DATA / "truth.jsonl"), export_delay_s=5.0)
    print(figures)


def test_report_of_the_otlp_directory_is_the_same(tmp_path):
    """``goodput report`` of the exporter's own file (no import step) gives the same."""
    run = translate_files(get_source("onelogger"), [DATA / "spans.jsonl"])
    write_spool(run.resource_spans, tmp_path / "imported")
    (tmp_path / "raw").mkdir()
    shutil.copy(DATA / "spans.jsonl", tmp_path / "raw" / "spans.jsonl")
    a, b = _report(tmp_path / "imported"), _report(tmp_path / "raw")
    for key in ("total_time_s", "productive_time_s", "badput_s", "attempts",
                "max_productive_step"):
        assert a[key] == b[key], key


def test_without_the_event_spans_the_spans_own_events_are_read(tmp_path):
    """A pipeline that dropped one-logger's zero-length event spans: the events of the
    spans that ended (the restarted attempt's ``application`` and ``training_loop``) give
    that attempt's start, rank, session and steps; the killed one, whose open spans never
    came, is not seen at all."""
    keep = []
    for line in (DATA / "spans.jsonl").read_text().splitlines():
        doc = json.loads(line)
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                ss["spans"] = [s for s in ss["spans"] if "_event_for_" not in s["name"]]
        keep.append(json.dumps(doc))
    (tmp_path / "in.jsonl").write_text("\n".join(keep) + "\n")
    full = translate_files(get_source("onelogger"), [DATA / "spans.jsonl"])
    bare = translate_files(get_source("onelogger"), [tmp_path / "in.jsonl"])

    def steps(run, attempt):
        return sorted((s["startTimeUnixNano"], s["endTimeUnixNano"], json.dumps(
            s["attributes"])) for rs in run.resource_spans for ss in rs["scopeSpans"]
            for s in ss["spans"] if s["name"] == "goodput.step" and any(
                kv["key"] == "goodput.attempt" and kv["value"]["intValue"] == str(attempt)
                for kv in rs["resource"]["attributes"]))

    assert steps(bare, 0) == steps(full, 1) and len(steps(full, 1)) == 8


def test_ddp_two_ranks_are_one_attempt(tmp_path):
    """A real two-rank run (torchrun, Lightning DDP over gloo): one attempt of two
    processes, ranks from one-logger's initialization event. one-logger's own span ids
    repeat there (Lightning re-seeds Python's ``random``, the OTel SDK's id source), so the
    goodput span ids are the emitter's: nothing is dropped as a duplicate."""
    files = sorted((DATA / "ddp").glob("spans-*.jsonl"))
    ids = [(s["traceId"], s["spanId"]) for f in files for line in f.read_text().splitlines()
           for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
           for s in ss["spans"]]
    assert len(set(ids)) < len(ids)  # the foreign ids collide
    run = translate_files(get_source("onelogger"), files)
    assert not run.problems.counts and not run.warnings
    ranks = sorted((a["goodput.process.index"], a["goodput.process.count"]) for a in (
        {kv["key"]: next(iter(kv["value"].values())) for kv in rs["resource"]["attributes"]}
        for rs in run.resource_spans))
    assert sorted(set(ranks)) == [("0", "2"), ("1", "2")]
    write_spool(run.resource_spans, tmp_path)
    jobs = to_json_dict(report_run_dir(tmp_path))["jobs"]
    (job,) = jobs
    assert job["job"] == "ddp-lightning/" + regenerate.SESSION
    assert not any(job["skipped"].values())
    (att,) = job["attempts"]
    assert att["processes"] == 2 and att["end_reason"] == "explicit"
    assert att["steps_kept"] == 20 == job["max_productive_step"]


def test_forget_drops_the_jobs_state():
    """``goodput serve`` retiring the job: the translator forgets its incarnations, so the
    restarted attempt's records sent again are a first incarnation (attempt hint 0)."""
    from goodput_processor.importers.sources.base import Emitter, attrs_of, spans_of

    src = get_source("onelogger")
    tr = src.translator(Emitter(src.imported_from), None)
    lines = [json.loads(x) for x in (DATA / "spans.jsonl").read_text().splitlines()]

    def feed(docs):
        for doc in docs:
            for rs in doc["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    tr.spans(attrs_of(rs["resource"]["attributes"]), ss["scope"]["name"],
                             spans_of(ss["spans"]), "test")
        return {kv["value"]["intValue"] for rs in tr.emit.take()
                for kv in rs["resource"]["attributes"] if kv["key"] == "goodput.attempt"}

    assert feed(lines) == {"0", "1"}
    second = [d for d in lines if d["resourceSpans"][0]["resource"] ==
              lines[-1]["resourceSpans"][0]["resource"]]
    tr.forget(JOB)
    assert feed(second) == {"0"}


def test_torn_and_malformed_records_are_skipped(tmp_path):
    lines = (DATA / "spans.jsonl").read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    doc = json.loads(lines[0])
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][5]["attributes"] = "nonsense"
    bad.write_text("\n".join([json.dumps(doc), '{"resourceSpans": [', *lines[1:],
                              lines[-1][: len(lines[-1]) // 2]]) + "\n")
    run = translate_files(get_source("onelogger"), [bad])
    assert sum(run.problems.counts.values()) >= 2
    assert run.resource_spans


# --- the live run -------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _tool_python() -> str | None:
    py = regenerate.DEFAULT_PYTHON
    if not os.path.exists(py):
        return None
    ok = subprocess.run([py, "-c", "import nv_one_logger.otel.exporter.otel_exporter, "
                         "nv_one_logger.training_telemetry.integration.pytorch_lightning"],
                        capture_output=True, timeout=120)
    return py if ok.returncode == 0 else None


@pytest.fixture
def tool_python() -> str:
    """The tool venv's interpreter; the test is skipped when one-logger is not importable
    (checked once per session, only by the tests that need it)."""
    py = _tool_python()
    if py is None:
        pytest.skip("one-logger 2.3.1 + lightning 2.5.6 not importable: build the tool venv "
                    "with tests/data/sources/onelogger/venv.sh (or set ONELOGGER_PYTHON)")
    return py


def test_live_kill_restart(tmp_path, tool_python):
    """A fresh real run (SIGKILL at step 67, restart from step 60) with a 500 ms batch
    delay: the same checks, with the smaller loss."""
    got = regenerate.run_scenario(tmp_path / "out", python=tool_python, bsp_delay_ms=500)
    run = translate_files(get_source("onelogger"), [got["spans"]])
    assert run.warnings.get("onelogger_tail_lost") == 1
    write_spool(run.resource_spans, tmp_path / "run")
    figures = check_against_truth(_report(tmp_path / "run"), _truth(got["truth"]),
                                  export_delay_s=0.5)
    print(figures)


# --- the same records live through a real `goodput serve` ---------------------------------

def _pb_request(doc: dict):
    """The protobuf ``ExportTraceServiceRequest`` of an OTLP JSON line (hex ids)."""
    import base64

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    doc = json.loads(json.dumps(doc))
    for rs in doc.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for s in ss.get("spans", ()):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if s.get(k):
                        s[k] = base64.b64encode(bytes.fromhex(s[k])).decode()
    return json_format.ParseDict(doc, ExportTraceServiceRequest())


def _send(protocol: str, addr: dict, line: str) -> None:
    if protocol == "grpc":
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        with grpc.insecure_channel(addr["grpc"]) as ch:
            trace_service_pb2_grpc.TraceServiceStub(ch).Export(
                _pb_request(json.loads(line)), timeout=30)
        return
    if protocol == "http-protobuf":
        body, ctype = _pb_request(json.loads(line)).SerializeToString(), "application/x-protobuf"
    else:
        body, ctype = line.encode(), "application/json"
    req = urllib.request.Request(addr["http"] + "/v1/traces", data=body, method="POST",
                                 headers={"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


@contextlib.contextmanager
def _serve(tmp_path: Path):
    """A real ``goodput serve`` process on loopback: yields ``{"grpc", "http"}`` and a
    ``report()`` of the job (its ``/v1/report`` document)."""
    from instr_util import child_env

    cmd = [sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port", "0",
           "--http-port", "0", "--wal-dir", str(tmp_path / "wal")]
    proc = subprocess.Popen(cmd, env=child_env(), stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    try:
        first = proc.stderr.readline()
        addr = {"grpc": re.search(r"grpc=(\S+)", first).group(1),
                "http": re.search(r"http=(\S+)", first).group(1)}

        def report() -> dict:
            url = addr["http"] + "/v1/report?job=" + urllib.parse.quote(JOB, safe="")
            with urllib.request.urlopen(url, timeout=60) as r:
                return json.loads(r.read())

        yield addr, report
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


@pytest.mark.parametrize("protocol", ["grpc", "http-protobuf", "http-json"])
def test_serve_live_equals_report(tmp_path, protocol):
    """The stored records sent as one-logger's exporter sent them (one request per line)
    to a real ``goodput serve`` process give the offline report."""
    pytest.importorskip("grpc")
    run = translate_files(get_source("onelogger"), [DATA / "spans.jsonl"])
    write_spool(run.resource_spans, tmp_path / "offline")
    offline = _report(tmp_path / "offline")
    with _serve(tmp_path) as (addr, report):
        for line in (DATA / "spans.jsonl").read_text().splitlines():
            _send(protocol, addr, line)
        doc = report()
    (live,) = [j for j in doc["jobs"] if j["job"] == JOB]
    for job in (live, offline):
        job.pop("skipped_examples", None)
    assert live == offline
    assert doc["sources"]["warnings"]["onelogger"] == {"onelogger_tail_lost": 1}


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_live_export_to_serve_kill_restart(tmp_path, protocol, tool_python):
    """The real run exporting live (one-logger's OTelExporter around the OTLP exporter,
    500 ms batch delay) to a real ``goodput serve``: killed at step 67, restarted; the live
    report agrees with the truth."""
    pytest.importorskip("grpc")
    with _serve(tmp_path) as (addr, report):
        got = regenerate.run_scenario(tmp_path / "out", python=tool_python,
                                      bsp_delay_ms=500, endpoint=addr[protocol],
                                      http=protocol == "http")
        doc = report()
    (live,) = [j for j in doc["jobs"] if j["job"] == JOB]
    print(check_against_truth(live, _truth(got["truth"]), export_delay_s=0.5))
    assert doc["sources"]["warnings"]["onelogger"] == {"onelogger_tail_lost": 1}
