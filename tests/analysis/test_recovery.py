"""Recovery phases and badput attributed to hosts (``goodput_processor.analysis.recovery``,
``goodput_processor.analysis.attribution``), on timelines built by hand: every figure is known.

The real launchers' counterparts (a torchrun restart against the driver's measured phases, a
2-rank run with one slow rank) are in ``tests/end_to_end/test_launchers.py``; the JAX/Orbax
crash and restart in ``tests/instrumentation/test_instr_jax.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_util import goodput
from metric_points import reader_points
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from otlp_fixtures import Timeline

from goodput import schema
from goodput_processor.account.accounting import account
from goodput_processor.account.run_dir import report_run_dir
from goodput_processor.analysis.recovery import PHASES
from goodput_processor.exporters.metrics import GoodputMetrics
from goodput_processor.results.report_json import job_to_dict
from goodput_processor.serve.store import LiveStore

HOSTS, SLOW, CRASH = 16, 5, 12


def _two_rank_restart(d, *, launcher=None, pods=False, spans_per_line=512, stopped=False,
                      interval_ms=None):
    """Attempt 0: 2 ranks, steps 1-14 of 1 s, save of step 10; rank 1 falls silent at 19.3
    (its last heartbeat), rank 0 ends with an exception at 20 (``stopped``: falls silent at
    19.2, and the agent reports it stopped by SIGTERM right after rank 1). Attempt 1 from 25:
    accelerator init 27-29, prep 29-30, gap, restore of step 10 30.5-32, compilation 32-34,
    step 11 of 2.5 s, steps 12-20 of 1 s, end 45.5. ``interval_ms``: attempt 0's heartbeat
    interval (default 1 s)."""
    for p in (0, 1):
        extra = {}
        if launcher:
            extra = {schema.RES_PROCESS_PID: 100 + p, schema.RES_SERVICE_INSTANCE_ID: f"i0{p}",
                     schema.RES_PROCESS_START: Timeline().ns(0), "host": "node0"}
        tl = Timeline(attempt=0, process=p, count=2, **extra).job_start(0, interval_ms)
        tl.span("accelerator_init", 1, 3).span("training_prep", 3, 4)
        for n in range(1, 11):
            tl.step(n, 3 + n, 4 + n)
        if p == 0:
            tl.save(14, 15, step=10)
        for n in range(11, 15):
            tl.step(n, 4 + n, 5 + n)
        if p == 1:
            tl.heartbeat(19, 19.3)
        elif stopped:
            tl.heartbeat(19, 19.2)
        else:
            tl.job_end(20, reason="exception")
        tl.write(d, spans_per_line=spans_per_line)
    for p in (0, 1):
        extra = {}
        if pods:
            extra = {schema.RES_K8S_POD_CREATED: Timeline().ns(21),
                     schema.RES_K8S_POD_SCHEDULED: Timeline().ns(23.5),
                     schema.RES_K8S_POD_STARTED: Timeline().ns(24.9)}
        if launcher:
            extra.update({schema.RES_PROCESS_PID: 200 + p,
                          schema.RES_SERVICE_INSTANCE_ID: f"i1{p}",
                          schema.RES_PROCESS_START: Timeline().ns(25), "host": "node0"})
        tl = Timeline(attempt=1, process=p, count=2, **extra).job_start(25)
        tl.span("accelerator_init", 27, 29).span("training_prep", 29, 30)
        tl.restore(30.5, 32, step=10).span("program_startup", 32, 34)
        tl.step(11, 34, 36.5)
        for i, n in enumerate(range(12, 21)):
            tl.step(n, 36.5 + i, 37.5 + i)
        tl.job_end(45.5)
        tl.write(d, spans_per_line=spans_per_line)
    if launcher:  # torchelastic's agent on node0: it saw rank 1 (pid 101) die of SIGKILL at 19.4
        tl = Timeline(process=0, host="node0", **{schema.RES_PROCESS_ROLE: "launcher",
                                    schema.RES_PROCESS_PID: 99,
                                    schema.RES_SERVICE_INSTANCE_ID: "agent",
                                    schema.RES_PROCESS_START: Timeline().ns(-1)})
        tl.job_start(-1)
        tl.span(schema.LAUNCHER_EVENT, 19.4, 19.4, {
            schema.ATTR_LAUNCHER_EVENT: "torchelastic.worker.failed",
            schema.ATTR_LAUNCHER_WORKER_PID: 101, schema.ATTR_LAUNCHER_EXIT_CODE: -9,
            schema.ATTR_LAUNCHER_RESTART_COUNT: 0, schema.ATTR_LAUNCHER_GLOBAL_RANK: 1})
        if stopped:  # the agent stopped rank 0 and reported it in the same pass, after rank 1
            tl.span(schema.LAUNCHER_EVENT, 19.400001, 19.400001, {
                schema.ATTR_LAUNCHER_EVENT: "torchelastic.worker.failed",
                schema.ATTR_LAUNCHER_WORKER_PID: 100, schema.ATTR_LAUNCHER_EXIT_CODE: -15,
                schema.ATTR_LAUNCHER_RESTART_COUNT: 0, schema.ATTR_LAUNCHER_GLOBAL_RANK: 0})
        tl.span(schema.LAUNCHER_EVENT, 21, 23, {
            schema.ATTR_LAUNCHER_EVENT: "torchelastic.worker.status.RENDEZVOUS"})
        tl.heartbeat(23, 46).write(d, spans_per_line=spans_per_line)
    return d


def test_phases_of_a_restart_by_hand(tmp_path):
    (r,) = report_run_dir(_two_rank_restart(tmp_path))
    (rec,) = r.recovery
    assert list(rec.phases) == list(PHASES)
    assert rec.phases == pytest.approx({
        "detection": 0.3,  # last progress (step 14 ends at 19) -> rank 1's last sign of life
        "termination": 0.7,  # -> rank 0's end (20)
        "rescheduling": 5.0,  # -> attempt 1's start (25)
        "startup": 2.0,  # -> its first phase (27)
        "rendezvous_init": 3.5,  # accelerator init 2 + prep 1 + the unmarked gap 0.5
        "restore": 1.5,
        "recompilation_warmup": 3.5,  # compilation 2 + step 11's 1.5 s above the level
    })
    f = rec.first_failure
    assert (f.process, f.host, f.how) == (1, "host1", "missing_heartbeat")
    # rank 0's exception (20) follows rank 1's silence: the documented order, no warning
    assert f.uncertain_among == ()
    assert "first_failure_uncertain" not in {w.code for w in r.warnings}
    assert f.at_ns == Timeline().ns(19.3)
    assert (rec.attempt, rec.next_attempt) == (0, 1)
    # the phases break the buckets down: rescheduling is the recovery, startup the second
    # attempt's process start-up, the rest its time before step 11 plus the warm-up excess
    b = r.badput_s
    assert rec.phases["rescheduling"] == b["infrastructure_recovery"]
    assert b["process_startup"] == pytest.approx(1 + rec.phases["startup"])  # 0-1, 25-27
    before_first_step = sum(rec.phases[k] for k in ("startup", "rendezvous_init", "restore"))
    assert before_first_step + 2.0 == pytest.approx(34 - 25)
    assert rec.phases["recompilation_warmup"] == pytest.approx(
        b["program_startup"] + b["training_slowdown"])
    assert rec.total_s == pytest.approx((34 - 19) + 1.5)
    # lost: the wasted region (15-20) and everything from rescheduling on
    assert rec.lost_s == pytest.approx(5 + 5 + 2 + 3.5 + 1.5 + 3.5)
    assert b["wasted_progress"] == pytest.approx(5)


def test_launcher_events_tell_a_signal_and_leave_the_attempts_alone(tmp_path):
    (plain,) = report_run_dir(_two_rank_restart(tmp_path / "plain"))
    (r,) = report_run_dir(_two_rank_restart(tmp_path / "agent", launcher=True))
    assert [a.processes for a in r.attempts] == [2, 2]  # the agent is no process of either
    assert r.buckets_ns == plain.buckets_ns
    (rec,) = r.recovery
    assert rec.first_failure.how == "signal"  # exit code -9: SIGKILL, as the agent saw it
    assert rec.first_failure.process == 1
    assert rec.evidence["launcher_detected_after_s"] == pytest.approx(0.1)
    assert rec.evidence["launcher_rendezvous_s"] == pytest.approx(2.0)


def test_the_worker_the_launcher_saw_fail_first_failed_first(tmp_path):
    """torchelastic's agent reports the workers it stopped after the one that died, in the same
    pass (as torchrun_restart_phases records it); the stopped rank 0 fell silent at 19.2,
    before rank 1's last heartbeat (19.3), yet rank 1 failed first, by SIGKILL, and detection
    runs to its last sign of life."""
    (r,) = report_run_dir(_two_rank_restart(tmp_path, launcher=True, stopped=True))
    (rec,) = r.recovery
    f = rec.first_failure
    assert (f.process, f.how, f.at_ns) == (1, "signal", Timeline().ns(19.3))
    assert rec.phases["detection"] == pytest.approx(0.3)
    assert rec.evidence["launcher_detected_after_s"] == pytest.approx(0.1)


def test_ranks_silent_together_leave_the_first_failure_uncertain(tmp_path):
    """Rank 0 falls silent at 19.2 and rank 1 at 19.3, with no end marker or launcher event:
    each died within a heartbeat interval (1 s) of its last sign of life, so either may have
    failed first. The report names rank 0 (silent first) and says it is uncertain, in the
    record, a named warning, the JSON, the text and the HTML."""
    run = _two_rank_restart(tmp_path / "run", stopped=True)
    (r,) = report_run_dir(run)
    (rec,) = r.recovery
    f = rec.first_failure
    assert (f.process, f.how, f.uncertain_among) == (0, "missing_heartbeat", (1,))
    (w,) = [w for w in r.warnings if w.code == "first_failure_uncertain"]
    assert (w.attempt, w.process) == (0, 0) and "process(es) 1" in w.message
    assert job_to_dict(r)["recovery"][0]["first_failure"]["uncertain_among"] == [1]
    res = goodput("report", str(run))
    assert "failed first (missing_heartbeat, inferred; or process 1)" in res.stdout
    assert "first_failure_uncertain" in res.stdout
    html = tmp_path / "r.html"
    goodput("report", str(run), "--html", str(html))
    assert "p0 host0 (missing_heartbeat, inferred)" in html.read_text()
    assert "or p1 (uncertain)" in html.read_text()
    # a heartbeat every 50 ms: rank 0 was surely dead (19.25) before rank 1's last sign
    (r,) = report_run_dir(_two_rank_restart(tmp_path / "fast", stopped=True, interval_ms=50))
    assert r.recovery[0].first_failure.uncertain_among == ()
    assert "first_failure_uncertain" not in {w.code for w in r.warnings}


def test_launcher_events_polled_live_equal_the_report(tmp_path):
    """The same run taken in by ``goodput serve``'s store a few lines at a time and polled
    with its memo after each (the launcher's events summarised a batch at a time): every
    poll equals accounting afresh, and the last one the report, launcher evidence included."""
    run = _two_rank_restart(tmp_path / "agent", launcher=True, spans_per_line=1)
    lines = [(f, line) for f in sorted(run.glob("*.jsonl"))
             for line in f.read_bytes().splitlines(keepends=True)]
    store = LiveStore(min_interval_s=0)
    for i, (f, line) in enumerate(lines):
        store.ingest_line(line, (str(f), i))
        for name in store.jobs():
            (live,) = store.results(now_ns=Timeline().ns(100), job=name)
            fresh = account(store.snapshot(name), None, Timeline().ns(100))
            assert job_to_dict(live) == job_to_dict(fresh)
    (rec,) = live.recovery
    assert rec.evidence["launcher_detected_after_s"] == pytest.approx(0.1)
    assert rec.evidence["launcher_rendezvous_s"] == pytest.approx(2.0)
    (r,) = report_run_dir(run, now_ns=Timeline().ns(100))
    assert job_to_dict(live) == job_to_dict(r)


def test_pod_times_split_the_rescheduling(tmp_path):
    (r,) = report_run_dir(_two_rank_restart(tmp_path, pods=True))
    (rec,) = r.recovery
    assert rec.evidence == pytest.approx({"pod_created_after_s": 1.0, "pod_queued_s": 2.5,
                                          "pod_start_s": 1.5})
    assert rec.phases["rescheduling"] == pytest.approx(5.0)


def test_unknown_phases_are_none(tmp_path):
    """No completed step before the failure: detection unknown. A resume past step 0 with no
    restore recorded: restore unknown (its time is in rendezvous_init)."""
    tl = Timeline(attempt=0).job_start(0).span("accelerator_init", 1, 3).heartbeat(3, 4)
    tl.write(tmp_path)
    tl = Timeline(attempt=1).job_start(10).span("accelerator_init", 11, 12)
    tl.step(6, 13, 14).step(7, 14, 15).job_end(15).write(tmp_path)
    (r,) = report_run_dir(tmp_path)
    (rec,) = r.recovery
    assert rec.phases["detection"] is None and rec.phases["restore"] is None
    assert rec.phases["termination"] == pytest.approx(0)
    assert rec.phases["rendezvous_init"] == pytest.approx(2)
    assert rec.first_failure.how == "missing_heartbeat"


# --- 16 processes: one slow host, one that crashes ---------------------------------------


def _sync_job(d, waits=True):
    """Synchronous data-parallel job of 16 hosts. Every step, each host computes 1.0 s (host
    SLOW: 1.2 s, 20 % slower; a deterministic jitter of up to 2 ms on the others), then waits
    in the all-reduce until the last host arrives; the all-reduce takes 10 ms; every host's
    step ends then. Attempt 0 runs steps 1-30, saves step 20 (0.5 s), and host CRASH dies in
    step 31 (last sign of life 0.3 s in; the others end with an exception 2 s in). Attempt 1
    starts 10 s later, restores step 20 and runs steps 21-40."""
    rng = np.random.default_rng(7)
    tls = {}
    t = 0.0

    def steps(att, first, last, t):
        for n in range(first, last + 1):
            arrive = {p: t + (1.2 if p == SLOW else 1.0 + rng.uniform(-0.002, 0.002))
                      for p in range(HOSTS)}
            end = max(arrive.values()) + 0.01
            for p, tl in tls.items():
                tl.step(n, t, end)
                if waits:
                    tl.span(schema.COLLECTIVE_WAIT, arrive[p], end)
            t = end
            if n == 20 and att == 0:
                tls[0].save(t, t + 0.5, step=20)
                t += 0.5
        return t

    tls = {p: Timeline(attempt=0, process=p, count=HOSTS).job_start(0) for p in range(HOSTS)}
    for tl in tls.values():
        tl.span("accelerator_init", 0.5, 1.5)
    t = steps(0, 1, 30, 1.5)
    for p, tl in tls.items():
        end = t + 0.3 if p == CRASH else t + 2.0  # step 31 in flight: its open record
        tl.span(schema.STEP, t, end, {schema.ATTR_STEP: 31, schema.ATTR_OPEN: True})
        (tl.heartbeat(t, t + 0.3) if p == CRASH else tl.job_end(t + 2.0, reason="exception"))
        tl.write(d)
    t0 = t + 12.0
    tls = {p: Timeline(attempt=1, process=p, count=HOSTS).job_start(t0) for p in range(HOSTS)}
    for tl in tls.values():
        tl.span("accelerator_init", t0 + 0.5, t0 + 1.5).restore(t0 + 1.5, t0 + 2.5, step=20)
    t = steps(1, 21, 40, t0 + 2.5)
    for tl in tls.values():
        tl.job_end(t).write(d)
    return d


@pytest.fixture(scope="module")
def sync_job(tmp_path_factory):
    return _sync_job(tmp_path_factory.mktemp("sync"))


def test_slow_host_and_crashing_host(sync_job):
    """> 90 % of training_slowdown on the slow host, the disruption on the crashing one."""
    (r,) = report_run_dir(sync_job, ideal_step_time_s=1.01)  # the fast hosts' step
    slowdown = r.badput_s["training_slowdown"]
    assert slowdown == pytest.approx(40 * 0.2, rel=0.02)  # kept steps 1-20 and 21-40
    by = {(h.host, h.process): h for h in r.host_badput}
    slow = by[(f"host{SLOW}", SLOW)]
    assert slow.slowdown_s / slowdown > 0.9, (slow, slowdown)
    assert slow.disruptions_caused == 0
    (rec,) = r.recovery
    f = rec.first_failure
    assert (f.process, f.host, f.how) == (CRASH, f"host{CRASH}", "missing_heartbeat")
    # step 30 ended, host 12 fell silent 0.3 s into step 31, the others ended 2 s into it
    assert rec.phases["detection"] == pytest.approx(0.3)
    assert rec.phases["termination"] == pytest.approx(1.7)
    assert rec.phases["rescheduling"] == pytest.approx(10.0)
    # it fell silent first: the disruption is charged to it on inference, apart
    assert f.evidence == "inferred"
    (crash,) = r.host_badput_inferred
    assert (crash.host, crash.process, crash.evidence) == (f"host{CRASH}", CRASH, "inferred")
    assert crash.disruptions_caused == 1 and crash.slowdown_s == 0
    assert crash.badput_ns == rec.lost_ns
    assert all(h.disruptions_caused == 0 for h in r.host_badput)
    assert by.get((f"host{CRASH}", CRASH), crash).slowdown_s < 0.05 * slowdown
    others = sum(h.slowdown_s for h in r.host_badput if h.process not in (SLOW, CRASH))
    assert others + r.slowdown_unattributed_s < 0.1 * slowdown
    assert r.host_badput[0].process == SLOW
    c = r.badput_charged
    assert c["observed_ns"] + c["inferred_ns"] + c["unattributed_ns"] == c["total_badput_ns"]
    assert c["total_badput_ns"] == r.total_ns - r.buckets_ns["productive"]
    assert c["inferred_ns"] == rec.lost_ns and c["unattributed_ns"] >= 0
    # the table and the JSON of the real command line
    p = goodput("report", sync_job, "--ideal-step-time", "1.01")
    assert p.returncode == 0, p.stderr
    assert "top hosts by badput caused (observed):" in p.stdout
    assert "inferred, not ranked above" in p.stdout
    assert f"process {CRASH} on host{CRASH} failed first (missing_heartbeat, inferred)" in p.stdout
    p = goodput("report", sync_job, "--ideal-step-time", "1.01", "--format", "json")
    job = json.loads(p.stdout)["jobs"][0]
    assert job["host_badput"][0]["process"] == r.host_badput[0].process
    assert list(job["recovery"][0]["phases_s"]) == list(PHASES)
    assert job["recovery"][0]["first_failure"]["how"] == "missing_heartbeat"
    assert job["recovery"][0]["first_failure"]["evidence"] == "inferred"
    assert job["host_badput_inferred"][0]["process"] == CRASH
    assert job["badput_charged"] == r.badput_charged


def test_without_collective_waits_the_slowdown_stays_unattributed(tmp_path):
    """Steps end together at the collective: nothing tells the hosts apart, so the report
    says so instead of guessing."""
    (r,) = report_run_dir(_sync_job(tmp_path, waits=False), ideal_step_time_s=1.01)
    slowdown = r.badput_s["training_slowdown"]
    assert r.slowdown_unattributed_s == pytest.approx(slowdown, rel=1e-6)
    assert all(h.slowdown_s == 0 for h in r.host_badput)


def test_host_badput_metric(sync_job):
    (r,) = report_run_dir(sync_job, ideal_step_time_s=1.01)
    reader = InMemoryMetricReader()
    GoodputMetrics(lambda: [r], MeterProvider(metric_readers=[reader]))
    pts, _ = reader_points(reader)
    got = {}
    for (name, attrs), v in pts.items():
        if name == "goodput.host.badput_time":
            a = dict(attrs)
            got[(a[schema.RES_HOST_NAME], a[schema.RES_PROCESS_INDEX],
                 a["goodput.badput.cause"], a["goodput.evidence"])] = v
    slow = next(h for h in r.host_badput if h.process == SLOW)
    assert got[(f"host{SLOW}", SLOW, "training_slowdown", "observed")] == pytest.approx(
        slow.slowdown_s)
    (crash,) = r.host_badput_inferred  # charged on its last sign of life: labelled so
    assert got[(f"host{CRASH}", CRASH, "disruptions", "inferred")] == pytest.approx(
        crash.badput_s)
    assert not any(c == "disruptions" and e == "observed" for _h, _p, c, e in got)
    assert len({(h, p) for h, p, _, e in got if e == "observed"}) <= 10  # the top N
    phases = {dict(attrs)["goodput.recovery.phase"]: v for (name, attrs), v in pts.items()
              if name == "goodput.recovery.phase_time"}
    (rec,) = r.recovery
    assert phases == pytest.approx({k: v for k, v in rec.phases.items() if v is not None})


# --- hostile input: the new evidence never makes the report raise ---------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_T = st.floats(0, 100, allow_nan=False)
_EVENT = st.tuples(st.sampled_from([schema.COLLECTIVE_WAIT, schema.LAUNCHER_EVENT, schema.STEP,
                                    schema.CHECKPOINT_RESTORE, schema.PROGRAM_STARTUP,
                                    schema.JOB_END, schema.HEARTBEAT]), _T, _T,
                   st.integers(-3, 3), st.integers(-(2**63), 2**63 - 1))


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(procs=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.booleans(),
                                st.lists(_EVENT, min_size=1, max_size=8)),
                      min_size=1, max_size=5))
def test_any_evidence_gives_phases_that_add_up(tmp_path_factory, procs):
    d = tmp_path_factory.mktemp("evidence")
    for i, (attempt, rank, launcher, events) in enumerate(procs):
        extra = {schema.RES_PROCESS_ROLE: "launcher"} if launcher else {}
        extra[schema.RES_K8S_POD_CREATED] = Timeline().ns(attempt * 30 - 5)
        tl = Timeline(attempt=attempt, process=rank, host="h",
                      **{schema.RES_SERVICE_INSTANCE_ID: f"x{i}",
                         schema.RES_PROCESS_PID: i, schema.RES_PROCESS_START:
                         Timeline().ns(attempt * 30)}, **extra)
        tl.job_start(attempt * 30)
        for name, a, b, n, big in events:
            s, e = sorted((attempt * 30 + a, attempt * 30 + b))
            attrs = {schema.ATTR_STEP: n, schema.ATTR_CHECKPOINT_STEP: n,
                     schema.ATTR_LAUNCHER_WORKER_PID: n % 5, schema.ATTR_LAUNCHER_EXIT_CODE: big,
                     schema.ATTR_LAUNCHER_EVENT: "x", schema.ATTR_END_REASON: "exception"}
            tl.span(name, s, e, attrs)
        tl.write(d)
    try:
        results = report_run_dir(d, now_ns=2**62)
    except Exception as e:  # only the documented refusal of a spool with nothing usable
        assert "holds no goodput spans" in str(e), e
        return
    for r in results:
        assert sum(r.buckets_ns.values()) == r.total_ns
        assert len(r.recovery) == r.disruptions
        for rec in r.recovery:
            assert all(v is None or v >= 0 for v in rec.phases.values()), rec
            assert rec.lost_s >= 0 and rec.first_failure.how in ("exception", "signal",
                                                                 "missing_heartbeat", "end")
        assert all(h.badput_s >= h.slowdown_s >= 0 for h in r.host_badput)
        assert r.slowdown_unattributed_s >= 0
        json.dumps(job_to_dict(r), allow_nan=False)
