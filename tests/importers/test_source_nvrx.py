"""The ``nvrx`` source: NVIDIA resiliency extension 0.7.0's ft_launcher cycle events.

On the kept data of a real run (``tests/data/sources/nvrx/``, made by ``regenerate.py``:
ft_launcher with 2 gloo workers on the CPU, rank 1 SIGKILLed after step 33, restarted from
the checkpoint of step 20; the workers recorded with this project's recorder): the events
read from the launcher's own log, the merged report against the driver's fsync'd truth,
and that the launcher's events add evidence without adding time. The live tests (ft_launcher
itself, and a real ``goodput serve``) are in ``test_source_nvrx_live.py``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tarfile
from pathlib import Path

import pytest

from goodput import schema
from goodput_processor.importers.sources import (
    detect_file_source,
    get_source,
    translate_files,
    write_spool,
)
from goodput_processor.importers.sources.nvrx import NvrxTranslator, sniff

DATA = Path(__file__).resolve().parents[1] / "data" / "sources" / "nvrx"
LOG = DATA / "ft_launcher.log"

_spec = importlib.util.spec_from_file_location("nvrx_regenerate", DATA / "regenerate.py")
rg = importlib.util.module_from_spec(_spec)
sys.modules["nvrx_regenerate"] = rg
_spec.loader.exec_module(rg)

needs_linux_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or not sys.platform.startswith("linux"),
    reason="the truth harness (benchmarks/launchers.py) needs torch and Linux")


def _spans(run) -> list[dict]:
    out = []
    for rs in run.resource_spans:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                at = {a["key"]: next(iter(a["value"].values())) for a in s["attributes"]}
                out.append({"event": at[schema.ATTR_LAUNCHER_EVENT],
                            "cycle": int(at[schema.ATTR_LAUNCHER_RESTART_COUNT]),
                            "start": int(s["startTimeUnixNano"]),
                            "end": int(s["endTimeUnixNano"]), "attrs": at,
                            "name": s["name"], "id": s["spanId"]})
    return sorted(out, key=lambda s: (s["start"], s["end"]))


def _resource(run) -> dict:
    (rs,) = run.resource_spans
    return {a["key"]: next(iter(a["value"].values())) for a in rs["resource"]["attributes"]}


def _translate(tmp_path: Path, text: str, **kw):
    p = tmp_path / "launcher.log"
    p.write_text(text)
    return translate_files(get_source("nvrx"), [p], **kw)


def _line(cycle, event, t, rank="0", node="n1_77_0", host="h1", local="UTC"):
    """One ft_launcher cycle event line as the ``nvrx`` logger writes it (``t`` UTC)."""
    pre = t if local == "UTC" else local
    return (f"{pre.replace('.', ',')} [INFO] [{host}] [workload:?(?) infra:?(?)] "
            f"profiling.py:93   - Cycle: {cycle} Event: {event} Node: {node} Rank: {rank} "
            f"Time: {t} UTC")


# --- the real log ------------------------------------------------------------------------


def test_the_log_is_recognised():
    assert detect_file_source(str(LOG)) == "nvrx"
    assert sniff(LOG.read_bytes()[:65536])
    assert not sniff(b'{"resourceSpans": []}\n')


def test_events_of_the_real_launcher_log():
    """Every cycle event of the real run, as launcher_event spans of one launcher process,
    with the worker torchelastic saw fail (the pid the driver killed, signal 9)."""
    drv = json.loads((DATA / "driver.json").read_text())
    run = translate_files(get_source("nvrx"), [LOG], job="j")
    assert run.warnings == {} and len(run.problems) == 0
    res = _resource(run)
    assert res[schema.RES_PROCESS_ROLE] == "launcher"
    assert int(res[schema.RES_PROCESS_PID]) == drv["agent_pid"]
    assert res[schema.RES_JOB_NAME] == "j"
    spans = _spans(run)
    assert {s["name"] for s in spans} == {schema.LAUNCHER_EVENT}
    assert [(s["event"], s["cycle"]) for s in spans] == [
        ("nvrx.rendezvous", 0), ("nvrx.health_check", 0), ("nvrx.worker_start", 0),
        ("nvrx.worker_failed", 0), ("nvrx.failure_detected", 1),
        ("nvrx.worker_terminated", 1), ("nvrx.rendezvous", 1), ("nvrx.health_check", 1),
        ("nvrx.worker_start", 1)]
    failed = spans[3]["attrs"]
    (kill,) = drv["kills"]
    assert int(failed[schema.ATTR_LAUNCHER_WORKER_PID]) == kill["pid"]
    assert int(failed[schema.ATTR_LAUNCHER_EXIT_CODE]) == -9
    # the launcher saw it after the kill, within its monitor interval and the machine's load
    assert 0 < spans[3]["start"] / 1e9 - kill["t"] < 2
    events = rg.cycle_events(LOG)
    for s in spans:
        if s["event"] == "nvrx.rendezvous":
            c = s["cycle"]
            assert s["start"] / 1e9 == pytest.approx(events[(c, "rendezvous_started")])
            assert s["end"] / 1e9 == pytest.approx(events[(c, "rendezvous_completed")])
    term = next(s for s in spans if s["event"] == "nvrx.worker_terminated")
    assert term["start"] / 1e9 == pytest.approx(events[(1, "failure_detected")])
    assert len({s["id"] for s in spans}) == len(spans)  # same-instant events stay apart


def test_reading_the_log_twice_gives_the_same_spans(tmp_path):
    once = _spans(translate_files(get_source("nvrx"), [LOG]))
    twice = _spans(translate_files(get_source("nvrx"), [LOG, LOG]))
    assert once == twice


# --- merged with the workers' own spool: the report against the driver's truth ----------


#: The kept runs: one kill (rank 1 after step 33, restored from step 20) and two (then rank
#: 0 of the restart after step 28, before its next save: restored from step 20 again).
CASES = {"nvrx_kill_worker": DATA, "nvrx_kill_twice": DATA / "nvrx_kill_twice"}
KEPT = {"nvrx_kill_worker": [20, 20], "nvrx_kill_twice": [20, 0, 20]}


def _workers(run_dir: Path, data: Path = DATA) -> None:
    run_dir.mkdir(parents=True)
    with tarfile.open(data / "workers.tar.gz") as tar:
        tar.extractall(run_dir, filter="data")


def _truth(lh, data: Path):
    drv = json.loads((data / "driver.json").read_text())
    events = [json.loads(x) for x in (data / "truth.jsonl").read_text().splitlines()]
    kills = [lh.Kill(**k) for k in drv["kills"]]
    dead = {int(k): v for k, v in drv["dead_at"].items()}
    procs = lh.processes(events, kills, dead)
    s = lh.Settings(**drv["settings"])
    return drv, s, procs, kills, lh.compute_truth(procs, s.flush_interval,
                                                  margin=s.flushed_margin)


@pytest.fixture(scope="module", params=sorted(CASES))
def merged(request, tmp_path_factory):
    """A kept run's workers' spool plus its imported launcher log, and the reports of the
    workers alone and merged."""
    data = CASES[request.param]
    lh = rg.harness()
    drv, s, procs, kills, truth = _truth(lh, data)
    d = tmp_path_factory.mktemp("nvrx") / "run"
    _workers(d, data)
    alone = rg.report_json(lh, d)
    rg.import_launcher_log(data / "ft_launcher.log", d, drv["case"], drv["agent_pid"])
    return lh, drv, s, procs, kills, truth, rg.report_json(lh, d), alone, d, data


@needs_linux_torch
def test_merged_report_agrees_with_the_truth(merged):
    """Attempts, processes, kept steps, max step exactly; checkpoint save and restore,
    wasted progress and infrastructure recovery within 0.5 s; every recovery phase within
    0.5 s; the killed rank failed first, by a signal, as the launcher saw it; each
    restart's launcher_rendezvous_s is NVRx's rendezvous of its cycle."""
    lh, drv, s, procs, kills, truth, rep, _, d, data = merged
    out = lh.Outcome(drv["case"])
    out.kills = kills
    n = len(rg.PLANS[drv["case"]]) + 1
    expect = lh.Expect([2] * n, phases=True, launchers={drv["agent_pid"]})
    lh.compare(out, truth, rep, procs, d, s, expect)
    lh.compare_first_failures(out, truth, rep)
    rg.compare_recovery(lh, out, truth, rep, expect)
    rg.check(lh, out, truth, rep, data / "ft_launcher.log")
    print(lh.summarize([out], s))
    assert not out.failures, out.failures
    job = rep["jobs"][0]
    assert len(job["attempts"]) == n and job["max_productive_step"] == 40
    assert [a["steps_kept"] for a in job["attempts"]] == KEPT[drv["case"]]


@needs_linux_torch
def test_the_launcher_adds_evidence_not_time(merged):
    """The same report without the launcher's events: every bucket, attempt and phase the
    same (the events count no time: nothing twice); only the first failure's how and the
    launcher evidence come from NVRx."""
    a, m = merged[7]["jobs"][0], merged[6]["jobs"][0]
    assert a["badput_s"] == m["badput_s"]
    assert (a["productive_time_s"], a["total_time_s"]) == (m["productive_time_s"],
                                                           m["total_time_s"])
    keys = ("start_unix_ns", "end_unix_ns", "steps_kept", "processes")
    for x, y in zip(a["attempts"], m["attempts"], strict=True):
        assert {k: x[k] for k in keys} == {k: y[k] for k in keys}
    assert len(a["recovery"]) == len(m["recovery"]) >= 1
    for ra, rm in zip(a["recovery"], m["recovery"], strict=True):
        assert ra["phases_s"] == rm["phases_s"]
        assert "launcher_rendezvous_s" not in ra["evidence"]
        assert ra["first_failure"]["how"] != "signal"
        assert rm["first_failure"]["how"] == "signal"
        assert rm["evidence"]["launcher_rendezvous_s"] > 0


def test_the_second_failure_is_cycle_2():
    """The twice-killed run: each worker_failed names the pid the driver killed, in the
    cycle of the attempt it failed in; each failure_detected raises the cycle."""
    data = CASES["nvrx_kill_twice"]
    drv = json.loads((data / "driver.json").read_text())
    run = translate_files(get_source("nvrx"), [data / "ft_launcher.log"])
    assert run.warnings == {} and len(run.problems) == 0
    spans = _spans(run)
    failed = [(s["cycle"], int(s["attrs"][schema.ATTR_LAUNCHER_WORKER_PID]))
              for s in spans if s["event"] == "nvrx.worker_failed"]
    assert failed == [(i, k["pid"]) for i, k in enumerate(drv["kills"])]
    assert [s["cycle"] for s in spans if s["event"] == "nvrx.failure_detected"] == [1, 2]
    assert [s["cycle"] for s in spans if s["event"] == "nvrx.rendezvous"] == [0, 1, 2]


def test_the_launcher_alone_has_no_attempts(tmp_path):
    """NVRx says nothing about steps: its events alone make a job with no attempts and no
    time (the launcher is no process of any attempt)."""
    from goodput_processor.account.run_dir import report_run_dir

    run = translate_files(get_source("nvrx"), [LOG], job="alone")
    write_spool(run.resource_spans, tmp_path)
    (r,) = report_run_dir(tmp_path)
    assert r.job == "alone" and r.total_ns == 0 and r.productive_time_s == 0
    assert len(r.attempts) == 0 and r.max_productive_step is None


# --- the translator's rules on made-up lines --------------------------------------------


def test_job_name_precedence(tmp_path, monkeypatch):
    text = ("--rdzv-backend=c10d --rdzv-endpoint=localhost:0 --rdzv-id=abc-123\n"
            + _line(0, "rendezvous_started", "2026-12-07 14:00:00.000") + "\n")
    for var in ("GOODPUT_NVRX_JOB", "GOODPUT_JOB_NAME"):
        monkeypatch.delenv(var, raising=False)
    assert _resource(_translate(tmp_path, text))[schema.RES_JOB_NAME] == "nvrx-abc-123"
    monkeypatch.setenv("GOODPUT_JOB_NAME", "from-env")
    assert _resource(_translate(tmp_path, text))[schema.RES_JOB_NAME] == "from-env"
    monkeypatch.setenv("GOODPUT_NVRX_JOB", "nvrx-env")
    assert _resource(_translate(tmp_path, text))[schema.RES_JOB_NAME] == "nvrx-env"
    assert _resource(_translate(tmp_path, text, job="cli"))[schema.RES_JOB_NAME] == "cli"
    from goodput_processor.importers.sources.base import Emitter

    em = Emitter("nvrx")
    tr = NvrxTranslator(em, job="arg")
    tr.line(_line(0, "rendezvous_started", "2026-12-07 14:00:00.000"), "x:1")
    tr.finish()
    (rs,) = em.take()
    assert {a["key"]: a["value"] for a in rs["resource"]["attributes"]}[
        schema.RES_JOB_NAME] == {"stringValue": "arg"}


def test_log_records_take_their_job_from_the_resource(monkeypatch):
    """OTLP log records (the filelog receiver's): the resource's service.name is the job,
    the host comes from the records' resource when it has one, and the records give the
    same events as the file."""
    from goodput_processor.importers.sources import translate_otlp

    for var in ("GOODPUT_NVRX_JOB", "GOODPUT_JOB_NAME", "GOODPUT_NVRX_HOST"):
        monkeypatch.delenv(var, raising=False)
    (doc,) = _logs_requests(LOG.read_text().splitlines(), "from-resource", per=10_000)
    doc["resourceLogs"][0]["resource"]["attributes"].append(
        {"key": "host.name", "value": {"stringValue": "node-a"}})
    run = translate_otlp(get_source("nvrx"), doc)
    res = _resource(run)
    assert (res[schema.RES_JOB_NAME], res[schema.RES_HOST_NAME]) == ("from-resource", "node-a")
    files = _spans(translate_files(get_source("nvrx"), [LOG]))
    assert [(s["event"], s["start"], s["end"]) for s in _spans(run)] == [
        (s["event"], s["start"], s["end"]) for s in files]


def test_two_nodes_one_failure(tmp_path, monkeypatch):
    """Two nodes' launcher logs: one saw its worker fail, the other joined the restart
    (failure_detected with no failed worker). Two launcher processes; the cycle's failure
    is named by the first node, so no warning; the second node's log alone has one."""
    monkeypatch.delenv("GOODPUT_NVRX_HOST", raising=False)
    a = tmp_path / "a.log"
    a.write_text("\n".join([
        _line(0, "worker_start_completed", "2026-12-07 14:00:00.000", node="a_11_0", host="ha"),
        "E1207 14:00:05.000000 11 api.py:1002] failed (exitcode: -9) local_rank: 0 "
        "(pid: 500) of binary: python",
        _line(1, "failure_detected", "2026-12-07 14:00:05.001", node="a_11_0", host="ha"),
    ]) + "\n")
    b = tmp_path / "b.log"
    b.write_text("\n".join([
        _line(0, "worker_start_completed", "2026-12-07 14:00:00.000", node="b_22_0", host="hb",
              rank="1"),
        _line(1, "failure_detected", "2026-12-07 14:00:05.300", node="b_22_0", host="hb",
              rank="1"),
    ]) + "\n")
    both = translate_files(get_source("nvrx"), [a, b], job="j")
    assert both.warnings == {}
    hosts = sorted({a["value"]["stringValue"] for rs in both.resource_spans
                    for a in rs["resource"]["attributes"] if a["key"] == schema.RES_HOST_NAME})
    assert hosts == ["ha", "hb"]
    failed = [s for s in _spans(both) if s["event"] == "nvrx.worker_failed"]
    assert [(s["cycle"], int(s["attrs"][schema.ATTR_LAUNCHER_WORKER_PID])) for s in failed] \
        == [(0, 500)]
    assert translate_files(get_source("nvrx"), [b], job="j").warnings == {
        "nvrx_failed_worker_unnamed": 1}


@needs_linux_torch
def test_the_documented_import_command(tmp_path):
    """docs/sources/nvrx.md's commands: ``goodput import LOG --job JOB --to RUNS`` into
    the workers' job directory ``RUNS/JOB``, beside their spool, then ``goodput report
    RUNS/JOB``: the merged recovery (NVRx evidence included), no warning."""
    import subprocess

    from instr_util import child_env

    drv = json.loads((DATA / "driver.json").read_text())
    run = tmp_path / drv["case"]
    _workers(run)
    cli = [sys.executable, "-m", "goodput_processor.cli"]
    subprocess.run([*cli, "import", str(LOG), "--job", drv["case"], "--to",
                    str(tmp_path)], env=child_env(), check=True, timeout=300,
                   capture_output=True)
    res = subprocess.run([*cli, "report", str(run), "--format", "json"], env=child_env(),
                         check=True, timeout=300, capture_output=True, text=True)
    (job,) = json.loads(res.stdout)["jobs"]
    assert job["warnings"] == []
    (rec,) = job["recovery"]
    assert (rec["first_failure"]["process"], rec["first_failure"]["how"]) == (1, "signal")
    assert rec["evidence"]["launcher_rendezvous_s"] == pytest.approx(
        rg.cycle_rendezvous(LOG)[1], abs=1e-3)


def test_a_collector_file_of_the_log_records(tmp_path):
    """The Collector's file exporter's output of those log records (OTLP JSON, one request
    a line): told to be NVRx's from its first line, and the same events as the log."""
    f = tmp_path / "logs.jsonl"
    f.write_text("".join(json.dumps(d) + "\n" for d in _logs_requests(
        LOG.read_text().splitlines(), "j")))
    assert detect_file_source(str(f)) == "nvrx"
    got = _spans(translate_files(get_source("nvrx"), [f], job="j"))
    want = _spans(translate_files(get_source("nvrx"), [LOG], job="j"))
    assert got == want


def test_local_time_offset_and_glog_year(tmp_path, monkeypatch):
    """The glog line (local time, no year) is placed by the offset and year the cycle lines
    show: here UTC+2 across New Year (local 01:00:00.5 on 1 January is 23:00:00.5 UTC)."""
    monkeypatch.delenv("GOODPUT_NVRX_HOST", raising=False)
    text = "\n".join([
        _line(3, "worker_start_completed", "2026-12-31 22:59:00.000",
              local="2027-01-01 00:59:00.000"),
        "E0101 01:00:00.500000 77 torch/distributed/elastic/multiprocessing/api.py:1002] "
        "failed (exitcode: 1) local_rank: 0 (pid: 4242) of binary: /usr/bin/python",
        _line(4, "failure_detected", "2026-12-31 23:00:00.501",
              local="2027-01-01 01:00:00.501"),
    ]) + "\n"
    run = _translate(tmp_path, text)
    assert run.warnings == {}
    failed = next(s for s in _spans(run) if s["event"] == "nvrx.worker_failed")
    import calendar
    assert failed["start"] == (calendar.timegm((2026, 12, 31, 23, 0, 0)) * 10**9
                               + 500_000_000)
    assert failed["cycle"] == 3 and int(failed["attrs"][schema.ATTR_LAUNCHER_EXIT_CODE]) == 1
    assert _resource(run)[schema.RES_HOST_NAME] == "h1"  # from the logging prefix


def test_bad_and_cut_lines_are_skipped(tmp_path):
    """A bad time, a cut-short event line, a failure line before any event: each skipped
    and counted; a rendezvous the log ended inside is kept as its start, with a warning."""
    text = "\n".join([
        "E1207 14:00:00.000000 77 api.py:1] failed (exitcode: -9) local_rank: 0 (pid: 1)",
        _line(0, "rendezvous_started", "2026-13-45 14:00:00.000"),
        _line(0, "rendezvous_started", "2026-12-07 14:00:00.000"),
        _line(0, "health_check_completed", "2026-12-07 14:00:00.100"),
        _line(0, "something_new", "2026-12-07 14:00:00.200"),
        "2026-12-07 14:00:00,300 [INFO] [h1] [workload:?(?) infra:?(?)] profiling.py:93 "
        "  - Cycle: 0 Event: rendezvous_comp",
    ])
    run = _translate(tmp_path, text)
    assert run.problems.counts == {"unknown_record": 1, "malformed": 1, "truncated": 1}
    assert run.warnings == {"nvrx_rendezvous_unfinished": 1, "nvrx_unknown_event": 1}
    assert [(s["event"], s["end"] - s["start"]) for s in _spans(run)] == [
        ("nvrx.rendezvous", 0), ("nvrx.health_check", 0), ("nvrx.something_new", 0)]


def test_a_failure_without_the_worker_line_is_named(tmp_path):
    """Only the ``nvrx`` logger's lines (no torchelastic line): the failed worker is not
    named, and the warning says so."""
    text = "\n".join(_line(c, e, f"2026-12-07 14:00:0{i}.000") for i, (c, e) in enumerate(
        [(0, "worker_start_completed"), (1, "failure_detected"), (1, "worker_terminated")]))
    run = _translate(tmp_path, text)
    assert run.warnings == {"nvrx_failed_worker_unnamed": 1}
    term = next(s for s in _spans(run) if s["event"] == "nvrx.worker_terminated")
    assert term["end"] - term["start"] == 1_000_000_000


def _logs_requests(lines: list[str], job: str, per: int = 7) -> list[dict]:
    """The launcher's lines as the filelog receiver batches them: OTLP JSON
    ``ExportLogsServiceRequest`` dicts of ``per`` records each."""
    res = {"attributes": [{"key": "service.name", "value": {"stringValue": job}},
                          {"key": "log.file.name", "value": {"stringValue": LOG.name}}]}
    out = []
    for i in range(0, len(lines), per):
        recs = [{"observedTimeUnixNano": str(1_800_000_000_000_000_000 + i + j),
                 "body": {"stringValue": x}} for j, x in enumerate(lines[i:i + per])]
        out.append({"resourceLogs": [{"resource": res, "scopeLogs": [
            {"scope": {"name": "filelog"}, "logRecords": recs}]}]})
    return out
