"""Span rows kept compressed, and a process whose rows are inflated only when read.

A process whose rows no longer change (a finished attempt's, in a live job) need not keep
them as an array: :func:`pack_rows` keeps each column's differences from row to row,
deflated (about 17 of 72 bytes a row on the recorder's spools), and a
:class:`PackedProcessSpans` hands them to the accounting with ``data`` inflated only if
something reads it. The accounting's memo keys a process's rows by
:func:`~goodput_processor.model.memo.data_key` (count, first and last row), which a packed process
answers without inflating: a poll that finds the process's results kept never reads them,
and one that does not reads the same rows, inflated. ``goodput serve``'s compaction
(:mod:`goodput_processor.serve.compaction`) packs the rows it takes in
(:mod:`goodput_processor.serve.rows`), keeps the memos' resolved copy of them as
:class:`DerivedRows` of those, and packs the rolling windows' old segments
(:class:`PackedSegments`).
"""

from __future__ import annotations

import os
import zlib

import numpy as np

from ..read.rows import ProcessSpans, shallow_copy
from .memo import rows_key

try:  # (zlib-ng, a dependency, deflates at about twice zlib's speed at level 1)
    from zlib_ng import zlib_ng as _zlib
except ImportError:  # pragma: no cover - zlib-ng is installed with the processor
    _zlib = zlib

__all__ = ["DerivedRows", "PackedProcessSpans", "PackedRows", "PackedSegments",
           "SpilledColumns", "pack_rows", "replace_rows", "unpack_rows"]

#: Deflate level of packed rows: 1 (fastest; level 6 saves a sixth more, at twice the time).
PACK_LEVEL = 1


class PackedRows:
    """Rows ``(n, ncols)`` int64 kept compressed: per column, the differences from one row
    to the next (int64, wrapping: exact for any values) deflated. ``key``: their
    :func:`~goodput_processor.model.memo.rows_key`; ``nbytes``: the compressed bytes held in
    memory (0 once written to a file: :meth:`spill`)."""

    __slots__ = ("columns", "key", "n", "nbytes")

    def __init__(self, columns: list[bytes], key: tuple, n: int) -> None:
        self.columns, self.key, self.n = columns, key, n
        self.nbytes = sum(len(c) for c in columns)

    def spill(self, path: str, offset: int) -> None:
        """Read the columns from ``path`` from now on: the caller has written them there,
        one after another from byte ``offset`` (:class:`SpilledColumns`); the bytes held
        in memory go."""
        self.columns = SpilledColumns(path, offset, [len(c) for c in self.columns])
        self.nbytes = 0


class SpilledColumns:
    """Deflated columns of :class:`PackedRows` kept in a file: ``len(lengths)`` columns of
    those byte lengths, one after another from byte ``offset`` of ``path``. Iterating reads
    them (one ``pread`` each).

    Raises (when iterated):
        OSError: the file cannot be read, or is shorter than the columns (it was removed or
            cut while the rows were kept in it: they are lost).
    """

    __slots__ = ("lengths", "offset", "path")

    def __init__(self, path: str, offset: int, lengths: list[int]) -> None:
        self.path, self.offset, self.lengths = path, offset, lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        with open(self.path, "rb") as f:
            at = self.offset
            for n in self.lengths:
                raw = os.pread(f.fileno(), n, at)
                if len(raw) != n:
                    raise OSError(f"{self.path}: {len(raw)} of {n} bytes of packed rows at "
                                  f"byte {at} (the file was cut or replaced)")
                at += n
                yield raw


def pack_rows(d: np.ndarray) -> PackedRows:
    """:class:`PackedRows` of rows ``d`` (``(n, ncols)`` int64; not changed). Temporaries:
    one column (8 bytes a row) at a time."""
    cols = []
    for c in range(d.shape[1]):
        col = d[:, c]
        delta = np.empty(len(col), np.int64)
        if len(col):
            delta[0] = col[0]
            np.subtract(col[1:], col[:-1], out=delta[1:])
        cols.append(_zlib.compress(delta.tobytes(), PACK_LEVEL))
    return PackedRows(cols, rows_key(d), len(d))


class DerivedRows:
    """Rows made from packed rows when read: ``derive(rows of source)`` (a pure function
    of them, e.g. their open records resolved), whose :func:`~goodput_processor.model.memo.
    rows_key` is ``key`` and length ``n``. Holds no bytes of its own."""

    __slots__ = ("source", "derive", "key", "n")
    nbytes = 0

    def __init__(self, source: PackedRows, derive, key: tuple, n: int) -> None:
        self.source, self.derive, self.key, self.n = source, derive, key, n


