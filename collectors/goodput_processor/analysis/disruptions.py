"""The recovery records of a live job at a poll's cost of its running attempt (issue 40).

A job with hundreds of restarts has hundreds of disruptions. The record of a disruption
(:class:`~goodput_processor.analysis.recovery.Recovery`: the failed attempt ``a``, the
attempt ``r`` that took over) is a pure function of those two attempts (bounds, rows, the
kept steps the accounting made of ``r``'s rows), of the job's launcher events, and of two
job-wide numbers that reach it through ``r``'s warm-up: the ideal step time and the noise
band. Once ``r`` has finished, new rows (which land in the running attempt) change none of
that, so :func:`kept_recovery_report` keeps each such record under exactly those inputs,
and a poll builds one key per disruption, looks it up, and redoes only the records it does
not find (the disruption into the running attempt, or all of them when the ideal step time
moved). The records are the same objects :func:`~.recovery.recovery_report` makes, so the
result equals accounting afresh to the nanosecond (``tests/model/test_incremental.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..model.memo import AccountingMemo, proc_key
from ..read.rows import JobSpans
from .recovery import Recovery, _launcher_events, recovery_report

__all__ = ["job_wide", "kept_recovery_report"]


def _ident(x) -> tuple:
    """What a record reads of one attempt ``x`` (an ``Attempt``) besides its kept steps:
    its number, bounds, declared processes and its processes' identities and rows."""
    return (x.attempt, x.start_ns, x.end_ns, x.declared_process_count,
            tuple((p.index, p.host, p.pid, proc_key(p)) for p in x.processes))


def job_wide(job: JobSpans, result, memo: AccountingMemo | None = None) -> tuple:
    """What every record reads of the whole job: the ideal step time and noise band (through
    the warm-up) and the launcher events (count, last row, host of each launcher)."""
    events = tuple((len(d), d[-1].tobytes() if len(d) else b"", p.host)
                   for p, d in _launcher_events(job, memo))
    return (result.ideal_step_time_s, result.noise_tolerance_s, events)


def kept_recovery_report(job: JobSpans, attempts: Sequence, bounds: Sequence[int | None],
                         resumes: Sequence[int | None], result,
                         wasted_start: Sequence[int],
                         memo: AccountingMemo | None = None,
                         done: Sequence[Recovery] = (),
                         wide: tuple | None = None) -> tuple[Recovery, ...]:
    """:func:`~.recovery.recovery_report` (same arguments, same records), each disruption
    whose attempt that took over is not the last one kept in ``memo`` under its inputs
    (see the module docstring); without a memo, :func:`~.recovery.recovery_report` itself.

    ``done``: the records of the first ``len(done)`` disruptions, made before from the same
    attempts, bounds, resume steps, wasted-region starts and :func:`job_wide` ``wide``
    (the caller keeps them: :mod:`goodput_processor.account.live`); they are not looked
    up again.

    Cost at a poll that finds them: one key per disruption after ``done`` (the two
    attempts' identities, the taking-over attempt's kept-step bound, resume step,
    wasted-region starts and the memo keys of its kept steps, the ideal step time and noise
    band, the launcher events' count and last row), plus the records it redoes.
    """
    n = len(attempts)
    if memo is None or n < 3:
        return recovery_report(job, attempts, bounds, resumes, result, wasted_start, memo)
    job_wide_ = job_wide(job, result, memo) if wide is None else wide
    steps = result.steps
    d0 = len(done)
    ident = {i: _ident(attempts[i]) for i in range(d0, n - 1)}
    keys = [("recovery", ident[i], ident[i + 1], bounds[i + 1], resumes[i + 1], wasted_start[i],
             wasted_start[i + 1], tuple(steps.of_attempt(attempts[i + 1].attempt)[2]),
             job_wide_) for i in range(d0, n - 2)]  # (the last one's r is running: redone)
    out = [memo.peek(k) for k in keys]
    if out.count(None) > 1:  # (the ideal step time moved, or the first poll): all at once
        out = list(recovery_report(job, attempts, bounds, resumes, result, wasted_start, memo))
        for k, rec in zip(keys, out[d0:], strict=False):
            memo.put(k, rec)
        return tuple(out)
    for j, rec in enumerate(out):
        if rec is None:
            out[j] = _one(job, attempts, bounds, resumes, result, wasted_start, memo, d0 + j)
            memo.put(keys[j], out[j])
    out.append(_one(job, attempts, bounds, resumes, result, wasted_start, memo, n - 2))
    return (*done, *out)


def _one(job, attempts, bounds, resumes, result, wasted_start, memo, i: int) -> Recovery:
    """The record of disruption ``i`` (attempt ``i`` followed by ``i + 1``):
    :func:`~.recovery.recovery_report` of those two attempts. The same record as in the
    whole job's report: each reads only its two attempts, and a launcher rendezvous event
    counts for the first attempt that starts after it, which is ``i + 1`` in both."""
    j = slice(i, i + 2)
    return recovery_report(job, attempts[j], bounds[j], resumes[j], result,
                           wasted_start[j], memo)[0]
