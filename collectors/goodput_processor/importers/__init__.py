"""``goodput import``: convert other tools' goodput logs into goodput spans.

Two log formats are read here (``docs/span-schema.md`` describes the spans written), and
every source of :mod:`.sources` (other tools' own telemetry: ``--from torchtitan``,
``onelogger``, ``megatron-log``, ...; ``docs/sources/``):

- ``mgm``: entries of Google's ``ml-goodput-measurement`` recorder and of the Orbax
  checkpoint logger, exported from Cloud Logging (``gcloud logging read --format=json``,
  log sinks) or mgm's local cache file (:mod:`.mgm`);
- ``resiliency``: the JSON-lines event logs of ``resiliency.goodput_measure``
  (:mod:`.resiliency`).

The spans are written as spool files under ``RUN_DIR/<job>/`` (:mod:`.writer`), so
``goodput report RUN_DIR/<job>`` and every other consumer of spool files reads them like
spans a training job wrote; their resource carries ``goodput.imported_from``::

    from goodput_processor.importers import import_logs

    summary = import_logs(["export.json"], "goodput-runs")
    print(summary.jobs, summary.problems)

Units: input times are POSIX seconds (mgm) or ISO 8601 strings (resiliency); spans hold
integer nanoseconds since the Unix epoch.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import timezone as _timezone
from datetime import tzinfo

from . import mgm, resiliency, sources
from .common import (
    EntryReader,
    InputError,
    LogImportError,
    OutputExistsError,
    Problems,
    check_readable,
    unwrap,
)
from .resiliency_attempts import DEFAULT_DUPLICATE_WINDOW_S
from .writer import SpanWriter

__all__ = ["SOURCES", "ImportSummary", "ImportedJob", "InputError", "LogImportError",
           "OutputExistsError", "detect_source", "import_logs", "source_names"]

#: Accepted ``source`` names -> the ``goodput.imported_from`` value written.
SOURCES = {
    "mgm": "ml-goodput-measurement",
    "ml-goodput-measurement": "ml-goodput-measurement",
    "resiliency": "resiliency",
}
_PEEK_ENTRIES = 200


@dataclass(frozen=True)
class ImportedJob:
    """One job written: its directory and how many attempts, processes, spans, files."""

    run_dir: str
    attempts: int
    processes: int
    spans: int
    files: int


@dataclass
class ImportSummary:
    """The result of :func:`import_logs`.

    ``source`` is ``"ml-goodput-measurement"`` or ``"resiliency"``; ``jobs`` maps each job
    written to an :class:`ImportedJob`; ``entries`` counts the JSON values read;
    ``problems`` counts problems by reason and ``examples`` holds up to 20
    ``"file:line: reason: detail"`` strings; ``duplicates`` counts duplicate resiliency
    lines dropped: identical events, a node's ``job_started`` repeated within the duplicate
    window with nothing in between, and repeated ``job_terminated`` of a node in one
    attempt (the last one kept); not problems.
    """

    source: str
    jobs: dict[str, ImportedJob]
    entries: int
    problems: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    duplicates: int = 0
    files: tuple[str, ...] = ()
    #: what a source inferred rather than read: ``{warning name: count}`` (sources only)
    warnings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """A JSON-serialisable dict of the summary."""
        return {
            "source": self.source,
            "files": list(self.files),
            "entries": self.entries,
            "jobs": {name: vars(j).copy() for name, j in sorted(self.jobs.items())},
            "problems": dict(sorted(self.problems.items())),
            "problem_examples": list(self.examples),
            "duplicates": self.duplicates,
            "warnings": dict(sorted(self.warnings.items())),
        }


def _tz(value) -> tzinfo | None:
    if value is None or isinstance(value, tzinfo):
        return value
    if str(value).upper() in ("UTC", "Z", "GMT"):
        return _timezone.utc
    from zoneinfo import ZoneInfo

    try:
        return ZoneInfo(str(value))
    except (KeyError, ValueError, OSError) as e:  # ZoneInfoNotFoundError is a KeyError
        raise ValueError(f"unknown time zone {value!r} (expected an IANA name such as "
                         "'UTC' or 'Europe/Paris')") from e


def _classify(value) -> str | None:
    payload, logts = unwrap(value)
    if payload is None:
        return None
    if resiliency.is_resiliency_payload(payload, logts):
        return "resiliency"
    if mgm.is_mgm_payload(payload):
        return "mgm"
    return None


def source_names() -> list[str]:
    """Every ``--from`` value: ``mgm``, ``resiliency`` and the names of :mod:`.sources`."""
    return ["mgm", "resiliency", *sorted(sources.all_sources())]


def detect_source(paths) -> str:
    """``"mgm"``, ``"resiliency"`` or a source's name (:mod:`.sources`), from the first
    recognisable entries of each file (a source: its first 64 KiB).

    Raises:
        InputError: a file cannot be read, no file has a recognisable entry among its
            first ones, or the files disagree.
    """
    found: dict[str, str] = {}
    for path in paths:
        check_readable(path)
        reader = EntryReader(path, Problems())
        for n, (value, _line, _element) in enumerate(reader):
            kind = _classify(value)
            if kind is not None:
                found[path] = kind
                break
            if n >= _PEEK_ENTRIES:
                break
    for path in paths:
        if path not in found:
            name = sources.detect_file_source(path)
            if name is not None:
                found[path] = name
    kinds = set(found.values())
    if not kinds:
        raise InputError(f"cannot tell the format of {', '.join(map(str, paths))}: no "
                         "ml-goodput-measurement or resiliency entry among the first "
                         f"{_PEEK_ENTRIES}, and no source recognises it; pass --from "
                         f"(one of: {', '.join(source_names())})")
    if len(kinds) > 1:
        detail = ", ".join(f"{p}: {k}" for p, k in found.items())
        raise InputError(f"the input files are of different formats ({detail}); import "
                         "them separately")
    return kinds.pop()


def import_logs(paths, run_dir, *, source: str = "auto", job: str | None = None,
                timezone="UTC", overwrite: bool = False,
                duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S,
                progress=None) -> ImportSummary:
    """Convert goodput logs into spool files under ``run_dir`` (one directory per job).

    Args:
        paths: input files (str or PathLike): JSON lines or a JSON array.
        run_dir: parent of the job directories written (``run_dir/<job>/``).
        source: ``"auto"`` (detect from the first entries), ``"mgm"`` (alias
            ``"ml-goodput-measurement"``) or ``"resiliency"``.
        job: import only this job; entries that name no job belong to it. None: every
            job of the input.
        timezone: zone of resiliency timestamps without an offset: an IANA name or a
            ``tzinfo`` (default UTC). Not used for mgm (POSIX seconds).
        overwrite: replace spans already in a job's directory instead of refusing.
        duplicate_window_s: resiliency only: a node's ``job_started`` repeated within this
            many seconds of its start, with no checkpoint or termination event of its
            attempt in between, is a duplicate line, not a restart (default 10 s;
            ``docs/migration.md``).
        progress: optional ``callback(phase, advance, total)``: phase ``"read"`` advances in
            bytes of input, ``"write"`` in spans written.

    Returns:
        An :class:`ImportSummary`; problems with the input are counted in it, not raised.

    Raises:
        InputError: an input file is missing, unreadable or empty; its format cannot be
            told; ``job`` is not in it; or nothing could be imported (the message counts
            the problems).
        OutputExistsError: a job directory already holds spans and ``overwrite`` is False
            (nothing is written then).
        ValueError: unknown ``source`` or ``timezone``; ``duplicate_window_s`` < 0.
        OSError: the output cannot be written.
    """
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise InputError("no input file given")
    if source != "auto" and source not in SOURCES and source not in sources.all_sources():
        raise ValueError(f"unknown source {source!r}: --from is auto or one of "
                         f"{', '.join(source_names())}")
    tz = _tz(timezone)
    total = sum(check_readable(p) for p in paths)
    if source == "auto":
        source = detect_source(paths)
    if source not in SOURCES:
        return _import_source(sources.get_source(source), paths, run_dir, job=job,
                              overwrite=overwrite, progress=progress, total=total)
    name = SOURCES[source]
    writer = SpanWriter(run_dir, name, overwrite=overwrite)
    if job is not None:
        writer.check([job])  # fail before the (long) conversion when we can

    read_cb = None
    if progress is not None:
        def read_cb(n, _total=total):
            progress("read", n, _total)

    duplicates = 0
    if name == "resiliency":
        res = resiliency.convert(paths, tz=tz, job=job, duplicate_window_s=duplicate_window_s,
                                 progress=read_cb)
        tables, counts, entries, problems = res.tables, res.process_counts, res.entries, \
            res.problems
        duplicates = res.duplicates
    else:
        res = mgm.convert(paths, job=job, progress=read_cb)
        tables, counts, entries, problems = res.tables, {}, res.entries, res.problems
    if not tables:
        detail = ", ".join(f"{k} {v}" for k, v in sorted(problems.counts.items()))
        first = f"; first: {problems.examples[0]}" if problems.examples else ""
        what = f" for job {job!r}" if job is not None else ""
        raise InputError(f"nothing to import{what} from {', '.join(paths)}: {entries} "
                         f"entr{'y' if entries == 1 else 'ies'} read, no span made "
                         f"({detail or 'no known entry'}){first}")
    writer.check(tables)
    nspans = sum(len(t) for t in tables.values())
    write_cb = None
    if progress is not None:
        def write_cb(n):
            progress("write", n, nspans)

    jobs = {}
    for jname in sorted(list(tables)):
        w = writer.write_job(jname, tables.pop(jname), counts.get(jname), progress=write_cb,
                             release=True)
        jobs[jname] = ImportedJob(w.run_dir, w.attempts, w.processes, w.spans, w.files)
    return ImportSummary(source=name, jobs=jobs, entries=entries,
                         problems=Counter(problems.counts), examples=list(problems.examples),
                         duplicates=duplicates, files=tuple(paths))



def _import_source(src, paths, run_dir, *, job, overwrite, progress, total) -> ImportSummary:
    """``import_logs`` of a :mod:`.sources` source: translate, then write the spool."""
    read_cb = None
    if progress is not None:
        def read_cb(n, _total=total):
            progress("read", n, _total)

    run = sources.translate_files(src, paths, progress=read_cb, job=job)
    problems = run.problems
    if not run.resource_spans:
        detail = ", ".join(f"{k} {v}" for k, v in sorted(problems.counts.items()))
        first = f"; first: {problems.examples[0]}" if problems.examples else ""
        raise InputError(f"nothing to import from {', '.join(paths)} as {src.name}: "
                         f"{run.records} record(s) read, no span made "
                         f"({detail or 'no known record'}){first}")
    written = sources.write_spool(run.resource_spans, run_dir, overwrite=overwrite)
    if progress is not None:
        n = sum(w["spans"] for w in written.values())
        progress("write", n, n)
    jobs = {name: ImportedJob(w["run_dir"], w["attempts"], w["processes"], w["spans"],
                              w["files"]) for name, w in written.items()}
    return ImportSummary(source=src.imported_from, jobs=jobs, entries=run.records,
                         problems=Counter(problems.counts), examples=list(problems.examples),
                         files=tuple(paths), warnings=dict(run.warnings))
