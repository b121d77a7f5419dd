"""A forked child never writes into its parent's spool.

``os.fork`` (a DataLoader worker, ``multiprocessing``'s ``fork`` start method, a bare fork)
copies the parent's recorder into the child: its spool files, its span-id generator, its
exit hook. Left alone, the child's exit would write the parent's end marker, and its spans
would enter the parent's attempt with the parent's span ids (so the parent's own would be
dropped as duplicates). An ``os.register_at_fork`` hook stops every recorder in the child
instead: it writes nothing more, keeps nothing (what the child records is dropped, said
once in a log line), and leaves the parent's files as they are. A child that calls
``goodput.configure()`` records as a process of its own (its own pid, instance id and
spool files). ``forkserver`` and ``spawn`` children start a fresh interpreter: they never
had the parent's recorder.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import weakref

from goodput.tail import NULL as _NO_TAIL

__all__ = ["track"]

_log = logging.getLogger("goodput.recorder")
#: Every recorder of this process.
_RECORDERS: weakref.WeakSet = weakref.WeakSet()


def track(recorder) -> None:
    """Stop ``recorder`` in any child this process forks from now on."""
    _RECORDERS.add(recorder)


class _ForkedQueue:
    """The record queue of a recorder in a forked child: takes nothing (no thread drains it
    there, and its records would go into the parent's spool), and says so once."""

    __slots__ = ("parent", "said")

    def __init__(self, parent: int):
        self.parent, self.said = parent, False

    def append(self, _record) -> None:
        if not self.said:
            self.said = True
            _log.warning("goodput: process %d is a fork of process %d and records nothing "
                         "through the recorder it inherited (its spans would mix with its "
                         "parent's); call goodput.configure() in it to record it as a "
                         "process of its own", os.getpid(), self.parent)

    def __len__(self) -> int:
        return 0

    def popleft(self):
        raise IndexError("a forked child's recorder holds no records")


def _stop(rec, parent: int) -> None:
    """Stop recorder ``rec`` in this forked child of process ``parent`` (see the module
    docstring): a buffered file's bytes still held in the child's copy go to /dev/null."""
    rec.forked_from = parent
    rec._shut = True
    rec._q = _ForkedQueue(parent)
    rec._tail = _NO_TAIL
    rec._open.tail = _NO_TAIL
    rec._thread = None
    try:
        atexit.unregister(rec.shutdown)
        if sys.excepthook == rec._excepthook:
            sys.excepthook = rec._prev_excepthook or sys.__excepthook__
        gz = getattr(rec._sink, "_gz", None)
        if gz is not None:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, gz.fileno())
            finally:
                os.close(null)
    except Exception:  # noqa: BLE001 - never raise into the child
        pass
    rec._sink = None


def _after_fork_in_child() -> None:
    parent = os.getppid()
    for rec in list(_RECORDERS):
        if rec.forked_from is None:
            _stop(rec, parent)


os.register_at_fork(after_in_child=_after_fork_in_child)