def _load(packed: PackedRows | DerivedRows) -> np.ndarray:
    if isinstance(packed, DerivedRows):
        return packed.derive(unpack_rows(packed.source))
    return unpack_rows(packed)


def unpack_rows(packed: PackedRows, extra: int = 0) -> np.ndarray:
    """The rows of ``packed``, in a new ``(n + extra, ncols)`` int64 array (the ``extra``
    rows after them uninitialised: room to append)."""
    out = np.empty((packed.n + extra, len(packed.columns)), np.int64)
    for c, raw in enumerate(packed.columns):
        np.cumsum(np.frombuffer(_zlib.decompress(raw), np.int64), out=out[: packed.n, c])
    return out


class PackedProcessSpans(ProcessSpans):
    """A process whose rows are packed (:class:`PackedRows`, or :class:`DerivedRows` of
    packed rows): its
    ``data`` (read-only) is inflated when first read and then kept by this object only;
    ``rows_id`` is :func:`~goodput_processor.model.memo.rows_key` of the rows without reading
    them (None on a copy made with ``dataclasses.replace``, which carries ``data``)."""

    @property
    def data(self) -> np.ndarray:
        d = self.__dict__.get("data")
        if d is None:
            d = _load(self.__dict__["_packed"])
            d.flags.writeable = False
            self.__dict__["data"] = d
        return d

    @data.setter
    def data(self, value) -> None:
        self.__dict__["data"] = value

    @property
    def rows_id(self) -> tuple | None:
        packed = self.__dict__.get("_packed")
        return None if packed is None else packed.key

    @classmethod
    def of(cls, proc: ProcessSpans, packed: PackedRows, **changes) -> PackedProcessSpans:
        """A copy of ``proc`` (its fields, ``changes`` applied) whose rows are ``packed``
        (its ``data`` not read).

        Raises:
            TypeError: a name in ``changes`` is not a field.
        """
        if type(proc) in (ProcessSpans, cls):
            out = shallow_copy(cls, proc, changes)  # (no __init__: a few µs less)
            out.__dict__["data"] = None
            out.__dict__["_packed"] = packed
            return out
        fields = {f: getattr(proc, f) for f in proc.__dataclass_fields__ if f != "data"}
        fields.update(changes)
        out = cls(**fields, data=None)
        out.__dict__["_packed"] = packed
        return out


def replace_rows(proc: ProcessSpans, **changes) -> ProcessSpans:
    """``dataclasses.replace(proc, **changes)`` that keeps packed rows packed: a
    :class:`PackedProcessSpans` whose ``data`` is not among ``changes`` stays one (its rows
    not inflated)."""
    packed = proc.__dict__.get("_packed") if isinstance(proc, PackedProcessSpans) else None
    if packed is None or "data" in changes:
        return proc.copy(**changes)
    return PackedProcessSpans.of(proc, packed, **changes)


class PackedSegments:
    """One part's painted segments (:meth:`goodput_processor.account.painting._Acc.attempt`:
    boundaries ``b`` (int64 ns, ``m + 1``), owner level (int16, ``m``) and kept-step rank
    (int64, ``m``)) kept packed, as :func:`pack_rows` packs rows; ``first``/``last``: the
    first and last boundary (None without any), ``n``: how many. For a part the rolling
    windows have left behind (``goodput serve``: :meth:`~goodput_processor.serve.store.
    LiveStore.compact`): a window reads it only if it reaches that far back."""

    __slots__ = ("_b", "_rest", "first", "last", "n")

    def __init__(self, b: np.ndarray, owner: np.ndarray, seg_kept: np.ndarray) -> None:
        self._b = pack_rows(b.reshape(-1, 1))
        self._rest = pack_rows(np.stack((owner.astype(np.int64), seg_kept), axis=1))
        self.n = len(b)
        self.first, self.last = (int(b[0]), int(b[-1])) if len(b) else (None, None)

    @property
    def nbytes(self) -> int:
        """Compressed bytes held in memory."""
        return self._b.nbytes + self._rest.nbytes

    @property
    def packed(self) -> tuple[PackedRows, PackedRows]:
        """The :class:`PackedRows` it is kept as (boundaries; owner and kept-step rank), for
        writing them to a file (:meth:`PackedRows.spill`)."""
        return self._b, self._rest

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(b, owner, seg_kept)``, inflated (new arrays)."""
        rest = unpack_rows(self._rest)
        return (unpack_rows(self._b).ravel(), rest[:, 0].astype(np.int16),
                np.ascontiguousarray(rest[:, 1]))
