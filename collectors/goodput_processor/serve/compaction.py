"""Compaction of ``goodput serve``'s quiet processes: what no new span can change, packed.

A live job's finished attempts no longer change, yet the store and the accounting's memos
hold them as arrays: the store's span rows, the memos' resolved copy of them, the painted
segments the rolling windows keep, and the kept steps of both memos. :func:`compact`
(:meth:`~goodput_processor.serve.store.LiveStore.compact`, every maintenance round of
``goodput serve``) takes each process that has taken no new span for a while:

- its rows are packed (:meth:`~goodput_processor.serve.rows.ProcessRows.pack`: each
  column's differences deflated, about 17 of 72 bytes a row on the recorder's spools), and
  with the store's :class:`~goodput_processor.serve.spill.Spill` written to disk;
- the memos let go of their resolved copy of them, made again from the packed rows if read
  (:func:`pack_runs`);
- the rolling windows' painted segments of the parts that end more than twice the longest
  window before the job's end are packed (:func:`pack_segments`) and, with the store's
  spill, written to disk with the rows (:func:`spill_segments`),
  and their memo shares the other memo's kept steps where they are equal
  (:func:`share_parts`);
- with the spill, the kept steps of whole attempts and of a running attempt's pieces
  (many small attempts together, in one file) and the sorted step times of the finished
  ones and of the pieces are moved to memory-mapped files (:func:`map_steps`): a poll's
  binary searches read a few pages of them; so are the painted segments the windows may
  still reach (:func:`map_segments`);
- then the C heap's free pages go back to the system
  (:func:`~goodput_processor.read.heap.trim_heap`).

Only processes with an OS identity (``service.instance.id``, pid and start time: what the
recorder writes) are packed: the accounting keeps a resolved copy of those, so a poll finds
what it needs in the memo. A poll reads nothing that was packed; anything that does read
it gets the same rows (``tests/serve/test_serve_packing.py``, ``tests/model/test_incremental.py``).
"""

from __future__ import annotations

import mmap
import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from ..model.memo import AccountingMemo, rows_key
from ..model.open_records import resolve_open
from ..model.packed import DerivedRows, PackedProcessSpans, PackedSegments
from ..read.heap import trim_heap
from .rows import pack_rows

__all__ = ["MAP_STEPS", "compact", "map_segments", "map_steps", "pack_runs", "pack_segments",
           "share_parts", "spill_segments"]

#: Kept steps at least this many (of one attempt, or in one sorted run) are mapped to a
#: file by :func:`map_steps`; fewer stay in memory (one file, and one descriptor, each).
MAP_STEPS = 1 << 16

#: Where a painted part (``painting._Acc._part``'s tuple, as a memo keeps it) holds its
#: kept-step arrays and its segments.
_KEPT, _SEGMENTS = 3, 6


def _packable(store, job: str, key: tuple) -> bool:
    """Whether process ``key`` of ``job`` has an OS identity (the accounting keeps a
    resolved copy of its rows); under the store's lock."""
    p = store._reader.jobs.get(job, SimpleNamespace(processes={})).processes.get(key)
    return bool(p is not None and p.instance and p.pid is not None
                and p.process_start_ns is not None)


def compact(store, min_quiet_s: float, min_rows: int = 4096,
            map_least: int | None = None) -> int:
    """Compact ``store``'s processes (a :class:`~goodput_processor.serve.store.LiveStore`)
    that have taken no new row for ``min_quiet_s`` seconds and have at least ``min_rows``
    rows (see the module docstring). Deflating runs outside the store's lock (ingest goes
    on); what a job's memos keep is compacted under the job's memo lock (a poll of that
    job waits); ``map_least``: :func:`map_steps`' least steps (default :data:`MAP_STEPS`).
    Returns the rows packed and let go (0 when nothing was new)."""
    now, done, shared = time.monotonic(), 0, 0
    with store._lock:
        todo = [(job, key, r, r.view())
                for job, procs in store._rows.items() for key, r in procs.items()
                if r.packed is None and r.n >= max(min_rows, 1)
                and now - r.changed >= min_quiet_s and _packable(store, job, key)]
    while todo:  # (each process's rows go before the next is packed)
        job, key, r, rows = todo.pop()
        packed = pack_rows(rows)
        del rows
        with store._lock:
            took = store._rows.get(job, {}).get(key) is r and r.pack(packed)
        if took:
            done += packed.n
            if store.spill is not None:  # (the bytes go to disk: Spill.put)
                store.spill.put(job, packed)
    with store._lock:
        jobs = [(job, store._memos.get(job), {(key, r.packed.key): r.packed for key, r in
                                              procs.items() if r.packed is not None},
                 store._reach.get(job)) for job, procs in store._rows.items()]
    for job, held, packed, reach in jobs:
        if held is None:
            continue
        lock, memos = held
        with lock:  # (one accounting of a job at a time)
            if packed:  # the memos' resolved copies of every packed process's rows
                done += pack_runs(list(memos.values()), packed)
            if reach is not None and True in memos:  # segments the windows left behind
                shared += pack_segments(memos[True], reach)
                if store.spill is not None:  # (and to disk, with the rows)
                    shared += spill_segments(memos[True], store.spill, job) > 0
            if False in memos and True in memos:  # one copy of the kept steps
                shared += share_parts(memos[False], memos[True])
            if store.spill is not None and map_steps(  # whole attempts' kept steps, to files
                    list(memos.values()), store.spill.map, map_least) + (
                    map_segments(memos[True], store.spill.map, map_least)
                    if True in memos else 0):
                shared += 1
                with store._lock:  # (a finished job's result held the arrays: made anew)
                    store._done.pop(job, None)
    if done or shared:
        trim_heap()
        with store._lock:  # (their next accountings let go of what they held before)
            store._trim_after.update((job, w) for job, held, _p, _r in jobs
                                     if held is not None for w in held[1])
    return done


