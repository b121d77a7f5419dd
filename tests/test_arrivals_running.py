"""A running attempt's arrivals folded as its rows arrive equal them read afresh (Hypothesis).

``attribution._running_arrivals`` keeps, per process, the arrivals of the steps that a later
step of the same process has started after, and reads only the new rows (and the latest
steps with the waits from their start) at each poll. On random attempts of several
processes (collective waits inside steps, rows arriving in order or shuffled, steps and
waits that do not block, unnumbered steps, a step number run twice, rows past
``settled`` that change from poll to poll), the waterfall of every step number after every
poll must equal the one made from all rows at once (``_waterfall`` without a memo), float
for float.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goodput_processor.attribution import _waterfall
from goodput_processor.memo import AccountingMemo
from goodput_processor.timeline import (
    C_END,
    C_FLAGS,
    C_IVAL,
    C_KIND,
    C_START,
    F_NONBLOCKING,
    K_COLLECTIVE_WAIT,
    K_DATA_LOADING,
    K_STEP,
    NCOLS,
    NONE,
)

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
T0 = 1_700_000_000 * 10**9
MS = 10**6


def _row(kind, start, end, num=NONE, flags=0):
    r = np.zeros(NCOLS, np.int64)
    r[[C_START, C_END, C_KIND, C_IVAL, C_FLAGS]] = start, end, kind, num, flags
    return r


@st.composite
def attempts(draw):
    """An attempt of 2-4 processes running steps 1..n in step, each its rows as a recorder
    writes them (a data loading row, the wait inside the step, then the step), sometimes
    shuffled."""
    nproc, n = draw(st.integers(2, 4)), draw(st.integers(1, 25))
    rows = [[] for _ in range(nproc)]
    t = T0
    for k in range(1, n + 1):
        dur = draw(st.sampled_from([500, 500, 520, 1000])) * MS
        last = draw(st.integers(0, nproc - 1))
        for p in range(nproc):
            rows[p].append(_row(K_DATA_LOADING, t, t + 10 * MS))
            s, e = t + 10 * MS, t + 10 * MS + dur
            ready = e if p == last else s + draw(st.integers(300, 499)) * MS
            flags = F_NONBLOCKING if draw(st.integers(0, 30)) == 0 else 0
            if ready < e:
                rows[p].append(_row(K_COLLECTIVE_WAIT, ready, e, flags=flags))
            num = NONE if draw(st.integers(0, 20)) == 0 else k
            rows[p].append(_row(K_STEP, s, e, num))
            if draw(st.integers(0, 25)) == 0:  # the same step number again
                rows[p].append(_row(K_STEP, s, e, num))
        t += 10 * MS + dur
    data = []
    for p in range(nproc):
        d = np.array(rows[p], np.int64)
        if draw(st.integers(0, 3)) == 0:
            d = d[draw(st.permutations(range(len(d))))]
        data.append(d)
    return data, n


@given(attempts(), st.data())
@SETTINGS
def test_running_arrivals_equal_all_rows_at_once_after_every_poll(job, data):
    full, n = job
    nums = np.array([*range(1, n + 1), NONE], np.int64)
    memo = AccountingMemo()
    cuts = sorted(data.draw(st.lists(st.integers(1, max(len(d) for d in full)), max_size=6)))
    for cut in [*cuts, None]:
        procs = []
        for i, d in enumerate(full):
            rows = d[:cut]
            settled = data.draw(st.integers(max(0, len(rows) - 3), len(rows)))
            procs.append(SimpleNamespace(host=f"h{i}", index=i, attempt=0, data=rows,
                                         origin=((0, i, "x"), None, f"x{i}"),
                                         settled=settled))
        a = SimpleNamespace(attempt=0, processes=procs)
        got = _waterfall(a, nums, memo)
        want = _waterfall(a, nums)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)
        memo.end_round()
