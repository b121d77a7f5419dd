"""What a live job's accounting keeps of its finished attempts between polls (issue 40).

A live job grows at its end: new rows land in the running (last) attempt, and a finished
attempt's contribution to the accounting (its painted buckets, kept steps, resume step,
row of the result, the recovery records of the disruptions between finished attempts, its
warnings, its straggler runs) is a pure function of that attempt, its kept-step bound (the
lowest resume step of the attempts after it) and the bucket levels. A :class:`Prefix` is
that contribution of the job's finished attempts, folded once, when they finish, into the
running totals of an accounting (:class:`~.painting._Acc`) and the lists the analyses
combine; a poll starts from it and accounts only the attempts after it (the running one,
and any that finished since).

The prefix is valid for a poll's attempts ``attempts[:k]`` when they are the very
:class:`~goodput_processor.model.attempts.Attempt` objects it folded (the model hands out
the same object for an attempt whose rows and bounds are unchanged), with the same bounds,
resume steps, bucket levels and segment keeping: :func:`valid_length` finds the longest
such ``k``. A new attempt with a lower resume step lowers the bounds of the attempts
before it, a late process of a finished attempt makes a new Attempt object: the prefix is
cut there, and the rest is accounted as afresh. The result is the same, to the nanosecond,
as accounting the job afresh (``tests/account/test_live_prefix.py`` and the incremental
properties).

One :class:`Prefix` is kept per job, on the job's
:class:`~goodput_processor.model.memo.AccountingMemo` (``memo.prefix``), by this module
only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..analysis.elastic import marker_rows as _marker_rows
from ..analysis.stragglers import fold_parts
from ..model.packed import PackedProcessSpans
from .checks import fold_attempts

__all__ = ["Prefix", "keep_records", "kept_records", "marker_rows", "packed", "restore",
           "run_attributes", "same_attempts", "snapshot", "stragglers_done", "valid_length",
           "warnings_done"]


@dataclass
class Prefix:
    """The folded contribution of a job's first ``len(attempts)`` attempts, all finished.

    ``attempts``: the Attempt objects (identity names them); ``resume``, ``bounds``: their
    resume steps and kept-step bounds; ``types``: per attempt, the custom badput types of
    its primary; ``names``: the bucket levels they were painted with; ``seg``: whether
    segments were kept; ``acc``: :func:`snapshot` of the running totals after them (one
    part per attempt); ``rows``: their :class:`~goodput_processor.results.job.AttemptResult`
    rows; ``kept``: what analyses keep of these attempts, by name (each entry with the
    other inputs it was made from)."""

    attempts: tuple
    resume: list
    bounds: list
    types: list
    names: tuple
    seg: bool
    acc: tuple
    rows: list
    kept: dict = field(default_factory=dict)


def valid_length(prefix: Prefix | None, attempts: list, resume: list, bounds: list,
                 names: tuple, seg: bool) -> int:
    """How many of ``attempts`` (with their ``resume`` steps and ``bounds``) the
    ``prefix`` holds as they are: the same Attempt objects, resume steps and bounds, the
    same bucket levels ``names`` and segment keeping ``seg``; 0 without a prefix."""
    if prefix is None or prefix.names != names or prefix.seg != seg:
        return 0
    k = 0
    for a, b, r, br, rr in zip(prefix.attempts, attempts, prefix.bounds, bounds,
                               resume, strict=False):
        if a is not b or r != br or prefix.resume[k] != rr:
            break
        k += 1
    return k


def same_attempts(prefix: Prefix | None, attempts: list) -> int:
    """How many leading ``attempts`` are the prefix's Attempt objects."""
    if prefix is None:
        return 0
    k = 0
    for a, b in zip(prefix.attempts, attempts, strict=False):
        if a is not b:
            break
        k += 1
    return k


def packed(attempts) -> bool:
    """Whether a process of ``attempts`` has rows ``goodput serve`` packed
    (:class:`~goodput_processor.model.packed.PackedProcessSpans`): such attempts are made
    anew at each poll (a kept copy would keep their rows once read), so no prefix is kept
    of them."""
    return any(isinstance(p, PackedProcessSpans) for a in attempts for p in a.processes)


def snapshot(acc) -> tuple:
    """The running totals of ``acc`` (a :class:`~.painting._Acc`), copied: what the
    attempts added so far contributed."""
    return (acc._ns.copy(), dict(acc.async_ns), acc.elastic, list(acc.kept),
            list(acc.wasted_start), list(acc.part_keys), list(acc.parts),
            None if acc.segments is None else list(acc.segments), acc._kept_before,
            acc.attempt_index)


