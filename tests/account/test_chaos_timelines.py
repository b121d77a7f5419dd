"""Chaos: messy timelines have defined results (docs/reliability.md, "Timelines").

Hosts whose clocks disagree by seconds, spans arriving out of order or twice, attempts
with no end, a job name reused for a new run. Every case is written as real spool files
(OTLP JSON lines, ``tests/otlp_fixtures.py``) and read by the real reader; every result
is checked for its defined values and for buckets that are never negative and sum
exactly to the total (so no instant is counted in two buckets).
"""

from __future__ import annotations

import random

import pytest
from otlp_fixtures import T0_NS, Timeline, otlp_span, write_spool

from goodput_processor import account, read_run_dir, report_run_dir

NS = 1_000_000_000
FAR_FUTURE = T0_NS + 10**6 * NS  # "now" long after every fixture: nothing is running


def check_buckets(r) -> None:
    """No negative bucket; the buckets partition the total exactly."""
    assert all(v >= 0 for v in r.buckets_ns.values()), r.buckets_ns
    assert sum(r.buckets_ns.values()) == r.total_ns
    assert r.total_ns == r.end_ns - r.start_ns
    assert 0.0 <= r.goodput <= 1.0
    ends = [(a.start_ns, a.end_ns) for a in r.attempts]
    assert all(s <= e for s, e in ends), ends
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(ends, ends[1:], strict=False)), ends


def report(tmp_path, *timelines, now_ns=FAR_FUTURE, ideal=1):
    for tl in timelines:
        tl.write(tmp_path)
    (r,) = report_run_dir(tmp_path, ideal_step_time_s=ideal, now_ns=now_ns)
    check_buckets(r)
    return r


def clean_attempt(attempt=0, process=0, count=1, skew=0.0, t0=0.0, end=True, **kw) -> Timeline:
    """job_start at t0, steps 1..10 (1 s each) from t0+1, job_end at t0+12; clock + skew."""
    tl = Timeline(attempt=attempt, process=process, count=count, **kw)
    t = t0 + skew
    tl.job_start(t).steps(1, 10, start=t + 1, step_time=1)
    if end:
        tl.job_end(t + 12)
    return tl


# --- clocks that disagree ----------------------------------------------------------


@pytest.mark.parametrize("skew", [5.0, -5.0, 0.3])
def test_skewed_secondary_host_widens_the_attempt_into_other(tmp_path, skew):
    """A secondary host's clock off by ``skew`` s: the attempt spans every host's
    markers (earliest start, latest end), the primary's steps are untouched, and the
    difference is ``process_startup`` (before the primary's first step) and ``other``
    (after its end)."""
    r = report(tmp_path, clean_attempt(process=0, count=2),
               clean_attempt(process=1, count=2, skew=skew))  # fmt: skip
    (a,) = r.attempts
    assert a.primary_process == 0 and a.processes == 2
    assert r.total_time_s == pytest.approx(12 + abs(skew))
    assert r.productive_time_s == 10
    early = 1 + max(-skew, 0)  # the attempt's start to the primary's first step
    assert r.badput_s["process_startup"] == pytest.approx(early)
    assert r.badput_s["other"] == pytest.approx(1 + max(skew, 0))
    assert r.max_productive_step == 10


def test_restart_on_a_host_whose_clock_is_behind_cuts_the_killed_attempt(tmp_path):
    """Attempt 1 on a host 5 s behind: its start (12 s real, 7 s recorded) falls inside
    attempt 0, which is cut there: no overlap, no negative recovery; the steps of attempt
    0 after the cut are not counted and the ones before it past the resume step are
    wasted."""
    a0 = clean_attempt(end=False)  # killed after step 10 (ends at 11 s)
    a1 = Timeline(attempt=1)
    a1.job_start(7).restore(7, 8, step=4).steps(5, 10, start=8, step_time=1).job_end(15)
    r = report(tmp_path, a0, a1)
    first, second = r.attempts
    assert (first.end_reason, first.cut, first.duration_s) == ("killed", True, 7)
    assert r.badput_s["infrastructure_recovery"] == 0
    # Steps 1..4 of attempt 0 (1..5 s) kept; 5..7 s (steps 5, 6) wasted.
    assert r.badput_s["wasted_progress"] == 2
    assert r.productive_time_s == 4 + 6 and r.max_productive_step == 10
    assert r.total_time_s == 15


def test_running_attempt_on_a_clock_ahead_of_now_ends_at_its_last_sign_of_life(tmp_path):
    """The last attempt, no end marker, its host clock 2 s ahead of "now": running, and
    its end is its last span (not now, which would cut off its own spans)."""
    tl = clean_attempt(end=False)  # last span ends at 11 s
    tl.write(tmp_path)
    job = read_run_dir(tmp_path).jobs["job"]
    r = account(job, ideal_step_time_s=1, now_ns=tl.ns(9))
    check_buckets(r)
    (a,) = r.attempts
    assert a.end_reason == "running" and r.total_time_s == 11
    assert r.productive_time_s == 10


