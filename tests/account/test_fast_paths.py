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
from random_jobs import MS, T0, loop_jobs

from goodput_processor import to_json_dict
from goodput_processor.account import painting
from goodput_processor.account.accounting import account
from goodput_processor.model import open_records
from goodput_processor.read.rows import (
    K_DATA_LOADING,
    K_STEP,
    NCOLS,
    NONE,
    JobSpans,
)

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
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
