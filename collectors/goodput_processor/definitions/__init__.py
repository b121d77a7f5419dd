"""Other tools' goodput definitions, computed on this project's timeline.

``goodput report RUN_DIR --definitions NAME`` picks one (``docs/definitions.md`` compares
them on the same examples):

- ``goodput`` (default): this project's model (:mod:`goodput_processor.account.accounting`);
- ``mgm``: Google's ``ml-goodput-measurement`` 0.2.3 (:mod:`.mgm`);
- ``resiliency``: ``resiliency.goodput_measure``'s calculator (:mod:`.resiliency`);
- ``ettr``: Meta's effective training time ratio and ETT% (:mod:`.ettr`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFINITIONS", "REPORT_SCHEMA", "NoResult", "render", "report", "to_json",
           "write_json"]

#: Names accepted by ``--definitions``; the first is the default.
DEFINITIONS = ("goodput", "mgm", "resiliency", "ettr")
#: ``schema`` of the JSON output for the ``mgm``, ``resiliency`` and ``ettr`` definitions.
REPORT_SCHEMA = "goodput.definitions/1"


@dataclass(frozen=True)
class NoResult:
    """A job the chosen definitions give no number for, and why (e.g. mgm 0.2.3 raises
    "productive training time is invalid" where its rules make no sense of the log)."""

    job: str
    definitions: str
    reason: str

    def to_json_dict(self) -> dict:
        """``{"job": ..., "definitions": ..., "error": reason}``."""
        return {"job": self.job, "definitions": self.definitions, "error": self.reason}


def report(
    path: str | os.PathLike,
    definitions: str = "goodput",
    ideal_step_time_s: float | None = None,
    now_ns: int | None = None,
    job: str | None = None,
    *,
    at_ns: int | None = None,
    exclusions_ns=(),
) -> list:
    """Results of every job in run directory ``path`` (or only ``job``) under ``definitions``.

    ``at_ns`` (ns since the epoch): account each job as it stood then (``goodput report
    --at``): spans after it are left out, those in flight at it end there
    (:func:`~goodput_processor.read.rows.as_of`), and *now* is ``at_ns`` (``now_ns`` wins when
    both are given); under ``mgm`` a job with no job end by then is measured up to ``at_ns``,
    as mgm's calculator queried at that moment does. ``exclusions_ns``: ``(start_ns, end_ns)``
    pairs to leave out (``goodput report --exclude``): this project's semantics
    (:func:`~goodput_processor.account.windows.account_excluding`) or mgm's
    ``get_job_goodput_with_exclusions`` (:mod:`.mgm_exclusion`).

    Returns a list sorted by job name of :class:`~goodput_processor.results.job.JobResult`
    (``goodput``), :class:`.mgm.MgmResult` (``mgm``; ``ideal_step_time_s`` is its configured
    ideal step time) or :class:`.resiliency.ResiliencyResult` (``resiliency``;
    ``ideal_step_time_s`` is the reference step time and is required) or
    :class:`.ettr.EttrResult` (``ettr``). A job for which mgm's
    rules raise (as its calculator would) is a :class:`NoResult` with the reason.

    Raises:
        ValueError: unknown ``definitions`` (the message lists the names), bad or (for
            ``resiliency``) missing ``ideal_step_time_s``, exclusions with ``resiliency``
            (which has no such notion), an exclusion whose end is not after its start.
        KeyError: ``job`` is not in the run directory.
        ReadError: see :func:`~goodput_processor.read.reader.read_run_dir`.
    """
    if definitions not in DEFINITIONS:
        raise ValueError(
            f"unknown definitions {definitions!r}; choose one of {', '.join(DEFINITIONS)}"
        )
    exclusions_ns = [(int(a), int(b)) for a, b in exclusions_ns]
    for a, b in exclusions_ns:
        if b <= a:
            raise ValueError(f"exclusion [{a}, {b}] ns: its end is not after its start")
    if exclusions_ns and definitions in ("resiliency", "ettr"):
        raise ValueError(f"exclusions are not defined for --definitions {definitions}")
    if now_ns is None:
        now_ns = at_ns
    if definitions == "goodput":
        from ..account.run_dir import report_run_dir

        return report_run_dir(path, ideal_step_time_s=ideal_step_time_s, now_ns=now_ns, job=job,
                              at_ns=at_ns, exclusions_ns=exclusions_ns)
    from ..read.reader import read_run_dir
    from ..read.rows import as_of

    if definitions == "resiliency":
        from .resiliency import account_resiliency

        def one(js):
            return account_resiliency(js, ideal_step_time_s, now_ns=now_ns)
    elif definitions == "ettr":
        from .ettr import account_ettr

        def one(js):
            return account_ettr(js, ideal_step_time_s, now_ns=now_ns)
    else:
        from .mgm import account_mgm
        from .mgm_exclusion import account_mgm_excluding

        def one(js):
            try:
                if exclusions_ns:
                    return account_mgm_excluding(js, exclusions_ns, now_ns=now_ns,
                                                 ideal_step_time_s=ideal_step_time_s)
                return account_mgm(js, now_ns=now_ns, ideal_step_time_s=ideal_step_time_s)
            except ValueError as e:  # mgm's own "cannot compute" cases
                return NoResult(js.name, "mgm", str(e))

    from ..read import result_cache

    kept = None
    if definitions == "mgm" and now_ns is None and not exclusions_ns:
        kept = result_cache.lookup(path, {"definitions": "mgm",
                                          "ideal_step_time_s": ideal_step_time_s, "job": job})
        if kept is not None and kept[2] is not None:
            return kept[2]
    spans = read_run_dir(path)
    names = sorted(spans.jobs)
    if job is not None:
        if job not in spans.jobs:
            raise KeyError(f"no job named {job!r} in {spans.path} (jobs: {', '.join(names)})")
        names = [job]
    out = []
    for n in names:
        js = spans.jobs[n] if at_ns is None else as_of(spans.jobs[n], at_ns)
        if definitions == "mgm" and not exclusions_ns:  # (read here for this one
            js.own_rows()  # accounting: narrowed, its open records resolved in place)
        out.append(one(js))
    if kept is not None:
        result_cache.save(Path(path), kept[0], kept[1], out)
    return out


def to_json(definitions: str, results: Sequence, indent: int | None = 2) -> str:
    """The JSON form of :func:`report`'s results (``goodput.report/1`` for ``goodput``,
    else ``{"schema": "goodput.definitions/1", "definitions": ..., "jobs": [...]}``)."""
    if definitions == "goodput":
        from ..results.report_json import to_json as report_json

        return report_json(results, indent=indent)
    doc = {"schema": REPORT_SCHEMA, "definitions": definitions,
           "jobs": [r.to_json_dict() for r in results]}
    from ..results.report_json import dumps

    return dumps(doc, indent)


#: Step deviations per piece of :func:`write_json`.
PIECE = 1 << 16


def write_json(definitions: str, results: Sequence, out, indent: int | None = 2) -> None:
    """Write :func:`to_json`'s text and a newline to ``out`` (a text stream). The same
    text; under ``mgm`` each job's step deviation (an entry per step) is made and written
    :data:`PIECE` entries at a time, not as one dict of every step (about 120 bytes a step
    before the text)."""
    if definitions != "mgm":
        out.write(to_json(definitions, results, indent) + "\n")
        return
    import uuid

    from ..results.report_json import dumps

    mark = f"goodput-step-deviation-{uuid.uuid4().hex}-"
    jobs, deviations = [], []
    for r in results:
        if isinstance(r, NoResult):
            jobs.append(r.to_json_dict())
            continue
        jobs.append(r.to_json_dict(step_deviation=False))
        jobs[-1]["step_deviation_s"] = f"{mark}{len(deviations)}"
        deviations.append(r.step_deviation_s)
    text = dumps({"schema": REPORT_SCHEMA, "definitions": definitions, "jobs": jobs}, indent)
    for i, dev in enumerate(deviations):
        before, text = text.split(f'"{mark}{i}"', 1)
        out.write(before)
        _write_mapping(out, dev, indent, dumps)
    out.write(text + "\n")


def _write_mapping(out, deviation, indent: int | None, dumps) -> None:
    """``deviation`` (step number -> seconds) as :func:`to_json` writes it inside a job of
    the ``jobs`` list (entries at depth 4), a piece at a time."""
    if not len(deviation):
        out.write("{}")
        return
    out.write("{")
    for n, piece in enumerate(_pieces(deviation)):
        inner = dumps(piece, indent)[1:-1]  # the entries, without the braces
        if indent:  # at depth 4 instead of 1; the piece's own closing newline dropped
            inner = inner[:-1].replace("\n" + " " * indent, "\n" + " " * (4 * indent))
        out.write(("," if n else "") + inner)
    out.write("\n" + " " * (3 * indent) + "}" if indent else "}")


def _pieces(deviation):
    """``deviation`` with string keys, :data:`PIECE` entries per dict, in order."""
    if hasattr(deviation, "str_keyed"):  # (.mgm_steps.Deviation: from its arrays)
        for a in range(0, len(deviation), PIECE):
            yield deviation.str_keyed(a, a + PIECE)
        return
    piece = {}
    for k, v in deviation.items():
        piece[str(k)] = v
        if len(piece) == PIECE:
            yield piece
            piece = {}
    if piece:
        yield piece


def render(definitions: str, results: Sequence, console=None) -> None:
    """Print :func:`report`'s results as tables to ``console`` (default stdout)."""
    from ..results.table import render_table
    from ..terminal import make_console

    console = console or make_console()
    if definitions == "goodput":
        render_table(results, console)
        return
    for r in results:
        if isinstance(r, NoResult):
            console.print(f"Job {r.job}: no {r.definitions} result: {r.reason}",
                          style="yellow", markup=False)
    results = [r for r in results if not isinstance(r, NoResult)]
    if definitions == "resiliency":
        from .resiliency import render_resiliency

        render_resiliency(results, console)
    elif definitions == "ettr":
        from .ettr import render_ettr

        render_ettr(results, console)
    elif results:
        from .mgm import render_mgm

        render_mgm(results, console)
