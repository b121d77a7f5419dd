"""Reading a run directory with worker processes: its files cut into line-aligned byte
ranges, each read by a worker into its own reader, merged in file order.

Workers are forked (on Linux): they do not re-import the caller's ``__main__`` (spawning
would re-run unguarded scripts), and they only parse JSON, taking no lock another thread
might hold. Elsewhere the run directory is read in one process.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from .heap import trim_heap

__all__ = ["read_parallel", "units", "worker_count"]

#: Bytes of rows merged between two trims of the C heap (:func:`~.heap.trim_heap`).
TRIM_BYTES = 16 << 20
#: Bytes per work unit, and the least input worth starting workers for.
UNIT_BYTES = 32 << 20
PARALLEL_MIN_BYTES = 64 << 20
MAX_WORKERS = 4
CAN_FORK = sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods()


def _read_unit(make_reader, unit: tuple[str, int, int | None]):
    """Worker: read one line-aligned byte range of a file into a new reader."""
    reader = make_reader()
    reader.read_range(*unit)
    return reader


def units(files: list[Path]) -> list[tuple[str, int, int | None]]:
    """``files`` split into line-aligned byte ranges ``(path, start, end)`` of about
    :data:`UNIT_BYTES` (a compressed ``.gz`` file is one range, ``end`` None).

    Raises:
        OSError: a file cannot be read.
    """
    out = []
    for p in files:
        size = p.stat().st_size
        if p.name.endswith(".gz"):  # compressed: read whole
            out.append((str(p), 0, None))
            continue
        cuts = [0]
        with open(p, "rb") as f:
            for b in range(UNIT_BYTES, size, UNIT_BYTES):
                if b > cuts[-1]:
                    f.seek(b)
                    f.readline()
                    if cuts[-1] < f.tell() < size:
                        cuts.append(f.tell())
        cuts.append(size)
        out += [(str(p), a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
    return out


def worker_count(requested: int | None, nbytes: int, nunits: int) -> int:
    """Workers to read ``nbytes`` (uncompressed, about) in ``nunits`` ranges: ``requested``
    (at most one per range), else one per CPU (at most :data:`MAX_WORKERS`) for input of
    at least :data:`PARALLEL_MIN_BYTES` where processes can be forked, else 1."""
    if requested is not None:
        return max(1, min(requested, nunits))
    if nbytes < PARALLEL_MIN_BYTES or not CAN_FORK:
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS, nunits))


def read_parallel(files: list[Path], workers: int, make_reader, tick=None):
    """``files`` read by ``workers`` processes, each range into ``make_reader()`` (a
    ``goodput_processor.read.reader`` reader; a picklable callable), merged in file order into
    one such reader (not finished), which is returned; ``tick(path, start, end)`` (if given,
    :func:`.progress.ticker`'s) is called with each range once merged.

    Raises:
        OSError, NotImplementedError, ImportError, RuntimeError: no worker processes here.
    """
    todo = units(files)
    reader, bases, last_jobs = make_reader(), {}, {}
    ctx = multiprocessing.get_context("fork" if CAN_FORK else None)
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    try:
        parts = pool.map(functools.partial(_read_unit, make_reader), todo)
        merged = 0
        for (path, start, end), part in zip(todo, parts, strict=True):
            base = bases.get(path, 0)
            size = part.row_bytes()
            reader.merge(part, base, last_jobs.get(path))
            bases[path] = base + part.nlines
            last_jobs[path] = part.last_job or last_jobs.get(path)
            part = None
            if tick is not None:
                tick(path, start, end)
            merged += size
            if merged >= TRIM_BYTES:  # (the buffers' growth and the parts, out of the heap)
                trim_heap()
                merged = 0
    finally:  # on an error, do not wait for the units not started yet
        pool.shutdown(wait=True, cancel_futures=True)
    trim_heap()
    return reader
