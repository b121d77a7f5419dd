"""Another tool's OTLP JSON in a run directory, read through the sources.

``goodput report DIR`` of a directory the OpenTelemetry Collector's file exporter wrote
(a foreign producer's spans or log records, one OTLP JSON request per line) translates
each file on the way in with the source that takes it
(:mod:`goodput_processor.importers.sources`), as ``goodput import --from`` would, and
reads the translated spans as spool lines (:func:`translate_into`); :func:`foreign_files`
tells which files those are. A line's leading spans of a source's usual shape (Megatron-LM's
iteration spans) are read from its text by a template scan
(:mod:`goodput_processor.read.foreign_template`), not parsed. Takes a reader object;
imports nothing of the reader.
"""

from __future__ import annotations

from pathlib import Path

from goodput import schema

from .cache import CACHE_DIR

__all__ = ["foreign_files", "translate_into"]


def foreign_files(root: Path, files: list[Path]) -> dict:
    """The OTLP JSON files under ``root`` that a source of another tool's telemetry takes
    (``*.json``/``*.jsonl``, gzip or not), as ``{source name: [paths]}``; files named like
    the spool (``spans-*``, ``metrics-*``) and the columnar cache are not looked at. Each
    other file costs a read of its first line (at most 64 MiB) or its first 64 KiB."""
    from ..importers.sources import detect_file_source

    try:
        extra = sorted(p for pat in ("*.json", "*.json.gz") for p in root.rglob(pat)
                       if p.is_file())
    except OSError:
        extra = []
    found: dict = {}
    for p in [*files, *extra]:
        if p.name.startswith(("spans-", schema.METRICS_SPOOL_PREFIX)) or (
                CACHE_DIR in p.relative_to(root).parts):
            continue
        try:
            name = detect_file_source(str(p))
        except Exception:  # noqa: BLE001 - unreadable here: the reader reports it
            name = None
        if name is not None:
            found.setdefault(name, []).append(p)
    return found


def translate_into(reader, root: Path, foreign: dict) -> None:
    """Translate each source's files of ``foreign`` (``{name: [paths]}``) and hand the
    goodput spans to ``reader`` (a :class:`goodput_processor.read.reader._Reader`) as spool
    lines, each job marked as read from ``root``; the records a source skipped are counted
    in the reader's skipped records (with up to 20 examples in all)."""
    from ..importers.sources import get_source, translate_files
    from ..importers.sources.driver import no_gc
    from .emitted import ingest_emitted
    from .foreign_template import scan

    def ingest(batches: list) -> None:  # rows straight, as their spool lines give
        for batch in batches:
            job = ingest_emitted(reader, batch, (name, "translated"))
            if job is not None:
                job.run_dirs.add(str(root))

    for name, paths in sorted(foreign.items()):
        with no_gc():  # (see no_gc: the translated spans are read while they are many)
            # each line's spans are read into rows as soon as they are made, not held
            run = translate_files(get_source(name), paths, sink=ingest, scan=scan)
            ingest(run.resource_spans)
            del run.resource_spans[:]
        reader.skipped.update(run.problems.counts)
        reader.examples.extend(run.problems.examples[: max(0, 20 - len(reader.examples))])
