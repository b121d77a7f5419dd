"""Sources: the telemetry other tools already emit, read as this project's goodput spans.

Each module here reads one foreign vocabulary (see :mod:`.base` for the contract) and
documents which buckets and recovery phases its input can show, which it cannot, and the
versions it was checked against; ``docs/sources/`` has a page per source. A third party
adds a source with an entry point in the group ``goodput_processor.sources`` whose object
is a :class:`~.base.Source`::

    [project.entry-points."goodput_processor.sources"]
    mytool = "mypackage.goodput_source:SOURCE"

What a source emits goes down the one code path of the project's own spans:
:func:`translate_files` (``goodput import --from NAME``, ``goodput report`` of a directory
of a foreign producer's OTLP JSON) and :func:`translate_otlp` (``goodput serve``).
"""

from __future__ import annotations

import importlib
import logging
from importlib.metadata import entry_points

from .base import Emitter, ForeignLog, ForeignSpan, Source, Translator
from .driver import (
    SourceRun,
    detect_file_source,
    match_otlp,
    translate_files,
    translate_otlp,
    write_spool,
)

__all__ = ["BUILTIN", "ENTRY_POINT_GROUP", "Emitter", "ForeignLog", "ForeignSpan", "Source",
           "SourceRun", "Translator", "all_sources", "detect_file_source", "get_source",
           "match_otlp", "translate_files", "translate_otlp", "write_spool"]

_log = logging.getLogger("goodput_processor.sources")

#: The entry-point group a third-party source registers in.
ENTRY_POINT_GROUP = "goodput_processor.sources"

#: Built-in sources: ``--from`` name -> ``"module:attribute"`` of its :class:`Source`
#: (imported on first use).
BUILTIN: dict[str, str] = {
    "nvrx": ".nvrx:SOURCE",
    "onelogger": ".onelogger:SOURCE",
    "megatron": ".megatron:SOURCE",
    "torchft": ".torchft:SOURCE",
    "torchtitan": ".torchtitan:SOURCE",
    "megatron-log": ".megatron_log:SOURCE",
    "dllogger": ".nemo_log:DLLOGGER_SOURCE",
    "nemo-log": ".nemo_log:SOURCE",
    "maxtext-log": ".maxtext_log:SOURCE",
}

_cache: dict[str, Source] | None = None


def all_sources() -> dict[str, Source]:
    """Every source: the built-in ones, then those of entry points (a third-party source
    with a built-in's name is ignored, with a log line; one that fails to load, built-in
    or not, too).
    ``{name: Source}``."""
    global _cache
    if _cache is not None:
        return _cache
    found: dict[str, Source] = {}
    for name, target in BUILTIN.items():
        mod, _, attr = target.partition(":")
        try:
            found[name] = getattr(importlib.import_module(mod, __name__), attr)
        except Exception as e:  # a broken source never stops the processor
            _log.warning("goodput: built-in source %r (%s) failed to load: %r", name,
                         target, e)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in found:
            _log.warning("goodput: source entry point %r ignored: a built-in source has "
                         "that name", ep.name)
            continue
        try:
            src = ep.load()
        except Exception as e:  # a broken plugin never stops the processor
            _log.warning("goodput: source entry point %r (%s) failed to load: %r",
                         ep.name, ep.value, e)
            continue
        if not isinstance(src, Source):
            _log.warning("goodput: source entry point %r is a %s, not a Source", ep.name,
                         type(src).__name__)
            continue
        found[ep.name] = src
    _cache = found
    return found


def get_source(name: str) -> Source:
    """The source called ``name``.

    Raises:
        ValueError: no such source (the message lists them).
    """
    sources = all_sources()
    if name not in sources:
        raise ValueError(f"unknown source {name!r}; the sources are: "
                         f"{', '.join(sorted(sources))}")
    return sources[name]
