"""The recovery phases' read of a restarted attempt's rows
(:mod:`goodput_processor.model.restart_rows`)
summarised a batch at a time gives what reading all the rows at once gave (Hypothesis).

The reference is the read it replaced (all rows, clipped to the attempt and to their latest
time), kept here verbatim. Random rows (phases before the attempt's start, damaged ones
ending before they start, non-blocking ones, steps past the kept-step bound, restores,
compilations, equal starts) grow poll after poll as a live process's do: a prefix that only
grows (``settled``), then a few rows that change (the open records resolved). At each poll
the summary through a memo, and without one, must give the reference's values, for any
attempt end (before, at or after the rows' latest time) and with the summary keeping only
1, 2, 3 or the default number of leading kept steps. End to end, the accounting with one
leading kept step kept is the accounting with the default, with and without a memo.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_polls import arrivals, result_state, take_batch
from random_jobs import MS, T0

from goodput_processor.account.accounting import account
from goodput_processor.model import memo as memo_mod
from goodput_processor.model import restart_rows as rr
from goodput_processor.model.memo import AccountingMemo, rows_key
from goodput_processor.read.rows import (
    C_END,
    C_FLAGS,
    C_IVAL,
    C_KIND,
    C_START,
    F_NONBLOCKING,
    K_CHECKPOINT_RESTORE,
    K_DATA_LOADING,
    K_HEARTBEAT,
    K_JOB_START,
    K_PROGRAM_STARTUP,
    K_STEP,
    NCOLS,
    NONE,
    ProcessSpans,
    is_phase,
)

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
_KINDS = [K_STEP] * 5 + [K_DATA_LOADING, K_CHECKPOINT_RESTORE, K_PROGRAM_STARTUP,
                         K_PROGRAM_STARTUP, K_HEARTBEAT, K_JOB_START]


# --- the reference: the read before summaries (recovery.py up to 0ed5929) -----------------
def _ref_rows(r, bound, end_ns):
    d = r.primary.data
    kinds, flags = d[:, C_KIND], d[:, C_FLAGS]
    blocking = (flags & F_NONBLOCKING) == 0
    s, e = np.clip(d[:, C_START], r.start_ns, end_ns), np.clip(d[:, C_END], r.start_ns,
                                                                end_ns)
    phase = is_phase(kinds) & (e >= s)
    first = int(s[phase].min()) if phase.any() else end_ns
    steps = (kinds == K_STEP) & blocking & (e > s)
    kept = steps & ((d[:, C_IVAL] <= bound) if bound is not None else True)
    t_fk = int(s[kept].min()) if kept.any() else end_ns
    t_fk = max(t_fk, first)
    rest = (kinds == K_CHECKPOINT_RESTORE) & blocking
    comp = (kinds == K_PROGRAM_STARTUP) & blocking
    restore_ns, rest_pieces = rr.union_ns(s[rest], e[rest], first, t_fk)
    _, comp_pieces = rr.union_ns(s[comp], e[comp], first, t_fk)
    ks, ke = s[kept], e[kept]
    order = np.argsort(ks, kind="stable")
    return (first, t_fk, restore_ns, rest_pieces, comp_pieces, s[comp], e[comp], ks[order],
            ke[order], bool(rest.any()))


def _ref_last(r, bound):
    d = r.primary.data
    if not len(d):
        return None
    kinds = d[:, C_KIND]
    s, e = np.maximum(d[:, C_START], r.start_ns), np.maximum(d[:, C_END], r.start_ns)
    steps = (kinds == K_STEP) & ((d[:, C_FLAGS] & F_NONBLOCKING) == 0) & (e > s)
    if bound is not None:
        steps &= d[:, C_IVAL] <= bound
    if not (is_phase(kinds) & (e >= s)).any() or not steps.any():
        return None
    return int(max(s.max(), e.max()))


def _reference(r, bound):
    last = _ref_last(r, bound)
    return _ref_rows(r, bound, min(r.end_ns, last) if last is not None else r.end_ns)
# --- end of the reference -----------------------------------------------------------------


@contextlib.contextmanager
def _lead(n: int | None):
    saved = rr.LEAD
    rr.LEAD = saved if n is None else n
    try:
        yield
    finally:
        rr.LEAD = saved


@contextlib.contextmanager
def _chunk(n: int):
    saved = memo_mod.CHUNK_ROWS
    memo_mod.CHUNK_ROWS = n
    try:
        yield
    finally:
        memo_mod.CHUNK_ROWS = saved


@st.composite
def _rows(draw, n: int) -> np.ndarray:
    """``n`` random rows (ms on a small grid, so that starts and ends often tie)."""
    d = np.zeros((n, NCOLS), np.int64)
    for i in range(n):
        start = T0 + draw(st.integers(-5, 40)) * MS
        end = start + draw(st.integers(-3, 12)) * MS  # now and then damaged: end < start
        kind = draw(st.sampled_from(_KINDS))
        flags = F_NONBLOCKING if draw(st.integers(0, 5)) == 0 else 0
        ival = draw(st.integers(0, 8)) if kind in (K_STEP, K_CHECKPOINT_RESTORE) else NONE
        d[i, :7] = start, end, kind, ival, NONE, flags, -1
        d[i, 8] = i
    return d


@st.composite
def growing(draw):
    """Rows that only grow (``settled``) and, per poll, a few rows that change after them:
    ``[(data, settled)]``; the attempt's start, its kept-step bound, and an offset of its
    end from the rows' latest time (ns)."""
    grown = draw(_rows(draw(st.integers(0, 30))))
    polls, settled = [], 0
    for _ in range(draw(st.integers(1, 6))):
        settled = draw(st.integers(settled, len(grown)))
        extra = draw(_rows(draw(st.integers(0, 3))))
        polls.append((np.concatenate([grown[:settled], extra]), settled))
    start = T0 + draw(st.integers(-2, 10)) * MS
    bound = draw(st.one_of(st.none(), st.integers(0, 8)))
    return polls, start, bound, draw(st.integers(-20, 20)) * MS


