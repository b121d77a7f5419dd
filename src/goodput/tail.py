"""The tail of an attempt's spool: what the training thread recorded, in the OS at once.

The journal (:mod:`goodput.segments`) is written by the recorder's background thread once
per flush interval; a process killed with SIGKILL between two flushes would lose what it
recorded since the last one. So each record also goes, on the recording thread, into
``BASE.tail`` beside the journal ``BASE.jsonl``: a fixed-size file mapped into memory
(``mmap``), written with ``struct.pack_into`` (well under a microsecond). A store into a
shared file mapping is in the page cache the moment it is made: a killed process loses
none of it; only the machine losing power can (see ``docs/reliability.md``).

The file is a ring of fixed records (:data:`goodput.schema.TAIL_RECORD`: a phase's end, a
phase's start, a step start) numbered by a sequence number, a small blob ring for what a
record cannot hold (custom span names, other attributes, error messages), the journal's
line template (text before and after a line's spans: the attempt's resource) and a state
the background thread writes after each journal write: every record up to sequence number
``S`` is in the journal, and the step then in flight. The processor reads only the
records after ``S``, and only once the writer is gone: the writer holds an exclusive
``flock`` on the file while it lives (released by the kernel however the process ends), so
a live job is read from its journal alone. The layout is in :mod:`goodput.schema`
(the contract between the two sides); the reader is
``collectors/goodput_processor/read/tail.py``.

At the attempt's clean end the journal holds everything and the file is removed. A ring
holds :data:`RING` records; the training thread wakes the background thread every
:data:`WAKE_EVERY` records, so it is not overrun in practice; records overwritten before
their flush (only then at risk) are counted in :attr:`Tail.overruns`.

Nothing here raises: failures are counted (:attr:`Tail.failures`) and the tail is given up,
the journal goes on as before.
"""

from __future__ import annotations

import fcntl
import json
import logging
import mmap
import os
import random
import struct
import threading
import weakref
import zlib

from goodput import schema

_log = logging.getLogger(__name__)

RING = 4096  # records in the ring (a power of two)
BLOBS = 32 << 10  # bytes of the blob ring
TEMPLATE = 16 << 10  # bytes of one copy of the line template
WAKE_EVERY = 1024  # records between two wake-ups of the background thread (a power of two)
_MAX_BLOB = 4096

_REC = struct.Struct(schema.TAIL_RECORD)
# The same record, its fields a phase's start or a record without a value leave 0 unset
# (fewer arguments to pack: about 30 % cheaper each)
_REC_START = struct.Struct("<Q8xq8xQ")  # word, start, seq
_REC_VALUE_START = struct.Struct("<Qqq8xQ")  # word, value, start, seq
_REC_SPAN = struct.Struct("<Q8xqqQ")  # word, start, end, seq
_HEAD = struct.Struct(schema.TAIL_HEAD)
_STATE = struct.Struct(schema.TAIL_STATE)
_TMPL = struct.Struct(schema.TAIL_TEMPLATE)
_SEQ = struct.Struct("<Q")
_RING_AT = schema.TAIL_DATA_AT + 2 * TEMPLATE
_BLOB_AT = _RING_AT + RING * _REC.size
SIZE = _BLOB_AT + BLOBS
_MASK = RING - 1
# _REC.size is 40: the record offsets below multiply by it
# (tests/recorder/test_spool_tail.py checks).
_NAME_IDS = {name: i + 1 for i, name in enumerate(schema.TAIL_NAMES)}
_STEP, _CKPT, _BLOCKING = schema.ATTR_STEP, schema.ATTR_CHECKPOINT_STEP, schema.ATTR_BLOCKING
_BEGIN, _END, _STEP_START = schema.TAIL_BEGIN, schema.TAIL_END, schema.TAIL_STEP_START
_F_STEP, _F_BLOB = schema.TAIL_F_STEP, schema.TAIL_F_BLOB


def _word(kind: int, flags: int, nid: int, blob_len: int = 0, blob_off: int = 0) -> int:
    """A record's first field (:data:`goodput.schema.TAIL_RECORD`)."""
    return kind | flags << 8 | nid << 16 | blob_len << 32 | blob_off << 48


# The words of the usual records, by span name: a phase's end, with a step number, a start.
_W_END = {n: _word(_END, 0, i) for n, i in _NAME_IDS.items()}
_W_END_STEP = {n: _word(_END, _F_STEP, i) for n, i in _NAME_IDS.items()}
_W_BEGIN = {n: _word(_BEGIN, 0, i) for n, i in _NAME_IDS.items()}
_W_BEGIN_STEP = {n: _word(_BEGIN, _F_STEP, i) for n, i in _NAME_IDS.items()}
_W_STEP_START = _word(_STEP_START, _F_STEP, 0)

_open_tails: weakref.WeakSet = weakref.WeakSet()


def tail_path(journal: str) -> str:
    """The tail file of the journal ``BASE.jsonl``: ``BASE.tail``."""
    base = journal[: -len(".jsonl")] if journal.endswith(".jsonl") else journal
    return base + schema.TAIL_SUFFIX