# --- spans out of order, twice -------------------------------------------------------


def _spans_with_ids(tl: Timeline, trace: str) -> list[dict]:
    return [otlp_span(*s, trace_id=trace, span_id=i + 1) for i, s in enumerate(tl.spans)]


def test_out_of_order_and_duplicated_spans_give_the_clean_result(tmp_path):
    """Every span twice (once more in the same file, once in a replayed copy), the lines
    shuffled and split small: duplicates are dropped by (trace id, span id), keeping the
    first, and the result equals the clean one to the nanosecond."""
    a0 = Timeline(attempt=0).job_start(0).restore(0, 1, step=0)
    a0.steps(1, 20, start=1, step_time=1).save(21, 22, step=20)
    a0.steps(21, 25, start=22, step_time=1).custom("eval", 27, 28)  # killed at 28
    a1 = Timeline(attempt=1).job_start(30).restore(30, 31, step=20)
    a1.steps(21, 30, start=31, step_time=1).job_end(41)

    clean_dir, messy_dir = tmp_path / "clean", tmp_path / "messy"
    rng = random.Random(8)
    n = 0
    for tl in (a0, a1):
        trace = f"{tl.attempt + 1:032x}"
        spans = _spans_with_ids(tl, trace)
        name = f"spans-p00000-a{tl.attempt:04d}.jsonl"
        write_spool(clean_dir / name, tl.resource, spans)
        messy = spans + spans  # twice in the same file
        rng.shuffle(messy)
        write_spool(messy_dir / name, tl.resource, messy, spans_per_line=3)
        replay = list(spans)
        rng.shuffle(replay)
        write_spool(messy_dir / f"replay-a{tl.attempt}.jsonl", tl.resource, replay)
        n += len(spans)
    (clean,) = report_run_dir(clean_dir, ideal_step_time_s=1, now_ns=FAR_FUTURE)
    (messy,) = report_run_dir(messy_dir, ideal_step_time_s=1, now_ns=FAR_FUTURE)
    check_buckets(clean)
    check_buckets(messy)
    assert messy.skipped["duplicate"] == 2 * n
    assert clean.skipped["duplicate"] == 0
    assert messy.buckets_ns == clean.buckets_ns
    assert (messy.start_ns, messy.end_ns) == (clean.start_ns, clean.end_ns)
    assert [(a.attempt, a.start_ns, a.end_ns, a.end_reason, a.steps_kept, a.steps_wasted)
            for a in messy.attempts] == [
        (a.attempt, a.start_ns, a.end_ns, a.end_reason, a.steps_kept, a.steps_wasted)
        for a in clean.attempts
    ]  # fmt: skip
    assert clean.badput_s["wasted_progress"] == 28 - 22
    assert clean.badput_s["infrastructure_recovery"] == 2


def test_same_span_id_in_another_trace_is_not_a_duplicate(tmp_path):
    """Identity is (trace id, span id): equal span ids in two traces are two spans."""
    tl = Timeline().job_start(0).steps(1, 4, start=0, step_time=1).job_end(4)
    a = [otlp_span(*s, trace_id="a" * 32, span_id=i + 1) for i, s in enumerate(tl.spans[:3])]
    b = [otlp_span(*s, trace_id="b" * 32, span_id=i + 1) for i, s in enumerate(tl.spans[3:])]
    write_spool(tmp_path / "spans-p00000-a0000.jsonl", tl.resource, a + b)
    (r,) = report_run_dir(tmp_path, ideal_step_time_s=1, now_ns=FAR_FUTURE)
    check_buckets(r)
    assert r.skipped["duplicate"] == 0
    assert r.productive_time_s == 4 and r.max_productive_step == 4


# --- attempts with no end ------------------------------------------------------------


def test_attempt_with_no_end_is_killed_unless_last_and_recently_alive(tmp_path):
    """No end marker: the last attempt seen alive within 3 heartbeat intervals of now is
    running (its end is now); otherwise (or if any attempt follows) it was killed and
    ends at its last sign of life (span or heartbeat end)."""
    a0 = clean_attempt(end=False)
    a0.heartbeat(11, 11.5)  # the recorder's heartbeat: its last sign of life
    a1 = Timeline(attempt=1).job_start(20, interval_ms=1000).restore(20, 21, step=10)
    a1.steps(11, 14, start=21, step_time=1)  # no end either: last span ends at 25
    for tl in (a0, a1):
        tl.write(tmp_path)
    job = read_run_dir(tmp_path).jobs["job"]

    running = account(job, ideal_step_time_s=1, now_ns=a1.ns(27))  # 2 s < 3 intervals
    check_buckets(running)
    assert [a.end_reason for a in running.attempts] == ["killed", "running"]
    assert running.attempts[0].end_ns == a0.ns(11.5)
    # process start-up: 0-1 s before the first step; other: 25-27 s after attempt 1's last
    # step. The heartbeat after attempt 0's last kept step (11-11.5 s) is wasted progress.
    assert running.end_ns == a1.ns(27) and running.badput_s["other"] == 2
    assert running.badput_s["process_startup"] == 1
    assert running.badput_s["wasted_progress"] == 0.5
    assert running.badput_s["infrastructure_recovery"] == 8.5

    killed = account(job, ideal_step_time_s=1, now_ns=a1.ns(28.5))  # 3.5 s: not alive
    check_buckets(killed)
    assert [a.end_reason for a in killed.attempts] == ["killed", "killed"]
    assert killed.end_ns == a1.ns(25) and killed.total_time_s == 25
    # Nothing follows the last attempt: its steps are kept, nothing is wasted there.
    assert killed.max_productive_step == 14 and killed.badput_s["wasted_progress"] == 0.5


