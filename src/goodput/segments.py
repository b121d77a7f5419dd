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
  earlier) is in the same window, gzip-compressed. It is built while its segment is
  written (``*.jsonl.gz.tmp``, which no reader reads) and renamed when the segment closes.

A segment closes when a window closes and its journal holds ``segment_bytes`` or more.
Its journal is then **retired**: deleted (with the exporters' ``.offset`` sidecars) once
every exporter has sent it and ``grace_ns`` have passed, so that tailing readers have read
it. Until then both files exist and readers read the ``.gz``. The attempt's last segment
is not compacted: at the attempt's end its ``.gz.tmp`` is removed and its journal stays. A
process killed mid-segment leaves its ``.gz.tmp`` behind (never read). Compaction that
fails (disk full) is given up for that segment, whose journal then stays.

Runs on the recorder's background thread only (under the recorder's lock). I/O errors
never raise: journal write failures are counted in :attr:`SpoolWriter.failures` and the
line is handed to ``on_failed``; compaction failures in :attr:`compact_failures`.
"""

from __future__ import annotations

import logging
import os
import zlib

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
        level: zlib level of the compacted segments (1-9).
        grace_ns: a retired journal stays at least this long (ns) after its segment closed.
        on_segment: called with the path of each new journal segment after the first.
        on_failed: called with a line (str) the journal could not take.
    """

    def __init__(self, path, encoder, segment_bytes: int | None = 16 << 20, level: int = 1,
                 grace_ns: int = 600 * 10**9, on_segment=None, on_failed=None):
        self.path = self._first = os.fspath(path)
        self._line = encoder.line
        self._segment_bytes = segment_bytes
        self._compact = segment_bytes is not None
        self._level = level
        self._grace_ns = grace_ns
        self._on_segment = on_segment
        self._on_failed = on_failed
        self.failures = 0  # journal writes and syncs that failed
        self.compact_failures = 0  # compacted segments given up
        self.exported = 0  # spans written to the journal
        self.retired: list[list] = []  # [journal path, retired at ns or None]
        self._index = 0
        self._file = None
        self._bytes = 0  # in the current journal segment
        self._torn = False  # a write failed part-way: start the next one on a new line
        self._closed = False
        self._pending: list[str] = []  # span texts not yet in the journal
        self._win: list = []  # span texts of the open window (None: left out)
        self._opens: dict[tuple, tuple[int, int]] = {}  # (name, start) -> (index, end)
        self._gz = None  # the compacted segment being written (.gz.tmp), and its compressor
        self._z = None
        self._broken = False  # compaction of this segment was given up

    # --- spans in ----------------------------------------------------------------

    def add(self, text: str, name: str, t0: int, t1: int, is_open: bool) -> None:
        """One encoded span (for the journal's next line and the open window)."""
        self._pending.append(text)
        if not self._compact:
            return
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
        segment if its journal is full."""
        if not self._compact:
            return
        spans = [t for t in self._win if t is not None]
        self._win, self._opens = [], {}
        if spans and not self._broken:
            self._compact_line(self._line(spans).encode("utf-8"))
        if self._bytes >= self._segment_bytes:
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
        """The attempt ended: write, sync and close the journal; drop the unfinished
        compacted segment. Later writes fail."""
        self.flush()
        self.sync()
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

    def _compact_line(self, data: bytes) -> None:
        try:
            if self._gz is None:
                self._gz = open(self.path + ".gz.tmp", "wb")  # noqa: SIM115
                self._z = zlib.compressobj(self._level, zlib.DEFLATED, 31)  # gzip format
            out = self._z.compress(data)
            if out:
                self._gz.write(out)
        except (OSError, ValueError, zlib.error) as exc:
            self._give_up(exc)

    def _give_up(self, exc) -> None:
        self.compact_failures += 1
        if self.compact_failures == 1:
            _log.warning("goodput: cannot write the compacted spool segment %s.gz (%s); its "
                         "journal stays instead", self.path, exc)
        self._drop_compact()
        self._broken = True

    def _drop_compact(self) -> None:
        gz, self._gz, self._z = self._gz, None, None
        if gz is not None:
            try:
                gz.close()
                os.remove(gz.name)
            except OSError:
                pass

    def _finish_compact(self) -> bool:
        """Complete, sync and rename the compacted segment; True if it is in place."""
        gz = self._gz
        if gz is None or self._broken:
            self._drop_compact()
            return False
        try:
            gz.write(self._z.flush())
            gz.flush()
            os.fsync(gz.fileno())
            gz.close()
            os.replace(gz.name, self.path + ".gz")
            self._gz = self._z = None
            _sync_dir(os.path.dirname(self.path) or ".")
            return True
        except (OSError, ValueError, zlib.error) as exc:
            self._give_up(exc)
            return False

    def _rotate(self) -> None:
        self.flush()
        self.sync()
        if self._finish_compact():
            self.retired.append([self.path, None])
        self._close_journal()
        self._index += 1
        self.path = segment_path(self._first, self._index)
        self._bytes, self._torn, self._broken = 0, False, False
        if self._on_segment is not None:
            try:
                self._on_segment(self.path)
            except Exception as exc:  # the exporters' bookkeeping must not stop the spool
                _log.warning("goodput: new spool segment %s not announced: %s", self.path, exc)

    def reap(self, now_ns: int, sent=None, on_removed=None) -> None:
        """Delete the retired journals whose grace is over and that ``sent(path)`` says
        every exporter has sent; ``on_removed(path)`` after each."""
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


def _sync_dir(path: str) -> None:
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
