"""The spool of one process's attempt: journal segments, each closed one compacted.

``BASE`` is the attempt's spool path (:func:`goodput.config.spool_path`) without
``.jsonl``; every file is OTLP JSON lines (``docs/span-schema.md``):

- ``BASE.jsonl``, ``BASE.s0001.jsonl``, ...: the **journal**, one segment after the other.
  Each flush appends the spans written since the last one as one line (up to 512 spans a
  line, behind the resource), written to the OS at once: a kill loses nothing written.
  The exporters' forwarders and tailing readers (``goodput serve --spool-dir``, the
  in-process monitor) follow these files.
- ``BASE.jsonl.gz``, ``BASE.s0001.jsonl.gz``, ...: a closed segment **compacted**: one line
  per trace window (the resource once per window, not once per flush), without the
  ``goodput.open`` records whose phase's complete span (same name and start, ending no
  earlier) is in the same window, gzip-compressed. It is built in memory while its segment
  is written (about a twentieth of the journal: under 1 MiB for a 16 MiB segment), then
  written whole as ``*.jsonl.gz.tmp`` (which no reader reads) and renamed into place.

A segment closes at the first window close after its journal holds ``segment_bytes``, or
``segment_ns`` (a few minutes) after its first span, whichever comes first, and
when the attempt ends (:meth:`SpoolWriter.close`). Its journal is then **retired**: deleted
(with the exporters' ``.offset`` sidecars) once every exporter has sent it and ``grace_ns``
have passed, so that tailing readers have read it. Until then both files exist and readers
read the ``.gz``. At the attempt's end the last segment's ``.gz`` is written and renamed but
not synced (the exit is not held for it) and its journal stays: the next attempt of the
same rank checks that ``.gz``, syncs it and retires the journal
(:mod:`goodput.leftovers`), as it compacts the journal a killed attempt left. Compaction
that fails (disk full), or a segment whose journal lost a write, is given up for that
segment, whose journal then stays (a reader sees what the journal holds, either way).

Runs on the recorder's background thread only (under the recorder's lock), and at the
attempt's end on the thread that ends it. I/O errors never raise: journal write failures
are counted in :attr:`SpoolWriter.failures` and the line is handed to ``on_failed``;
compaction failures in :attr:`compact_failures`.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from collections import deque

_log = logging.getLogger(__name__)
BATCH_SPANS = 512  # spans per journal line at most


def segment_path(path: str, index: int) -> str:
    """Journal file of segment ``index`` of the spool file ``path`` (``*.jsonl``)."""
    if index == 0:
        return path
    base = path[: -len(".jsonl")] if path.endswith(".jsonl") else path
    return f"{base}.s{index:04d}.jsonl"


class SpoolWriter:
    """Writes one attempt's encoded spans to its journal and compacted segments.

    Args:
        path: the journal's first segment (``*.jsonl``).
        encoder: the attempt's :class:`goodput.encode.Encoder`.
        segment_bytes: a segment closes at the first window close after its journal
            reached this size (bytes); None: one segment, never compacted.
        segment_ns: ... or this many ns (of ``clock``) after its first span was added;
            None: no time limit.
        clock: the time, ns (default :func:`time.time_ns`; the recorder's own clock).
        level: zlib level of the compacted segments (1-9).
        grace_ns: a retired journal stays at least this long (ns) after its segment closed.
        on_segment: called with the path of each new journal segment after the first.
        on_failed: called with a line (str) the journal could not take.
    """

    def __init__(self, path, encoder, segment_bytes: int | None = 16 << 20, level: int = 1,
                 grace_ns: int = 600 * 10**9, on_segment=None, on_failed=None,
                 segment_ns: int | None = None, clock=None):
        self.path = self._first = os.fspath(path)
        self._line = encoder.line
        self._segment_bytes = segment_bytes
        self._segment_ns = segment_ns
        self._clock = clock or time.time_ns
        self._compact = segment_bytes is not None
        self._level = level
        self._grace_ns = grace_ns
        self._on_segment = on_segment
        self._on_failed = on_failed
        self.failures = 0  # journal writes and syncs that failed
        self.compact_failures = 0  # compacted segments given up
        self.exported = 0  # spans written to the journal
        self.retired: list[list] = []  # [journal path, retired at ns or None]
        #: Journals of earlier attempts to retire (from any thread: :meth:`adopt`).
        self.adopted: deque = deque()
        self._index = 0
        self._file = None
        self._bytes = 0  # in the current journal segment
        self._torn = False  # a write failed part-way: start the next one on a new line
        self._closed = False
        self._pending: list[str] = []  # span texts not yet in the journal
        self._win: list = []  # span texts of the open window (None: left out)
        self._opens: dict[tuple, tuple[int, int]] = {}  # (name, start) -> (index, end)
        self._gz: list[bytes] = []  # the compacted segment so far (compressed), and its
        self._z = None  # compressor
        self._broken = False  # compaction of this segment was given up
        self._opened_ns: int | None = None  # when the segment's first span was added

    # --- spans in ----------------------------------------------------------------

    def add(self, text: str, name: str, t0: int, t1: int, is_open: bool) -> None:
        """One encoded span (for the journal's next line and the open window)."""
        self._pending.append(text)
        if not self._compact:
            return
        if self._opened_ns is None:
            self._opened_ns = self._clock()
        win = self._win
        if is_open:
            self._opens[(name, t0)] = (len(win), t1)
        elif self._opens:
            found = self._opens.pop((name, t0), None)
            if found is not None and t1 >= found[1]:
                win[found[0]] = None  # the complete span supersedes its open record
        win.append(text)

    def window_done(self) -> None:
        """A window closed (its root was the last span added): compact it, and close the
        segment if its journal is full or its time is up."""
        if not self._compact:
            return
        self._compact_window()
        if self._bytes >= self._segment_bytes or (
                self._segment_ns is not None and self._opened_ns is not None
                and self._clock() - self._opened_ns >= self._segment_ns):
            self._rotate()

    # --- the journal ---------------------------------------------------------------

    def flush(self) -> bool:
        """Append the pending spans to the journal (one line per 512). False if a write failed."""
        pending = self._pending
        if not pending:
            return True
        self._pending = []
        ok = True
        for i in range(0, len(pending), BATCH_SPANS):
            chunk = pending[i : i + BATCH_SPANS]
            line = self._line(chunk)
            if self._write(line.encode("utf-8")):
                self.exported += len(chunk)
            else:
                ok = False
                self._drop_compact()  # the compacted segment would hold what the journal lost
                self._broken = True
                if self._on_failed is not None:
                    self._on_failed(line)
        return ok

    def _write(self, data: bytes) -> bool:
        if self._closed:
            self.failures += 1
            return False
        try:
            if self._file is None:
                os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
                self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115
            view = memoryview(b"\n" + data if self._torn else data)
            f = self._file
            while view:  # unbuffered: what write() did not take was not written
                view = view[f.write(view) :]
            self._torn = False
            self._bytes += len(data)
            return True
        except (OSError, ValueError) as exc:
            if self._file is not None and isinstance(exc, OSError):
                self._torn = True
            self.failures += 1
            if self.failures == 1:
                _log.warning("goodput: cannot write spool file %s: %s", self.path, exc)
            return False

    def sync(self) -> None:
        """``fsync`` the journal, so its spans survive a machine crash."""
        if self._file is None:
            return
        try:
            os.fsync(self._file.fileno())
        except (OSError, ValueError) as exc:
            self.failures += 1
            _log.debug("goodput: fsync of %s failed: %s", self.path, exc)

    def close(self) -> None:
        """The attempt ended: write, sync and close the journal; write and rename its
        compacted segment (not synced: the next attempt does it, :mod:`goodput.leftovers`)
        and retire the journal. Later writes fail."""
        self.flush()
        self.sync()
        if self._compact:
            self._compact_window()  # spans of a window not closed (the recorder closes it)
        if self._compact and self._finish_compact(sync=False):
            self.retired.append([self.path, None])
        self._close_journal()
        self._drop_compact()
        self._closed = True

    def _close_journal(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    # --- compacted segments -----------------------------------------------------------

    def _compact_window(self) -> None:
        spans = [t for t in self._win if t is not None]
        self._win, self._opens = [], {}
        if spans and not self._broken:
            self._compact_line(self._line(spans).encode("utf-8"))

    def _compact_line(self, data: bytes) -> None:
        try:
            if self._z is None:
                self._z = zlib.compressobj(self._level, zlib.DEFLATED, 31)  # gzip format
            out = self._z.compress(data)
            if out:
                self._gz.append(out)
        except (ValueError, zlib.error) as exc:
            self._give_up(exc)

    def _give_up(self, exc) -> None:
        self.compact_failures += 1
        if self.compact_failures == 1:
            _log.warning("goodput: cannot write the compacted spool segment %s.gz (%s); its "
                         "journal stays instead", self.path, exc)
        self._drop_compact()
        self._broken = True

    def _drop_compact(self) -> None:
        self._gz, self._z = [], None

    def _finish_compact(self, sync: bool = True) -> bool:
        """Write the compacted segment as ``.gz.tmp`` (synced if ``sync``) and rename it
        into place; True if it is there."""
        if self._z is None or self._broken:
            self._drop_compact()
            return False
        tmp = self.path + ".gz.tmp"
        try:
            self._gz.append(self._z.flush())
            with open(tmp, "wb") as f:
                f.write(b"".join(self._gz))
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, self.path + ".gz")
        except (OSError, ValueError, zlib.error) as exc:
            try:
                os.remove(tmp)
            except OSError:
                pass
            self._give_up(exc)
            return False
        self._drop_compact()
        if sync:
            sync_dir(os.path.dirname(self.path) or ".")
        return True

    def _rotate(self) -> None:
        self.flush()
        self.sync()
        if self._finish_compact():
            self.retired.append([self.path, None])
        self._close_journal()
        self._index += 1
        self.path = segment_path(self._first, self._index)
        self._bytes, self._torn, self._broken = 0, False, False
        self._opened_ns = None
        if self._on_segment is not None:
            try:
                self._on_segment(self.path)
            except Exception as exc:  # the exporters' bookkeeping must not stop the spool
                _log.warning("goodput: new spool segment %s not announced: %s", self.path, exc)

    def adopt(self, journal: str) -> None:
        """Retire ``journal``, an earlier attempt's whose ``.gz`` is in place (any thread;
        :mod:`goodput.leftovers`)."""
        self.adopted.append(journal)

    def reap(self, now_ns: int, sent=None, on_removed=None) -> None:
        """Delete the retired journals whose grace is over and that ``sent(path)`` says
        every exporter has sent; ``on_removed(path)`` after each."""
        while self.adopted:
            self.retired.append([self.adopted.popleft(), None])
        keep = []
        for item in self.retired:
            if item[1] is None:
                item[1] = now_ns
            if now_ns - item[1] < self._grace_ns or (sent is not None and not sent(item[0])):
                keep.append(item)
                continue
            try:
                os.remove(item[0])
            except FileNotFoundError:
                pass
            except OSError as exc:
                _log.debug("goodput: cannot remove %s: %s", item[0], exc)
                keep.append(item)
                continue
            if on_removed is not None:
                on_removed(item[0])
        self.retired = keep


def sync_dir(path: str) -> None:
    """fsync the directory ``path`` (a rename or a removal in it made durable); an
    ``OSError`` is ignored (a directory that cannot be opened or synced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


class MemorySink:
    """Without a spool: each flush's spans go, as decoded lines, to ``hold(line)`` (the
    exporters' memory queues); nothing at all when ``hold`` is None."""

    path = None
    failures = compact_failures = 0
    retired: list = []
    adopted: tuple = ()

    def __init__(self, encoder, hold=None):
        self._line = encoder.line
        self._hold = hold
        self._pending: list[str] = []
        self.exported = 0

    def add(self, text: str, name: str, t0: int, t1: int, is_open: bool) -> None:
        if self._hold is not None:
            self._pending.append(text)

    def window_done(self) -> None:
        pass

    def flush(self) -> bool:
        pending, self._pending = self._pending, []
        for i in range(0, len(pending), BATCH_SPANS):
            chunk = pending[i : i + BATCH_SPANS]
            self._hold(self._line(chunk))
            self.exported += len(chunk)
        return True

    def sync(self) -> None:
        pass

    def close(self) -> None:
        self.flush()

    def reap(self, now_ns: int, sent=None, on_removed=None) -> None:
        pass
