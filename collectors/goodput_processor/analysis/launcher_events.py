"""What a launcher saw of a job's workers: their failures and the rendezvous before each
restart, from ``goodput.launcher_event`` spans (schema 1.3; ``python -m goodput.torchrun``,
NVRx's ft_launcher through its source).

:func:`launcher_failures` gives, per host and worker pid, when and how the launcher saw it
fail (the recovery phases' first failure, :mod:`.recovery`); :func:`launcher_rendezvous`
matches each attempt's start to the rendezvous the launchers ended just before it
(within :data:`LAUNCHER_MATCH_NS`). All times integer ns since the epoch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from goodput import schema

from ..model.memo import data_key, folded
from ..read.rows import (
    C_AUX,
    C_END,
    C_IVAL,
    C_KIND,
    C_SIDX,
    C_START,
    K_LAUNCHER_EVENT,
    NONE,
    JobSpans,
)

__all__ = ["LAUNCHER_MATCH_NS", "launcher_failures", "launcher_rendezvous"]


def _launcher_events(job: JobSpans, memo=None) -> list:
    """``[(process, its goodput.launcher_event rows)]`` for the job's processes with role
    ``launcher`` (their rows only grow at the end: ``memo`` keeps the events of the rows
    read, :func:`~goodput_processor.model.memo.folded`, so a launcher's heartbeats are not read
    again at every poll)."""
    out = []
    for p in job.processes.values():
        if p.run.get(schema.RES_PROCESS_ROLE) != "launcher" or not data_key(p)[0]:
            continue
        out.append((p, folded(memo, "launcher_events", p,
                              lambda d: d[d[:, C_KIND] == K_LAUNCHER_EVENT],
                              lambda x, y: np.concatenate((x, y)))))
    return out


def launcher_failures(job: JobSpans, memo=None) -> dict[tuple[str | None, int], tuple[int, int]]:
    """Workers a launcher saw fail: ``(host, pid) -> (time ns, exit code)``, the first such
    event per worker. Read from ``goodput.launcher_event`` spans of processes with role
    ``launcher`` that name a worker pid and a non-zero exit code (torchelastic's convention:
    negative = killed by that signal). ``memo``: see :func:`_launcher_events`."""
    return _failures(_launcher_events(job, memo))


def _failures(events: list) -> dict[tuple[str | None, int], tuple[int, int]]:
    out: dict[tuple[str | None, int], tuple[int, int]] = {}
    for p, d in events:
        d = d[(d[:, C_IVAL] != NONE) & (d[:, C_AUX] != NONE) & (d[:, C_AUX] != 0)]
        for row in d[np.argsort(d[:, C_END], kind="stable")]:
            out.setdefault((p.host, int(row[C_IVAL])), (int(row[C_END]), int(row[C_AUX])))
    return out


#: The next attempt's start is its processes' ``goodput.process.start_time_unix_nano``, read
#: from ``/proc`` in clock ticks of 10 ms and rounded down, so it can read up to one tick
#: before the process really started; launcher events are stamped on the launcher's wall
#: clock in microseconds. A launcher event that ended before a worker started can
#: therefore end up to one tick after that worker's recorded start (seen: the agent's
#: rendezvous ending 6 ms after it); one more millisecond covers the two clocks the start
#: is computed from (``CLOCK_REALTIME`` and ``CLOCK_BOOTTIME``, read apart).
LAUNCHER_MATCH_NS = 11_000_000


def launcher_rendezvous(job: JobSpans, events: list, starts: Sequence[int]) -> list:
    """The launchers' rendezvous before each attempt: per attempt of ``starts`` (their start
    times, ns since the epoch, in order), the ns covered by launcher rendezvous events
    (name containing ``RENDEZVOUS``, any case) of non-zero length that precede it, or None
    when no such event does.

    An event precedes the first attempt whose start is at or after its end less
    :data:`LAUNCHER_MATCH_NS` (the clocks' resolutions), so each event counts once, for one
    attempt. Zero-length events (torchelastic's ``torchelastic.rendezvous.*`` state
    records) carry no duration and are left out. Events of several launchers (one agent
    per node) count by the union of their intervals: they wait together.
    ``events``: :func:`_launcher_events`.
    """
    found: list[list[tuple[int, int]]] = [[] for _ in starts]
    first = np.asarray(starts, np.int64)
    for _p, d in events:
        d = d[d[:, C_END] > d[:, C_START]]
        for row in d:
            sidx = int(row[C_SIDX])
            name = job.strings[sidx] if 0 <= sidx < len(job.strings) else ""
            if "RENDEZVOUS" not in name.upper():
                continue
            i = int(np.searchsorted(first, int(row[C_END]) - LAUNCHER_MATCH_NS, "left"))
            if i < len(found):
                found[i].append((int(row[C_START]), int(row[C_END])))
    out: list = []
    for ivals in found:
        if not ivals:
            out.append(None)
            continue
        total, reach = 0, None
        for x, y in sorted(ivals):
            if reach is None or x > reach:
                total, reach = total + y - x, y
            elif y > reach:
                total, reach = total + y - reach, y
        out.append(total)
    return out
