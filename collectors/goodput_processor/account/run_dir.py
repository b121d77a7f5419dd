"""A run directory's report: read it, account every job, keep a finished run's results.

:func:`report_run_dir` is ``goodput report RUN_DIR`` with the default definitions: it reads
the run directory (:func:`~goodput_processor.read.reader.read_run_dir`), accounts each job
(:func:`~goodput_processor.account.accounting.account`, or
:func:`~goodput_processor.account.windows.account_excluding` with exclusions), each in
isolation (a failing job is reported failed), and keeps the results of a finished run
beside the spool (:mod:`goodput_processor.read.result_cache`).
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

from ..read import result_cache
from ..read.reader import read_run_dir
from ..read.rows import as_of
from ..results.job import JobResult
from .accounting import _check_ideal, account, isolated
from .checks import file_warnings
from .windows import account_excluding

_log = logging.getLogger(__name__)

__all__ = ["report_run_dir"]


def report_run_dir(
    path: str | os.PathLike,
    ideal_step_time_s: float | None = None,
    now_ns: int | None = None,
    job: str | None = None,
    *,
    at_ns: int | None = None,
    exclusions_ns=(),
) -> list[JobResult]:
    """Read ``path`` and account every job in it (or only ``job``), sorted by job name.

    Skips that cannot be tied to one job (rare) are added to every job's ``skipped``.
    ``at_ns``: each job as it stood then (:func:`~goodput_processor.read.rows.as_of`; pass
    ``now_ns=at_ns`` too). ``exclusions_ns``: ``(start_ns, end_ns)`` pairs left out
    (:func:`~goodput_processor.account.windows.account_excluding`).

    A job whose accounting raises is reported failed (``error`` set, :func:`isolated`),
    and logged; the other jobs are reported as usual.

    For a finished run (files quiet, no attempt running; with the cache on, ``now_ns``,
    ``at_ns`` and ``exclusions_ns`` not given) the results are kept beside the spool and a
    later call returns them without accounting again
    (:mod:`goodput_processor.read.result_cache`): equal to a new accounting, with read-only
    step arrays mapped from the cache.

    Raises:
        RunDirError, SpoolFormatError: see :func:`~goodput_processor.read.reader.read_run_dir`.
        KeyError: ``job`` is given and not in the run directory (message lists the jobs).
        ValueError: bad ``ideal_step_time_s``.
    """
    _check_ideal(ideal_step_time_s)
    kept = _kept(path, now_ns, at_ns, exclusions_ns, ideal_step_time_s, job)
    if kept is not None and kept[2] is not None:
        return kept[2]
    spans = read_run_dir(path)
    names = sorted(spans.jobs)
    if job is not None:
        if job not in spans.jobs:
            raise KeyError(f"no job named {job!r} in {spans.path} (jobs: {', '.join(names)})")
        names = [job]
    results = []
    skipped_files = tuple(file_warnings(spans.file_problems))
    for name in names:
        js = spans.jobs[name]
        js.skipped.update(spans.skipped)
        js.examples.extend(spans.examples[: max(0, 20 - len(js.examples))])
        if at_ns is not None:
            js = as_of(js, at_ns)
        if exclusions_ns:
            def compute(js=js):
                return account_excluding(js, exclusions_ns, ideal_step_time_s, now_ns)
        else:
            js.own_rows()  # (read here for this one accounting: narrowed, resolved in place)

            def compute(js=js):
                return account(js, ideal_step_time_s, now_ns)
        r = isolated(name, compute, lambda e, n=name: _log.exception(
            "goodput report: accounting job %r failed; it is reported as failed", n))
        results.append(replace(r, warnings=skipped_files + r.warnings) if skipped_files else r)
    if kept is not None:
        result_cache.save(Path(path), kept[0], kept[1], results)
    return results


def _kept(path, now_ns, at_ns, exclusions_ns, ideal_step_time_s, job):
    """:func:`goodput_processor.read.result_cache.lookup` for a report that may keep its
    results (*now* the clock's, no ``at_ns``, no exclusions), else None."""
    if now_ns is not None or at_ns is not None or exclusions_ns:
        return None
    return result_cache.lookup(path, {"definitions": "goodput",
                                      "ideal_step_time_s": ideal_step_time_s, "job": job})
