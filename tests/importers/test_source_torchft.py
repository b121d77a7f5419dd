"""The ``torchft`` source: torchft 0.2.0's OTLP log records as goodput spans.

The recorded test data (tests/data/sources/torchft/, ``regenerate.py``) is a real CPU
run of torchft's own lighthouse and two replica groups, one SIGKILLed mid-run and started
again: its report must agree with the driver's fsync'd truth. The live test runs torchft
again (tool venv of ``venv.sh``; skipped without it) with its exporter pointed at a real
``goodput serve`` on loopback, and compares serve's ``/v1/report`` with the offline
translation of the same requests and with the truth.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from instr_util import child_env

from goodput_processor import report_run_dir, to_json_dict
from goodput_processor.importers.sources import (
    detect_file_source,
    get_source,
    translate_files,
    translate_otlp,
    write_spool,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "sources" / "torchft"
sys.path.insert(0, str(DATA))
from run_torchft import requests_to_jsonl, run, truth, venv_ok  # noqa: E402

JOB = "torchft-demo"
TOL_S = 0.5  # the acceptance tolerance of issue 37


def _report(resource_spans, out: Path) -> dict:
    written = write_spool(resource_spans, out)
    return to_json_dict(report_run_dir(written[JOB]["run_dir"]))["jobs"][0]


def _figures(job: dict) -> dict:
    return {"attempts": len(job["attempts"]),
            "steps_kept": sum(a["steps_kept"] for a in job["attempts"]),
            "max_step": job["max_productive_step"],
            "wasted_progress_s": job["badput_s"]["wasted_progress"],
            "infrastructure_recovery_s": job["badput_s"]["infrastructure_recovery"]}


def _agrees(got: dict, want: dict) -> None:
    for k in ("attempts", "steps_kept", "max_step"):
        assert got[k] == want[k], (k, got, want)
    for k in ("wasted_progress_s", "infrastructure_recovery_s"):
        assert abs(got[k] - want[k]) <= TOL_S, (k, got, want)


def test_recorded_run_agrees_with_the_drivers_truth(tmp_path):
    src = get_source("torchft")
    assert detect_file_source(str(DATA / "otlp-logs.jsonl")) == "torchft"
    got = translate_files(src, [DATA / "otlp-logs.jsonl"])
    assert not got.problems.counts
    # the killed replica's last records (its batch processor's second) never left it
    assert got.warnings == {"torchft_tail_lost": 1, "torchft_tail_steps_inferred": 5}
    job = _report(got.resource_spans, tmp_path)
    want = truth(DATA)
    _agrees(_figures(job), want)
    assert want["wasted_progress_s"] > 0.1 and want["infrastructure_recovery_s"] > 1.0
    # quorum after quorum: the same process goes on (restart marker), the killed one not
    assert [a["end_reason"] for a in job["attempts"]] == ["restart"] * 3 + ["killed"]
    failed = [a for a in job["attempts"] if a["steps_wasted"]]
    assert [a["steps_wasted"] for a in failed] == [1]  # the failed commit, redone
    # the restarted replica's first step is the quorum's max step (a jump, healed)
    kill = [json.loads(x) for x in (DATA / "driver.jsonl").read_text().splitlines()]
    assert [k["ev"] for k in kill] == ["kill", "restart"]


def test_recorded_run_with_the_primary_killed(tmp_path):
    """Replica 0, its quorum's primary, killed: its last 7 commits never left it; they are
    taken from its peer's (lock step), and the figures still agree with the truth."""
    data = DATA / "kill-primary"
    got = translate_files(get_source("torchft"), [data / "otlp-logs.jsonl"])
    assert not got.problems.counts
    assert got.warnings == {"torchft_tail_lost": 1, "torchft_tail_steps_inferred": 7}
    job = _report(got.resource_spans, tmp_path)
    want = truth(data)
    _agrees(_figures(job), want)
    assert [a["steps_wasted"] for a in job["attempts"]] == [0, 1, 0, 0]


