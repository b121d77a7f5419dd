"""Accounting a live job poll after poll, with a memo, equals accounting it afresh (Hypothesis).

A random job (restarts, redone steps, overlapping and open phases, checkpoints, custom
badput) arrives in random batches: its spans in any order across and within processes, so
that late spans of a dead attempt land after the next attempt's, with exact duplicates
arriving again later. After every batch the job is accounted twice, with the memo that
the previous polls filled (:class:`goodput_processor.model.memo.AccountingMemo`) and without
any, and the two results must be equal field by field, buckets to the nanosecond and the
per-step arrays element by element. The same holds for a live job in ``goodput serve``'s
store fed batch by batch, for both definitions.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_polls import arrivals, pieces_of, result_state, take_batch
from otlp_fixtures import T0_NS, Timeline, otlp_span, resource
from random_jobs import MS, NOW, NS, T0, feed_store, jobs, loop_jobs, otlp_requests

from goodput import schema
from goodput_processor.account.accounting import account
from goodput_processor.account.windows import account_windows
from goodput_processor.definitions.mgm import account_mgm
from goodput_processor.model import pieces
from goodput_processor.model.memo import AccountingMemo
from goodput_processor.model.packed import PackedSegments
from goodput_processor.read.rows import (
    C_END,
    NCOLS,
    JobSpans,
    ProcessSpans,
)
from goodput_processor.serve.compaction import _mapped, pack_segments, spill_segments
from goodput_processor.serve.spill import Spill
from goodput_processor.serve.store import LiveStore

SETTINGS = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("identity", [False, True])
@SETTINGS
@given(case=arrivals(), ideal=st.sampled_from([None, 0.01]), running=st.booleans(),
       piece_rows=st.sampled_from([None, 1, 3]), spare=st.sampled_from([None, 0, 1]))
def test_memo_equals_fresh_accounting_after_every_batch(case, ideal, running, piece_rows,
                                                        spare, identity):
    """... also with the running attempt cut into pieces of a few rows
    (:mod:`goodput_processor.model.pieces`), with the slowdown attribution's candidate steps
    read again as the threshold falls, with the rolling windows, with and without OS
    process identity, and again with nothing new at a later now."""
    job, batches = case
    memo, w_memo = AccountingMemo(), AccountingMemo()
    seen: dict = {}
    with pieces_of(piece_rows, spare):
        for batch in batches:
            snap, now = take_batch(job, seen, batch, running, identity)
            fresh = account(snap, ideal, now)
            again = account(snap, ideal, now, memo=memo)
            assert result_state(again) == result_state(fresh)
            if running:  # a poll with nothing new, only a later now (still running)
                later = now + MS // 2
                assert result_state(account(snap, ideal, later, memo=memo)) == result_state(
                    account(snap, ideal, later))
            rows = sum(len(p.data) for p in snap.processes.values())
            assert len(memo) < 40 * (len(snap.processes) + 1) + 4 * rows  # one poll's worth
            _same_windows(snap, ideal, now, w_memo)


def _same_windows(snap: JobSpans, ideal, now: int, w_memo: AccountingMemo) -> None:
    """The rolling windows through ``w_memo`` equal them afresh."""
    w_again = account_windows(snap, (0.05, 1, 600), ideal, now, w_memo)
    w_fresh = account_windows(snap, (0.05, 1, 600), ideal, now)
    assert result_state(w_again[0]) == result_state(w_fresh[0])
    assert w_again[1] == w_fresh[1]


@st.composite
def in_time(draw):
    """A job whose rows arrive as a live job's do: each process's in time order (by end)
    but for a few late ones, in small batches, processes interleaved."""
    job = draw(loop_jobs())
    rows = []
    for key, p in job.processes.items():
        order = np.lexsort((p.data[:, 0], p.data[:, 1])).tolist()
        for _ in range(draw(st.integers(0, 3))):  # now and then a row arrives late
            if len(order) > 1:
                i = draw(st.integers(0, len(order) - 2))
                j = draw(st.integers(i + 1, len(order) - 1))
                order.insert(j, order.pop(i))
        rows.append([(key, i) for i in order])
    merged = []
    while any(rows):
        merged.append(rows[draw(st.integers(0, len(rows) - 1))].pop(0) if all(rows)
                      else next(r for r in rows if r).pop(0))
    size = draw(st.integers(1, 4))
    return job, [merged[k:k + size] for k in range(0, len(merged), size)]


@pytest.mark.parametrize("identity", [False, True])
# 60 examples per identity (120 in all): each example polls ~21 times with 4 accountings a
# poll, the suite's most expensive test; tests/model/test_incremental_restarts.py adds the
# many-attempt case
@settings(SETTINGS, max_examples=60)
@given(case=in_time(), ideal=st.sampled_from([None, 0.01]), running=st.booleans(),
       piece_rows=st.sampled_from([1, 2, 5]))
def test_running_attempt_in_pieces_equals_fresh_accounting(case, ideal, running, piece_rows,
                                                           identity):
    """A running attempt cut into pieces poll after poll (:mod:`goodput_processor.model.pieces`)
    as its rows arrive in time order with a few late ones: the same as accounting afresh,
    also with the rolling windows, with and without OS process identity."""
    job, batches = case
    memo, w_memo = AccountingMemo(), AccountingMemo()
    seen: dict = {}
    with pieces_of(piece_rows):
        for batch in batches:
            snap, now = take_batch(job, seen, batch, running, identity)
            assert result_state(account(snap, ideal, now, memo=memo)) == result_state(
                account(snap, ideal, now))
            _same_windows(snap, ideal, now, w_memo)


def test_a_long_running_attempt_is_cut_into_pieces():
    """One attempt of 400 back-to-back steps arriving 10 at a time, pieces of 50 rows:
    after the first cuts, a poll takes every piece but the last from the memo."""
    n = 400
    starts = T0 + np.arange(n) * 10 * MS
    d = np.zeros((n, NCOLS), np.int64)
    d[:, 0], d[:, 1], d[:, 2] = starts, starts + 10 * MS, 8  # steps
    d[:, 3], d[:, 4], d[:, 6], d[:, 7] = np.arange(n), -(2**63), -1, 0
    d[:, 8] = np.arange(n)
    job = JobSpans("long")
    job.processes[(0, 0, "")] = ProcessSpans("long", 0, 0, data=d[:0])
    memo = AccountingMemo()
    seen = []
    with pieces_of(50):
        for k in range(10, n + 1, 10):
            job.processes[(0, 0, "")].data = d[:k]
            now = int(d[k - 1, 1]) + MS
            assert result_state(account(job, None, now, memo=memo)) == result_state(
                account(job, None, now))
            seen.append(len(pieces.running_pieces(memo, _running(job, now))))
    assert seen[-1] >= 5  # cut as it grew, a piece at a time
    assert sorted(seen) == seen


def _running(job, now):
    from goodput_processor.model.attempts import build_attempts
    return build_attempts(job, now)[-1]


def test_the_memo_is_used_when_only_the_running_attempt_grows():
    """Two attempts; new rows arrive for the second one only: the first attempt's results
    (its runs, painting, warnings, failure) come from the memo."""
    n = 200
    job = JobSpans("grow")
    for attempt in range(2):
        t0 = T0 + attempt * 10**12
        starts = t0 + np.arange(n) * 10 * MS
        d = np.zeros((n, NCOLS), np.int64)
        d[:, 0], d[:, 1], d[:, 2] = starts, starts + 10 * MS, 8  # steps
        d[:, 3], d[:, 4], d[:, 6], d[:, 7] = np.arange(n), -(2**63), -1, attempt
        d[:, 8] = np.arange(n) + attempt * n
        job.processes[(attempt, 0, "")] = ProcessSpans("grow", attempt, 0, data=d)
    full = job.processes[(1, 0, "")].data
    memo = AccountingMemo()
    for k in (50, 100, 150, 200):
        job.processes[(1, 0, "")].data = full[:k]
        now = int(full[k - 1, 1]) + MS
        hits = memo.hits
        got = account(job, None, now, memo=memo)
        assert result_state(got) == result_state(account(job, None, now))
        if k > 50:
            assert memo.hits - hits >= 3  # runs, resume, attempt part, warnings, failure


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(pairs=jobs(), seed=st.integers(0, 2**32 - 1),
       pack=st.sampled_from([None, "memory", "disk"]))
def test_live_store_polled_after_every_batch_equals_fresh_accounting(pairs, seed, pack):
    """``goodput serve``'s store, fed through its three ingest paths in random batches and
    polled after each one (with its memo), gives what accounting the job afresh gives, with
    either definitions; ``pack``: every process's rows packed after each batch
    (:meth:`LiveStore.compact`), kept in memory or in a spill file (``disk``: and the kept
    steps of whole attempts and the finished ones' sorted step times memory-mapped from
    files), so that the polls read packed rows and new rows land on packed ones."""
    rng = random.Random(seed)
    reqs = otlp_requests(_with_identity(pairs) if pack else pairs, rng)
    spill = Spill() if pack == "disk" else None
    try:
        _poll_after_every_batch(reqs, rng, pack, LiveStore(min_interval_s=0, spill=spill))
    finally:
        if spill is not None:
            spill.close()


def _poll_after_every_batch(reqs, rng, pack, store) -> None:
    """Feed ``reqs`` to ``store`` two at a time (packing after each with ``pack``) and
    compare every poll with a fresh accounting (see the test above)."""
    for k in range(0, len(reqs), 2):
        feed_store(store, reqs[k : k + 2], rng)
        if pack:
            store.results(now_ns=NOW)  # (what the memo keeps, before the rows are packed)
            store.compact(min_quiet_s=0, min_rows=0, map_least=1)
            if store.spill is not None:  # kept steps of attempts and pieces mapped from files
                for memo in (store.memo(store.jobs()[0], windows=w) for w in (False, True)):
                    with memo as m:
                        assert all(_mapped(p[3][0]) for t in ("attempt", "piece")
                                   for _, p in m.entries(t) if len(p[3][0]))
                        assert all(_mapped(r.per) for t in ("sorted_steps", "sorted_attempt")
                                   for _, r in m.entries(t) if len(r.per))
            if k:  # and every painted segment the windows' memo keeps (read if reached)
                with store.memo(store.jobs()[0], windows=True) as memo:
                    pack_segments(memo, NOW)
                    if store.spill is not None:  # (to the spill file: read back from it)
                        spill_segments(memo, store.spill, store.jobs()[0])
                        assert all(p[6].nbytes == 0 for t in ("attempt", "piece")
                                   for _, p in memo.entries(t)
                                   if isinstance(p[6], PackedSegments))
        for name in store.jobs():
            (live,) = store.results(now_ns=NOW, job=name)
            fresh = account(store.snapshot(name), None, NOW)
            assert result_state(live) == result_state(fresh)
            with store.memo(name, windows=True) as memo:
                _, w_live = account_windows(store.snapshot(name), (60, 600), None, NOW, memo)
            _, w_fresh = account_windows(store.snapshot(name), (60, 600), None, NOW)
            assert w_live == w_fresh
            snap = store.snapshot_windows(name, (60, 600), now_ns=NOW)  # (a finished job's
            assert snap.windows == w_fresh  # kept)
            assert result_state(snap.result) == result_state(fresh)
            try:
                m_fresh = account_mgm(store.snapshot(name), now_ns=NOW).to_json_dict()
            except ValueError as e:  # the incumbent's own refusals, the same both ways
                m_fresh = str(e)
            try:
                m_live = account_mgm(store.snapshot(name), now_ns=NOW).to_json_dict()
            except ValueError as e:
                m_live = str(e)
            assert m_live == m_fresh


def _with_identity(pairs) -> list:
    """``pairs`` (:func:`jobs`) whose resources carry an OS process identity, as the
    recorder's do (schema 1.1: instance id, pid and start time): the processes whose rows
    the store packs."""
    out = []
    for res, span in pairs:
        a, i = res[schema.RES_ATTEMPT], res[schema.RES_PROCESS_INDEX]
        out.append(({**res, schema.RES_SCHEMA_VERSION: "1.1",
                     schema.RES_SERVICE_INSTANCE_ID: f"i{a}-{i}",
                     schema.RES_PROCESS_PID: 1000 + 10 * a + i,
                     schema.RES_PROCESS_START: T0_NS + a * NS}, span))
    return out


def test_a_live_os_process_is_resolved_once_for_the_report_and_the_windows(tmp_path):
    """A running OS process of ``goodput serve``'s store, with a step in flight at every
    flush and a few whose end was lost, taken in a few lines at a time: after each, the
    report and the rolling windows through the store's memos equal accounting afresh, and
    both memos keep one resolver of its open records (:mod:`goodput_processor.model.open_records`)
    between them."""
    tl = Timeline(job="live").os_process(4242, 0).job_start(0)
    for n in range(60):
        t = 1 + n
        tl.open(schema.STEP, t, t + 0.5, {schema.ATTR_STEP: n})  # in flight at a flush
        if n % 7 != 3:  # (some ends lost: their phase runs until the next step began)
            tl.step(n, t, t + 0.9)
    lines = tl.write(tmp_path, spans_per_line=3).read_bytes().splitlines(keepends=True)
    store = LiveStore(min_interval_s=0)
    for k in range(0, len(lines), 2):
        for i, line in enumerate(lines[k : k + 2]):
            store.ingest_line(line, ("journal", k + i))
        snap = store.snapshot("live")
        now = max(int(p.data[:, C_END].max()) for p in snap.processes.values()) + MS
        (live,) = store.results(now_ns=now, job="live")
        assert live.attempts[-1].end_reason == "running"
        assert result_state(live) == result_state(account(snap, None, now))
        with store.memo("live", windows=True) as memo:
            w_live = account_windows(store.snapshot("live"), (5, 60), None, now, memo)
        assert w_live[1] == account_windows(snap, (5, 60), None, now)[1]
    _, memos = store._memos["live"]
    assert memos[False].processes is memos[True].processes
    (state,) = memos[False].processes.values()
    assert state["open"].n == sum(len(p.data) for p in store.snapshot("live").processes.values())


def _steps(n: int, first: int = 0) -> list:
    """``n`` one-second steps of job "prop" (attempt 0, process 0), from step ``first``."""
    res = resource("prop", 0, 0, 1)
    return [(res, otlp_span(schema.STEP, T0_NS + k * NS, T0_NS + (k + 1) * NS,
                            {schema.ATTR_STEP: k}, trace_id="1" * 32, span_id=k + 1))
            for k in range(first, first + n)]


def test_a_finished_job_is_not_accounted_again_until_it_changes():
    """No attempt running: the store answers a later poll with the same result object
    (nothing changed, and a later now changes nothing); a new span gives a new result,
    equal to accounting afresh."""
    store = LiveStore(min_interval_s=0)
    feed_store(store, otlp_requests(_steps(10), None), random.Random(0))
    (a,) = store.results(now_ns=NOW)
    assert a.attempts[-1].end_reason != "running" and a.step_time.count == 10
    (b,) = store.results(now_ns=NOW + 10**12)
    assert b is a
    assert result_state(b) == result_state(account(store.snapshot("prop"), None, NOW + 10**12))
    feed_store(store, otlp_requests(_steps(1, 10), None), random.Random(0))
    (c,) = store.results(now_ns=NOW + 10**12)
    assert c is not a and c.step_time.count == 11
    assert result_state(c) == result_state(account(store.snapshot("prop"), None, NOW + 10**12))


def test_a_finished_job_s_windows_are_not_accounted_again_until_it_changes():
    """The same for the rolling windows (``snapshot_windows``, the scrape's accounting):
    kept per set of windows, they end at the job's end, and a new span gives new ones,
    equal to accounting afresh."""
    store = LiveStore(min_interval_s=0)
    feed_store(store, otlp_requests(_steps(10), None), random.Random(0))
    a = store.snapshot_windows("prop", (5, 60), now_ns=NOW)
    assert a.result.attempts[-1].end_reason != "running" and a.windows[0].total_ns == 5 * NS
    assert store.snapshot_windows("prop", (5, 60), now_ns=NOW + 10**12) is a
    other = store.snapshot_windows("prop", (3,), now_ns=NOW + 10**12)
    assert other is not a and other.windows[0].total_ns == 3 * NS
    _, fresh = account_windows(store.snapshot("prop"), (5, 60), None, NOW + 10**12)
    assert a.windows == fresh
    feed_store(store, otlp_requests(_steps(1, 10), None), random.Random(0))
    c = store.snapshot_windows("prop", (5, 60), now_ns=NOW + 10**12)
    assert c is not a and c.result.step_time.count == 11
    _, fresh = account_windows(store.snapshot("prop"), (5, 60), None, NOW + 10**12)
    assert c.windows == fresh and c.windows != a.windows
