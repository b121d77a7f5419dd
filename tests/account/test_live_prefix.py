"""A live job polled after each of random growth steps equals accounting it afresh, while
its finished attempts are folded once (:mod:`goodput_processor.account.live`, issue 40).

Each attempt is one OS process (instance, pid, start) that restores a checkpoint and
steps; the steps of a growth plan: rows added to the running attempt, a new attempt
(resuming from a random step, lower than before now and then: the earlier attempts' kept
bounds move), a second process that appears late in a finished attempt, a poll with
nothing new at a later now. After every step the poll through the job's memo must equal a
fresh accounting field by field.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_polls import result_state

from goodput_processor.account.accounting import account
from goodput_processor.model.memo import AccountingMemo
from goodput_processor.read.rows import (
    C_AUX,
    C_END,
    C_IVAL,
    C_KIND,
    C_SID,
    C_SIDX,
    C_START,
    C_TIDX,
    K_CHECKPOINT_RESTORE,
    K_STEP,
    NCOLS,
    NONE,
    JobSpans,
    ProcessSpans,
)

MS = 1_000_000
T0 = 1_700_000_000 * 10**9
GAP = 200 * MS  # between an attempt's last row and the next one's start


def _rows(t: int, first_step: int, steps: int, slow: list[int], restore: bool,
          sid0: int) -> np.ndarray:
    """A restore (when ``restore``) then ``steps`` steps numbered from ``first_step``
    starting at ``t`` (10 ms each, 30 ms for those whose index is in ``slow``)."""
    rows = []
    if restore:
        rows.append((t, t + 5 * MS, K_CHECKPOINT_RESTORE, first_step - 1))
        t += 5 * MS
    for i in range(steps):
        dt = 30 * MS if i in slow else 10 * MS
        rows.append((t, t + dt, K_STEP, first_step + i))
        t += dt
    d = np.zeros((len(rows), NCOLS), np.int64)
    d[:, [C_START, C_END, C_KIND, C_IVAL]] = np.array(rows, np.int64)
    d[:, C_AUX], d[:, C_SIDX], d[:, C_TIDX] = NONE, -1, 0
    d[:, C_SID] = sid0 + np.arange(len(rows))
    return d


class _Job:
    """A growing job: one process per attempt, appended to in place of a store."""

    def __init__(self):
        self.procs: dict = {}  # key -> ProcessSpans
        self.step = 0  # the next step number of the running attempt
        self.end = T0
        self.n = 0
        self.sid = 0

    def _proc(self, key, index, data, start) -> ProcessSpans:
        return ProcessSpans("live", key[0], index, host=f"h{key[0]}-{index}", data=data,
                            instance=f"i{key[0]}-{index}", pid=100 + key[0] * 10 + index,
                            process_start_ns=start)

    def new_attempt(self, back: int, steps: int, slow: list[int]) -> None:
        start = self.end + GAP
        first = max(self.step - back, 1)
        d = _rows(start, first, steps, slow, self.n > 0, self.sid)
        self.sid += 1000
        key = (self.n, 0, "")
        self.procs[key] = self._proc(key, 0, d, start)
        self.n += 1
        self.step, self.end = first + steps, int(d[-1, C_END])

    def grow(self, steps: int, slow: list[int]) -> None:
        key = (self.n - 1, 0, "")
        p = self.procs[key]
        d = _rows(self.end, self.step, steps, slow, False, self.sid)
        self.sid += 1000
        self.procs[key] = self._proc(key, 0, np.concatenate((p.data, d)),
                                     p.process_start_ns)
        self.step, self.end = self.step + steps, int(d[-1, C_END])

    def late_process(self, attempt: int) -> None:
        """A second process of finished attempt ``attempt``, seen only now."""
        p = self.procs.get((attempt, 0, ""))
        if p is None or attempt >= self.n - 1 or (attempt, 1, "") in self.procs:
            return
        d = p.data.copy()
        d[:, C_SID] += 500
        key = (attempt, 1, "")
        self.procs[key] = self._proc(key, 1, d, p.process_start_ns + MS)

    def job(self) -> JobSpans:
        job = JobSpans("live")
        job.processes.update(sorted(self.procs.items()))
        return job


_OPS = st.one_of(
    st.tuples(st.just("grow"), st.integers(1, 6), st.lists(st.integers(0, 5), max_size=2)),
    st.tuples(st.just("new"), st.integers(0, 8), st.integers(1, 6),
              st.lists(st.integers(0, 5), max_size=2)),
    st.tuples(st.just("late"), st.integers(0, 6)),
    st.tuples(st.just("idle")),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.integers(3, 6), ops=st.lists(_OPS, min_size=1, max_size=10),
       ideal=st.sampled_from([None, 0.01]))
def test_live_job_polled_after_each_growth_step_equals_fresh(first, ops, ideal):
    g = _Job()
    for _ in range(first):  # a few attempts to start with
        g.new_attempt(2, 5, [0])
    memo = AccountingMemo()
    now = g.end + MS
    account(g.job(), ideal, now, memo=memo)
    for op in ops:
        if op[0] == "grow":
            g.grow(op[1], op[2])
        elif op[0] == "new":
            g.new_attempt(op[1], op[2], op[3])
        elif op[0] == "late":
            g.late_process(op[1])
        now = max(now, g.end) + (3000 * MS if op[0] == "idle" else MS)
        job = g.job()
        got = account(job, ideal, now, memo=memo)
        assert result_state(got) == result_state(account(job, ideal, now))
        if memo.prefix is not None:  # what it folded: the finished attempts, in order
            assert [a.attempt for a in memo.prefix.attempts] == [
                r.attempt for r in got.attempts[: len(memo.prefix.attempts)]]


def test_a_poll_with_nothing_new_keeps_the_prefix_and_the_attempts():
    g = _Job()
    for _ in range(6):
        g.new_attempt(2, 5, [0])
    memo = AccountingMemo()
    job = g.job()
    first = account(job, None, g.end + MS, memo=memo)
    prefix = memo.prefix
    assert prefix is not None and len(prefix.attempts) == 5
    again = account(job, None, g.end + 2 * MS, memo=memo)
    assert memo.prefix is prefix  # nothing refolded
    assert result_state(again) == result_state(account(job, None, g.end + 2 * MS))
    assert again.attempts[:5] == first.attempts[:5]
    g.new_attempt(3, 4, [])  # a new attempt: the prefix extended by the one that finished
    job = g.job()
    account(job, None, g.end + MS, memo=memo)
    assert len(memo.prefix.attempts) == 6 and memo.prefix.attempts[:5] == prefix.attempts
