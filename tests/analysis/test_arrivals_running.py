"""A running attempt's arrivals folded as its rows arrive equal them read afresh (Hypothesis).

``slow_hosts._running_arrivals`` keeps, per process, the arrivals of the steps that a later
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
from live_polls import pieces_of, result_state, store_snapshot

from goodput_processor.account.accounting import account
from goodput_processor.analysis.slow_hosts import _waterfall
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
    C_TIDX,
    F_NONBLOCKING,
    K_COLLECTIVE_WAIT,
    K_DATA_LOADING,
    K_JOB_START,
    K_STEP,
    NCOLS,
    NONE,
    JobSpans,
    ProcessSpans,
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


def _job_of(rows_per_proc: list) -> JobSpans:
    """One attempt of the processes' rows (:func:`attempts`), each after a job-start row
    (heartbeat interval 10 s, so that it stays running), as the store holds them."""
    job = JobSpans("hosts")
    sid = 0
    for i, d in enumerate(rows_per_proc):
        t0 = int(d[:, C_START].min()) - 5 * MS
        rows = np.concatenate((_row(K_JOB_START, t0, t0, 10_000)[None], d))
        rows[:, C_AUX] = NONE
        rows[:, C_SIDX] = -1
        rows[:, C_TIDX] = 0
        rows[:, C_SID] = np.arange(sid, sid + len(rows))
        sid += len(rows)
        job.processes[(0, i, "")] = ProcessSpans("hosts", 0, i, host=f"h{i}",
                                                 process_count=len(rows_per_proc), data=rows)
    return job


@given(attempts(), st.sampled_from([None, 0.5]), st.sampled_from([1, 3]), st.data())
@SETTINGS
def test_slowdown_by_host_of_a_running_attempt_equals_fresh_poll_after_poll(job, ideal,
                                                                          piece_rows, data):
    """The whole accounting of a running attempt of several hosts, with slow steps, its rows
    arriving in time order batch by batch and cut into pieces of a few rows: after every
    batch, and again with nothing new at a later now (then with a lower ideal step time:
    other steps slow), the memo's result (slowdown by host, the step statistics and the
    warm-up kept for the same kept steps) equals accounting afresh."""
    full = _job_of(job[0])
    order = [(k, i) for k, p in full.processes.items()
             for i in np.argsort(p.data[:, C_END], kind="stable").tolist()]
    order.sort(key=lambda ki: int(full.processes[ki[0]].data[ki[1], C_END]))
    cuts = sorted(data.draw(st.lists(st.integers(1, len(order)), max_size=12)))
    memo = AccountingMemo()
    seen: dict = {}
    with pieces_of(piece_rows):
        for lo, hi in zip([0, *cuts], [*cuts, len(order)], strict=True):
            for k, i in order[lo:hi]:
                seen.setdefault(k, []).append(i)
            snap = store_snapshot(full, seen)
            last = max(int(p.data[:, C_END].max()) for p in snap.processes.values())
            # new rows; then nothing new; then nothing new, other steps slow (a lower ideal)
            for now, ide in ((last + MS, ideal), (last + 2 * MS, ideal), (last + 3 * MS, 0.45)):
                got = account(snap, ide, now, memo=memo)
                assert result_state(got) == result_state(account(snap, ide, now))
                assert got.attempts[-1].end_reason == "running"
