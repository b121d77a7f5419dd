"""The results of a finished run's report, kept beside the spool: the second ``goodput
report`` of a run that no longer changes reads its answer, not its spans.

:func:`~goodput_processor.account.run_dir.report_run_dir` (``goodput report``, the default
definitions) and :func:`~goodput_processor.definitions.report` with ``mgm``, both without
``--at`` or ``--exclude``, keep their list of results
(:class:`~goodput_processor.results.job.JobResult`, or
:class:`~goodput_processor.definitions.mgm_result.MgmResult` and
:class:`~goodput_processor.definitions.NoResult`) in ``RUN_DIR/.goodput-cache/`` (the
directory of :mod:`goodput_processor.read.cache`), one entry per ``(definitions, ideal step
time, job)`` asked for:

- **valid** while the span files (and a foreign producer's files that a source reads,
  :mod:`.read_foreign`) are the same paths with the same sizes and modification
  times (ns, taken *before* the files were read), and the processor's code is the same
  (a hash of every module of ``goodput_processor`` and of ``goodput.schema``);
- **written** only for a finished run: every span file unmodified for
  :data:`~goodput_processor.read.cache.QUIET_S` seconds, and no attempt ``running``. A result
  depends on *now* only through a running last attempt (an attempt seen alive within
  :data:`~goodput_processor.model.attempts.RUNNING_INTERVALS` heartbeats of now); once no attempt
  is running, none becomes running again as time passes, so the result stays what a new
  accounting would give. (An mgm result never depends on *now*: without ``--at`` a job
  with no job end is measured to its timeline's end, :mod:`.definitions.mgm`);
- **never in the way**: an unwritable directory, a full disk, a damaged or foreign entry is
  silently a miss (the report accounts as without it). Nothing is pickled: the results are
  JSON naming only dataclasses of ``goodput_processor``; their arrays (the kept steps'
  five int64 columns, :class:`~goodput_processor.analysis.step_arrays.StepArrays`; mgm's
  step numbers and float64 step times, :class:`~.definitions.mgm_steps.Deviation`) are one
  flat int64 ``.npy`` (float64 stored as its bits) that a hit maps into memory
  (``mmap_mode="r"``), read only where a caller reads them.

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
from .cache import enabled as cache_enabled
from .reader import span_files, tail_files

__all__ = ["cacheable", "load", "lookup", "save"]

_log = logging.getLogger(__name__)
_FORMAT = 2
_PACKAGE = __name__.partition(".")[0]  # goodput_processor
_DTYPES = {"i8": np.dtype(np.int64), "f8": np.dtype(np.float64)}  # the arrays kept
_CODE: list[str] = []


def _code_key() -> str:
    """A hash of every module of the processor and of ``goodput.schema`` (made once)."""
    if not _CODE:
        from goodput import schema

        here = Path(__file__).parent.parent  # the package, every stage
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


def lookup(path, params: dict) -> tuple[list, dict, list | None] | None:
    """``(file stats, params, results kept for them or None)`` for a report of run
    directory ``path`` with ``params`` (the report's arguments, JSON-ready) that may keep
    its results; None with the cache off (:func:`~goodput_processor.read.cache.enabled`) or a
    directory whose files cannot be listed (the reader says what is wrong with it). Pass
    the first two to :func:`save` after accounting."""
    if not cache_enabled():
        return None
    from .foreign import foreign_files

    root = Path(path)
    try:
        files = span_files(root) + tail_files(root)
        # a foreign producer's files too (goodput report of a Collector's OTLP JSON)
        files += sorted({p for ps in foreign_files(root, files).values() for p in ps}
                        - set(files))
        file_stats = stats(root, files)
    except OSError:
        return None
    return file_stats, params, (load(root, file_stats, params) if file_stats else None)


def cacheable(results) -> bool:
    """Whether ``results`` no longer depend on *now*: no attempt of any job is running
    (results without attempts, mgm's, never depend on it)."""
    return all(a.end_reason != "running" for r in results
               for a in getattr(r, "attempts", ()))


# --- JSON of results: dataclasses of goodput_processor, tuples, lists, dicts, and classes
# of goodput_processor kept as arrays (StepArrays, mgm's Deviation: they have
# ``cache_arrays()`` -> (1-D arrays, JSON-ready meta) and ``from_cache_arrays(arrays, meta)``),
# their arrays as indices into the list of kept arrays


def _class(name: str):
    """The class ``module:qualname`` of goodput_processor (ValueError for any other)."""
    module, _, qual = name.partition(":")
    if not module.startswith(_PACKAGE + "."):
        raise ValueError(f"{name} is not a class of {_PACKAGE}")
    cls = importlib.import_module(module)
    for part in qual.split("."):
        cls = getattr(cls, part)
    if not isinstance(cls, type):
        raise ValueError(f"{name} is not a class")
    return cls


def _enc(x, arrays: list):
    if x is None or isinstance(x, str) or type(x) in (bool, int, float):
        return x
    if type(x) is tuple:
        return {"$t": [_enc(v, arrays) for v in x]}
    if type(x) is list:
        return [_enc(v, arrays) for v in x]
    if type(x) is dict:
        return {"$d": [[_enc(k, arrays), _enc(v, arrays)] for k, v in x.items()]}
    cls = type(x)
    name = f"{cls.__module__}:{cls.__qualname__}"
    if not cls.__module__.startswith(_PACKAGE + "."):
        raise TypeError(f"no cache form for {cls.__module__}.{cls.__qualname__}")
    if hasattr(cls, "from_cache_arrays"):
        cols, meta = x.cache_arrays()
        at = len(arrays)
        arrays.extend(np.asarray(c, np.float64 if c.dtype.kind == "f" else np.int64)
                      for c in cols)
        return {"$a": name, "i": list(range(at, len(arrays))), "m": _enc(meta, arrays)}
    if dataclasses.is_dataclass(x):
        return {"$c": name, "f": {f.name: _enc(getattr(x, f.name), arrays)
                                  for f in dataclasses.fields(x)}}
    raise TypeError(f"no cache form for {cls.__module__}.{cls.__qualname__}")


def _dec(x, arrays: list):
    if isinstance(x, list):
        return [_dec(v, arrays) for v in x]
    if not isinstance(x, dict):
        return x
    if "$t" in x:
        return tuple(_dec(v, arrays) for v in x["$t"])
    if "$d" in x:
        return {_dec(k, arrays): _dec(v, arrays) for k, v in x["$d"]}
    if "$a" in x:
        cls = _class(x["$a"])
        if not hasattr(cls, "from_cache_arrays"):
            raise ValueError(f"{x['$a']} is not kept as arrays")
        return cls.from_cache_arrays([arrays[i] for i in x["i"]], _dec(x["m"], arrays))
    cls = _class(x["$c"])
    if not dataclasses.is_dataclass(cls):
        raise ValueError(f"{x['$c']} is not a dataclass")
    return cls(**{k: _dec(v, arrays) for k, v in x["f"].items()})


def _write_arrays(f, arrays: list[np.ndarray]) -> list[list]:
    """Write ``arrays`` (1-D int64 or float64) one after another as one flat int64 ``.npy``
    to ``f`` (a float64 as its bits); returns each one's ``[start, end, dtype]``."""
    n = sum(len(a) for a in arrays)
    np.lib.format.write_array_header_1_0(f, {
        "descr": np.lib.format.dtype_to_descr(np.dtype(np.int64)),
        "fortran_order": False, "shape": (n,)})
    out, at = [], 0
    for a in arrays:
        f.write(np.ascontiguousarray(a).data)
        out.append([at, at + len(a), "f8" if a.dtype.kind == "f" else "i8"])
        at += len(a)
    return out


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
        flat = np.load(d / doc["arrays"], mmap_mode="r", allow_pickle=False)
        if flat.ndim != 1 or flat.dtype != np.int64:
            return None
        arrays = [flat[a:b].view(_DTYPES[t]) for a, b, t in doc["array_parts"]]
        return [_dec(r, arrays) for r in doc["results"]]
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
        arrays: list[np.ndarray] = []
        encoded = [_enc(r, arrays) for r in results]
        d = root / CACHE_DIR
        d.mkdir(exist_ok=True)
        stem = _entry(params)
        fd, tmp = tempfile.mkstemp(prefix=f"{stem}-", suffix=".npy", dir=d)
        try:
            with os.fdopen(fd, "wb") as f:
                bounds = _write_arrays(f, arrays)
        except BaseException:
            os.unlink(tmp)
            raise
        doc = {"key": _code_key(), "files": file_stats, "params": params,
               "arrays": os.path.basename(tmp), "array_parts": bounds, "results": encoded}
        fd, tmp_doc = tempfile.mkstemp(prefix=f"{stem}-", suffix=".json", dir=d)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp_doc, d / f"{stem}.json")
        for old in d.glob("results-*"):  # this entry's earlier arrays; other stale entries
            if old.name in (f"{stem}.json", doc["arrays"]):
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
    """Whether the entry at ``path`` was made from other files than ``file_stats`` or by
    other code (an earlier version: it can never be read again); its arrays file goes with
    it (``steps`` in format 1)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
    if doc.get("files") == file_stats and doc.get("key") == _code_key():
        return False
    for name in ("arrays", "steps"):
        if isinstance(doc.get(name), str) and doc[name].startswith("results-"):
            (path.parent / os.path.basename(doc[name])).unlink(missing_ok=True)
    return True
