"""The write-ahead log of ``goodput serve``: nothing acknowledged is lost when serve dies.

Before a request is acknowledged, its spans are appended to this log, one segment per
job, in the spool's own format (OTLP JSON lines, :mod:`.encode`)::

    WAL_DIR/jobs/<job slug>/seg-00000001.jsonl   appended, rotated at segment_bytes
    WAL_DIR/results/<job slug>.json              a retired job's final report ("final":
                                                 true); the job stays retired (see .slots)

``<job slug>`` is the job name made safe for a file name (at most 80 characters) plus 16
hex digits of its SHA-256, so two names never share a directory. A job's directory is a
run directory: ``goodput report WAL_DIR/jobs/<slug>`` reads it.

Durability: ``write()`` of the whole line happens before the acknowledgement, so a
SIGKILL of serve loses nothing that was acknowledged (the data is in the kernel). Files
are fsynced by a background thread every ``fsync_interval_s`` seconds, so a crash of the
machine itself loses at most that much acknowledged data; ``fsync_interval_s=0`` fsyncs
before every acknowledgement. So are the directories that got a new segment, and the
segments closed to keep ``max_open_files`` open (fsynced, then closed, by that thread; at
most :data:`MAX_CLOSING` of them, or a quarter of the process's file limit, wait for it):
an append does not wait for an fsync, which it does under the store's lock (issue 38: a
request of 25 new jobs held that lock ~0.2-0.3 s for their directories' and the evicted
segments' fsyncs, and healthy exports waited for it).

A write that fails (disk full, I/O error, file size limit) is undone (the segment is
truncated back to its last whole line) and raises ``OSError``: the store refuses the
request with the retryable status, never acknowledging it.

On start, :meth:`WriteAheadLog.replay` reads every segment back in order; a torn last
line (serve killed mid-write, or a failed undo) is cut off and counted.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ReplayStats", "WriteAheadLog", "job_slug"]

_log = logging.getLogger(__name__)
#: Seconds a job whose spans the log refused keeps serve not ready (``/readyz``) after its
#: last refused append, unless one of its appends succeeds first (its client retries).
REFUSAL_MEMORY_S = 60.0
_SEG = re.compile(r"seg-(\d{8})\.jsonl$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_PROBE_BYTES = 64 << 10
#: Closed segments that wait, open, for the background thread's fsync at most (fewer
#: when a quarter of the process's limit of open files is less); past them a segment
#: closed is fsynced at once.
MAX_CLOSING = 1024


def job_slug(job: str) -> str:
    """The directory name of ``job``'s segments: safe characters, then its SHA-256."""
    digest = hashlib.sha256(job.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{_UNSAFE.sub('_', job)[:80].strip('.') or 'job'}-{digest}"


@dataclass
class ReplayStats:
    """What :meth:`WriteAheadLog.replay` read: ``lines`` taken in, ``bytes`` read,
    ``torn`` last lines cut off, ``segments`` files, ``seconds`` of wall time, ``skipped``
    segments left out (a directory, or unreadable: logged; the startup goes on)."""

    lines: int = 0
    bytes: int = 0
    torn: int = 0
    segments: int = 0
    seconds: float = 0.0
    skipped: int = 0


class _Segment:
    __slots__ = ("dirty", "fd", "path", "size")

    def __init__(self, path: Path, fd: int, size: int):
        self.path, self.fd, self.size, self.dirty = path, fd, size, False


class WriteAheadLog:
    """Append-only per-job segments under ``root`` (see the module docstring).

    Args:
        root: the log's directory (created if missing).
        fsync_interval_s: seconds between background fsyncs (>= 0; 0 = fsync in every
            :meth:`append`).
        segment_bytes: a segment is closed and a new one started past this size (> 0).
        max_open_files: segments kept open at once (least recently used are closed).

    Raises:
        OSError: ``root`` cannot be created.
        ValueError: a bad number.
    """

    def __init__(self, root: str | os.PathLike, *, fsync_interval_s: float = 1.0,
                 segment_bytes: int = 64 << 20, max_open_files: int = 64):
        if not fsync_interval_s >= 0:
            raise ValueError(f"fsync_interval_s must be >= 0 seconds, got {fsync_interval_s!r}")
        if not (segment_bytes > 0 and max_open_files > 0):
            raise ValueError("segment_bytes and max_open_files must be > 0")
        self.root = Path(root)
        self.jobs_dir, self.results_dir = self.root / "jobs", self.root / "results"
        for d in (self.jobs_dir, self.results_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.fsync_interval_s = float(fsync_interval_s)
        self.segment_bytes, self.max_open_files = int(segment_bytes), int(max_open_files)
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Segment] = OrderedDict()
        self._sizes: dict[str, int] = {}  # slug -> bytes in its segments
        #: The last write error (None after a successful write or probe).
        self.error: str | None = None
        #: job -> (monotonic s, why, a file-size limit?) of jobs whose last append failed
        #: (see refusals())
        self._refused: dict[str, tuple[float, str, bool]] = {}
        self.fsyncs = 0
        #: Directories with a new entry, and closed segments, not fsynced yet (:meth:`sync`).
        self._dirs: set[Path] = set()
        self._closing: list[_Segment] = []
        self._max_closing = min(MAX_CLOSING, _file_limit() // 4)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- replay ------------------------------------------------------------------------

    def replay(self, take: Callable[[bytes, tuple], None]) -> ReplayStats:
        """Call ``take(line, (path, line number))`` for every line of every segment, job by
        job, segment by segment; cut off torn last lines. Returns what was read."""
        t0, st = time.monotonic(), ReplayStats()
        for job_dir in sorted(p for p in self.jobs_dir.iterdir() if p.is_dir()):
            if self._retired_before(job_dir):  # (serve died between result and removal)
                self._finish_retiring(job_dir)
                continue
            size = 0
            for seg in self._segments(job_dir):
                if seg.is_dir():  # never one serve wrote: its job's other segments count
                    st.skipped += 1
                    _log.warning("goodput serve: %s is a directory: left out of the replay",
                                 seg)
                    continue
                st.segments += 1
                try:
                    size += self._replay_segment(seg, take, st)
                except OSError as e:  # unreadable: this segment only, never the startup
                    st.skipped += 1
                    _log.error("goodput serve: cannot replay %s (%s): left out", seg,
                               e.strerror or e)
            self._sizes[job_dir.name] = size
        st.seconds = time.monotonic() - t0
        return st

    @staticmethod
    def _segments(job_dir: Path) -> list[Path]:
        """Every entry of ``job_dir`` named like a segment, in order (files or not)."""
        return sorted(p for p in job_dir.iterdir() if _SEG.match(p.name))

    @staticmethod
    def _replay_segment(seg: Path, take, st: ReplayStats) -> int:
        whole, lineno = 0, 0
        with open(seg, "rb") as f:
            for line in f:
                if not line.endswith(b"\n"):
                    st.torn += 1
                    _log.warning("goodput serve: %s ends in a torn line of %d bytes (serve "
                                 "died mid-write); cut off", seg, len(line))
                    break
                lineno += 1
                whole += len(line)
                st.lines += 1
                take(line, (str(seg), lineno))
        if seg.stat().st_size != whole:
            os.truncate(seg, whole)
        st.bytes += whole
        return whole

    # --- appending ---------------------------------------------------------------------

    def append(self, job: str, data: bytes) -> None:
        """Append ``data`` (whole lines) to ``job``'s segment, fsynced as configured.

        Raises:
            OSError: it could not be written; the segment is left as it was before.
        """
        slug = job_slug(job)
        with self._lock:
            try:
                seg = self._segment(slug)
                if seg.size and seg.size + len(data) > self.segment_bytes:
                    self._close(slug)
                    seg = self._segment(slug, new=True)
                self._write(seg, data)
                if self.fsync_interval_s == 0:
                    os.fsync(seg.fd)
                    self.fsyncs += 1
                else:
                    seg.dirty = True
            except OSError as e:
                self.error = f"cannot write the write-ahead log in {self.root}: " \
                             f"{e.strerror or e}"
                self._refused.pop(job, None)  # (newest last; the oldest go past 1000)
                self._refused[job] = (time.monotonic(), self.error, e.errno == errno.EFBIG)
                while len(self._refused) > 1000:
                    del self._refused[next(iter(self._refused))]
                try:  # opened again by the next append (the disk may be back by then)
                    self._close(slug)
                except OSError:
                    pass
                raise
            self._sizes[slug] = self._sizes.get(slug, 0) + len(data)
            self.error = None
            if self._refused:
                self._refused.pop(job, None)

    def refusals(self, within_s: float | None = None) -> dict[str, str]:
        """``{job: why}`` of the jobs whose last append failed within the last
        ``within_s`` seconds (default :data:`REFUSAL_MEMORY_S`): a file-size limit refuses
        one job while the others, and the probe, still write. Takes no lock (what
        ``/readyz`` reads)."""
        since = time.monotonic() - (REFUSAL_MEMORY_S if within_s is None else within_s)
        return {job: why for job, (t, why, _) in list(self._refused.items()) if t >= since}

    def _write(self, seg: _Segment, data: bytes) -> None:
        view, done = memoryview(data), 0
        try:
            while done < len(data):
                done += os.write(seg.fd, view[done:])
        except OSError:
            try:  # undo the part written: the segment ends in a whole line again
                os.ftruncate(seg.fd, seg.size)
            except OSError:  # the replay cuts it off as a torn line
                _log.exception("goodput serve: cannot truncate %s back", seg.path)
            raise
        seg.size += done

    def _segment(self, slug: str, new: bool = False) -> _Segment:
        seg = self._open.get(slug)
        if seg is not None and not new:
            self._open.move_to_end(slug)
            return seg
        job_dir = self.jobs_dir / slug
        fresh_dir = not job_dir.exists()
        job_dir.mkdir(exist_ok=True)
        segs = self._segments(job_dir)
        n = int(_SEG.match(segs[-1].name).group(1)) if segs else 0
        if new or not segs or segs[-1].is_dir():  # (never append into a directory)
            n += 1
        path = job_dir / f"seg-{n:08d}.jsonl"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        seg = _Segment(path, fd, os.fstat(fd).st_size)
        if new or not segs:  # a new file: make its name durable too
            dirs = (job_dir, self.jobs_dir) if fresh_dir else (job_dir,)
            if self.fsync_interval_s == 0:
                for d in dirs:
                    _fsync_dir(d)
            else:  # (with the data, by the background thread)
                self._dirs.update(dirs)
        self._open[slug] = seg
        while len(self._open) > self.max_open_files:
            self._close(next(iter(self._open)), later=True)
        return seg

    def _close(self, slug: str, later: bool = False) -> None:
        """Close ``slug``'s segment, fsynced first if written since the last fsync;
        ``later``: by the background thread (:meth:`sync`), unless ``_max_closing``
        closed ones wait for it already (then now)."""
        seg = self._open.pop(slug, None)
        if seg is None:
            return
        if (later and seg.dirty and self.fsync_interval_s > 0
                and len(self._closing) < self._max_closing):
            self._closing.append(seg)
            return
        try:
            if seg.dirty:
                os.fsync(seg.fd)
                self.fsyncs += 1
        finally:
            os.close(seg.fd)

    def sync(self) -> None:
        """fsync every segment written since the last sync, then close those closed meanwhile
        and fsync the directories that got a new segment (the background thread's job)."""
        with self._lock:
            dirty = [s for s in self._open.values() if s.dirty]
            for s in dirty:
                s.dirty = False
            closing, self._closing = self._closing, []
            dirs, self._dirs = self._dirs, set()
        for s in closing:
            try:
                os.fsync(s.fd)
                self.fsyncs += 1
            except OSError as e:
                self.error = f"cannot fsync {s.path}: {e.strerror or e}"
                _log.error("goodput serve: %s", self.error)
            finally:
                os.close(s.fd)
        for d in sorted(dirs, key=lambda p: -len(p.parts)):  # (a job's, then jobs/)
            try:
                _fsync_dir(d)
            except OSError as e:  # (a retired job's directory is gone: nothing to keep)
                if e.errno != errno.ENOENT:
                    self.error = f"cannot fsync {d}: {e.strerror or e}"
                    _log.error("goodput serve: %s", self.error)
        for s in dirty:
            try:
                os.fsync(s.fd)
                self.fsyncs += 1
            except OSError as e:  # closed meanwhile (fsynced by _close) or an I/O error
                if e.errno != 9:
                    self.error = f"cannot fsync {s.path}: {e.strerror or e}"
                    _log.error("goodput serve: %s", self.error)

    def probe(self) -> str | None:
        """Write, fsync and remove a 64 KiB file: None if the disk takes it, else why.
        Clears :attr:`error` on success."""
        path = self.root / ".probe"
        try:
            with open(path, "wb") as f:
                f.write(b"\0" * _PROBE_BYTES)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            return f"write-ahead log {self.root} is not writable: {e.strerror or e}"
        finally:
            try:
                path.unlink()
            except OSError:
                pass
        with self._lock:
            self.error = None
            # the disk takes writes again; a file-size limit is one file's: still refused
            self._refused = {j: r for j, r in self._refused.items() if r[2]}
        return None

    # --- retiring jobs -----------------------------------------------------------------

    def retire(self, job: str, result: bytes | None) -> None:
        """A job leaves: write its final ``result`` (JSON) to ``results/<slug>.json``
        (atomically), then remove its segments.

        Raises:
            OSError: the result could not be written (the segments are kept).
        """
        slug = job_slug(job)
        if result is not None:
            tmp = self.results_dir / f".{slug}.json.tmp"
            with open(tmp, "wb") as f:
                f.write(result)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.results_dir / f"{slug}.json")
            _fsync_dir(self.results_dir)
        with self._lock:
            self._close(slug)
            self._sizes.pop(slug, None)
        self._finish_retiring(self.jobs_dir / slug)

    def _retired_before(self, job_dir: Path) -> bool:
        """Whether ``job_dir``'s job has a result file written after its last segment: it
        was retired and serve died before removing the segments. (Segments written after a
        result are a job that came back under an older serve: they are replayed.)"""
        try:
            done = (self.results_dir / f"{job_dir.name}.json").stat().st_mtime_ns
            return all(seg.stat().st_mtime_ns <= done for seg in job_dir.iterdir())
        except OSError:
            return False

    @staticmethod
    def _finish_retiring(job_dir: Path) -> None:
        """Remove a retired job's segments (its result file is written)."""
        if job_dir.is_dir():
            shutil.rmtree(job_dir)

    def size_bytes(self) -> int:
        """Bytes in all segments."""
        with self._lock:
            return sum(self._sizes.values())

    # --- background fsync --------------------------------------------------------------

    def start(self) -> WriteAheadLog:
        """Start the background fsync thread (none with ``fsync_interval_s=0``)."""
        if self.fsync_interval_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="goodput-serve-wal",
                                            daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.fsync_interval_s):
            self.sync()

    def close(self) -> None:
        """Stop the thread, fsync and close every segment."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.sync()  # (closed segments and new directories too)
        with self._lock:
            for slug in list(self._open):
                try:
                    self._close(slug)
                except OSError:
                    _log.exception("goodput serve: closing the write-ahead log")


def _file_limit() -> int:
    """The process's soft limit of open files (4096 where it cannot be read)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 4096
    return soft if soft > 0 else 4096


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
