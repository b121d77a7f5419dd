"""Summaries of a process's rows combined a batch at a time
(:mod:`goodput_processor.model.summaries`,
through :func:`goodput_processor.model.memo.folded`) equal the same reads of all rows at once
(Hypothesis): random rows, ties in time and step number, steps out of time order, clocks
that jump or were never set, damaged ends, growing poll after poll with a few open records
resolved at the end; the resume step also against the reading it replaced.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goodput_processor.model import summaries as sm
from goodput_processor.model.memo import AccountingMemo
from goodput_processor.read.rows import (
    C_AUX,
    C_END,
    C_FLAGS,
    C_IVAL,
    C_KIND,
    C_SID,
    C_SIDX,
    C_START,
    F_ERROR,
    K_ACCELERATOR_INIT,
    K_CHECKPOINT_RESTORE,
    K_CUSTOM_BADPUT,
    K_DATA_LOADING,
    K_ELASTIC_SLICES,
    K_HEARTBEAT,
    K_IDENTITY,
    K_JOB_END,
    K_JOB_START,
    K_STEP,
    NCOLS,
    NONE,
    ProcessSpans,
)

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
T0 = 1_700_000_000 * 10**9
S = 10**9
KINDS = (K_STEP, K_STEP, K_STEP, K_CHECKPOINT_RESTORE, K_CUSTOM_BADPUT, K_ELASTIC_SLICES,
         K_ACCELERATOR_INIT, K_DATA_LOADING, 0)


@st.composite
def rows(draw, max_size=40, kinds=KINDS):
    """An ``(n, NCOLS)`` int64 array of random rows, sorted by time (then step, end) or
    not, with a few rows moved."""
    n = draw(st.integers(0, max_size))
    d = np.zeros((n, NCOLS), np.int64)
    for i in range(n):
        start = draw(st.one_of(st.integers(0, 4).map(lambda k: T0 + k * S),
                               st.sampled_from([5, T0 - 100 * S, NONE + 1])))
        end = draw(st.one_of(st.integers(-3, 4).map(lambda k, s=start: max(s + k * S // 2,
                                                                            NONE)),
                             st.sampled_from([NONE, NONE + 10, 2**62])))
        d[i] = (start, end, draw(st.sampled_from(kinds)),
                draw(st.sampled_from([NONE, 0, 1, 2, 3, 5, 9])),
                draw(st.sampled_from([NONE, -1, 0, 1, 4])),
                draw(st.sampled_from([0, 1, F_ERROR, F_ERROR | 1])),
                draw(st.integers(-1, 3)), 0, i)
    for _ in range(draw(st.integers(0, 3)) if n else 0):  # the same step again, another count
        i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, len(d)))
        twin = d[i].copy()
        twin[C_AUX] = draw(st.sampled_from([NONE, 2, 7]))
        twin[C_SID] = len(d)
        d = np.concatenate((d[:j], twin[None], d[j:]))
    n = len(d)
    if draw(st.booleans()):  # in time order, as a live process records its steps
        d = d[np.lexsort((d[:, C_END], d[:, C_IVAL], d[:, C_START]))]
        for _ in range(draw(st.integers(0, 2))):  # a late row
            if n > 1:
                i, j = sorted(draw(st.lists(st.integers(0, n - 1), min_size=2, max_size=2)))
                d = np.concatenate((d[:i], d[i + 1 : j + 1], d[i : i + 1], d[j + 1 :]))
    return d


def _old_resume_step(d):
    """``painting.resume_step`` as it was before the summaries (the reference)."""
    kinds, ival, start = d[:, C_KIND], d[:, C_IVAL], d[:, C_START]
    for kind in (K_CHECKPOINT_RESTORE, K_STEP):
        r = np.flatnonzero((kinds == kind) & (ival != NONE))
        if len(r):
            r = r[start[r] == start[r].min()]
            r = r[np.argmin(ival[r])]
            if kind == K_CHECKPOINT_RESTORE:
                return int(ival[r])
            aux = d[r, C_AUX]
            return int(ival[r]) - (1 if aux == NONE else max(int(aux), 1))
    return None


def _all_reads(d, start_ns):
    """Every summary's value read from all rows ``d`` at once."""
    return (sm.step_order(d, start_ns), sm.resume_step(d),
            np.unique(d[d[:, C_KIND] == K_CUSTOM_BADPUT][:, C_SIDX]).tolist(),
            int(((d[:, C_FLAGS] & F_ERROR) != 0).sum()),
            d[d[:, C_KIND] == K_ELASTIC_SLICES].tolist())


