"""The C heap's free pages given back to the system.

numpy's arrays of a few MiB come from glibc's heap once its dynamic mmap threshold has
risen (it rises to the size of the largest mmapped block freed, up to 32 MiB), and glibc
keeps what it freed there resident. Where the processor has just let go of much at once
(a report's rows narrowed, ``goodput serve``'s compaction), :func:`trim_heap` hands those
pages back, so that the next peak does not stand on them. Where it cannot know (a live
poll's temporaries, freed when the poll is done), :func:`trim_heap_if_grown` does it once
the process has grown by a margin since the last trim.
"""

from __future__ import annotations

import os

__all__ = ["GROWTH_MARGIN_BYTES", "resident_bytes", "trim_heap", "trim_heap_if_grown"]

_TRIM: list = []  # glibc's malloc_trim, once looked up (None where there is none)
_AFTER: list = []  # resident bytes just after the last trim (none yet: empty)

#: Bytes the process may grow by after a trim before :func:`trim_heap_if_grown` trims
#: again: 8 MiB (a trim of a heap with 480 MiB free took 3.5 ms, one with 120 MiB 1.9 ms).
GROWTH_MARGIN_BYTES = 8 << 20


def resident_bytes() -> int | None:
    """This process's resident memory in bytes (Linux ``/proc/self/statm``; None where
    there is no such file)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


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
        _AFTER[:] = [resident_bytes()]


def trim_heap_if_grown(margin_bytes: int = GROWTH_MARGIN_BYTES) -> bool:
    """:func:`trim_heap` if the resident memory is more than ``margin_bytes`` above what it
    was just after the last trim (or if none was done yet). Cheap when not (one read of
    ``/proc/self/statm``, about 20 µs), so a periodic round can call it: memory the process
    really holds raises the mark it is compared with, so it costs at most one trim in vain
    per ``margin_bytes`` of growth. Returns whether it trimmed."""
    now = resident_bytes()
    if now is None:
        return False
    if _AFTER and _AFTER[0] is not None and now - _AFTER[0] <= margin_bytes:
        return False
    trim_heap()
    return bool(_TRIM and _TRIM[0] is not None)
