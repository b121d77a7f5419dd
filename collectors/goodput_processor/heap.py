"""The C heap's free pages given back to the system.

numpy's arrays of a few MiB come from glibc's heap once its dynamic mmap threshold has
risen (it rises to the size of the largest mmapped block freed, up to 32 MiB), and glibc
keeps what it freed there resident. Where the processor has just let go of much at once
(a report's rows narrowed, ``goodput serve``'s compaction), :func:`trim_heap` hands those
pages back, so that the next peak does not stand on them.
"""

from __future__ import annotations

__all__ = ["trim_heap"]

_TRIM: list = []  # glibc's malloc_trim, once looked up (None where there is none)


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim(0)``; nothing
    where the C library has none). It walks the heap's free chunks: call it after letting
    go of much, not in a loop over small things."""
    if not _TRIM:
        try:
            import ctypes

            _TRIM.append(ctypes.CDLL(None).malloc_trim)
        except (OSError, AttributeError):
            _TRIM.append(None)
    if _TRIM[0] is not None:
        _TRIM[0](0)
