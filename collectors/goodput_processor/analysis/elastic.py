"""Slice counts of elastic training jobs, and the slice efficiencies computed from them.

A job trained elastically (Pathways, MaxText's ``elastic_utils``) records its slice counts
as ``goodput.elastic_slices`` markers (``docs/span-schema.md``): how many slices were
stepping (running the training), available (healthy) and in the job (total). From them:

- **stepping slice efficiency**: time-weighted mean of stepping / total;
- **available slice efficiency**: time-weighted mean of available / total.

Both are fractions in [0, 1]. Formula: ml-goodput-measurement 0.2.3
``ElasticGoodputCalculator._compute_time_weighted_efficiency``: the counts hold from one
record to the next; a total below 1 counts as 1. Two variants differ in what the time
before the first record counts as:

- this project (:func:`slice_efficiency`, ``mgm=False``): it is not known, so it is left
  out: the mean runs over ``[max(start, first record), end)``;
- mgm (``mgm=True``): the counts of the last record at or before ``start`` hold from
  ``start``; without one, the time before the first record counts as 0 % in a mean over
  the whole ``[start, end)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.memo import cached, proc_key
from ..model.summaries import elastic_markers
from ..read.rows import C_AUX, C_IVAL, C_SIDX, C_START, NONE, JobSpans

__all__ = ["SliceEfficiency", "marker_rows", "records_of", "slice_efficiency", "slice_records"]


@dataclass(frozen=True)
class SliceEfficiency:
    """Time-weighted slice efficiencies of a job or an interval (fractions in [0, 1]).

    ``stepping``: mean of stepping (active) slices / total slices; ``available``: mean of
    available slices / total slices.
    """

    stepping: float
    available: float

    def to_json_dict(self) -> dict:
        """``{"stepping": float, "available": float}``."""
        return {"stepping": self.stepping, "available": self.available}


def _count(v: int) -> int:
    return 0 if v == NONE else int(v)


def slice_records(job: JobSpans, processes=None, memo=None) -> np.ndarray:
    """The job's slice-count records, as an ``(n, 4)`` int64 array of ``(time ns, stepping,
    available, total)`` rows sorted by time (ties in the order read), from the
    ``goodput.elastic_slices`` markers of ``processes`` (default every process of the job;
    a record written by several processes at the same time and with the same counts is
    kept once). An absent count is 0; ``total`` is at least 1. ``memo``: an
    :class:`~goodput_processor.model.memo.AccountingMemo` keeping each process's markers.
    """
    rows = marker_rows(job, job.processes.values() if processes is None else processes,
                       memo)
    return records_of(rows)


def marker_rows(job: JobSpans, processes, memo=None) -> list[tuple]:
    """The ``goodput.elastic_slices`` markers of ``processes`` as ``(time ns, stepping,
    available, total)`` tuples, in the processes' order (:func:`slice_records` before its
    sort; those of a list of processes are those of its parts, concatenated)."""
    rows = []
    for p in processes:
        for r in cached(memo, ("slices", proc_key(p)), lambda p=p: elastic_markers(p, memo)):
            sidx = int(r[C_SIDX])
            try:
                available = int(job.strings[sidx]) if sidx >= 0 else 0
            except ValueError:  # a non-numeric "available" attribute: unknown
                available = 0
            rows.append((int(r[C_START]), _count(r[C_IVAL]), available,
                         max(_count(r[C_AUX]), 1)))
    return rows


def records_of(rows: list[tuple]) -> np.ndarray:
    """:func:`slice_records` of its :func:`marker_rows`."""
    if not rows:
        return np.zeros((0, 4), np.int64)
    out = np.array(rows, np.int64)
    out = out[np.argsort(out[:, 0], kind="stable")]
    _, first = np.unique(out, axis=0, return_index=True)
    return out[np.sort(first)]


def slice_efficiency(records: np.ndarray, start_ns: int, end_ns: int,
                     mgm: bool = False) -> SliceEfficiency | None:
    """Stepping and available slice efficiency over ``[start_ns, end_ns)`` (module
    docstring), or None when there is no record or the interval is empty (and, without
    ``mgm``, when no record holds within it; mgm's variant gives 0 and 0 then).

    Args:
        records: :func:`slice_records`'s array.
        start_ns, end_ns: the interval, ns since the epoch.
        mgm: ml-goodput-measurement 0.2.3's variant (the time before the first record
            counts as 0 % unless a record at or before ``start_ns`` seeds it).
    """
    if not len(records):
        return None
    if end_ns <= start_ns:
        return SliceEfficiency(0.0, 0.0) if mgm else None
    t = records[:, 0]
    before = np.flatnonzero(t <= start_ns)
    inside = records[(t > start_ns) & (t < end_ns)]
    timeline = []
    if len(before):
        timeline.append((start_ns, *records[before[-1], 1:]))
    timeline += [tuple(r) for r in inside]
    if not timeline:  # mgm: records, but none that holds within the interval: 0 and 0
        return SliceEfficiency(0.0, 0.0) if mgm else None
    lo = start_ns if mgm else timeline[0][0]
    span = end_ns - lo
    if span <= 0:
        return None
    stepping = available = 0.0
    for i, (ts, act, avail, total) in enumerate(timeline):
        nxt = timeline[i + 1][0] if i + 1 < len(timeline) else end_ns
        stepping += act / total * (nxt - ts)
        available += avail / total * (nxt - ts)
    return SliceEfficiency(float(stepping / span), float(available / span))