def restore(acc, prefix: Prefix, k: int) -> int:
    """Set ``acc``'s running totals (a fresh :class:`~.painting._Acc`) to those of the
    prefix's first ``k`` attempts; returns how many it set (``k``, or 0 where the parts
    after ``k`` cannot be taken out exactly: elastic or asynchronous work in them; then
    ``acc`` is left fresh). The snapshot stays as it is."""
    ns, async_ns, elastic, kept, ws, keys, parts, segments, before, index = prefix.acc
    if index != len(prefix.attempts) or len(parts) != index:  # pragma: no cover - a bug
        return 0
    drop = parts[k:]
    if any(p[1] or p[2] for p in drop):
        return 0
    ns = ns.copy()
    for p in drop:
        ns -= p[0]
        before -= len(p[3][0])
    np.copyto(acc._ns, ns)
    acc.async_ns = dict(async_ns)
    acc.elastic = elastic if not drop else any(p[2] for p in parts[:k])
    acc.kept = kept[:k]
    acc.wasted_start = ws[:k]
    acc.part_keys = keys[:k]
    acc.parts = parts[:k]
    acc.segments = None if segments is None else segments[:k]
    acc._kept_before = before
    acc.attempt_index = k
    return k


# --- what the analyses keep of the prefix (in Prefix.kept, each valid for a prefix of it)


def warnings_done(prefix: Prefix | None, attempts: list, memo=None) -> tuple | None:
    """:func:`~.checks.fold_attempts` of the prefix's attempts (the first of ``attempts``),
    extended from what the prefix kept and kept again; None without a prefix."""
    if prefix is None:
        return None
    p = len(prefix.attempts)
    got = prefix.kept.get("warnings")
    if got is None or got[5][4] < p:
        got = fold_attempts(attempts[:p], len(attempts), got, memo)
        prefix.kept["warnings"] = got
    return got


def kept_records(prefix: Prefix | None, wide) -> tuple:
    """The recovery records of the disruptions between the prefix's attempts the prefix
    kept, made with the same job-wide inputs ``wide``
    (:func:`~goodput_processor.analysis.disruptions.job_wide`); () if none."""
    got = None if prefix is None else prefix.kept.get("recovery")
    return got[1] if got is not None and got[0] == wide else ()


def keep_records(prefix: Prefix | None, wide, records) -> None:
    """Keep the records of the disruptions between the prefix's attempts (the first
    ``len(prefix.attempts) - 1`` of a job's ``records``), made with ``wide``."""
    if prefix is not None and records:
        prefix.kept["recovery"] = (wide, tuple(records[: len(prefix.attempts) - 1]))


def marker_rows(prefix: Prefix | None, job, attempts: list, memo=None) -> list:
    """:func:`~goodput_processor.analysis.elastic.marker_rows` of every process of
    ``attempts``, the prefix's attempts' kept."""
    p = 0 if prefix is None else len(prefix.attempts)
    got = None if prefix is None else prefix.kept.get("slices")
    if p and (got is None or got[0] < p):
        start, done = (0, []) if got is None else got
        got = (p, done + _marker_rows(job, [x for a in attempts[start:p]
                                            for x in a.processes], memo))
        prefix.kept["slices"] = got
    head = got[1] if p else []
    return head + _marker_rows(job, [x for a in attempts[p:] for x in a.processes], memo)


def run_attributes(prefix: Prefix | None, attempts: list, fold) -> dict:
    """``fold(attempts)``, the ML run's resource attributes
    (:func:`~.accounting._run_attributes`), from those of the prefix's attempts, kept."""
    p = 0 if prefix is None else len(prefix.attempts)
    if not p:
        return fold(attempts)
    got = prefix.kept.get("run")
    if got is None or got[0] < p:
        got = (p, fold(attempts[got[0] if got else 0:p], dict(got[1]) if got else None))
        prefix.kept["run"] = got
    return fold(attempts[p:], dict(got[1]))


def stragglers_done(prefix: Prefix | None, attempts: list, memo=None) -> tuple | None:
    """:func:`~goodput_processor.analysis.stragglers.fold_parts` of the prefix's attempts,
    extended from what the prefix kept and kept again; None without a prefix."""
    if prefix is None:
        return None
    p = len(prefix.attempts)
    got = prefix.kept.get("stragglers")
    if got is None or got[0] < p:
        got = fold_parts(attempts[:p], prefix.bounds, memo, got)
        prefix.kept["stragglers"] = got
    return got
