"""Attempts and processes from evidence (``goodput_processor.model.attempts``), on spool files
shaped like what the recorder writes for each way real jobs are launched and killed.

Each case is a small timeline in seconds whose right answer is known; the launchers'
real runs are in ``test_launchers.py``.
"""

from __future__ import annotations

import json

import pytest
from otlp_fixtures import Timeline, write_spool

from goodput import schema
from goodput_processor.account.run_dir import report_run_dir
from goodput_processor.model.attempts import build_attempts
from goodput_processor.model.open_records import resolve_open
from goodput_processor.read.reader import read_run_dir

FAR = 2 * 10**18  # "now": long after every timeline (nothing is running)


def proc(rank=0, attempt=0, *, pid, start, index_source="env", attempt_source="process",
         count=2, host="h0"):
    return Timeline(attempt=attempt, process=rank, count=count, host=host).os_process(
        pid, start, attempt_source=attempt_source, index_source=index_source)


def result(run_dir):
    (r,) = report_run_dir(run_dir, now_ns=FAR)
    return r


def test_ranks_without_rank_variable_are_told_apart_by_the_framework_rank(tmp_path):
    """mp.spawn / Lightning's launcher: both processes say index 0 (default) until
    torch.distributed gives them ranks 0 and 1: one attempt, two processes, steps once."""
    for pid, rank in ((101, 0), (102, 1)):
        p = proc(0, pid=pid, start=0, index_source="default")
        p.job_start(0).identity(1, rank, 2).steps(1, 10, start=2, step_time=1).job_end(12)
        p.write(tmp_path)
    r = result(tmp_path)
    (a,) = r.attempts
    assert (a.processes, a.declared_processes, a.primary_process) == (2, 2, 0)
    assert a.steps_kept == 10 and r.step_time.count == 10
    assert not r.warnings


def test_two_processes_claiming_one_rank_without_evidence_are_a_warning(tmp_path):
    for pid in (101, 102):  # killed before torch.distributed was up: no identity marker
        proc(0, pid=pid, start=0, index_source="default").job_start(0).heartbeat(0, 3) \
            .write(tmp_path)
    r = result(tmp_path)
    assert len(r.attempts) == 1
    assert [w.code for w in r.warnings] == ["process_rank_unknown"]


def test_restart_without_end_marker_or_variable_is_a_new_attempt(tmp_path):
    """A relaunch by hand with the same environment (no GOODPUT_ATTEMPT, torchrun's restart
    count 0 again): rank 0 starts again while the first launch's rank 0 exists."""
    for attempt_source in ("process", "env"):
        run = tmp_path / attempt_source
        for pid, rank in ((10, 0), (11, 1)):
            proc(rank, pid=pid, start=0, attempt_source=attempt_source).job_start(0) \
                .steps(1, 8, start=1, step_time=1).heartbeat(9, 9.5).write(run)  # killed
        for pid, rank in ((20, 0), (21, 1)):
            proc(rank, pid=pid, start=12, attempt_source=attempt_source).job_start(12) \
                .restore(13, 14, step=5).steps(6, 10, start=14, step_time=1).job_end(19) \
                .write(run)
        r = result(run)
        assert [a.attempt for a in r.attempts] == [0, 1]
        a0, a1 = r.attempts
        assert (a0.end_reason, a0.cut, a0.processes, a1.processes) == ("killed", False, 2, 2)
        assert (a0.steps_kept, a0.steps_wasted) == (5, 3)
        assert r.badput_s["infrastructure_recovery"] == pytest.approx(2.5)
        assert r.badput_s["wasted_progress"] == pytest.approx(9.5 - 6)


def test_launcher_restart_count_splits_attempts_even_without_ranks(tmp_path):
    for pid, attempt in ((10, 0), (20, 1)):  # torchrun --max-restarts: the count is set
        t = attempt * 10
        proc(0, attempt, pid=pid, start=t, index_source="default", attempt_source="env") \
            .job_start(t).steps(1, 5, start=t + 1, step_time=1).heartbeat(t + 6, t + 9.8) \
            .write(tmp_path)
    assert [a.attempt for a in result(tmp_path).attempts] == [0, 1]