class NullTail:
    """No tail (no spool, or none could be made): every call does nothing."""

    path = None
    failures = overruns = 0

    def end(self, seq, name, t0, t1, attrs, err) -> None:
        pass

    def step_start(self, seq, step, at) -> None:
        pass

    def flushed(self, seq, pending) -> None:
        pass

    def template(self, prefix: str, suffix: str) -> None:
        pass

    def remove(self) -> None:
        pass

    def _close(self) -> None:
        pass


NULL = NullTail()


class Tail:
    """The tail file of one attempt (see the module docstring).

    :meth:`end`, :meth:`step_start` and :meth:`InFlight.add` run on any recording thread;
    :meth:`flushed`, :meth:`template` and :meth:`remove` on the background thread (under the
    recorder's lock). Use :func:`open_tail`, which never raises.
    """

    def __init__(self, path: str, prefix: str, suffix: str, seq: int = 0):
        self.path = path
        self.failures = 0  # records or state writes that failed
        self.overruns = 0  # records overwritten in the ring before their flush
        self._gen = 0
        self._tmpl_gen = 0
        self._flushed = seq  # records up to this one were recorded before the tail
        self._blob_pos = 0
        self._blob_lock = threading.Lock()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            flags = 0
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                flags |= schema.TAIL_LOCKED
            except OSError as exc:  # a file system without locks: readers cannot tell
                _log.debug("goodput: no lock on %s: %s", path, exc)
            os.ftruncate(fd, SIZE)
            # Blocks reserved now: a page of a sparse file written through the map on a
            # full disk is a SIGBUS that kills the training process. ENOSPC here is an
            # OSError instead, and the attempt goes on without a tail.
            os.posix_fallocate(fd, 0, SIZE)
            self._mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            try:
                os.remove(path)  # no tail rather than one readers would find empty
            except OSError:
                pass
            raise
        self._fd = fd
        rnd = random.Random()
        _HEAD.pack_into(self._mm, 0, schema.TAIL_MAGIC, schema.TAIL_VERSION, _REC.size, RING,
                        BLOBS, TEMPLATE, flags, rnd.getrandbits(64) | 1,
                        rnd.getrandbits(128).to_bytes(16, "little"))
        self.template(prefix, suffix)
        self.flushed(seq, None)
        self._pack = _REC.pack_into
        self._pack_start = _REC_START.pack_into
        self._pack_value_start = _REC_VALUE_START.pack_into
        self._pack_span = _REC_SPAN.pack_into
        _open_tails.add(self)

    # --- the recording threads (hot path) ----------------------------------------------

    def end(self, seq: int, name: str, t0: int, t1: int, attrs, err) -> None:
        """A phase ``name`` ran from ``t0`` to ``t1`` (ns): record ``seq``. Never raises."""
        try:
            if err is None:
                if attrs is None:
                    w = _W_END.get(name)
                    if w is not None:
                        self._pack_span(self._mm, _RING_AT + (seq & _MASK) * 40, w, t0, t1, seq)
                        return
                elif len(attrs) == 1:
                    v = attrs.get(_STEP)
                    w = _W_END_STEP.get(name)
                    if type(v) is int and w is not None:
                        self._pack(self._mm, _RING_AT + (seq & _MASK) * 40, w, v, t0, t1, seq)
                        return
            self._general(seq, _END, name, t0, t1, attrs, err)
        except Exception:
            self._failed()

    def step_start(self, seq: int, step: int, at: int) -> None:
        """Step ``step`` began at ``at`` (ns) (``goodput.step_start``): record ``seq``."""
        try:
            self._pack(self._mm, _RING_AT + (seq & _MASK) * 40, _W_STEP_START, step, at, at,
                       seq)
        except Exception:
            self._failed()

    def _general(self, seq, kind, name, t0, t1, attrs, err) -> None:
        """A record with attributes beyond a step number, an error or a custom name."""
        nid = _NAME_IDS.get(name, 0)
        flags, value, blob = 0, 0, {}
        rest = dict(attrs) if attrs else {}
        for key, flag in ((_STEP, schema.TAIL_F_STEP), (_CKPT, schema.TAIL_F_CKPT_STEP)):
            v = rest.get(key)
            if type(v) is int and -(1 << 63) <= v < (1 << 63) and not flags:
                flags, value = flag, v
                del rest[key]
        v = rest.get(_BLOCKING)
        if type(v) is bool:
            flags |= schema.TAIL_F_BLOCKING if v else schema.TAIL_F_ASYNC
            del rest[_BLOCKING]
        if not nid:
            blob["n"] = str(name)
        if rest:
            blob["a"] = {str(k): _plain(v) for k, v in rest.items()}
        if err is not None:
            blob["e"] = str(err)
        off = size = 0
        if blob:
            data = _SEQ.pack(seq) + json.dumps(blob, separators=(",", ":")).encode()
            if len(data) <= _MAX_BLOB:
                with self._blob_lock:
                    off = self._blob_pos
                    if off + len(data) > BLOBS:
                        off = 0
                    self._blob_pos = off + len(data)
                self._mm[_BLOB_AT + off : _BLOB_AT + off + len(data)] = data
                size = len(data)
                flags |= _F_BLOB
            elif not nid:
                return  # a custom name too long to keep: the journal alone has it
        self._pack(self._mm, _RING_AT + (seq & _MASK) * 40, _word(kind, flags, nid, size, off),
                   value, t0, t1, seq)

    def _failed(self) -> None:
        if self._mm is None:  # closed (in a forked child, or after the attempt's end)
            return
        self.failures += 1
        if self.failures == 1:
            _log.warning("goodput: a record could not be written to the spool's tail %s "
                         "(it still goes to the journal)", self.path, exc_info=True)

    # --- the background thread ---------------------------------------------------------

    def flushed(self, seq: int, pending) -> None:
        """The journal holds every record up to ``seq``; ``pending``: ``(step, start ns)``
        of the step in flight then (from ``step_start``), or None."""
        try:
            if seq - self._flushed > RING:
                self.overruns += seq - self._flushed - RING
            self._flushed = max(self._flushed, seq)
            self._gen += 1
            step, t0 = pending if pending is not None else (0, 0)
            _STATE.pack_into(self._mm, schema.TAIL_STATE_AT[self._gen & 1], self._gen,
                             self._flushed, step, t0, int(pending is not None), self._gen)
        except Exception:
            self._failed()

    def template(self, prefix: str, suffix: str) -> None:
        """The journal's line template (text before a line's spans, and after: the resource)
        from now on (written in turn into one of two copies, so a kill mid-way leaves the
        other)."""
        try:
            text = (prefix + "\x00" + suffix).encode()
            if len(text) > TEMPLATE:
                raise ValueError(f"resource of {len(text)} bytes: more than {TEMPLATE}")
            self._tmpl_gen += 1
            i = self._tmpl_gen & 1
            at = schema.TAIL_DATA_AT + i * TEMPLATE
            self._mm[at : at + len(text)] = text
            _TMPL.pack_into(self._mm, schema.TAIL_TEMPLATE_AT[i], self._tmpl_gen, len(text),
                            zlib.crc32(text))
        except Exception:
            self._failed()

    def remove(self) -> None:
        """The attempt ended and its journal holds everything: delete the file."""
        _open_tails.discard(self)
        try:
            os.remove(self.path)
        except OSError as exc:
            _log.debug("goodput: cannot remove %s: %s", self.path, exc)
        self._close()

    def _close(self) -> None:
        mm, self._mm = self._mm, None
        try:
            if mm is not None:
                mm.close()
        except (OSError, ValueError, BufferError):
            pass
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


