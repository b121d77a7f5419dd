"""Open records: phases in flight at a flush, resolved over a process's rows, all at once
(:func:`resolve_open`) or a batch at a time (:class:`OpenResolver`).

:func:`resolve_open` resolves a process's ``goodput.open`` records (phases in flight at a
flush) over all its rows, and copies them: at every poll of a long running job, that is
the whole attempt again. An :class:`OpenResolver` kept from one poll to the next
(:func:`goodput_processor.model.memo.process_state`) gives the same rows from the rows
added since: the complete rows go, in arrival order, into a buffer that only grows at the
end, and the few open records not yet settled (no complete span of their phase yet, the
first of their start) are kept apart with what the later rows said about them, then
written after the complete rows with their inferred end.

The result is the same array as :func:`resolve_open`'s, byte for byte
(``tests/model/test_open_records.py``). Where a new open record might match rows taken earlier
(a start at or before the latest start of its kind taken: overlapping asynchronous
phases, a late span), those rows are searched; otherwise only the new rows are read.
"""

from __future__ import annotations

import numpy as np

from ..read.rows import C_END, C_FLAGS, C_KIND, C_START, F_ENDLESS, F_OPEN, NCOLS
from .memo import rows_key

__all__ = ["OpenResolver", "resolve_open"]

_LOW = np.iinfo(np.int64).min
_HIGH = np.iinfo(np.int64).max


#: Up to this many open records of one kind in a process are resolved one by one (no sort).
_FEW_OPEN = 16


def resolve_open(d: np.ndarray, in_place: bool = False) -> np.ndarray:
    """One process's rows with its ``goodput.open`` records resolved.

    An open record (a phase in flight at a flush) is dropped when the phase's complete
    span (same kind and start) is there; otherwise the phase ran until the process's last
    sign of life (the latest end of any of its rows), or until the next phase of the same
    kind began if one did (its end was recorded but lost, e.g. to a full disk): the record
    is kept with that end, the open flag cleared and ``F_ENDLESS`` set (its end is inferred:
    ``--definitions mgm`` does not take it for a recorded end). Of several open records of
    one phase, one is kept.

    Returns a new array, or with ``in_place`` (and ``d`` writeable) the start of ``d``
    itself, overwritten (no copy of the rows: for rows read for one accounting).
    """
    flags = d[:, C_FLAGS]
    is_open = (flags & F_OPEN) != 0
    if not is_open.any():
        return d
    last_alive = int(d[:, C_END].max())
    kinds, start_col = d[:, C_KIND], d[:, C_START]
    open_idx = np.flatnonzero(is_open)
    op = d[open_idx]
    keep = np.ones(len(op), bool)
    end = np.full(len(op), last_alive, np.int64)
    for kind in np.unique(op[:, C_KIND]):
        rows = np.flatnonzero(op[:, C_KIND] == kind)
        starts = op[rows, C_START]
        of_kind = kinds == kind
        all_starts = start_col[of_kind]  # complete and open records of this kind
        if len(rows) <= _FEW_OPEN:  # the usual case: a few phases in flight, no sort of
            ost = np.unique(starts)  # the rows: one pass, binary searches in the open starts
            cand, cand_open = _near(all_starts, is_open[of_kind], ost[0])
            # each row's place among the open starts: how many of them are below its start
            idx = np.searchsorted(ost, cand, "left")
            same = ost[np.minimum(idx, len(ost) - 1)] == cand
            hit = np.zeros(len(ost), bool)
            hit[idx[same & ~cand_open]] = True  # a complete span of that start
            keep[rows[hit[np.searchsorted(ost, starts)]]] = False
            # the earliest start above each open start: the minimum over the places above it
            lowest = np.full(len(ost) + 1, np.iinfo(np.int64).max, np.int64)
            np.minimum.at(lowest, idx, cand)
            above = np.minimum.accumulate(lowest[::-1])[::-1]  # over places j+1 and up
            nxt = above[np.searchsorted(ost, starts) + 1]
            has = nxt != np.iinfo(np.int64).max
            end[rows[has]] = np.minimum(end[rows[has]], nxt[has])
        else:
            all_starts, kind_open = _near(all_starts, is_open[of_kind], int(starts.min()))
            done = np.sort(all_starts[~kind_open])
            if len(done):
                pos = np.minimum(np.searchsorted(done, starts), len(done) - 1)
                keep[rows[done[pos] == starts]] = False
            later = np.sort(all_starts)  # ... or until the next phase of its kind began
            pos = np.searchsorted(later, starts, side="right")
            has = pos < len(later)
            end[rows[has]] = np.minimum(end[rows[has]], later[pos[has]])
        _, first = np.unique(starts, return_index=True)  # one per phase start
        dup = np.ones(len(rows), bool)
        dup[first] = False
        keep[rows[dup]] = False
    op, end = op[keep], end[keep]  # (a copy: ``op`` was taken by index)
    op[:, C_END] = np.maximum(op[:, C_END], end)
    op[:, C_FLAGS] = (op[:, C_FLAGS] & ~F_OPEN) | F_ENDLESS
    # the other rows in file order, then the open records kept
    if in_place and d.flags.writeable:
        return _compact(d, is_open, op)
    return np.concatenate((np.compress(~is_open, d, axis=0), op))