def test_orphaned_workers_stay_in_their_attempt_and_are_flagged(tmp_path):
    """The torchrun agent was SIGKILLed; its workers lived on (own session) and finished,
    while the relaunch by hand resumed from step 20: their steps are not the relaunch's."""
    old = proc(0, pid=10, start=0).job_start(0).steps(1, 30, start=1, step_time=1).job_end(31)
    old.write(tmp_path)
    new = proc(0, pid=20, start=25).job_start(25).restore(26, 27, step=20) \
        .steps(21, 30, start=27, step_time=1).job_end(37)
    new.write(tmp_path)
    r = result(tmp_path)
    a0, a1 = r.attempts
    assert a0.cut and a0.end_ns == a1.start_ns
    # 21-24 ran before the relaunch started and were thrown away; 25-30 ran after it
    assert (a0.steps_kept, a0.steps_wasted, a1.resume_step, a1.steps_kept) == (20, 4, 20, 10)
    assert [w.code for w in r.warnings] == ["orphaned_processes"]
    assert r.warnings[0].attempt == 0


def test_a_second_job_start_in_one_process_is_a_new_attempt(tmp_path):
    """ml-goodput-measurement's record_job_start_time twice in one process: two resources
    of the same OS process."""
    a = proc(0, 0, pid=10, start=0).job_start(0).steps(1, 3, 1, 1).job_end(5, reason="restart")
    b = proc(0, 1, pid=10, start=0).job_start(5).steps(1, 3, 6, 1).job_end(9)
    a.write(tmp_path)
    b.write(tmp_path)
    r = result(tmp_path)
    assert [(x.attempt, x.end_reason) for x in r.attempts] == [(0, "restart"), (1, "exit")]


def test_attempt_ends_at_the_last_sign_of_life_of_any_process(tmp_path):
    """Rank 0 raised at 9 s; rank 1 stayed alive in accelerator init until 38.7 s."""
    proc(0, pid=10, start=0).job_start(0).steps(1, 8, 1, 1).job_end(9, reason="exception") \
        .write(tmp_path)
    proc(1, pid=11, start=0).job_start(0).steps(1, 8, 1, 1).open("accelerator_init", 9, 10) \
        .heartbeat(37.7, 38.7).write(tmp_path)
    proc(0, pid=20, start=40).job_start(40).steps(1, 5, 41, 1).job_end(46).write(tmp_path)
    proc(1, pid=21, start=40).job_start(40).steps(1, 5, 41, 1).job_end(46).write(tmp_path)
    r = result(tmp_path)
    a0 = r.attempts[0]
    assert a0.duration_s == pytest.approx(38.7) and a0.end_reason == "killed"
    assert r.badput_s["infrastructure_recovery"] == pytest.approx(40 - 38.7)


def test_a_restart_that_adds_processes(tmp_path):
    """1 process, killed at ~5 s; the restart runs 2 processes from 5.55 s."""
    proc(0, pid=10, start=0, count=1).job_start(0).steps(1, 4, 0.5, 1).heartbeat(4.5, 5) \
        .write(tmp_path)
    for pid, rank in ((20, 0), (21, 1)):
        proc(rank, pid=pid, start=5.55).job_start(5.55).steps(1, 4, 6, 1).job_end(10) \
            .write(tmp_path)
    r = result(tmp_path)
    a0, a1 = r.attempts
    assert (a0.end_reason, a0.cut, a0.processes, a1.processes) == ("killed", False, 1, 2)
    assert r.badput_s["infrastructure_recovery"] == pytest.approx(0.55)