def pack_runs(memos: list[AccountingMemo], packed: dict) -> int:
    """Let go of the resolved rows the ``memos`` of one job keep of the processes whose own
    rows are packed (``packed``: ``(process key, rows_key) -> PackedRows``; :func:`compact`
    calls this, one accounting of the job at a time): the runs kept then hold a
    :class:`~goodput_processor.model.packed.PackedProcessSpans` whose rows, if read, are
    :func:`~goodput_processor.model.open_records.resolve_open` of the packed rows
    (:class:`~goodput_processor.model.packed.DerivedRows`: the same rows as the resolver's,
    ``tests/model/test_open_records.py``), kept in the process's state (shared by the memos);
    its open records' resolver is let go (a new row of the process resolves them afresh).
    Returns the rows let go (0 for those let go before)."""
    todo: dict[tuple, list] = {}
    for memo in memos:
        for key, runs in memo.entries("runs"):
            if key[1:3] in packed and len(runs) == 1 and not isinstance(
                    runs[0].proc, PackedProcessSpans) and runs[0].proc.origin == key[1:]:
                todo.setdefault(key, []).append((memo, runs[0]))
    done = 0
    while todo:
        key, held = todo.popitem()
        origin = key[1:]
        for memo, run in held:
            state = memo.processes.get((origin[0], origin[2]))
            if state is None:
                continue
            kept = state.get("packed")
            if kept is None or kept[0] != origin:
                d = run.proc.data
                rows = DerivedRows(packed[origin[:2]], resolve_open, rows_key(d), len(d))
                kept = state["packed"] = (origin, rows, run.proc.settled)
                state.pop("open", None)
                done += len(d)
                del d
            memo.put(key, [replace(run, proc=PackedProcessSpans.of(run.proc, kept[1]))])
        held = run = None  # (the unpacked rows go now)
    return done


def pack_segments(memo: AccountingMemo, before_ns: int) -> int:
    """Pack the painted segments ``memo`` keeps (the accountings with rolling windows) of
    the parts that end before ``before_ns`` (ns since the epoch): a window reads them only
    if it reaches back that far (:class:`~goodput_processor.model.packed.PackedSegments`).
    Returns the parts packed."""
    done = 0
    for tag in ("attempt", "piece"):
        for key, part in memo.entries(tag):
            seg = part[_SEGMENTS]
            if isinstance(seg, tuple) and len(seg[0]) >= 2 and int(seg[0][-1]) < before_ns:
                memo.put(key, (*part[:_SEGMENTS], PackedSegments(*seg)))
                done += 1
    return done


def spill_segments(memo: AccountingMemo, spill, job: str) -> int:
    """Write the packed segments ``memo`` keeps (:func:`pack_segments`) to ``job``'s file
    in ``spill`` (a :class:`~goodput_processor.serve.spill.Spill`; each once: those on
    disk already are left), letting go of their bytes in memory. Returns the bytes
    written."""
    done = 0
    for tag in ("attempt", "piece"):
        for _key, part in memo.entries(tag):
            seg = part[_SEGMENTS]
            if isinstance(seg, PackedSegments):
                done += sum(spill.put(job, p) for p in seg.packed)
    return done


def share_parts(memo: AccountingMemo, windows: AccountingMemo) -> int:
    """Let the memo of the accountings with rolling windows (``windows``) use the kept
    steps that ``memo`` (the job's other memo, without segments) keeps of the same parts,
    where they are equal element by element: the painted parts' kept-step arrays and the
    sorted kept steps, of the job and of a running attempt's pieces
    (:mod:`goodput_processor.analysis.steptimes`), are then one copy, not two.
    Returns the parts and sorted runs shared."""
    def plain(key):  # (a part's key ends with whether segments are kept)
        return (*key[:-1], False)

    def same(x, y) -> bool:
        return all(np.array_equal(a, b) for a, b in zip(x, y, strict=True))

    done = 0
    for tag in ("attempt", "piece"):
        for key, part in windows.entries(tag):
            other = memo.kept(plain(key)) if key[-1] is True else None
            if other is not None and other[_KEPT] is not part[_KEPT] and same(
                    other[_KEPT], part[_KEPT]):
                windows.put(key, (*part[:_KEPT], other[_KEPT], *part[_KEPT + 1:]))
                done += 1
    for tag in ("sorted_steps", "sorted_attempt"):  # (a job's, and one attempt's pieces')
        for key, run in windows.entries(tag):
            other = memo.kept((key[0], tuple(plain(k) for k in key[1])))
            if other is not None and other is not run and other.same(run):
                windows.put(key, other)
                done += 1
    return done