class InFlight(set):
    """The recorder's set of phases in flight (:mod:`goodput.phases` adds and discards them
    on the training thread; each is an object with ``name``, ``_t0`` and ``attrs``): adding
    one also writes its start to :attr:`tail` (record ``next_seq()``), in one call."""

    __slots__ = ("tail", "next_seq")

    def add(self, entry) -> None:
        _set_add(self, entry)
        tail = self.tail
        if tail is NULL:
            return
        try:
            seq = self.next_seq()
            attrs = entry.attrs
            if attrs is None:
                w = _W_BEGIN.get(entry.name)
                if w is not None:
                    tail._pack_start(tail._mm, _RING_AT + (seq & _MASK) * 40, w, entry._t0, seq)
                    return
            elif len(attrs) == 1:
                v = attrs.get(_STEP)
                w = _W_BEGIN_STEP.get(entry.name)
                if type(v) is int and w is not None:
                    tail._pack_value_start(tail._mm, _RING_AT + (seq & _MASK) * 40, w, v,
                                           entry._t0, seq)
                    return
            tail._general(seq, _BEGIN, entry.name, entry._t0, entry._t0, attrs, None)
        except Exception:
            tail._failed()


_set_add = set.add


def _plain(v):
    """An attribute value as JSON can hold it (as the SDK keeps it: str() of the rest)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return str(v)


def open_tail(journal: str, prefix: str, suffix: str, seq: int = 0):
    """The tail of the journal ``journal`` (a :class:`Tail`), or :data:`NULL` (warned
    about) if it cannot be made. ``prefix``, ``suffix``: the journal's line template;
    ``seq``: the last sequence number recorded before it (not in it). Never raises."""
    path = tail_path(journal)
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return Tail(path, prefix, suffix, seq)
    except Exception as exc:
        _log.warning("goodput: no spool tail %s (%s): a SIGKILL may lose up to one flush "
                     "interval of records", path, exc)
        return NULL


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) lets go of its parent's tails: their lock must
    go with the parent."""
    for t in list(_open_tails):
        t._close()
        _open_tails.discard(t)


os.register_at_fork(after_in_child=_after_fork_in_child)
