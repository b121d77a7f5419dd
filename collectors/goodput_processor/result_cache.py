"""The results of a finished run's report, kept beside the spool: the second ``goodput
report`` of a run that no longer changes reads its answer, not its spans.

:func:`~goodput_processor.accounting.report_run_dir` (``goodput report``, the default
definitions, without ``--at`` or ``--exclude``) keeps its list of
:class:`~goodput_processor.report.JobResult` in ``RUN_DIR/.goodput-cache/`` (the directory
of :mod:`goodput_processor.cache`), one entry per ``(ideal step time, job)`` asked for:

- **valid** while the span files are the same paths with the same sizes and modification
  times (ns, taken *before* the files were read), and the processor's code is the same
  (a hash of every module of ``goodput_processor`` and of ``goodput.schema``);
- **written** only for a finished run: every span file unmodified for
  :data:`~goodput_processor.cache.QUIET_S` seconds, and no attempt ``running``. A result
  depends on *now* only through a running last attempt (an attempt seen alive within
  :data:`~goodput_processor.attempts.RUNNING_INTERVALS` heartbeats of now); once no attempt
  is running, none becomes running again as time passes, so the result stays what a new
  accounting would give;
- **never in the way**: an unwritable directory, a full disk, a damaged or foreign entry is
  silently a miss (the report accounts as without it). Nothing is pickled: the results are
  JSON naming only dataclasses of ``goodput_processor``; the kept step arrays
  (:class:`~goodput_processor.steptimes.StepArrays`, five int64 columns) are one ``.npy``
  that a hit maps into memory (``mmap_mode="r"``), read only where a caller reads them.

Turned off with the columnar cache (``goodput report --no-cache``,
``GOODPUT_REPORT_CACHE=0``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from .cache import CACHE_DIR, QUIET_S
from .steptimes import StepArrays

__all__ = ["cacheable", "load", "save"]

_log = logging.getLogger(__name__)
_FORMAT = 1
_PACKAGE = __name__.rpartition(".")[0]  # goodput_processor
_STEP_COLUMNS = 5  # step, attempt, start_ns, time_ns, count (StepArrays)
_CODE: list[str] = []


def _code_key() -> str:
    """A hash of every module of the processor and of ``goodput.schema`` (made once)."""
    if not _CODE:
        from goodput import schema

        here = Path(__file__).parent
        h = hashlib.sha256(str(_FORMAT).encode())
        for p in sorted(here.rglob("*.py")) + [Path(schema.__file__)]:
            h.update(p.name.encode())
            h.update(p.read_bytes())
        _CODE.append(h.hexdigest()[:16])
    return _CODE[0]


def _entry(params: dict) -> str:
    """The file-name stem of the entry for ``params`` (the report's arguments)."""
    text = json.dumps(params, sort_keys=True)
    return "results-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def stats(root: Path, files: list[Path]) -> list[list]:
    """``[relative path, size, mtime ns]`` of each of ``files``; take it *before* reading
    them (raises OSError as ``os.stat``)."""
    out = []
    for p in files:
        st = p.stat()
        out.append([str(p.relative_to(root)), st.st_size, st.st_mtime_ns])
    return out


def cacheable(results) -> bool:
    """Whether ``results`` no longer depend on *now*: no attempt of any job is running."""
    return all(a.end_reason != "running" for r in results for a in r.attempts)


# --- JSON of results: dataclasses of goodput_processor, tuples, lists, dicts, StepArrays


def _enc(x, steps: list):
    if x is None or isinstance(x, str) or type(x) in (bool, int, float):
        return x
    if type(x) is tuple:
        return {"$t": [_enc(v, steps) for v in x]}
    if type(x) is list:
        return [_enc(v, steps) for v in x]
    if type(x) is dict:
        return {"$d": [[_enc(k, steps), _enc(v, steps)] for k, v in x.items()]}
    if type(x) is StepArrays:
        steps.append(x)
        return {"$steps": len(steps) - 1, "ideal": x.ideal_ns, "tol": x.tol_ns}
    cls = type(x)
    if dataclasses.is_dataclass(x) and cls.__module__.startswith(_PACKAGE + "."):
        return {"$c": f"{cls.__module__}:{cls.__qualname__}",
                "f": {f.name: _enc(getattr(x, f.name), steps)
                      for f in dataclasses.fields(x)}}
    raise TypeError(f"no cache form for {cls.__module__}.{cls.__qualname__}")


def _dec(x, steps: list):
    if isinstance(x, list):
        return [_dec(v, steps) for v in x]
    if not isinstance(x, dict):
        return x
    if "$t" in x:
        return tuple(_dec(v, steps) for v in x["$t"])
    if "$d" in x:
        return {_dec(k, steps): _dec(v, steps) for k, v in x["$d"]}
    if "$steps" in x:
        return StepArrays(steps[x["$steps"]], x["ideal"], x["tol"])
    module, _, name = x["$c"].partition(":")
    if not module.startswith(_PACKAGE + "."):
        raise ValueError(f"{x['$c']} is not a class of {_PACKAGE}")
    cls = importlib.import_module(module)
    for part in name.split("."):
        cls = getattr(cls, part)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"{x['$c']} is not a dataclass")
    return cls(**{k: _dec(v, steps) for k, v in x["f"].items()})


