"""The span rows ``goodput serve``'s store keeps for one process of a live job.

Rows arrive in the reader's buffers; each snapshot moves the new ones into a
:class:`ProcessRows`, so that what a job holds is one array per process, read through views
that later arrivals never change, and a duplicate is dropped where it arrives.

A process whose rows have stopped growing (a finished attempt's) is *packed*
(:meth:`ProcessRows.pack`, run by :meth:`~goodput_processor.serve.store.LiveStore.compact`):
its rows are kept compressed, each column delta-coded and deflated (about 17 of 72 bytes a
row on the recorder's spools), and a snapshot hands the accounting a
:class:`PackedProcessSpans`, whose ``data`` is inflated only if something reads it. The
accounting's memo keys a process's rows by :func:`~goodput_processor.model.memo.data_key`, which
a packed process answers without inflating, so a poll that finds the process's results kept
never inflates it; one that does not (a memo dropped, a new resource attribute) reads the
same rows, inflated, and gives the same result.
"""

from __future__ import annotations

import time

import numpy as np

from ..model.memo import rows_key
from ..model.packed import PackedProcessSpans, PackedRows, pack_rows, unpack_rows
from ..read import rows as tl

__all__ = ["PackedProcessSpans", "ProcessRows", "pack_rows", "unpack_rows"]


class ProcessRows:
    """One process's rows as the store keeps them: ``data[:n]`` (int64, :data:`~goodput_
    processor.read.rows.COLUMNS`), in arrival order, without duplicates (the first of a
    repeated (trace, span id) is kept), in an array that grows by half when full (with a
    sixteenth to spare after a bulk load), and their
    span ids sorted (for the duplicate check of new rows) in two runs: all but the latest
    (merged into it when the latest reaches 1/16 of it) and the latest, so that taking a
    batch costs the batch, not the rows held. Rows once taken never change."""

    __slots__ = ("data", "n", "old_sids", "new_sids", "packed", "changed", "snap")

    def __init__(self) -> None:
        self.data = np.zeros((0, tl.NCOLS), np.int64)
        self.n = 0
        self.old_sids = np.zeros(0, np.int64)
        self.new_sids = np.zeros(0, np.int64)
        #: the rows packed (:meth:`pack`; ``data`` is then empty), or None
        self.packed: PackedRows | None = None
        #: when rows were last taken (``time.monotonic()`` seconds; 0: never)
        self.changed = 0.0
        #: the process's copy the last snapshot handed out for these rows, with what it was
        #: made of (``(n, resource identity, copy)``; None: none to reuse), kept by
        #: :meth:`goodput_processor.serve.live_results.LiveResults.snapshot`
        self.snap: tuple | None = None

    def view(self) -> np.ndarray:
        """The rows (a read-only view; not for packed rows)."""
        v = self.data[: self.n]
        v.flags.writeable = False
        return v

    def nbytes(self) -> int:
        """Bytes held: the rows (packed or not, over-allocation included) and span ids."""
        rows = self.data.nbytes + (0 if self.packed is None else self.packed.nbytes)
        return rows + self.old_sids.nbytes + self.new_sids.nbytes

    def pack(self, packed: PackedRows) -> bool:
        """Keep the rows as ``packed`` (:func:`pack_rows` of :meth:`view`, made outside the
        store's lock) if they are still those rows; returns whether it did."""
        if self.packed is not None or packed.n != self.n or packed.key != rows_key(
                self.data[: self.n]):
            return False
        self.packed, self.data, self.snap = packed, np.zeros((0, tl.NCOLS), np.int64), None
        # (the sorted span ids are in the packed rows too: made again when unpacked)
        self.old_sids = self.new_sids = np.zeros(0, np.int64)
        return True

    def unpack(self, extra: int = 0) -> None:
        """Rows packed are inflated back into ``data`` (with room for ``extra`` more), and
        their span ids sorted again."""
        if self.packed is not None:
            self.data = unpack_rows(self.packed, extra + self.n // 16)
            self.old_sids = np.sort(self.data[: self.n, tl.C_SID])
            self.new_sids = np.zeros(0, np.int64)
            self.packed = None

    def _seen(self, sid: np.ndarray) -> bool:
        """Whether any of ``sid`` is the span id of a row already taken."""
        for run in (self.old_sids, self.new_sids):
            if len(run):
                pos = np.minimum(np.searchsorted(run, sid), len(run) - 1)
                if (run[pos] == sid).any():
                    return True
        return False

    def append(self, new: np.ndarray) -> int:
        """Take ``new`` rows (arrival order); returns the number of duplicates dropped."""
        new, ndup = tl.drop_duplicates(new)
        sid = new[:, tl.C_SID]
        self.unpack(len(new))
        if self.n and self._seen(sid):
            # a span id seen before (a retried export): the exact check over all the rows
            both, ndup2 = tl.drop_duplicates(np.concatenate((self.data[: self.n], new)))
            new, ndup = both[self.n :], ndup + ndup2
            sid = new[:, tl.C_SID]
        k = len(new)
        if not k:
            return ndup
        if self.n + k > len(self.data):  # (room for a few more batches after a bulk load)
            size = max(self.n + k + (self.n + k) // 16, len(self.data) * 3 // 2, 64)
            grown = np.empty((size, tl.NCOLS), np.int64)
            grown[: self.n] = self.data[: self.n]
            self.data = grown
        self.data[self.n : self.n + k] = new
        self.n += k
        self.changed = time.monotonic()
        ins = np.sort(sid)
        self.new_sids = np.insert(self.new_sids, np.searchsorted(self.new_sids, ins), ins)
        if len(self.new_sids) * 16 > max(len(self.old_sids), 4096):
            both = np.concatenate((self.old_sids, self.new_sids))
            self.old_sids, self.new_sids = np.sort(both, kind="stable"), np.zeros(0, np.int64)
        return ndup
