"""The accounting's fast paths give exactly what the general code gives (Hypothesis).

``painting.DISJOINT_FAST_PATH`` (no painting when no two blocking phases of an attempt
overlap) and ``open_records._FEW_OPEN`` (open records resolved one by one, without sorting)
are switched off and on over random jobs whose phases mostly follow one another, as a
training loop writes them, with overlaps, zero-length phases, open records, restarts,
redone steps, checkpoints and custom badput mixed in. The whole JSON report and the
per-step arrays must be identical, to the nanosecond.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goodput_processor import to_json_dict
from goodput_processor.account import painting
from goodput_processor.account.accounting import account
from goodput_processor.model import open_records
from goodput_processor.read.rows import (
    F_NONBLOCKING,
    F_OPEN,
    K_CHECKPOINT_RESTORE,
    K_CHECKPOINT_SAVE,
    K_CUSTOM_BADPUT,
    K_DATA_LOADING,
    K_HEARTBEAT,
    K_JOB_END,
    K_JOB_START,
    K_PROGRAM_STARTUP,
    K_STEP,
    NCOLS,
    NONE,
    JobSpans,
    ProcessSpans,
)

T0 = 1_700_000_000 * 10**9
MS = 1_000_000
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
_KINDS = [K_STEP] * 6 + [K_DATA_LOADING] * 3 + [K_CHECKPOINT_SAVE, K_CHECKPOINT_RESTORE,
                                                  K_CUSTOM_BADPUT, K_PROGRAM_STARTUP,
                                                  K_HEARTBEAT]


@st.composite
def loop_jobs(draw) -> JobSpans:
    """1-3 attempts of 1-2 processes; each process's phases mostly back to back."""
    job = JobSpans("fast", strings=["eval", "sdc", "killed"])
    t, sid = T0, 0
    step = 0
    for attempt in range(draw(st.integers(1, 3))):
        resume = draw(st.integers(0, max(step, 0)))
        for process in range(draw(st.integers(1, 2))):
            rows = []
            at = t + draw(st.integers(0, 3)) * MS
            rows.append((at, at, K_JOB_START, 10_000, NONE, 0, -1))
            at += draw(st.integers(0, 50)) * MS
            s = resume
            for _ in range(draw(st.integers(0, 25))):
                kind = draw(st.sampled_from(_KINDS))
                length = draw(st.integers(0, 40)) * MS
                start = at - (draw(st.integers(0, 30)) * MS if draw(st.integers(0, 9)) == 0
                              else 0)  # now and then an overlap with what came before
                flags = F_NONBLOCKING if draw(st.integers(0, 7)) == 0 else 0
                if draw(st.integers(0, 8)) == 0:
                    flags |= F_OPEN
                ival, aux, sidx = NONE, NONE, -1
                if kind == K_STEP:
                    s += 1
                    ival = s
                    if draw(st.integers(0, 6)) == 0:
                        aux = draw(st.integers(1, 3))
                elif kind in (K_CHECKPOINT_SAVE, K_CHECKPOINT_RESTORE):
                    ival = draw(st.integers(0, max(s, 0)))
                elif kind == K_CUSTOM_BADPUT:
                    sidx = draw(st.integers(0, 1))
                rows.append((start, start + length, kind, ival, aux, flags, sidx))
                if flags & F_OPEN and draw(st.booleans()):  # completed later as well
                    rows.append((start, start + length + 5 * MS, kind, ival, aux,
                                 flags & ~F_OPEN, sidx))
                at = max(at, start + length) + draw(st.integers(0, 5)) * MS
            if draw(st.booleans()):
                rows.append((at, at, K_JOB_END, NONE, NONE, 0, 2))
            step = max(step, s)
            data = np.zeros((len(rows), NCOLS), np.int64)
            for i, r in enumerate(rows):
                sid += 1
                data[i, :7] = r
                data[i, 7], data[i, 8] = attempt, sid
            order = draw(st.permutations(range(len(rows))))
            job.processes[(attempt, process, "")] = ProcessSpans(
                "fast", attempt, process, host=f"h{process}", process_count=2,
                data=data[list(order)])
        t = at + draw(st.integers(1, 100)) * MS
    return job