def test_the_step_in_flight_at_a_kill_is_counted(tmp_path):
    """Killed inside step 6: its open record (written at the flush at 6.2 s) makes it a
    started step that ran until the last sign of life."""
    proc(0, pid=10, start=0).job_start(0).steps(1, 5, 1, 1).open("step", 6, 6.2,
                                                                   {schema.ATTR_STEP: 6}) \
        .heartbeat(6.2, 6.9).write(tmp_path)
    proc(0, pid=20, start=8).job_start(8).restore(8, 9, step=3).steps(4, 8, 9, 1).job_end(14) \
        .write(tmp_path)
    r = result(tmp_path)
    a0 = r.attempts[0]
    assert (a0.steps_kept, a0.steps_wasted) == (3, 3)  # 4, 5 and the one in flight
    assert a0.duration_s == pytest.approx(6.9)


def test_open_records_of_finished_phases_are_dropped():
    from goodput_processor.read.rows import C_END, C_FLAGS, C_KIND, K_STEP, NONE

    t = Timeline().job_start(0).open("step", 1, 1.5, {schema.ATTR_STEP: 1}).step(1, 1, 2) \
        .open("step", 2, 2.5, {schema.ATTR_STEP: 2}).heartbeat(2.5, 4)
    import numpy as np

    rows = []
    for name, s, e, attrs, _ in t.spans:
        kind = {schema.JOB_START: 0, schema.HEARTBEAT: 2, schema.STEP: K_STEP}[name]
        flags = 4 if attrs.get(schema.ATTR_OPEN) else 0
        rows.append((s, e, kind, attrs.get(schema.ATTR_STEP, NONE), NONE, flags, -1, 0, 0))
    d = resolve_open(np.array(rows, np.int64))
    steps = d[d[:, C_KIND] == K_STEP]
    assert len(steps) == 2 and not (steps[:, C_FLAGS] & 4).any()
    assert sorted(steps[:, C_END] - t.ns(0)) == [t.ns(2) - t.ns(0), t.ns(4) - t.ns(0)]


def test_wasted_steps_come_from_every_rank(tmp_path):
    """Rank 0 was SIGKILLed right after the save of step 30 and lost its last flush; rank 1's
    spool has the 30 steps after it."""
    proc(0, pid=10, start=0).job_start(0).steps(1, 30, 1, 0.01).save(1.3, 1.4, 30) \
        .write(tmp_path)
    proc(1, pid=11, start=0).job_start(0).steps(1, 30, 1, 0.01).save(1.3, 1.4, 30) \
        .steps(31, 60, 1.4, 0.03).write(tmp_path)
    for pid, rank in ((20, 0), (21, 1)):
        proc(rank, pid=pid, start=4).job_start(4).restore(4, 5, 30).steps(31, 40, 5, 0.1) \
            .job_end(6.5).write(tmp_path)
    a0 = result(tmp_path).attempts[0]
    assert a0.steps_wasted == 30 and a0.duration_s == pytest.approx(2.3)


def test_import_and_live_ingestion_give_the_same_attempts(tmp_path):
    """The same spans read from the spool and through goodput serve's store."""
    pytest.importorskip("opentelemetry.proto")
    from goodput_processor.serve.store import LiveStore

    for pid, rank in ((101, 0), (102, 1)):
        proc(0, pid=pid, start=0, index_source="default").job_start(0).identity(1, rank, 2) \
            .steps(1, 4, 2, 1).heartbeat(6, 7).write(tmp_path)
    proc(0, pid=201, start=9).job_start(9).identity(9.5, 0, 1).steps(3, 6, 10, 1).job_end(14) \
        .write(tmp_path)
    store = LiveStore()
    for path in sorted(tmp_path.glob("*.jsonl")):
        for line in path.read_text().splitlines():  # as OTLP protobuf, as gRPC delivers it
            store.ingest_request(_as_protobuf(json.loads(line)))
    live = build_attempts(store.snapshot("job"), FAR)
    spool = build_attempts(read_run_dir(tmp_path).jobs["job"], FAR)
    shape = [[(a.attempt, a.start_ns, a.end_ns, tuple(p.index for p in a.processes))
              for a in attempts] for attempts in (live, spool)]
    assert shape[0] == shape[1] and [len(x[3]) for x in shape[0]] == [2, 1]


