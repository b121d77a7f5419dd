"""Opening a spool file for :mod:`goodput_processor.read.reader`: a compacted segment at once.

A ``*.jsonl.gz`` file read through :func:`gzip.open` costs a Python call per 8 KiB of
compressed input and a CRC pass of its own; most of a spool is compacted segments of a few
MB. :func:`open_spool` decompresses such a segment in one zlib call instead, only when that
gives what :func:`gzip.open` gives, line for line: a single gzip member that zlib reads to
its end, with nothing after it, and a size within bounds (so a damaged, padded,
multi-member or very large file is read by :func:`gzip.open` as before, with the same
lines and the same error at the same place). That call is zlib-ng's (the ``zlib-ng``
package, a dependency: the same inflate, header and trailer checks, about twice as fast as
the standard library's zlib here), or zlib's where it is not installed.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib

try:
    from zlib_ng import zlib_ng as _inflate
except ImportError:  # pragma: no cover - a dependency; the standard library otherwise
    _inflate = zlib

__all__ = ["open_spool"]

#: Largest compressed file, and largest content, decompressed at once.
WHOLE_MAX_FILE = 16 << 20
WHOLE_MAX_CONTENT = 128 << 20


def _gunzip_whole(path: str) -> bytes | None:
    """The content of the single-member gzip file ``path`` if small enough, else None."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not 18 <= size <= WHOLE_MAX_FILE:  # 18: a gzip header and trailer
            return None
        raw = f.read(size + 1)
    if len(raw) != size:
        return None
    content_size = int.from_bytes(raw[-4:], "little")  # ISIZE: the content size mod 2**32
    if content_size > WHOLE_MAX_CONTENT:
        return None
    d = _inflate.decompressobj(wbits=31)  # gzip header and trailer (CRC, size) checked
    try:
        out = d.decompress(raw, content_size + 1)
    except (zlib.error, _inflate.error):
        return None
    if not d.eof or d.unused_data or d.unconsumed_tail or len(out) != content_size:
        return None
    return out


def open_spool(path: str):
    """A binary file object of the span file ``path`` (``*.jsonl`` or ``*.jsonl.gz``): its
    lines as :func:`open` or :func:`gzip.open` gives them.

    Raises:
        OSError: the file cannot be opened or read.
    """
    if not path.endswith(".gz"):
        return open(path, "rb")
    whole = _gunzip_whole(path)
    return gzip.open(path, "rb") if whole is None else io.BytesIO(whole)