def test_protobuf_requests_translate_as_their_json(tmp_path):
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsServiceRequest,
    )

    from goodput_processor.importers.sources.driver import OtlpTranslation

    tr, pb_spans = OtlpTranslation(), []
    for p in sorted((DATA / "requests").glob("*.pb")):
        req = ExportLogsServiceRequest.FromString(p.read_bytes())
        pb_spans += tr.logs(req.resource_logs, p.name)
    assert not tr.problems.counts and tr.ignored == 0
    json_run = translate_files(get_source("torchft"), [DATA / "otlp-logs.jsonl"])
    a = _report(pb_spans, tmp_path / "pb")
    b = _report(json_run.resource_spans, tmp_path / "json")
    for job in (a, b):
        job.pop("skipped_examples")
    assert _figures(a) == _figures(b)
    assert a["badput_s"] == b["badput_s"]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_recorded_requests_sent_to_serve_give_the_import_report(tmp_path, protocol):
    """torchft's real request bodies, sent again to an in-process ``goodput serve`` by gRPC
    ``LogsService/Export`` or ``POST /v1/logs``: the same report as the import."""
    pytest.importorskip("grpc")
    import grpc
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc

    from goodput_processor.serve import GoodputServer, LiveStore

    server = GoodputServer(LiveStore(min_interval_s=0), grpc_port=0, http_port=0)
    try:
        addr = server.addresses()
        bodies = [p.read_bytes() for p in sorted((DATA / "requests").glob("*.pb"))]
        if protocol == "grpc":
            with grpc.insecure_channel(addr["grpc"]) as ch:
                stub = logs_service_pb2_grpc.LogsServiceStub(ch)
                for b in bodies:
                    stub.Export(logs_service_pb2.ExportLogsServiceRequest.FromString(b),
                                timeout=30)
        else:
            for b in bodies:
                req = urllib.request.Request(addr["http"] + "/v1/logs", data=b, method="POST",
                                             headers={"Content-Type": "application/x-protobuf"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    assert r.status == 200
        (live,) = [j for j in _get(addr["http"] + f"/v1/report?job={JOB}")["jobs"]
                   if j["job"] == JOB]
    finally:
        server.stop(10, final=False)
    got = translate_files(get_source("torchft"), [DATA / "otlp-logs.jsonl"])
    off = _report(got.resource_spans, tmp_path)
    assert _figures(live) == _figures(off)
    assert live["badput_s"] == off["badput_s"]


@pytest.mark.parametrize("data", [DATA, DATA / "kill-primary"], ids=["kill1", "kill0"])
def test_streamed_requests_give_the_imports_spans(data):
    """What ``goodput serve`` keeps (one translator across requests, never finished) makes
    the same spans as the import, the lost tail included: the runs went on for more than
    the 10 s of record time after which serve takes it."""
    from goodput_processor.importers.sources.driver import OtlpTranslation

    tr, streamed = OtlpTranslation(), []
    for line in (data / "otlp-logs.jsonl").read_text().splitlines():
        streamed += tr.logs(json.loads(line)["resourceLogs"], "stream")
    off = translate_files(get_source("torchft"), [data / "otlp-logs.jsonl"])

    def ids(rss):
        return sorted(s["spanId"] for rs in rss for ss in rs["scopeSpans"] for s in ss["spans"])

    assert ids(streamed) == ids(off.resource_spans)
    assert tr.warnings["torchft"] == off.warnings


def _log(scope: str, t: int, **attrs) -> dict:
    def v(x):
        if isinstance(x, bool):
            return {"boolValue": x}
        if isinstance(x, int):
            return {"intValue": str(x)}
        return {"stringValue": str(x)}

    return {"resourceLogs": [{"resource": {"attributes": []}, "scopeLogs": [{
        "scope": {"name": scope},
        "logRecords": [{"timeUnixNano": str(t), "body": {"stringValue": ""},
                        "attributes": [{"key": k, "value": v(x)} for k, x in attrs.items()]}],
    }]}]}


def _merge(docs: list[dict]) -> dict:
    return {"resourceLogs": [rl for d in docs for rl in d["resourceLogs"]]}


def _spans(run) -> list[tuple]:
    return sorted((s["name"], int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]),
                   {a["key"]: next(iter(a["value"].values())) for a in s["attributes"]},
                   s.get("status", {}).get("code", 0))
                  for rs in run.resource_spans for ss in rs["scopeSpans"] for s in ss["spans"])


S = 1_000_000_000


def test_failed_commits_errors_and_out_of_order_records():
    base = dict(job_id="j", replica_id="train_ddp_0", rank=0)
    docs = [
        # commits of quorum 1 arrive before its quorum record (separate batch processors)
        _log("torchft_commits", 11 * S, **base, quorum_id=1, step=0, commit_result=True),
        _log("torchft_commits", 12 * S, **base, quorum_id=1, step=1, commit_result=False),
        _log("torchft_commits", 13 * S, **base, quorum_id=1, step=1, commit_result=True),
        _log("torchft_commits", 14 * S, **base, quorum_id=1, step=2, commit_result=False),
        _log("torchft_quorums", 10 * S, **base, quorum_id=1, step=0),
        _log("torchft_errors", 14 * S, job_id="j", replica_id="train_ddp_0", rank=1,
             quorum_id=1, error="process_group_abort"),
        _log("torchft_quorums", 16 * S, **base, quorum_id=2, step=2),
        _log("torchft_commits", 17 * S, **base, quorum_id=2, step=2, commit_result=True),
        _log("torchft_commits", 17 * S, **base, quorum_id=2, step=2, commit_result=True),
        # malformed: no quorum id; skipped and counted, never raised
        _log("torchft_commits", 18 * S, job_id="j", replica_id="x", step=3),
    ]
    got = translate_otlp(get_source("torchft"), _merge(docs))
    assert got.problems.counts == {"malformed": 1}
    assert got.warnings == {"torchft_process_group_abort": 1}
    spans = _spans(got)
    assert ("goodput.step", 10 * S, 11 * S, {"goodput.step": "0"}, 0) in spans
    assert ("goodput.custom_badput", 11 * S, 12 * S,
            {"goodput.badput.type": "torchft_failed_commit"}, 0) in spans
    assert ("goodput.step", 12 * S, 13 * S, {"goodput.step": "1"}, 0) in spans
    # the last commit of quorum 1 failed and quorum 2 redid step 2: an ERROR step
    assert ("goodput.step", 13 * S, 14 * S, {"goodput.step": "2"}, 2) in spans
    assert ("goodput.job_end", 14 * S, 14 * S, {"goodput.end.reason": "restart"}, 0) in spans
    assert ("goodput.custom_badput", 14 * S, 14 * S,
            {"goodput.badput.type": "torchft_process_group_abort"}, 2) in spans
    assert ("goodput.step", 16 * S, 17 * S, {"goodput.step": "2"}, 0) in spans
    # the commit received twice gives its span twice, with one id (kept once)
    ids = [s["spanId"] for rs in got.resource_spans for ss in rs["scopeSpans"]
           for s in ss["spans"] if s["name"] == "goodput.step"]
    assert len(ids) == 5 and len(set(ids)) == 4
    attempts = sorted({a["value"]["intValue"] for rs in got.resource_spans
                       for a in rs["resource"]["attributes"] if a["key"] == "goodput.attempt"})
    assert attempts == ["0", "1"]


