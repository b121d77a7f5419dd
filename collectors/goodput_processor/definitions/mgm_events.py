"""The event stream of ``--definitions mgm``: a job's spans as ml-goodput-measurement's log.

mgm 0.2.3 computes from its Cloud Logging entries, one per recorder call, in the order they
were written. :func:`events` turns a job's spans (the attempts' primary processes, found
as :func:`~goodput_processor.model.attempts.build_attempts` finds them) into that stream: a step
start per step, a start and an end per paired phase (accelerator init, training prep, data
loading, custom badput, elastic waits and reinitialisation), one entry per checkpoint save
and restore (Orbax's statistics), the job's start and its logged end. :func:`pairs` pairs
starts and ends as mgm does. The calculator is :mod:`.mgm`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis.elastic import slice_records
from ..model.attempts import build_attempts
from ..model.memo import AccountingMemo, cached, proc_key
from ..read.rows import (
    C_END,
    C_FLAGS,
    C_IVAL,
    C_KIND,
    C_SIDX,
    C_START,
    F_ENDLESS,
    F_NONBLOCKING,
    K_ACCELERATOR_INIT,
    K_CHECKPOINT_RESTORE,
    K_CHECKPOINT_SAVE,
    K_CUSTOM_BADPUT,
    K_DATA_LOADING,
    K_ELASTIC_REINIT,
    K_ELASTIC_WAIT,
    K_STEP,
    K_TRAINING_PREP,
    NONE,
    JobSpans,
)

#: Custom badput type of a span without ``goodput.badput.type`` (mgm's recorder default).
DEFAULT_CUSTOM_TYPE = "unknown"

# Event kinds of the mgm stream.
(E_JOB_START, E_JOB_END, E_STEP, E_TPU_START, E_TPU_END, E_PREP_START, E_PREP_END,
 E_DL_START, E_DL_END, E_CUSTOM_START, E_CUSTOM_END, E_SAVE, E_RESTORE, E_WAIT_START,
 E_WAIT_END, E_REINIT_START, E_REINIT_END) = range(17)
#: Span kind -> (start event, end event) for the paired phases.
_PAIRED = {
    K_ACCELERATOR_INIT: (E_TPU_START, E_TPU_END),
    K_TRAINING_PREP: (E_PREP_START, E_PREP_END),
    K_DATA_LOADING: (E_DL_START, E_DL_END),
    K_CUSTOM_BADPUT: (E_CUSTOM_START, E_CUSTOM_END),
    K_ELASTIC_WAIT: (E_WAIT_START, E_WAIT_END),
    K_ELASTIC_REINIT: (E_REINIT_START, E_REINIT_END),
}
# Order of events at equal times (the order the recorder writes them).
_R_JOB_START, _R_END, _R_STEP, _R_START, _R_END_ZERO, _R_JOB_END = range(6)


@dataclass(frozen=True)
class Events:
    """mgm events in stream order: time (ns), kind (``E_*``), value (step number for
    steps, checkpoint step for save/restore, index into ``types`` for custom badput and
    into ``wait_types`` for elastic waits), duration (ns, save/restore only). ``types``:
    upper-cased custom badput types; ``wait_types``: elastic wait event types as written."""

    t: np.ndarray
    kind: np.ndarray
    val: np.ndarray
    dur: np.ndarray
    types: tuple[str, ...]
    wait_types: tuple[str, ...] = ()

    def subset(self, mask: np.ndarray) -> Events:
        return Events(self.t[mask], self.kind[mask], self.val[mask], self.dur[mask],
                       self.types, self.wait_types)


@dataclass(frozen=True)
class _Chunk:
    """One attempt's events sorted by (time, rank, order written): their rank (the order at
    equal times), kind, value (custom badput and elastic wait types as indices into
    ``types``/``wait_types``, the attempt's own, in order of first appearance), duration."""

    t: np.ndarray
    rank: np.ndarray
    kind: np.ndarray
    val: np.ndarray
    dur: np.ndarray
    types: tuple[str, ...]
    wait_types: tuple[str, ...]


def _chunk(job: JobSpans, a) -> _Chunk:
    """The events of attempt ``a`` (see :func:`events`), sorted."""
    return _sorted(*_pieces(job, a))


def _pieces(job: JobSpans, a) -> tuple:
    """The events of attempt ``a`` in pieces, unsorted: ``(cols, types, wait_types)`` for
    :func:`_sorted` (every piece its own memory, none a view of the rows)."""
    types: dict[str, int] = {}
    wait_types: dict[str, int] = {}
    cols: tuple[list, ...] = ([], [], [], [], [])  # t, rank, kind, val, dur: one per add

    def add(t, rank, kind, val=None, dur=None):
        t = np.asarray(t, np.int64).reshape(-1)
        n = len(t)

        def same(x, dtype):  # a constant column: a view, no memory per event
            return np.broadcast_to(np.array(x, dtype), (n,))

        for col, x in zip(cols, (t, same(rank, np.int8) if np.isscalar(rank) else rank,
                                 same(kind, np.int8), same(0, np.int64) if val is None else val,
                                 same(0, np.int64) if dur is None else dur), strict=True):
            col.append(x)

    add(a.start_ns, _R_JOB_START, E_JOB_START)
    d = a.primary.data
    kinds, start, end, ival = d[:, C_KIND], d[:, C_START], d[:, C_END], d[:, C_IVAL]
    blocking = (d[:, C_FLAGS] & F_NONBLOCKING) == 0
    # a phase whose end is inferred (in flight at a kill, or at --at) logged its start only
    recorded_end = (d[:, C_FLAGS] & F_ENDLESS) == 0
    sel = (kinds == K_STEP) & (ival != NONE)
    add(start[sel], _R_STEP, E_STEP, ival[sel])
    for k, (ek_start, ek_end) in _PAIRED.items():
        sel = (kinds == k) & blocking
        if not sel.any():
            continue
        val = None
        if k == K_CUSTOM_BADPUT:
            names = [(job.strings[s] if s >= 0 else DEFAULT_CUSTOM_TYPE).upper()
                     for s in d[sel, C_SIDX]]
            val = np.array([types.setdefault(n, len(types)) for n in names], np.int64)
        elif k == K_ELASTIC_WAIT:  # mgm's ElasticGoodputRecorder default: 'unknown'
            names = [job.strings[s] if s >= 0 else DEFAULT_CUSTOM_TYPE
                     for s in d[sel, C_SIDX]]
            val = np.array([wait_types.setdefault(n, len(wait_types)) for n in names],
                           np.int64)
        s, e = start[sel], end[sel]
        # A span's start and end interleave so that pairing sees them in write order.
        add(s, _R_START, ek_start, val)
        ended = recorded_end[sel]
        add(e[ended], np.where(e > s, _R_END, _R_END_ZERO).astype(np.int8)[ended], ek_end,
            None if val is None else val[ended])
    for k, ek in ((K_CHECKPOINT_SAVE, E_SAVE), (K_CHECKPOINT_RESTORE, E_RESTORE)):
        # Orbax logs a checkpoint's statistics once it is done: not for one in flight
        sel = (kinds == k) & blocking & recorded_end
        add(start[sel], _R_START, ek, ival[sel], end[sel] - start[sel])
    if a.end_reason not in ("killed", "running", "restart"):
        add(a.end_ns, _R_JOB_END, E_JOB_END)
    return cols, types, wait_types


def _sorted(cols: tuple[list, ...], types: dict, wait_types: dict) -> _Chunk:
    """The :class:`_Chunk` of :func:`_pieces`' output (its lists are emptied)."""
    t, rank = _joined(cols[0]), _joined(cols[1])
    order = np.lexsort((rank, t))  # (stable: the order written at equal time and rank)
    # sorted a column at a time (each unsorted one goes before the next is joined)
    t = t[order]
    rank = rank[order]
    kind = _joined(cols[2])[order]
    val = _joined(cols[3])[order]
    dur = _joined(cols[4])[order]
    return _Chunk(t, rank, kind, val, dur, tuple(types), tuple(wait_types))


def _joined(pieces: list) -> np.ndarray:
    """The pieces joined; the list is emptied (the pieces go with it)."""
    out = np.concatenate(pieces)
    pieces.clear()
    return out


def chunk_key(a) -> tuple:
    """What :func:`_chunk` of attempt ``a`` depends on: its primary's rows
    (:func:`~goodput_processor.model.memo.proc_key`), its start, and its logged end (None for an
    end mgm never logs)."""
    logged = a.end_reason not in ("killed", "running", "restart")
    return (proc_key(a.primary), a.start_ns, a.end_ns if logged else None)


def renumber(chunks, types: dict, wait_types: dict) -> list[np.ndarray]:
    """The values of ``chunks`` (:class:`_Chunk`, in attempt order) in the stream's
    numbering: custom and wait types renumbered by first appearance over the attempts in
    order, continuing ``types``/``wait_types`` (name -> index, extended in place)."""
    vals = []
    for c in chunks:
        lut = np.array([types.setdefault(n, len(types)) for n in c.types], np.int64)
        wlut = np.array([wait_types.setdefault(n, len(wait_types)) for n in c.wait_types],
                        np.int64)
        val = c.val
        remap = []
        if not np.array_equal(lut, np.arange(len(lut))):
            remap.append(((c.kind == E_CUSTOM_START) | (c.kind == E_CUSTOM_END), lut))
        if not np.array_equal(wlut, np.arange(len(wlut))):
            remap.append(((c.kind == E_WAIT_START) | (c.kind == E_WAIT_END), wlut))
        if remap:
            val = val.copy()
            for sel, table in remap:
                val[sel] = table[c.val[sel]]
        vals.append(val)
    return vals


def in_order(chunks) -> bool:
    """Whether the stream of ``chunks`` is their concatenation: no chunk begins before the
    one before it ends (at equal time and rank, the earlier attempt first)."""
    return all((a.t[-1], a.rank[-1]) <= (b.t[0], b.rank[0])
               for a, b in zip(chunks[:-1], chunks[1:], strict=True))


def _merge(chunks: list[_Chunk], consume: bool = False) -> Events:
    """The chunks' events as one stream, in (time, rank, attempt, order written) order
    (custom and wait types renumbered by first appearance over the attempts in order).
    ``consume``: empty ``chunks``, each of their columns going once joined."""
    types: dict[str, int] = {}
    wait_types: dict[str, int] = {}
    vals = renumber(chunks, types, wait_types)
    if len(chunks) == 1:
        c = chunks[0]
        if consume:
            chunks.clear()
        return Events(c.t, c.kind, vals[0], c.dur, tuple(types), tuple(wait_types))
    # each chunk is sorted: so is the whole when no chunk begins before the last one ends
    ordered = in_order(chunks)
    cols = [[getattr(c, f) for c in chunks] for f in ("t", "rank", "kind", "dur")]
    if consume:
        chunks.clear()
    t, rank, kind, dur = (_joined(c) for c in cols)
    val = _joined(vals)
    if ordered:
        return Events(t, kind, val, dur, tuple(types), tuple(wait_types))
    order = np.lexsort((np.arange(len(t)), rank, t))
    return Events(t[order], kind[order], val[order], dur[order], tuple(types),
                  tuple(wait_types))


def events(job: JobSpans, now_ns: int | None) -> tuple[Events, int | None, np.ndarray]:
    """The mgm event stream of ``job`` (see the module docstring), the end of its last
    attempt (ns; None without attempts) and the slice-count records of the attempts'
    primary processes (:func:`~goodput_processor.analysis.elastic.slice_records`)."""
    return keyed_events(job, now_ns)[:3]


def keyed_events(job: JobSpans, now_ns: int | None, memo: AccountingMemo | None = None
                 ) -> tuple[Events, int | None, np.ndarray, tuple]:
    """:func:`events`, and the stream's key: what it depends on (a tuple, one
    :func:`chunk_key` per attempt).

    ``memo`` (:mod:`goodput_processor.model.memo`): each attempt's events are kept under their
    key and the stream under the attempts' keys, so that an attempt whose rows did not
    change is not read again. The rows must only grow at the end between calls (those of
    a spool tailer, of ``goodput serve``)."""
    chunks, keys, last_end, slices = keyed_chunks(job, now_ns, memo)
    return stream(chunks, keys, memo), last_end, slices, keys


def keyed_chunks(job: JobSpans, now_ns: int | None, memo: AccountingMemo | None = None
                 ) -> tuple[list[_Chunk], tuple, int | None, np.ndarray]:
    """Each attempt's events (sorted; kept in ``memo`` under their :func:`chunk_key`), the
    attempts' keys, the end of the last attempt (ns; None without attempts) and the slice
    counts, as :func:`keyed_events` (which merges the chunks: :func:`stream`)."""
    attempts = build_attempts(job, now_ns, memo)
    slices = slice_records(job, [a.primary for a in attempts], memo)
    if not attempts:
        return [], (), None, slices
    keys = tuple(chunk_key(a) for a in attempts)
    last_end = attempts[-1].end_ns
    if memo is None and job.rows_owned:  # rows read for this one accounting: each
        # attempt's go once its events are taken, before they are sorted, the smallest
        # attempt first (while one's are taken, the rows of those not taken yet are held:
        # the largest goes last, beside the others' events, about a third of their rows)
        job.drop_rows()
        chunks = [None] * len(attempts)
        for i in sorted(range(len(attempts)),
                        key=lambda i: sum(len(p.data) for p in attempts[i].processes)):
            pieces = _pieces(job, attempts[i])
            attempts[i] = None
            chunks[i] = _sorted(*pieces)
    else:
        chunks = [cached(memo, ("mgm_chunk", k), lambda a=a: _chunk(job, a))
                  for k, a in zip(keys, attempts, strict=True)]
    return chunks, keys, last_end, slices


def stream(chunks: list[_Chunk], keys: tuple, memo: AccountingMemo | None = None) -> Events:
    """The event stream of ``chunks`` (:func:`keyed_chunks`), kept in ``memo`` under
    ``keys``."""
    if not chunks:
        z = np.zeros(0, np.int64)
        return Events(z, z.astype(np.int8), z, z, ())
    return cached(memo, ("mgm_stream", keys), lambda: _merge(chunks))


def take_stream(chunks: list[_Chunk]) -> Events:
    """:func:`stream` of ``chunks`` for one accounting (no memo), emptying the list: each
    column of the chunks goes once joined, so the peak is the events and one column, not
    the events twice."""
    return _merge(chunks, consume=True) if chunks else stream(chunks, ())


def pairs(ev: Events, k_start: int, k_end: int, by_val: bool = False):
    """Start/end times of mgm's pairs of one phase: an end closes the latest start after
    the previous end (a second start overwrites the first; an end without start is
    ignored), per value when ``by_val`` (custom badput types).

    mgm 0.2.3: ``_get_current_productive_and_unproductive_time`` (tpu_init,
    training_prep, data_loading), ``_extract_custom_sync_intervals`` (custom, per type).
    Returns ``(start_t, end_t, val, end_pos)`` arrays, ``end_pos`` = stream index of the end
    (increasing unless ``by_val``); ``val`` is None unless ``by_val``.
    """
    pos = np.flatnonzero((ev.kind == k_start) | (ev.kind == k_end))
    if by_val:
        pos = pos[np.lexsort((pos, ev.val[pos]))]  # grouped by type, stream order within
    if len(pos) < 2:
        z = np.zeros(0, np.int64)
        return z, z, z if by_val else None, z
    is_start = ev.kind[pos] == k_start
    close = ~is_start[1:] & is_start[:-1]
    if by_val:
        close &= ev.val[pos[1:]] == ev.val[pos[:-1]]
    ends, starts = pos[1:][close], pos[:-1][close]
    del pos, is_start, close
    if by_val:
        o = np.argsort(ends, kind="stable")
        ends, starts = ends[o], starts[o]
    return ev.t[starts], ev.t[ends], ev.val[ends] if by_val else None, ends