def test_attempt_whose_start_marker_was_lost_starts_at_its_first_span(tmp_path):
    """No job_start (lost) and no job_end: from its first span to its last."""
    a0 = Timeline(attempt=0).steps(1, 5, start=3, step_time=1)
    a1 = Timeline(attempt=1).job_start(10).restore(10, 11, step=5)
    a1.steps(6, 10, start=11, step_time=1).job_end(16)
    r = report(tmp_path, a0, a1)
    first = r.attempts[0]
    assert (first.start_ns, first.end_ns, first.end_reason) == (a0.ns(3), a0.ns(8), "killed")
    assert r.total_time_s == 13 and r.badput_s["infrastructure_recovery"] == 2
    assert r.badput_s["wasted_progress"] == 0 and r.productive_time_s == 10


def test_attempt_with_only_a_start_marker(tmp_path):
    """Killed right after it started (only job_start was flushed): zero length, no
    wasted progress, the gap to the restart is recovery."""
    a0 = clean_attempt(end=False)  # killed after 11 s
    a1 = Timeline(attempt=1).job_start(15)  # killed at once
    a2 = Timeline(attempt=2).job_start(20).restore(20, 21, step=10).job_end(22)
    r = report(tmp_path, a0, a1, a2)
    assert [a.duration_s for a in r.attempts] == [11, 0, 2]
    assert r.badput_s["infrastructure_recovery"] == 4 + 5
    assert r.disruptions == 2 and r.max_productive_step == 10


# --- a job name reused for a new run ----------------------------------------------------


def test_reused_name_in_the_same_run_dir_is_the_next_attempt(tmp_path):
    """A second run of the same job name in the same run directory is attempt 1 of the
    same job (the recorder numbers attempts from the files there; the spans carry no run
    identity). Defined result: the first run's steps past the second run's resume step
    (0: it restored nothing) are wasted progress and the gap is recovery. Use a new job
    name or run directory per run (docs/reliability.md)."""
    first = clean_attempt()
    second = clean_attempt(attempt=1, t0=3600)
    r = report(tmp_path, first, second)
    assert [a.end_reason for a in r.attempts] == ["exit", "exit"]
    assert r.attempts[0].steps_wasted == 10 and r.attempts[1].steps_kept == 10
    assert r.badput_s["wasted_progress"] == 11  # from the first step to the end marker
    assert r.badput_s["infrastructure_recovery"] == 3600 - 12
    assert r.max_productive_step == 10


@pytest.mark.parametrize("first_ended", [True, False])
def test_reused_name_and_attempt_number_splits_into_attempts(tmp_path, first_ended):
    """Two runs that both claim attempt 0 of process 0 of one job (two run directories
    read together, or both sent to one `goodput serve`): a process starts an attempt
    once, so a start marker after that process had stepped or ended begins another run.
    Defined result: the same as the next attempt in one run directory (above), never one
    attempt of 3612 s with steps counted twice. The first run may have been killed."""
    first = clean_attempt(end=first_ended)  # killed: its last step ends at 11 s
    second = clean_attempt(t0=3600)
    first.write(tmp_path)
    write_spool(tmp_path / "other-run.jsonl", second.resource, second.spans)
    (r,) = report_run_dir(tmp_path, ideal_step_time_s=1, now_ns=FAR_FUTURE)
    check_buckets(r)
    assert len(r.attempts) == 2 and r.disruptions == 1
    assert r.attempts[0].steps_wasted == 10 and r.attempts[1].steps_kept == 10
    assert r.productive_time_s == 10 and r.max_productive_step == 10
    assert r.attempts[0].end_reason == ("exit" if first_ended else "killed")
    assert r.badput_s["infrastructure_recovery"] == 3600 - (12 if first_ended else 11)


def test_extra_start_marker_before_any_step_does_not_split(tmp_path):
    """A second start marker before the process stepped or ended (an imported log adds
    one at the scheduling time) is not another run: one attempt from the earliest."""
    tl = Timeline().job_start(0).custom("scheduling", 0, 3).job_start(3)
    tl.steps(1, 10, start=4, step_time=1).job_end(14)
    r = report(tmp_path, tl)
    (a,) = r.attempts
    assert (a.duration_s, a.steps_kept) == (14, 10)
    assert r.badput_s["custom:scheduling"] == 3 and r.productive_time_s == 10