def _write_steps(f, steps: list[StepArrays]) -> list[list[list[int]]]:
    """Write the step columns of ``steps`` as one ``(5, n)`` int64 ``.npy`` to ``f``;
    returns, per :class:`StepArrays`, its parts' ``[start, end)`` in the columns. (Their
    memo keys are not kept: a report has no memo to give them to.)"""
    parts = [p for s in steps for p in s._parts]
    n = sum(len(p[0]) for p in parts)
    np.lib.format.write_array_header_1_0(f, {
        "descr": np.lib.format.dtype_to_descr(np.dtype(np.int64)),
        "fortran_order": False, "shape": (_STEP_COLUMNS, n)})
    for i in range(_STEP_COLUMNS):  # row i: column i of every part, in order
        for p in parts:
            f.write(np.ascontiguousarray(p[i], np.int64).data)
    bounds, at = [], 0
    for s in steps:
        mine = []
        for p in s._parts:
            mine.append([at, at + len(p[0])])
            at += len(p[0])
        bounds.append(mine)
    return bounds


def load(root: Path, file_stats: list[list], params: dict) -> list | None:
    """The results kept for ``params`` if valid for ``file_stats`` (:func:`stats`), else
    None (never raises)."""
    d = root / CACHE_DIR
    stem = _entry(params)
    try:
        doc = json.loads((d / f"{stem}.json").read_text(encoding="utf-8"))
        if (doc.get("key") != _code_key() or doc.get("files") != file_stats
                or doc.get("params") != params):
            return None
        cols = np.load(d / doc["steps"], mmap_mode="r", allow_pickle=False)
        if cols.ndim != 2 or cols.shape[0] != _STEP_COLUMNS or cols.dtype != np.int64:
            return None
        steps = [[tuple(cols[i, a:b] for i in range(_STEP_COLUMNS)) for a, b in mine]
                 for mine in doc["step_parts"]]
        return [_dec(r, steps) for r in doc["results"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError) as e:
        if not isinstance(e, FileNotFoundError):
            _log.debug("goodput: kept results of %s not used: %s", root, e)
        return None


def save(root: Path, file_stats: list[list], params: dict, results: list,
         now_s: float | None = None) -> bool:
    """Keep ``results`` (accounted from files with ``file_stats``, taken before reading
    them) for ``params`` if the run is finished (quiet, :func:`cacheable`); True if
    written. Never raises."""
    try:
        now_s = time.time() if now_s is None else now_s
        if any(now_s - mtime / 1e9 < QUIET_S for _, _, mtime in file_stats):
            return False
        if not cacheable(results):
            return False
        steps: list[StepArrays] = []
        encoded = [_enc(r, steps) for r in results]
        d = root / CACHE_DIR
        d.mkdir(exist_ok=True)
        stem = _entry(params)
        fd, tmp = tempfile.mkstemp(prefix=f"{stem}-", suffix=".npy", dir=d)
        try:
            with os.fdopen(fd, "wb") as f:
                bounds = _write_steps(f, steps)
        except BaseException:
            os.unlink(tmp)
            raise
        doc = {"key": _code_key(), "files": file_stats, "params": params,
               "steps": os.path.basename(tmp), "step_parts": bounds, "results": encoded}
        fd, tmp_doc = tempfile.mkstemp(prefix=f"{stem}-", suffix=".json", dir=d)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp_doc, d / f"{stem}.json")
        for old in d.glob("results-*"):  # this entry's earlier steps; other stale entries
            if old.name in (f"{stem}.json", doc["steps"]):
                continue
            if old.suffix == ".npy" and old.name.startswith(stem + "-"):
                old.unlink(missing_ok=True)
            elif old.suffix == ".json" and _stale(old, file_stats):
                old.unlink(missing_ok=True)
        return True
    except (OSError, ValueError, TypeError) as e:
        _log.debug("goodput: results of %s not kept: %s", root, e)
        return False


def _stale(path: Path, file_stats: list[list]) -> bool:
    """Whether the entry at ``path`` was made from other files than ``file_stats`` (its
    steps file goes with it)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
    if doc.get("files") == file_stats:
        return False
    if isinstance(doc.get("steps"), str):
        (path.parent / os.path.basename(doc["steps"])).unlink(missing_ok=True)
    return True