def _as_protobuf(req: dict):
    import base64

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    for rs in req["resourceSpans"]:  # OTLP/JSON ids are hex; protobuf JSON wants base64
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId"):
                    span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return json_format.ParseDict(req, ExportTraceServiceRequest())


def test_an_open_step_whose_end_was_lost_ends_where_the_next_step_began(tmp_path):
    """A full disk dropped step 3's span but not its open record: step 3 ran until step 4
    began, not until the process's last sign of life (which would swallow steps 4-6)."""
    proc(0, pid=10, start=0).job_start(0).steps(1, 2, 1, 1).open("step", 3, 3.5,
                                                                   {schema.ATTR_STEP: 3}) \
        .steps(4, 6, 4.2, 1).job_end(8).write(tmp_path)
    r = result(tmp_path)
    assert r.attempts[0].steps_kept == 6 and r.step_time.count == 6
    assert r.steps.time_ns[2] == pytest.approx(1.2e9)


def test_spools_of_recorders_before_1_1_keep_their_declared_attempts(tmp_path):
    """Schema 1.0: an instance id but no process start. A relaunch by hand that appended
    attempt 0 again to the same file is split as before (a start after steps)."""
    for inst, t, first in (("old-a", 0, 1), ("old-b", 20, 6)):
        tl = Timeline(**{schema.RES_SERVICE_INSTANCE_ID: inst, schema.RES_PROCESS_PID: 7})
        tl.job_start(t).steps(first, first + 4, t + 1, 1).job_end(t + 7)
        write_spool(tmp_path / "spans-p00000-a0000.jsonl", tl.resource, tl.spans, mode="a")
    r = result(tmp_path)
    assert [(a.attempt, a.steps_kept) for a in r.attempts] == [(0, 5), (1, 5)]


def _mgm(p):
    """``p`` recorded through ``goodput.mgm`` (its resource says so, as its recorder's)."""
    p.resource[schema.RES_RECORDER_API] = "ml-goodput-measurement"
    return p


def test_an_explicit_job_start_after_the_steps_began_is_a_restart_while_the_old_lives(
        tmp_path):
    """``goodput.mgm``: the restarted process records ``record_job_start_time`` at 30 s,
    while the first one, alive until 32 s, still saves a checkpoint (25-31 s); no rank
    variable. Two attempts (the old one cut at the restart), not one with
    two processes claiming rank 0; without the mgm mark, one (the alive rule)."""
    for mark, attempts in ((True, 2), (False, 1)):
        d = tmp_path / str(mark)
        old = proc(0, pid=101, start=0, index_source="default").job_start(0)
        old.steps(0, 4, start=5, step_time=4).save(25, 31, step=1).heartbeat(31, 32)
        new = proc(0, pid=102, start=29, index_source="default").job_start(30)
        new.steps(2, 4, start=35, step_time=3).job_end(44)
        for p in (old, new):
            (_mgm(p) if mark else p).write(d)
        r = result(d)
        assert len(r.attempts) == attempts, mark
        if mark:
            assert r.attempts[1].start_ns - r.attempts[0].start_ns == 30 * 10**9
            assert r.attempts[0].end_reason == "killed" and r.attempts[1].steps_kept == 3
            assert "process_rank_unknown" not in [w.code for w in r.warnings]


def test_explicit_job_starts_of_one_launch_before_its_steps_are_one_attempt(tmp_path):
    """Two processes of one launch both record through ``goodput.mgm`` without a rank
    variable (against its README's one-writer rule): both start before any step, so they
    stay one attempt (with the rank warning)."""
    for pid, t in ((101, 0), (102, 0.5)):
        p = _mgm(proc(0, pid=pid, start=0, index_source="default")).job_start(t)
        p.steps(0, 9, start=2, step_time=1).job_end(12).write(tmp_path)
    r = result(tmp_path)
    assert len(r.attempts) == 1
    assert [w.code for w in r.warnings] == ["process_rank_unknown"]
