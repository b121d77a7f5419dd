"""How far a read of a run directory has come, for whoever shows it (``goodput report``).

The reader only counts: :func:`~goodput_processor.read.reader.read_run_dir` asks
:func:`ticker` for a function to call with each span file (or line-aligned byte range of
one, when worker processes read it) it has finished, and calls it. Nothing is
counted unless a caller is :func:`watching`: a command line that draws a progress bar
wraps the read in ``with watching(bar):`` and gets ``bar("read", advance, total)`` calls
(``advance`` and ``total`` in bytes on disk, a compressed ``.jsonl.gz`` by its compressed
size), the signature of ``goodput import``'s progress callback. The watcher is a context
variable: a read in another thread or context is not counted.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator, Sequence

__all__ = ["Progress", "ticker", "watching"]

#: ``callback(phase, advance, total)``: ``phase`` is ``"read"``; ``advance`` and ``total``
#: are bytes (``advance`` since the last call).
Progress = Callable[[str, int, int], None]

_WATCHER: contextvars.ContextVar[Progress | None] = contextvars.ContextVar(
    "goodput_read_progress", default=None)


@contextlib.contextmanager
def watching(callback: Progress | None) -> Iterator[None]:
    """Within the block, reads of run directories in this context report to ``callback``
    (None: to nobody, as outside any block)."""
    token = _WATCHER.set(callback)
    try:
        yield
    finally:
        _WATCHER.reset(token)


def ticker(paths: Sequence[str | os.PathLike]) -> Callable[..., None] | None:
    """A function ``tick(path, start=0, end=None)`` telling the watcher that the bytes
    ``[start, end)`` of ``path`` (one of ``paths``; ``end`` None: to its size now) are
    read, of the total size of ``paths`` now (an unreadable file counts 0); None when
    nobody watches (the reader then skips the calls)."""
    callback = _WATCHER.get()
    if callback is None:
        return None
    sizes = {os.fspath(p): _size(p) for p in paths}
    total = sum(sizes.values())

    def tick(path, start: int = 0, end: int | None = None) -> None:
        size = sizes.get(os.fspath(path), 0)
        callback("read", max(0, min(size, size if end is None else end) - start), total)

    return tick


def _size(path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:  # (gone since it was listed: a journal compacted meanwhile)
        return 0