def map_steps(memos: list[AccountingMemo], mapper, min_steps: int | None = None) -> int:
    """Move what the ``memos`` of one job keep per kept step to where ``mapper`` puts it
    (:meth:`~goodput_processor.serve.spill.Spill.map`: memory-mapped files), each array
    once: the kept-step arrays of the painted parts that no new row changes (whole
    attempts and a running attempt's pieces: the five arrays of
    :meth:`~goodput_processor.account.painting._Acc._part`), gathered into one file once
    those not moved yet hold at least ``min_steps`` (default :data:`MAP_STEPS`) steps (200
    attempts of 5,000 steps: one file), and the sorted step times of finished attempts
    and of a running attempt's pieces (:func:`~goodput_processor.analysis.steptimes.
    step_stats`' "sorted_steps" and "sorted_attempt" runs) of at least ``min_steps``
    steps, in place. A part shared by the memos (:func:`share_parts`) stays one copy.
    Where a run moved, the step statistics the memos keep of it (their order statistics
    read the run's arrays as they were: a second copy) are let go, made again from the
    moved run by the next accounting. Returns the steps moved."""
    least = MAP_STEPS if min_steps is None else min_steps
    todo: dict[int, tuple] = {}  # id(kept arrays) -> them: not moved yet
    for memo in memos:
        for tag in ("attempt", "piece"):
            for _key, part in memo.entries(tag):
                kept = part[_KEPT]
                if len(kept[0]) and not _mapped(kept[0]):
                    todo[id(kept)] = kept
    done = 0
    if sum(len(k[0]) for k in todo.values()) >= least:
        moved = _map_many(list(todo.values()), mapper)  # id(kept) -> its mapped copy
        done += sum(len(todo[i][0]) for i in moved)
        for memo in memos:
            for tag in ("attempt", "piece"):
                for key, part in memo.entries(tag):
                    new = moved.get(id(part[_KEPT]))
                    if new is not None:
                        memo.put(key, (*part[:_KEPT], new, *part[_KEPT + 1:]))
    runs = False
    for memo in memos:
        for tag in ("sorted_steps", "sorted_attempt"):  # (in place: shared ones too)
            for _key, run in memo.entries(tag):
                if len(run.per) >= least and not _mapped(run.per) and run.spill(mapper):
                    done += len(run.per)
                    runs = True
    if runs:  # (the statistics are made again from the runs, where they are now)
        for memo in memos:
            for key, _stats in memo.entries("step_stats"):
                memo.put(key, None)
    return done


def map_segments(memo: AccountingMemo, mapper, min_segments: int | None = None) -> int:
    """Move the painted segments ``memo`` (the accountings with rolling windows) keeps of
    the parts that no new row changes (whole attempts, a running attempt's pieces) and
    :func:`pack_segments` left as they are (those the windows may reach) to where
    ``mapper`` puts them (:meth:`~goodput_processor.serve.spill.Spill.map`), one file per
    part of at least ``min_segments`` (default :data:`MAP_STEPS`) segments: a window finds
    its first and last segment by binary search (a few pages) and reads the segments in
    between. Returns the segments moved."""
    least = MAP_STEPS if min_segments is None else min_segments
    done = 0
    for tag in ("attempt", "piece"):
        for key, part in memo.entries(tag):
            seg = part[_SEGMENTS]
            if isinstance(seg, tuple) and len(seg[0]) >= max(least, 2) and not _mapped(
                    seg[0]):
                got = mapper(list(seg))
                if got is not None:
                    memo.put(key, (*part[:_SEGMENTS], tuple(got)))
                    done += len(seg[0])
    return done


def _map_many(kept: list[tuple], mapper) -> dict[int, tuple]:
    """The kept-step arrays of each of ``kept`` (tuples of arrays) moved by one call of
    ``mapper`` (one file), by ``id`` of the tuple (a broadcast view, one value, stays);
    empty if they could not be moved."""
    which = [(k, i) for k in kept for i, a in enumerate(k) if a.strides != (0,)]
    got = mapper([k[i] for k, i in which]) if which else None
    if got is None:
        return {}
    out: dict[int, list] = {}
    for (k, i), a in zip(which, got, strict=True):
        out.setdefault(id(k), list(k))[i] = a
    return {key: tuple(v) for key, v in out.items()}


def _mapped(a: np.ndarray) -> bool:
    """Whether ``a`` is a view of a memory map (:func:`map_steps` moved it)."""
    while isinstance(a, np.ndarray):
        a = a.base
    return isinstance(a, memoryview) and isinstance(a.obj, mmap.mmap)
