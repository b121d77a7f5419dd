"""Badput attributed to hosts: which host made the job slow, and which made it restart
(``docs/accounting.md``, "Badput attributed to hosts").

**Slow steps.** ``training_slowdown`` is measured on each attempt's primary process. For every
anomalous kept step, every host process of the attempt that ran the same step number gives
its *arrival*: when it finished its own part of the step and reached the synchronisation
point, i.e. the step span's end minus the ``goodput.collective_wait`` time recorded inside it
(schema 1.3; without such spans, the step's end). In synchronous data-parallel training the
step ends for everyone when the last host arrives, so the step's excess over the ideal step
time is caused by the hosts that arrived after the earliest one. It is split as a waterfall:
with arrivals sorted latest first, ``a1 >= a2 >= ... >= ak``, the stretch ``[a(j+1), a(j)]``
is shared equally by the ``j`` hosts that arrived after ``a(j+1)``; the host that alone
arrived last carries ``a1 - a2``. The blames sum to ``a1 - ak``; when that is more than the
step's excess they are scaled down to it, and what the spread does not explain (a step slow
on every host alike, or hosts whose step spans all end together at the collective because no
collective wait was recorded) stays *unattributed*. An attempt with a single process gets
all of its slowdown.

**Disruptions.** Each disruption (:mod:`.recovery`) is charged to the process that failed
first, with the badput it caused (:attr:`~.recovery.Recovery.lost_ns`), on that failure's
evidence: ``observed`` or ``inferred`` (its last sign of life only), kept apart. The
warm-up excess of the steps after a restart (:func:`~.warmup.warmup`) is part of that,
so it is taken out of those steps' excess before the slowdown is split among hosts.

Each second of badput is charged once: the disruptions' windows do not overlap and hold no
kept step, so in integer ns over all hosts, observed + inferred + unattributed = the job's
badput (:class:`HostCharges`). The table lists hosts by ``badput_s`` = attributed slowdown
+ the badput of the disruptions they caused, observed and inferred apart. Vectorised over
all processes of an attempt (one concatenation, a sort and a few cumulative sums): the
slow steps' split is :mod:`.slow_hosts`; this module charges hosts and makes the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from goodput import schema

from .slow_hosts import slowdown_by_host

__all__ = ["DEFAULT_TOP", "HostBadput", "HostCharges", "host_badput"]

#: Hosts listed in the report and the metric.
DEFAULT_TOP = 10
_NS = 1_000_000_000


@dataclass(frozen=True)
class HostBadput:
    """Badput charged to one host process (seconds): ``slowdown_s`` of
    ``training_slowdown`` attributed to it, ``disruptions_caused`` (it failed first),
    ``badput_s`` = slowdown + the badput of those disruptions (``badput_ns``: the same in
    integer ns). ``evidence``: ``observed`` (the slowdown, and disruptions whose first
    failure was observed: an exception, an end marker, a launcher's event) or ``inferred``
    (disruptions charged on its last sign of life only; no slowdown): a process with both
    has a row of each."""

    host: str | None
    process: int
    slowdown_s: float
    disruptions_caused: int
    badput_s: float
    evidence: str = "observed"
    badput_ns: int = 0




@dataclass(frozen=True)
class HostCharges:
    """Badput charged to host processes (:func:`host_badput`).

    ``observed``: the top host processes by badput charged on observed evidence (the
    slowdown attributed to them, and the disruptions they failed first in with an observed
    failure), most first; ``inferred``: the top by the disruptions charged to them on their
    last sign of life only (:attr:`.recovery.FirstFailure.evidence` ``inferred``), apart.
    ``slowdown_unattributed_s``: training slowdown no host's arrival explains. The four ns
    sums are over all host processes, not only the top: ``total_badput_ns`` (the job's
    badput: total less productive) = ``observed_ns`` + ``inferred_ns`` + ``unattributed_ns``
    exactly; ``unattributed_ns`` (>= 0) is the badput charged to no host: the unattributed
    slowdown and everything outside the disruptions (start-up of the first attempt,
    checkpoints, data loading, ...).
    """

    observed: tuple[HostBadput, ...] = ()
    inferred: tuple[HostBadput, ...] = ()
    slowdown_unattributed_s: float = 0.0
    total_badput_ns: int = 0
    observed_ns: int = 0
    inferred_ns: int = 0
    unattributed_ns: int = 0


def host_badput(attempts: Sequence, result, recoveries: Sequence = (),
                top: int = DEFAULT_TOP, memo=None) -> HostCharges:
    """The hosts that caused the most badput, on observed and on inferred evidence, apart.

    Args:
        attempts: the job's attempts (:func:`~goodput_processor.model.attempts.build_attempts`).
        result: its :class:`~goodput_processor.results.job.JobResult` (its buckets: the job's
            badput is ``total_ns`` less the productive bucket).
        recoveries: its :class:`~goodput_processor.analysis.recovery.Recovery` records (their
            windows do not overlap, so each ns of badput is charged once).
        top: how many hosts to list in each group (>= 1), most badput first (ties: lower
            rank first).
        memo: an :class:`~goodput_processor.model.memo.AccountingMemo` (see
            :func:`slowdown_by_host`).

    Returns:
        :class:`HostCharges`; hosts with no badput are left out. All sums are in integer
        ns, so that hosts plus unattributed equal the job's badput to the nanosecond.

    Raises:
        ValueError: ``top`` < 1.
    """
    if top < 1:
        raise ValueError(f"top must be >= 1, got {top!r}")
    slow, unattributed = slowdown_by_host(attempts, result, memo)
    caused: dict[tuple, list] = {}
    for rec in recoveries:
        f = rec.first_failure
        if f.process is None:  # no process showed a failure: charged to no host
            continue
        key = (f.host, f.process, getattr(f, "evidence", "observed"))
        c = caused.setdefault(key, [0, 0])
        c[0] += 1
        c[1] += rec.lost_ns
    groups: dict[str, list] = {"observed": [], "inferred": []}
    for host, proc in {k[:2] for k in caused} | set(slow):
        s = slow.get((host, proc), 0)
        for ev in ("observed", "inferred"):
            n, lost = caused.get((host, proc, ev), (0, 0))
            s_ev = s if ev == "observed" else 0
            if s_ev > 0 or n:
                groups[ev].append(HostBadput(host, int(proc), s_ev / _NS, n,
                                             (s_ev + lost) / _NS, ev, s_ev + lost))
    for rows in groups.values():
        rows.sort(key=lambda h: (-h.badput_ns, h.process, h.host or ""))
    obs = sum(h.badput_ns for h in groups["observed"])
    inf = sum(h.badput_ns for h in groups["inferred"])
    total = int(result.total_ns) - int(result.buckets_ns.get(schema.PRODUCTIVE, 0))
    return HostCharges(tuple(groups["observed"][:top]), tuple(groups["inferred"][:top]),
                       unattributed / _NS, total, obs, inf, total - obs - inf)