#: Rows moved at a time by :func:`_compact`.
_CHUNK_ROWS = 1 << 16


def _compact(d: np.ndarray, drop: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """``concatenate((d[~drop], tail))`` written over ``d`` itself, a chunk at a time
    (``len(tail) <= drop.sum()``); returns the view of ``d`` it fills."""
    w = int(np.argmax(drop))  # rows before the first dropped stay where they are
    for i in range(w, len(d), _CHUNK_ROWS):
        block = d[i : i + _CHUNK_ROWS][~drop[i : i + _CHUNK_ROWS]]  # (a copy)
        d[w : w + len(block)] = block
        w += len(block)
    d[w : w + len(tail)] = tail
    return d[: w + len(tail)]


#: Rows of one kind below which :func:`_near` keeps them all (tests set 0).
_NEAR_MIN = 1024


def _near(starts: np.ndarray, is_open: np.ndarray, first: int) -> tuple:
    """``(starts, is_open)`` of the rows that start at or after ``first`` (the earliest
    open record: rows before it match none), or all of them when that would not leave
    out many: rows mostly come in time order, so the middle row tells."""
    if len(starts) < _NEAR_MIN or starts[len(starts) // 2] >= first:
        return starts, is_open
    near = starts >= first
    return starts[near], is_open[near]


def _kind_max(kinds: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Per kind code (``0 .. size-1``), the maximum of ``values`` (``_LOW`` where none)."""
    out = np.full(size, _LOW, np.int64)
    np.maximum.at(out, kinds, values)
    return out


def _member(x: np.ndarray, sorted_values: np.ndarray) -> np.ndarray:
    """Bool mask: which of ``x`` are in ``sorted_values`` (sorted ascending)."""
    if not len(sorted_values):
        return np.zeros(len(x), bool)
    pos = np.minimum(np.searchsorted(sorted_values, x), len(sorted_values) - 1)
    return sorted_values[pos] == x


class OpenResolver:
    """:func:`resolve_open` of one process's rows, which only
    grow at the end, a batch at a time (see the module docstring).

    :meth:`resolve` takes the process's rows so far and returns the resolved rows and how
    many of them only grow (the complete rows; the open records kept follow them). Not
    thread-safe; the array returned is valid until the next call (which may write over the
    open records at its end).
    """

    __slots__ = ("n", "head", "buf", "m", "alive", "top", "top_done", "pend", "nxt")

    def __init__(self) -> None:
        self.n = 0  # rows taken
        self.head: tuple = rows_key(np.zeros((0, NCOLS), np.int64))
        self.buf = np.zeros((0, NCOLS), np.int64)  # complete rows (m), then the open ones
        self.m = 0
        self.alive = _LOW  # latest end of any row taken
        self.top = np.zeros(0, np.int64)  # per kind: latest start of the rows taken
        self.top_done = np.zeros(0, np.int64)  # ... of the complete rows taken
        self.pend = np.zeros((0, NCOLS), np.int64)  # open records kept, in arrival order
        self.nxt = np.zeros(0, np.int64)  # per kept record: next start of its kind (or HIGH)

    def resolve(self, d: np.ndarray) -> tuple[np.ndarray, int]:
        """``(resolve_open(d), complete rows)`` for the process's rows ``d`` (``(n, NCOLS)``
        int64, arrival order); rows taken by an earlier call must come first, unchanged,
        else everything is taken again."""
        if self.n > len(d) or rows_key(d[: self.n]) != self.head:
            self.__init__()
        if len(d) > self.n:
            self._take(d[self.n:])
            self.n = len(d)
            self.head = rows_key(d)
        return self._rows(), self.m

    # --- one batch -----------------------------------------------------------------------

    def _take(self, new: np.ndarray) -> None:
        kinds = new[:, C_KIND]
        size = max(len(self.top), int(kinds.max()) + 1)
        if size > len(self.top):
            grow = size - len(self.top)
            self.top = np.append(self.top, np.full(grow, _LOW, np.int64))
            self.top_done = np.append(self.top_done, np.full(grow, _LOW, np.int64))
        is_open = (new[:, C_FLAGS] & F_OPEN) != 0
        done = new[~is_open] if is_open.any() else new
        m0 = self.m
        self._append(done)
        self.alive = max(self.alive, int(new[:, C_END].max()))
        self._settle_kept(new, is_open)
        if is_open.any():
            self._add_open(new, is_open, m0)
        self.top = np.maximum(self.top, _kind_max(kinds, new[:, C_START], size))
        if len(done):
            self.top_done = np.maximum(self.top_done, _kind_max(done[:, C_KIND],
                                                                done[:, C_START], size))

    def _append(self, done: np.ndarray) -> None:
        """Complete rows after those taken (the buffer grows by half when full)."""
        need = self.m + len(done) + len(self.pend)
        if need > len(self.buf):
            grown = np.empty((max(need + need // 16, len(self.buf) * 3 // 2, 64), NCOLS),
                             np.int64)
            grown[: self.m] = self.buf[: self.m]
            self.buf = grown
        self.buf[self.m : self.m + len(done)] = done
        self.m += len(done)

    def _settle_kept(self, new: np.ndarray, is_open: np.ndarray) -> None:
        """The open records kept, against the new rows: dropped where their phase's
        complete span came, and their next start of the same kind moved earlier."""
        if not len(self.pend):
            return
        keep = np.ones(len(self.pend), bool)
        kinds = new[:, C_KIND]
        for kind in np.unique(self.pend[:, C_KIND]):
            rows = np.flatnonzero(self.pend[:, C_KIND] == kind)
            starts = self.pend[rows, C_START]
            of_kind = kinds == kind
            later = np.sort(new[of_kind, C_START])
            done = np.sort(new[of_kind & ~is_open, C_START])
            if len(done):
                keep[rows[_member(starts, done)]] = False
            pos = np.searchsorted(later, starts, "right")
            has = pos < len(later)
            self.nxt[rows[has]] = np.minimum(self.nxt[rows[has]], later[pos[has]])
        self.pend, self.nxt = self.pend[keep], self.nxt[keep]

    def _add_open(self, new: np.ndarray, is_open: np.ndarray, m0: int) -> None:
        """The new open records: kept unless their phase's complete span is there or an
        earlier record of the same start is; with the next start of their kind."""
        op = new[is_open]
        keep = np.ones(len(op), bool)
        nxt = np.full(len(op), _HIGH, np.int64)
        kinds = new[:, C_KIND]
        for kind in np.unique(op[:, C_KIND]):
            rows = np.flatnonzero(op[:, C_KIND] == kind)
            starts = op[rows, C_START]
            of_kind = kinds == kind
            later = np.sort(new[of_kind, C_START])  # the new rows of this kind
            done = np.sort(new[of_kind & ~is_open, C_START])
            pos = np.searchsorted(later, starts, "right")
            has = pos < len(later)
            nxt[rows[has]] = later[pos[has]]
            matched = _member(starts, done)
            # the rows taken before: searched only where they may start at or after it
            top = self.top[kind] if kind < len(self.top) else _LOW
            top_done = self.top_done[kind] if kind < len(self.top_done) else _LOW
            if (starts <= top_done).any():
                old = self.buf[:m0]
                matched |= _member(starts, np.sort(old[old[:, C_KIND] == kind, C_START]))
            if (starts < top).any():
                old = self.buf[:m0]
                taken = np.sort(np.concatenate((old[old[:, C_KIND] == kind, C_START],
                                                self.pend[self.pend[:, C_KIND] == kind,
                                                          C_START])))
                pos = np.searchsorted(taken, starts, "right")
                has = pos < len(taken)
                nxt[rows[has]] = np.minimum(nxt[rows[has]], taken[pos[has]])
            # one per phase start: the first, unless one is kept already
            _, first = np.unique(starts, return_index=True)
            dup = np.ones(len(rows), bool)
            dup[first] = False
            kept_starts = np.sort(self.pend[self.pend[:, C_KIND] == kind, C_START])
            keep[rows[matched | dup | _member(starts, kept_starts)]] = False
        self.pend = np.concatenate((self.pend, op[keep]))
        self.nxt = np.concatenate((self.nxt, nxt[keep]))

    def _rows(self) -> np.ndarray:
        """The complete rows, then the open records kept with their end inferred."""
        k = len(self.pend)
        if self.m + k > len(self.buf):
            self._append(self.pend[:0])
        if k:
            tail = self.buf[self.m : self.m + k]
            tail[:] = self.pend
            tail[:, C_END] = np.maximum(self.pend[:, C_END], np.minimum(self.alive, self.nxt))
            tail[:, C_FLAGS] = (self.pend[:, C_FLAGS] & ~F_OPEN) | F_ENDLESS
        v = self.buf[: self.m + k]
        v.flags.writeable = False
        return v
