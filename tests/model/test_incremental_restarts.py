"""A live job with hundreds of attempts, polled with a memo, equals accounting it afresh
(issue 40: a poll's cost independent of the number of finished attempts).

The job: ``ATTEMPTS`` attempts of a few steps each, each after the first restoring a
checkpoint a few steps back (so each redoes steps: wasted progress, kept-step bounds),
compiling, then stepping with a slow warm-up and now and then a slow step (anomalous steps,
recovery phases with warm-up). Most attempts arrive at once, then the last ones grow batch
by batch, a new attempt starting on the way, with a poll after each batch and one with
nothing new at a later now; every poll through the memo must equal a fresh accounting
field by field, and the finished disruptions' records and attempts come from the memo.
"""

from __future__ import annotations

import numpy as np
import pytest
from live_polls import result_state

from goodput_processor.account.accounting import account
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
    K_CHECKPOINT_RESTORE,
    K_PROGRAM_STARTUP,
    K_STEP,
    NCOLS,
    NONE,
    JobSpans,
    ProcessSpans,
)

MS = 1_000_000
T0 = 1_700_000_000 * 10**9
ATTEMPTS = 150
STEPS = 12  # per attempt
REDONE = 3  # steps each attempt redoes of the one before


def _attempt_rows(k: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of attempt ``k``: a restore and a compilation (after the first), then
    ``STEPS`` steps numbered on from the previous attempt's kept steps."""
    t = T0 + k * 10**9  # an attempt a second
    rows = []
    first = k * (STEPS - REDONE)
    if k:
        rows.append((t, t + 20 * MS, K_CHECKPOINT_RESTORE, first, NONE))
        rows.append((t + 20 * MS, t + 50 * MS, K_PROGRAM_STARTUP, NONE, NONE))
        t += 50 * MS
    for i in range(STEPS):
        dt = 10 * MS + int(rng.integers(0, 100_000))
        if i < 2 or rng.random() < 0.1:  # a warm-up, and now and then a slow step
            dt *= 3
        rows.append((t, t + dt, K_STEP, first + i, NONE))
        t += dt
    d = np.zeros((len(rows), NCOLS), np.int64)
    d[:, [C_START, C_END, C_KIND, C_IVAL, C_AUX]] = np.array(rows, np.int64)
    d[:, C_FLAGS], d[:, C_SIDX], d[:, C_TIDX] = 0, -1, k
    d[:, C_SID] = np.arange(len(rows)) + k * 1000
    return d


def _job(rows: list[np.ndarray], upto: int, last_rows: int) -> JobSpans:
    """The job with attempts ``0 .. upto - 1`` whole and the first ``last_rows`` rows of
    attempt ``upto`` (none: it has not started)."""
    job = JobSpans("restarts")
    for k in range(upto + (last_rows > 0)):
        d = rows[k] if k < upto else rows[k][:last_rows]
        job.processes[(k, 0, "")] = ProcessSpans("restarts", k, 0, data=d)
    return job


@pytest.mark.parametrize("ideal", [None, 0.01])
def test_hundreds_of_attempts_polled_equal_fresh_accounting(ideal):
    rng = np.random.default_rng(7)
    rows = [_attempt_rows(k, rng) for k in range(ATTEMPTS)]
    memo = AccountingMemo()
    polls = [(ATTEMPTS - 2, 3), (ATTEMPTS - 2, len(rows[ATTEMPTS - 2])),
             (ATTEMPTS - 1, 4), (ATTEMPTS - 1, 9)]
    for upto, n in polls:
        job = _job(rows, upto, n)
        now = int(job.processes[(upto, 0, "")].data[:, C_END].max()) + MS
        for at in (now, now + MS // 2):  # new rows, then nothing new at a later now
            got = account(job, ideal, at, memo=memo)
            assert result_state(got) == result_state(account(job, ideal, at))
            # the finished attempts folded once (account.live.Prefix), and the records of
            # the disruptions between them kept with them
            assert len(memo.prefix.attempts) == upto
            assert len(memo.prefix.kept["recovery"][1]) == upto - 1
        assert len(got.attempts) == upto + 1 and len(got.recovery) == upto
