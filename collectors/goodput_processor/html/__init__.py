"""The self-contained HTML report: timeline, processes, goodput over time, step times.

``goodput report RUN_DIR --html out.html`` and ``GET /v1/report.html`` of ``goodput serve``
write one HTML file that opens without network access (Plotly's basic bundle, vendored here
as ``plotly-basic.min.js``, and a small script are inlined; see ``docs/html-report.md``).

- :func:`render_html`: jobs' spans -> the page (a string, optionally written out);
- :func:`report_html`: a run directory -> the page, returning the results as
  :func:`~goodput_processor.account.run_dir.report_run_dir` does;
- :func:`live_report_html`: the page of a live :class:`~goodput_processor.serve.store.LiveStore`;
- :func:`~goodput_processor.html.segments.bucket_segments`: the painted timeline itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..read.rows import JobSpans
from ..results.job import JobResult
from .segments import JobSegments, Row, bucket_segments

__all__ = ["JobSegments", "Row", "bucket_segments", "live_report_html", "render_html",
           "report_html"]


def render_html(
    jobs: Iterable[JobSpans | JobSegments],
    out: str | os.PathLike | None = None,
    *,
    ideal_step_time_s: float | None = None,
    now_ns: int | None = None,
    title: str | None = None,
    windows_s=None,
) -> str:
    """The HTML report of ``jobs`` (spans, accounted here, or :class:`JobSegments`).

    Args:
        jobs: one section per job, in this order.
        out: a path to write the page to (UTF-8), or a text stream; None = only return it.
        ideal_step_time_s, now_ns: as for :func:`~goodput_processor.account.accounting.account`.
        title: the page title (default: ``goodput report: <job names>``).
        windows_s: rolling windows (seconds) of the over-time chart (default: two nice
            lengths near 1/20 and 1/5 of each job).

    Returns:
        The page.

    Raises:
        ValueError: bad ``ideal_step_time_s``.
        OSError: ``out`` cannot be written.
    """
    from .page import job_section, page

    segs = [j if isinstance(j, JobSegments) else bucket_segments(j, ideal_step_time_s, now_ns)
            for j in jobs]
    if title is None:
        title = "goodput report: " + ", ".join(s.result.job for s in segs)
    html = page([job_section(i, s, windows_s) for i, s in enumerate(segs)], title)
    if out is not None:
        if hasattr(out, "write"):
            out.write(html)
        else:
            with open(out, "w", encoding="utf-8") as f:
                f.write(html)
    return html


def report_html(
    path: str | os.PathLike,
    out: str | os.PathLike | None,
    ideal_step_time_s: float | None = None,
    now_ns: int | None = None,
    job: str | None = None,
) -> list[JobResult]:
    """Read run directory ``path``, write the HTML report of every job (or only ``job``)
    to ``out``, and return the results (as ``report_run_dir(path, ...)`` would).

    Raises:
        RunDirError, SpoolFormatError, KeyError, ValueError: as
            :func:`~goodput_processor.account.run_dir.report_run_dir`.
        OSError: as :func:`render_html`.
    """
    from ..read.reader import read_run_dir

    spans = read_run_dir(path)
    names = sorted(spans.jobs)
    if job is not None:
        if job not in spans.jobs:
            raise KeyError(f"no job named {job!r} in {spans.path} (jobs: {', '.join(names)})")
        names = [job]
    segs = []
    for name in names:  # skips not tied to a job go to every job, as report_run_dir does
        js = spans.jobs[name]
        js.skipped.update(spans.skipped)
        js.examples.extend(spans.examples[: max(0, 20 - len(js.examples))])
        segs.append(bucket_segments(js, ideal_step_time_s, now_ns))
    render_html(segs, out)
    return [s.result for s in segs]


def live_report_html(store, job: str | None = None, now_ns: int | None = None) -> str:
    """The HTML report of a live ``goodput serve`` store (every job, or only ``job``).

    Raises:
        KeyError: ``job`` has not been seen.
    """
    names = store.jobs()
    if job is not None:
        if job not in names:
            raise KeyError(f"no job named {job!r} (jobs: {', '.join(names) or 'none'})")
        names = [job]
    return render_html([store.snapshot(n) for n in names],
                       ideal_step_time_s=store.ideal_step_time_s, now_ns=now_ns,
                       title="goodput serve (live): " + (", ".join(names) or "no jobs yet"))
