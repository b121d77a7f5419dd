"""The span rows ``goodput serve``'s store keeps for one process of a live job.

Rows arrive in the reader's buffers; each snapshot moves the new ones into a
:class:`ProcessRows`, so that what a job holds is one array per process, read through views
that later arrivals never change, and a duplicate is dropped where it arrives.
"""

from __future__ import annotations

import numpy as np

from .. import timeline as tl

__all__ = ["ProcessRows"]


class ProcessRows:
    """One process's rows as the store keeps them: ``data[:n]`` (int64, :data:`~goodput_
    processor.timeline.COLUMNS`), in arrival order, without duplicates (the first of a
    repeated (trace, span id) is kept), in an array that grows by half when full, and their
    span ids sorted (for the duplicate check of new rows). Rows once taken never change."""

    __slots__ = ("data", "n", "sids")

    def __init__(self) -> None:
        self.data = np.zeros((0, tl.NCOLS), np.int64)
        self.n = 0
        self.sids = np.zeros(0, np.int64)

    def view(self) -> np.ndarray:
        """The rows (a read-only view)."""
        v = self.data[: self.n]
        v.flags.writeable = False
        return v

    def nbytes(self) -> int:
        return self.data.nbytes + self.sids.nbytes

    def append(self, new: np.ndarray) -> int:
        """Take ``new`` rows (arrival order); returns the number of duplicates dropped."""
        new, ndup = tl.drop_duplicates(new)
        sid = new[:, tl.C_SID]
        pos = np.searchsorted(self.sids, sid)
        if (self.sids[np.minimum(pos, len(self.sids) - 1)] == sid).any() if self.n else False:
            # a span id seen before (a retried export): the exact check over all the rows
            both, ndup2 = tl.drop_duplicates(np.concatenate((self.data[: self.n], new)))
            new, ndup = both[self.n :], ndup + ndup2
            sid = new[:, tl.C_SID]
            pos = np.searchsorted(self.sids, sid)
        k = len(new)
        if not k:
            return ndup
        if self.n + k > len(self.data):
            grown = np.empty((max(self.n + k, len(self.data) * 3 // 2, 64), tl.NCOLS), np.int64)
            grown[: self.n] = self.data[: self.n]
            self.data = grown
        self.data[self.n : self.n + k] = new
        self.n += k
        order = np.argsort(sid, kind="stable")
        self.sids = np.insert(self.sids, pos[order], sid[order])
        return ndup