def _attempt(data: np.ndarray, settled: int, start: int, end_off: int):
    last = max(int(data[:, :2].max()), start) if len(data) else start
    p = ProcessSpans("j", 1, 0, data=data, origin=(("k",), rows_key(data), ("id",)),
                     settled=settled)
    return SimpleNamespace(attempt=1, start_ns=start, end_ns=max(last + end_off, start),
                           primary=p)


def _same(got: rr.RestartRows, ref: tuple) -> None:
    first, t_fk, restore_ns, rest_pieces, comp_pieces, cs, ce, ks, ke, restored = ref
    assert (got.first, got.t_fk, got.restore_ns, got.rest_pieces, got.comp_pieces,
            got.restored, got.kept) == (first, t_fk, restore_ns, rest_pieces, comp_pieces,
                                        restored, len(ks) > 0)
    assert got.comp_starts.tolist() == cs.tolist() and got.comp_ends.tolist() == ce.tolist()
    for t in {*ks.tolist(), first, t_fk, T0 - MS, T0 + 41 * MS}:
        hit = ke[ks == t]
        assert got.latest_end(t) == (int(hit.max()) if len(hit) else None)


@SETTINGS
@given(case=growing(), lead=st.sampled_from([1, 2, 3, None]))
def test_summaries_poll_after_poll_read_what_all_the_rows_read(case, lead):
    """Through a memo poll after poll, and without one: the reference's values, the end
    of the kept steps at every start included."""
    polls, start, bound, end_off = case
    memo = AccountingMemo()
    with _lead(lead):
        for data, settled in polls:
            r = _attempt(data, settled, start, end_off)
            ref = _reference(r, bound)
            _same(rr.restart_rows(r, bound, memo), ref)
            _same(rr.restart_rows(r, bound), ref)
            memo.end_round()


@SETTINGS
@given(case=growing(), lead=st.sampled_from([1, 3, None]), chunk=st.integers(1, 5))
def test_a_summary_read_a_few_rows_at_a_time_reads_what_all_the_rows_read(case, lead, chunk):
    """A one-shot read of a long attempt folds its summary over pieces of ``memo.CHUNK_ROWS``
    rows: with pieces of 1 to 5 rows, the reference's values."""
    polls, start, bound, end_off = case
    data, settled = polls[-1]
    with _lead(lead), _chunk(chunk):
        r = _attempt(data, settled, start, end_off)
        _same(rr.restart_rows(r, bound), _reference(r, bound))


def test_a_long_warm_up_is_read_past_the_leading_steps():
    """More kept steps than the summary keeps: the end of a later one is read from all
    the rows; a running attempt (its end after its rows) takes the summary."""
    n = 50
    d = np.zeros((n, NCOLS), np.int64)
    d[:, C_START] = T0 + np.arange(n) * 10 * MS
    d[:, C_END], d[:, C_KIND], d[:, C_IVAL] = d[:, C_START] + 9 * MS, K_STEP, np.arange(n)
    memo = AccountingMemo()
    with _lead(4):
        for k in (10, 30, 50):
            r = _attempt(d[:k], k, T0, MS)
            got = rr.restart_rows(r, None, memo)
            assert got._upto == T0 + 30 * MS and got._more is not None
            _same(got, _reference(r, None))
            memo.end_round()


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=arrivals(), ideal=st.sampled_from([None, 0.01]), running=st.booleans())
def test_accounting_with_one_leading_step_kept_is_the_same(case, ideal, running):
    """End to end, batch after batch with OS process identity: the summary keeping one
    leading kept step (warm-ups read from all the rows) gives the accounting of the
    default, with a memo and without."""
    _accounted_alike(case, ideal, running, lambda: _lead(1))


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=arrivals(), ideal=st.sampled_from([None, 0.01]), running=st.booleans(),
       chunk=st.integers(1, 4))
def test_accounting_with_summaries_read_a_few_rows_at_a_time_is_the_same(case, ideal,
                                                                        running, chunk):
    """End to end: every summary of ``memo.folded`` (evidence, step order, resume step,
    custom types, errors, elastic markers, restart phases, a launcher's events) read 1 to
    4 rows at a time gives the accounting of reading them whole, with a memo and without."""
    _accounted_alike(case, ideal, running, lambda: _chunk(chunk))


def _accounted_alike(case, ideal, running, setting) -> None:
    """Batch after batch with OS process identity: the accounting under ``setting()`` (a
    context manager), with a memo and without, equals the default's."""
    job, batches = case
    memo = AccountingMemo()
    seen: dict = {}
    for batch in batches:
        snap, now = take_batch(job, seen, batch, running, True)
        want = result_state(account(snap, ideal, now))
        with setting():
            assert result_state(account(snap, ideal, now, memo=memo)) == want
            assert result_state(account(snap, ideal, now)) == want