def _process_reads(p, start_ns, memo):
    return (sm.step_order_of(p, start_ns, memo), sm.resume_of(p, memo),
            sm.custom_sids(p, memo), sm.error_spans(p, memo),
            sm.elastic_markers(p, memo).tolist())


@SETTINGS
@given(d=rows(), cuts=st.lists(st.integers(0, 40), max_size=5),
       start=st.sampled_from([T0, T0 + 3 * S]))
def test_step_order_combined_in_batches_equals_all_rows(d, cuts, start):
    """Folding :func:`step_order_both` over consecutive batches gives :func:`step_order`
    of all rows whenever it says it is exact, and it is exact for rows in time order; the
    resume step's summary folds to that of all rows."""
    bounds = sorted({min(c, len(d)) for c in cuts} | {0, len(d)})
    parts = [d[a:b] for a, b in zip(bounds, bounds[1:], strict=False)] or [d]
    s, r = sm.step_order(parts[0], start), sm._resume_rows(parts[0])
    for part in parts[1:]:
        s = sm.step_order_both(s, sm.step_order(part, start))
        r = sm._resume_both(r, sm._resume_rows(part))
    assert r == sm._resume_rows(d)  # (the first row of ties: the same count)
    whole = sm.step_order(d, start)
    steps = d[(d[:, C_KIND] == K_STEP) & (d[:, C_IVAL] != NONE)]
    keys = [tuple(r) for r in steps[:, [C_START, C_IVAL, C_END]].tolist()]
    if keys == sorted(keys):
        assert s.exact
    if s.exact:
        assert s == whole
    else:
        assert s._replace(back=0, overlap=0, first=None, last=None, exact=True) == whole._replace(
            back=0, overlap=0, first=None, last=None)
    assert sm.resume_step(d) == _old_resume_step(d)


@SETTINGS
@given(d=rows(), polls=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 3)),
                                min_size=1, max_size=6),
       start=st.sampled_from([T0, T0 + 3 * S]))
def test_reads_through_a_memo_poll_after_poll_equal_all_rows(d, polls, start):
    """A process whose settled rows grow at the end poll after poll, a few resolved open
    records after them (any rows): each read through the memo equals it from all rows."""
    memo, n = AccountingMemo(), 0
    extra = d[::-1].copy()  # the "open records resolved": any rows
    for grow, tail in polls:
        n = min(n + grow, len(d))
        data = np.concatenate((d[:n], extra[:tail]))
        p = ProcessSpans("j", 0, 0, data=data, origin=(("k",), None, "id"), settled=n)
        assert _process_reads(p, start, memo) == _all_reads(data, start)
        memo.end_round()
    p = ProcessSpans("j", 0, 0, data=d)  # no memo, no settled rows
    assert _process_reads(p, start, None) == _all_reads(d, start)


def test_steps_starting_together_across_batches_are_not_combined_by_arrival():
    """Two steps starting at the same time, the higher number arriving first and in an
    earlier batch: in time order (ties by number) the step number does not go down, and the
    combination says it cannot tell (then all rows are read again)."""
    d = np.zeros((2, NCOLS), np.int64)
    d[:, C_START], d[:, C_END], d[:, C_KIND], d[:, C_IVAL] = T0, T0 + S, K_STEP, (5, 3)
    d[:, C_AUX] = NONE
    s = sm.step_order_both(sm.step_order(d[:1], T0), sm.step_order(d[1:], T0))
    assert not s.exact and sm.step_order(d, T0).back == 0
    memo = AccountingMemo()
    for n in (1, 2):
        p = ProcessSpans("j", 0, 0, data=d[:n], origin=(("k",), None, "id"), settled=n)
        assert sm.step_order_of(p, T0, memo) == sm.step_order(d[:n], T0)
        memo.end_round()


@SETTINGS
@given(d=rows(kinds=(K_JOB_START, K_JOB_END, K_HEARTBEAT, K_IDENTITY, K_STEP)),
       cuts=st.lists(st.integers(1, 40), max_size=5))
def test_a_process_evidence_combined_in_batches_equals_all_rows(d, cuts):
    """Folding :func:`evidence_both` over consecutive batches (markers tied at their end
    in different batches included) gives :func:`evidence` of all rows."""
    if not len(d):
        return
    bounds = sorted({min(c, len(d)) for c in cuts} | {0, len(d)})
    parts = [d[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    e = sm.evidence(parts[0])
    for part in parts[1:]:
        e = sm.evidence_both(e, sm.evidence(part))
    assert e == sm.evidence(d)
