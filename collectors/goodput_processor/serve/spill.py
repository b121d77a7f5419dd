"""The packed rows of ``goodput serve``'s quiet processes, kept on disk (``--spill-dir``).

Compaction (:mod:`goodput_processor.serve.compaction`) packs the rows of a process that
has gone quiet; with a :class:`Spill`, those packed bytes (about 17 a span on the
recorder's spools) are then written to a file of the job's and let go from memory. Nothing
a poll needs is in them: a poll reads the memos, and only something that reads the
process's rows again (a late span of it, a report of a memo let go) reads them back, one
``pread`` per column (:class:`~goodput_processor.model.packed.SpilledColumns`).

Compaction also maps the kept steps of finished attempts and their sorted step times
(:meth:`Spill.map`): each set of arrays is written to an unnamed file in the directory
(``tempfile.TemporaryFile``) and read back through a read-only memory map, so that the
pages a poll does not touch (a binary search touches a few) are not resident; the file's
disk space goes when the last array of it is let go.

The files are a cache, not a record: the write-ahead log or the spool is what a restart
replays. One file per job (``<job slug>.rows``), appended to, removed when the job leaves
(:meth:`Spill.forget`) or the spill is closed. A file that cannot be written leaves the
rows in memory (logged); one removed or cut while rows are kept in it makes reading them
fail, and the job is reported failed (``JobResult.error``), the other jobs unaffected.
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import tempfile
import threading
import weakref

import numpy as np

from ..model.packed import PackedRows
from .wal import job_slug

__all__ = ["Spill"]

_log = logging.getLogger(__name__)


class Spill:
    """A directory of files holding packed rows, one per job.

    Args:
        directory: where; None = a new private directory under the system's temporary
            directory (``tempfile.mkdtemp``), removed with everything in it on
            :meth:`close` (or when the object is collected, or at exit).

    Raises:
        OSError: ``directory`` cannot be made.
    """

    def __init__(self, directory: str | os.PathLike | None = None):
        self._own = directory is None
        self.directory = (tempfile.mkdtemp(prefix="goodput-serve-spill-") if self._own
                          else os.fspath(directory))
        os.makedirs(self.directory, exist_ok=True)
        self._lock = threading.Lock()
        self._paths: dict[str, str] = {}  # job -> its file
        #: Bytes written to the files (of the jobs still here).
        self.disk_bytes = 0
        self._sizes: dict[str, int] = {}
        #: Bytes of the files of :meth:`map` still mapped.
        self.mapped_bytes = 0
        self._failed = False
        self._finalizer = weakref.finalize(self, _remove, self.directory, self._paths,
                                           self._own)

    def put(self, job: str, packed: PackedRows) -> int:
        """Write ``packed``'s columns to ``job``'s file and let the rows read them from it
        (:meth:`~goodput_processor.model.packed.PackedRows.spill`). Returns the bytes written:
        0 when they were already on disk, or could not be written (the rows stay in
        memory; logged once)."""
        cols = packed.columns
        if not isinstance(cols, list):
            return 0
        with self._lock:
            path = self._paths.get(job)
            if path is None:
                path = self._paths[job] = os.path.join(self.directory, job_slug(job) + ".rows")
            try:
                with open(path, "ab") as f:
                    offset = f.seek(0, os.SEEK_END)
                    for c in cols:
                        f.write(c)
            except OSError as e:
                if not self._failed:
                    _log.error("goodput serve: cannot write packed rows to %s (%s); they "
                               "stay in memory", path, e.strerror or e)
                self._failed = True
                return 0
            n = sum(len(c) for c in cols)
            self._sizes[job] = self._sizes.get(job, 0) + n
            self.disk_bytes += n
        packed.spill(path, offset)
        return n

    def map(self, arrays: list[np.ndarray]) -> list[np.ndarray] | None:
        """The same ``arrays`` (1-D numeric), read from now on from a file in the
        directory through a read-only memory map: views of it, equal element by element,
        not writable (each at an offset that is a multiple of 8 bytes). The file has no
        name (``tempfile.TemporaryFile``); its disk space goes when the last of the views
        is let go, and :attr:`mapped_bytes` drops with it. Returns None when the file
        cannot be written or mapped (the caller keeps the arrays in memory; logged
        once)."""
        if not sum(a.nbytes for a in arrays):
            return None
        try:
            with tempfile.TemporaryFile(dir=self.directory, prefix="steps-") as f:
                at = []
                for a in arrays:
                    at.append(f.tell() + -f.tell() % 8)  # (aligned: int16 arrays among them)
                    f.write(bytes(at[-1] - f.tell()))
                    f.write(np.ascontiguousarray(a).data)
                total = f.tell()
                f.flush()
                mm = mmap.mmap(f.fileno(), total, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            if not self._failed:
                _log.error("goodput serve: cannot map kept steps to a file in %s (%s); "
                           "they stay in memory", self.directory, getattr(e, "strerror", e) or e)
            self._failed = True
            return None
        with self._lock:
            self.mapped_bytes += total
        weakref.finalize(mm, self._unmapped, total)
        return [np.frombuffer(mm, a.dtype, len(a), off) for a, off in zip(arrays, at, strict=True)]

    def _unmapped(self, n: int) -> None:
        with self._lock:
            self.mapped_bytes -= n

    def forget(self, job: str) -> None:
        """Remove ``job``'s file (the job has left: nothing reads its rows any more)."""
        with self._lock:
            path = self._paths.pop(job, None)
            self.disk_bytes -= self._sizes.pop(job, 0)
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Remove every job's file (and the directory, if it was made here). Rows kept in
        them can no longer be read."""
        self._finalizer()


def _remove(directory: str, paths: dict, own: bool) -> None:
    if own:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for path in list(paths.values()):
        try:
            os.unlink(path)
        except OSError:
            pass
    paths.clear()
