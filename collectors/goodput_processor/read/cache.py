"""A columnar cache of a run directory's spans, beside the spool: the second report of a
finished run reads arrays, not JSON.

``read_run_dir`` parses every OTLP JSON line of a run directory into int64 span rows
(:data:`~goodput_processor.read.rows.COLUMNS`). For a run that no longer changes, this module
keeps those rows in ``RUN_DIR/.goodput-cache/`` (one ``.npy`` of every process's rows and
an ``index.json`` of the rest of the :class:`~goodput_processor.read.rows.SpanSet`) and gives
them back while the cache is still valid:

- **valid** when the span files are the same paths with the same sizes and modification
  times (ns), and the reader's code is the same (a hash of its ``read*.py`` modules and
  ``timeline.py`` is part of the key, so a new version never reads an old cache);
- **written** only for a quiet run: every span file unmodified for :data:`QUIET_S` seconds
  (a live run's files change at every flush; caching them would cost a write per report);
- **never in the way**: an unwritable directory, a full disk or a damaged cache is
  silently a cache miss (the report reads the spool as without it). Nothing is pickled:
  arrays load with ``allow_pickle=False``, the rest is JSON.

Turn it off with ``goodput report --no-cache`` or ``GOODPUT_REPORT_CACHE=0``. The same
directory keeps a finished run's report results (:mod:`goodput_processor.read.result_cache`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from . import rows as tl
from .rows import JobSpans, ProcessSpans, SpanSet

__all__ = ["CACHE_DIR", "QUIET_S", "enabled", "load", "save"]

_log = logging.getLogger(__name__)
CACHE_DIR = ".goodput-cache"
#: A run is cached once none of its span files changed for this many seconds.
QUIET_S = 30.0
_FORMAT = 1
_PROC_FIELDS = ("attempt", "index", "host", "process_count", "schema_version", "run",
                "instance", "pid", "process_start_ns", "attempt_source", "index_source")


def enabled(explicit: bool | None = None) -> bool:
    """Whether to use the cache: ``explicit``, else ``GOODPUT_REPORT_CACHE`` (``0`` = off)."""
    if explicit is not None:
        return explicit
    return os.environ.get("GOODPUT_REPORT_CACHE", "1").strip().lower() not in ("0", "false",
                                                                           "no", "off")


def _code_key() -> str:
    h = hashlib.sha256(str(_FORMAT).encode())
    here = Path(__file__).parent  # read/: the reader's modules and the row layout, and
    # the sources that translate other tools' files on the way in (importers/sources)
    mods = sorted(here.glob("*.py")) + sorted(
        (here.parent / "importers" / "sources").glob("*.py"))
    for mod in mods:
        h.update(mod.read_bytes())
    return h.hexdigest()[:16]


def _stats(root: Path, files: list[Path]) -> list[list]:
    out = []
    for p in files:
        st = p.stat()
        out.append([str(p.relative_to(root)), st.st_size, st.st_mtime_ns])
    return out


def load(root: Path, files: list[Path]) -> SpanSet | None:
    """The cached :class:`SpanSet` of ``root`` if it is valid for ``files``, else None."""
    d = root / CACHE_DIR
    try:
        index = json.loads((d / "index.json").read_text(encoding="utf-8"))
        if index.get("key") != _code_key() or index.get("files") != _stats(root, files):
            return None
        rows = np.load(d / index["rows"], allow_pickle=False)
        if rows.ndim != 2 or rows.shape[1] != tl.NCOLS or rows.dtype != np.int64:
            return None
        strings = index["strings"]
        jobs = {}
        for j in index["jobs"]:
            job = JobSpans(j["name"], skipped=Counter(j["skipped"]), examples=j["examples"],
                           strings=strings, schema_versions=set(j["schema_versions"]),
                           over_limit=Counter(j["over_limit"]),
                           run_dirs={str(root / x) for x in j.get("run_dirs", ())})
            for p in j["processes"]:
                meta = dict(zip(_PROC_FIELDS, p["fields"], strict=True))
                proc = ProcessSpans(j["name"], **meta)
                proc.data = rows[p["rows"][0] : p["rows"][1]]
                job.processes[(proc.attempt, proc.index, proc.instance)] = proc
            jobs[j["name"]] = job
        problems = [(str(root / x[0]), x[1], x[2]) for x in index["file_problems"]]
        return SpanSet(str(root), jobs, Counter(index["skipped"]), index["examples"],
                       strings, len(files), problems)
    except (OSError, ValueError, KeyError, TypeError) as e:
        if not isinstance(e, FileNotFoundError):
            _log.debug("goodput: report cache of %s not used: %s", root, e)
        return None


def save(root: Path, files: list[Path], spans: SpanSet, now_s: float | None = None) -> bool:
    """Write the cache of ``spans`` (read from ``files``) if the run is quiet; True if
    written. Never raises."""
    try:
        stats = _stats(root, files)
        now_s = time.time() if now_s is None else now_s
        if any(now_s - mtime / 1e9 < QUIET_S for _, _, mtime in stats):
            return False
        d = root / CACHE_DIR
        d.mkdir(exist_ok=True)
        parts, jobs, at = [], [], 0
        for name in sorted(spans.jobs):
            job = spans.jobs[name]
            procs = []
            for p in job.processes.values():
                parts.append(p.data)
                procs.append({"fields": [getattr(p, f) for f in _PROC_FIELDS],
                              "rows": [at, at + len(p.data)]})
                at += len(p.data)
            jobs.append({"name": name, "skipped": dict(job.skipped),
                         "examples": list(job.examples),
                         "schema_versions": sorted(job.schema_versions),
                         "over_limit": dict(job.over_limit), "processes": procs,
                         "run_dirs": sorted(os.path.relpath(x, root) for x in job.run_dirs)})
        fd, tmp = tempfile.mkstemp(prefix="rows-", suffix=".npy", dir=d)
        with os.fdopen(fd, "wb") as f:  # what np.save writes, without joining the parts
            np.lib.format.write_array_header_1_0(f, {
                "descr": np.lib.format.dtype_to_descr(np.dtype(np.int64)),
                "fortran_order": False, "shape": (at, tl.NCOLS)})
            for part in parts:
                f.write(np.ascontiguousarray(part, np.int64).data)
        index = {"key": _code_key(), "files": stats, "rows": os.path.basename(tmp),
                 "strings": list(spans.strings), "jobs": jobs,
                 "skipped": dict(spans.skipped), "examples": list(spans.examples),
                 "file_problems": [[os.path.relpath(x[0], root), x[1], x[2]]
                                   for x in spans.file_problems]}
        fd, tmp_index = tempfile.mkstemp(prefix="index-", suffix=".json", dir=d)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(index, f)
        os.replace(tmp_index, d / "index.json")
        for old in d.glob("rows-*.npy"):  # the rows of earlier caches
            if old.name != index["rows"]:
                old.unlink(missing_ok=True)
        return True
    except (OSError, ValueError, TypeError) as e:
        _log.debug("goodput: report cache of %s not written: %s", root, e)
        return False