def test_malformed_records_are_skipped_never_raised():
    bad = [
        _log("torchft_commits", 5 * S, job_id="j", replica_id="r", rank="x", quorum_id=1,
             step=1, commit_result=True),
        _log("torchft_commits", 5 * S, job_id="j", replica_id="r", rank=0, quorum_id="q",
             step=1, commit_result=True),
        _log("torchft_commits", 0, job_id="j", replica_id="r", rank=0, quorum_id=1, step=1,
             commit_result=True),
        _log("torchft_quorums", 5 * S, job_id="j", replica_id="r", rank=0, quorum_id=-3,
             step=1),
        _log("torchft_errors", 5 * S, job_id="j", replica_id="r", rank=0),
        {"resourceLogs": [{"scopeLogs": [{"scope": {"name": "torchft_commits"},
                                          "logRecords": [{"attributes": "nonsense"}]}]}]},
    ]
    got = translate_otlp(get_source("torchft"), _merge(bad))
    assert got.problems.counts["malformed"] >= 5
    assert got.resource_spans == []


def test_a_first_commit_without_its_quorum_record():
    doc = _log("torchft_commits", 5 * S, job_id="j", replica_id="r3", rank=1, quorum_id=4,
               step=7, commit_result=True)
    got = translate_otlp(get_source("torchft"), doc)
    assert got.warnings == {"torchft_quorum_record_missing": 1}
    assert _spans(got) == [("goodput.step", 5 * S, 5 * S, {"goodput.step": "7"}, 0)]
    res = {a["key"]: a["value"] for a in got.resource_spans[0]["resource"]["attributes"]}
    assert res["goodput.process.index"] == {"intValue": "3001"}
    assert res["goodput.attempt"] == {"intValue": "3"}


# --- live: torchft itself, exporting to a real goodput serve ---------------------------------

def _serve(wal: Path, cwd: Path):
    cmd = [sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port", "off",
           "--http-port", "0", "--wal-dir", str(wal)]
    proc = subprocess.Popen(cmd, env=child_env(), stderr=subprocess.PIPE, text=True, cwd=cwd)
    line = proc.stderr.readline()
    m = re.search(r"http=(\S+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"goodput serve did not start: {line!r}")
    return proc, m.group(1)


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=120) as r:
        return json.loads(r.read())


@pytest.mark.skipif(bool(why := venv_ok()), reason=why or "")
def test_live_kill_restart_to_goodput_serve(tmp_path):
    serve, url = _serve(tmp_path / "wal", tmp_path)
    try:
        # the primary killed: serve takes its lost tail from its peer as the import does
        # (30 steps after the rejoin: more than serve's 10 s before it takes a lost tail)
        run(tmp_path / "run", forward=url, timeout_s=400, kill_replica=0,
            steps_after_rejoin=30)
        (live,) = [j for j in _get(url + f"/v1/report?job={JOB}")["jobs"] if j["job"] == JOB]
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    requests_to_jsonl(tmp_path / "run" / "requests", tmp_path / "otlp-logs.jsonl")
    offline = translate_files(get_source("torchft"), [tmp_path / "otlp-logs.jsonl"])
    off = _report(offline.resource_spans, tmp_path / "offline")
    want = truth(tmp_path / "run")
    print("live", _figures(live), "offline", _figures(off), "truth", want)
    assert _figures(live) == _figures(off)
    # torchft logs nothing at exit: live, the last attempt is still running when /v1/report
    # is asked, so its time after its last step (in `other`) runs to that moment, while the
    # import ends it at the last record it holds (some sent after that moment); every other
    # bucket is the same
    assert {k: v for k, v in live["badput_s"].items() if k != "other"} == {
        k: v for k, v in off["badput_s"].items() if k != "other"}
    _agrees(_figures(live), want)
