"""Tail spool directories: take in new complete lines of ``*.jsonl`` files as they are written.

A single machine needs no receiver: ``goodput serve --spool-dir RUN_DIR`` follows the files
the recorder writes (``spans-p<index>-a<attempt>-<pid>-<id>.jsonl`` journals). Every poll lists
the ``*.jsonl`` files under each directory (recursively: new attempts, processes and
segments are new files), reads each from where the last poll stopped and takes in only
complete lines (ending in a newline); a torn last line is left for the next poll and taken
in once it is complete. A file that shrank (truncated or replaced) is read again from its
start.

Spool tails (``X.tail``, :mod:`~goodput_processor.read.tail`): once the process that wrote
one is gone (its lock is free), the records its journal lacks are taken in, once, after the
journals (a live process's records come from its journal).

Compacted segments (``X.jsonl.gz``, renamed into place whole when the recorder closes a
segment, ``docs/span-schema.md``): one that the tailer did not follow as its journal
``X.jsonl`` is read once, whole; a journal whose ``.gz`` is there and that the tailer has
not started is skipped (its journal may be deleted later). So a tailer started on a run
that is long under way (a restarted ``goodput serve``, a new monitor) reads everything once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import zlib
from pathlib import Path

from goodput import schema

from ..read import tail as read_tail
from ..read.spool_io import open_spool
from .slots import as_client
from .store import LiveStore

__all__ = ["SpoolTailer"]

_log = logging.getLogger(__name__)
_CHUNK = 8 << 20  # bytes read at a time
#: A directory whose mtime is this recent (ns) is listed again at every poll.
_SETTLE_NS = 2_000_000_000


def _scan(d: str) -> tuple[list[str], list[str]]:
    """``(spool files, subdirectories)`` directly in directory ``d``: the ``*.jsonl``,
    ``*.jsonl.gz`` and ``*.tail`` files (links to files too) but the metrics spools, and the
    directories that are not links.

    Raises:
        OSError: ``d`` cannot be listed.
    """
    files, subdirs = [], []
    with os.scandir(d) as entries:
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    subdirs.append(e.path)
                elif (e.name.endswith((".jsonl", ".jsonl.gz", schema.TAIL_SUFFIX))
                      and e.is_file()
                      and not e.name.startswith(schema.METRICS_SPOOL_PREFIX)):
                    files.append(e.path)
            except OSError:
                continue
    return files, subdirs


class SpoolTailer:
    """Follows the ``*.jsonl`` files under ``dirs`` into ``store``.

    Args:
        store: where lines go (:meth:`LiveStore.ingest_line`).
        dirs: spool (run) directories; one that does not exist yet is watched until it does.
        poll_s: seconds between polls (> 0).

    Raises:
        ValueError: ``poll_s`` is not > 0, or ``dirs`` is empty.
    """

    def __init__(self, store: LiveStore, dirs, poll_s: float = 0.5):
        if not poll_s > 0:
            raise ValueError(f"poll interval must be > 0 seconds, got {poll_s!r}")
        self.dirs = [Path(d) for d in dirs]
        if not self.dirs:
            raise ValueError("no spool directory to tail")
        self.store, self.poll_s = store, float(poll_s)
        self._files: dict[str, list[int]] = {}  # path -> [offset, lines taken in]
        self._tails_read: set[str] = set()  # tails whose writer was gone: taken in
        self._dirs: dict[str, tuple] = {}  # directory -> (mtime ns, spool files, subdirectories)
        self._listed: dict[str, tuple] = {}  # root -> (the listings it read, its sorted files)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._poll_lock = threading.Lock()

    def poll(self) -> int:
        """Read what is new in every file now; returns the number of complete lines taken in."""
        with self._poll_lock:
            n = 0
            for d in self.dirs:
                with as_client(f"spool:{os.fspath(d)}"):  # (who holds the job slots: .slots)
                    n += self._poll_dir(d)
            return n

    def _poll_dir(self, d) -> int:
        """Read what is new in directory ``d`` (under the poll lock)."""
        n = 0
        try:
            files = self._list(os.fspath(d))
        except OSError:
            return 0  # missing or unreadable for now: try again next poll
        names = set(files)
        tails = []
        for p in files:
            if read_tail.is_tail(p):
                tails.append(p)
            elif p.endswith(".gz"):
                if p not in self._files and p[:-3] not in self._files:
                    n += self._read_gz(p)
            elif p in self._files or p + ".gz" not in names:
                n += self._read(p)
        for p in tails:  # after every journal: what they lack
            if p not in self._tails_read:
                n += self._read_tail(p)
        return n

    def _read_tail(self, path: str) -> int:
        """Take in the records of a spool tail its journal lacks, once its writer is gone."""
        lines = read_tail.tail_lines(path)
        if lines is None:
            return 0  # alive: its journal will have them
        self._tails_read.add(path)
        for i, line in enumerate(lines, 1):
            self.store.ingest_line(line, (path, i))
        return len(lines)

    def _list(self, root: str) -> list[str]:
        """Paths of the spool files under ``root`` (recursively, not into links to
        directories), in path order. A directory is listed again only when its mtime moved
        or is recent (:data:`_SETTLE_NS`: file systems that keep coarse mtimes): appending
        to a file does not change its directory, adding or renaming one does.

        Raises:
            OSError: ``root`` cannot be read.
        """
        out, todo, now = [], [root], time.time_ns()
        seen = []  # (the listings read: the same ones as last time -> the same sorted list)
        while todo:
            d = todo.pop()
            try:
                mtime = os.stat(d).st_mtime_ns
                kept = self._dirs.get(d)
                if kept is None or kept[0] != mtime or now - mtime < _SETTLE_NS:
                    kept = self._dirs[d] = (mtime, *_scan(d))
            except OSError:
                if d == root:
                    raise
                continue  # a subdirectory gone or unreadable (as a glob skips it)
            seen.append(kept)
            out += kept[1]
            todo += kept[2]
        last = self._listed.get(root)
        if last is not None and len(last[0]) == len(seen) and all(
                x is y for x, y in zip(last[0], seen, strict=True)):
            return last[1]  # (O(directories), not a sort of every file's path per poll)
        files = sorted(out, key=lambda p: p.split(os.sep))
        self._listed[root] = (seen, files)
        return files

    def _read_gz(self, path: str) -> int:
        """Take in every line of a compacted segment (complete once it exists), once."""
        state = self._files[path] = [0, 0]
        try:
            with open_spool(path) as f:  # (at once where it can: read_io)
                for line in f:
                    state[1] += 1
                    self.store.ingest_line(line, (path, state[1]))
            state[0] = os.stat(path).st_size
        except (OSError, EOFError, zlib.error) as e:
            _log.warning("goodput serve: cannot read %s: %s", path, e)
        return state[1]

    def _read(self, path: str) -> int:
        state = self._files.setdefault(path, [0, 0])
        try:
            size = os.stat(path).st_size
            if size < state[0]:
                _log.warning("goodput serve: %s shrank; reading it again from the start", path)
                state[:] = [0, 0]
            if size == state[0]:
                return 0
            n = 0
            with open(path, "rb") as f:
                f.seek(state[0])
                while state[0] < size:
                    chunk = f.read(min(_CHUNK, size - state[0]))
                    if not chunk:
                        break
                    end = chunk.rfind(b"\n") + 1
                    if end == 0:
                        if len(chunk) < _CHUNK:
                            break  # torn last line: wait for the rest
                        chunk = chunk + f.readline()  # a line longer than a chunk
                        end = len(chunk) if chunk.endswith(b"\n") else 0
                        if end == 0:
                            break
                    for line in chunk[:end].splitlines():
                        state[1] += 1
                        self.store.ingest_line(line, (path, state[1]))
                        n += 1
                    state[0] += end
                    f.seek(state[0])
            return n
        except OSError as e:
            _log.warning("goodput serve: cannot read %s: %s", path, e.strerror or e)
            return 0

    def start(self) -> SpoolTailer:
        """Poll every ``poll_s`` seconds on a daemon thread; returns ``self``."""
        self._thread = threading.Thread(target=self._run, name="goodput-serve-tail", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # keep tailing whatever one poll ran into
                _log.exception("goodput serve: spool poll failed")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop polling, then read what is left once more (bounded by ``timeout_s``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.poll()

    def positions(self) -> dict[str, int]:
        """Bytes taken in so far per file path."""
        with self._poll_lock:
            return {p: s[0] for p, s in self._files.items()}