def _everything(job: JobSpans, ideal, now) -> tuple:
    r = account(job, ideal, now)
    steps = tuple(np.asarray(a).tolist() for a in (r.steps.step, r.steps.attempt,
                                                    r.steps.start_ns, r.steps.time_ns,
                                                    r.steps.count))
    return to_json_dict([r]), steps


@SETTINGS
@given(job=loop_jobs(), ideal=st.sampled_from([None, 0.01]),
       running=st.booleans())
def test_fast_paths_equal_the_general_code(job, ideal, running):
    last = max(int(p.data[:, 1].max()) for p in job.processes.values())
    now = last + (MS if running else 10**12)
    near = open_records._NEAR_MIN
    try:
        open_records._NEAR_MIN = 0  # open records matched against the rows after them only
        fast = _everything(job, ideal, now)
    finally:
        open_records._NEAR_MIN = near
    old = painting.DISJOINT_FAST_PATH, open_records._FEW_OPEN
    try:
        painting.DISJOINT_FAST_PATH, open_records._FEW_OPEN = False, 0
        general = _everything(job, ideal, now)
    finally:
        painting.DISJOINT_FAST_PATH, open_records._FEW_OPEN = old
    assert fast == general


def test_the_fast_path_is_taken_on_a_training_loop():
    """A loop of data loading and steps takes the fast path (no overlap)."""
    n = 100
    starts = T0 + np.arange(2 * n) * 10 * MS
    data = np.zeros((2 * n, NCOLS), np.int64)
    data[:, 0], data[:, 1] = starts, starts + 10 * MS
    data[:, 2] = np.where(np.arange(2 * n) % 2, K_STEP, K_DATA_LOADING)
    data[:, 3] = np.where(data[:, 2] == K_STEP, np.arange(2 * n) // 2, NONE)
    data[:, 4], data[:, 6], data[:, 8] = NONE, -1, np.arange(2 * n)
    lv = np.where(data[:, 2] == K_STEP, 1, 0).astype(np.int16)
    totals = painting._disjoint_totals(data[:, 0], data[:, 1], lv, int(data[-1, 1]), 3)
    assert totals is not None and totals.tolist() == [n * 10 * MS, n * 10 * MS, 0]
    data[5, 1] += 15 * MS  # one phase runs into the next: paint
    assert painting._disjoint_totals(data[:, 0], data[:, 1], lv, int(data[-1, 1]), 3) is None


@SETTINGS
@given(phases=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 12), st.integers(0, 2)),
                       max_size=12),
       cut=st.integers(0, 80), shuffle=st.randoms(use_true_random=False))
def test_disjoint_totals_equal_the_time_below_the_cut_or_decline(phases, cut, shuffle):
    """Phases in any order, some empty, some crossing or past the cut: the time per level
    below the cut when no two non-empty ones overlap there, else None (then painting)."""
    shuffle.shuffle(phases)
    s = np.array([p[0] for p in phases], np.int64)
    e = s + np.array([p[1] for p in phases], np.int64)
    lv = np.array([p[2] for p in phases], np.int16)
    got = painting._disjoint_totals(s, e, lv, cut, 3)
    live = sorted((a, min(b, cut), c) for a, b, c in zip(s.tolist(), e.tolist(),
                                                          lv.tolist(), strict=True)
                  if min(b, cut) > a)
    overlap = any(x[1] > y[0] for x, y in zip(live, live[1:], strict=False))
    if overlap:
        assert got is None
    else:
        want = [sum(b - a for a, b, c in live if c == level) for level in range(3)]
        assert got is not None and got.tolist() == want
