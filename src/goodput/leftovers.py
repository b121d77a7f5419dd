"""What earlier attempts of a rank left in the spool, finished when the rank starts again.

A process killed mid-segment leaves its journal uncompacted (the compacted segment is built
in memory, :mod:`goodput.segments`), a process killed while it wrote a compacted segment
leaves a ``*.jsonl.gz.tmp``, and an attempt that ended leaves the journal of its last
segment next to its ``.gz`` (it cannot outlive the grace of tailing readers). When an
attempt opens, the recorder starts :func:`tidy` on a thread of its own (``goodput-tidy``,
once; the training thread never waits for it) over the spool files of its own rank
(``spans-p<index>-a*``) that are not its own:

- a ``.gz.tmp`` whose writer is gone: removed;
- a journal with its ``.gz``: the ``.gz`` is checked (it decompresses to its end, CRC
  included) and synced, and the journal handed to the writer to retire (deleted after the
  grace, once every exporter has sent it, as its own writer would have); a ``.gz`` that does
  not check out is removed (its journal holds every span);
- a journal without ``.gz`` whose writer is gone: compacted as it is (its bytes
  gzip-compressed: the same lines, so every reader makes the same rows of them; a torn last
  line stays torn), synced, renamed into place, and handed over to retire;
- an exporter's ``.offset`` sidecar whose journal is gone: removed.

A writer is gone when its tail (``BASE.tail``, :mod:`goodput.tail`) exists and is not locked
(the kernel drops the writer's ``flock`` however the process ends), or, with no tail or a
file system without locks, when all of its journals have been untouched for
:data:`QUIET_S`. A journal that an exporter has not sent to its end (its sidecar's offset
short of the journal's size) is compacted but not handed over: that exporter's next
forwarder sends it, and a later start retires it.

Nothing raises: a file that cannot be read, written or removed is left as it is (logged
at debug level).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import time
import zlib

from goodput.segments import sync_dir
from goodput.tail import tail_path

_log = logging.getLogger(__name__)

QUIET_S = 600.0  # a writer without a (lockable) tail is gone once its journals are this old
LEVEL = 6  # zlib level of a journal compacted here (off the training thread, once)
_CHUNK = 1 << 20
_SEGMENT = re.compile(r"\.s\d{4}$")
#: A recorder's BASE (:func:`goodput.config.spool_path`): not an import's or another tool's.
_RECORDER_BASE = re.compile(r"spans-p\d{5}-a\d{4,}-\d+-[0-9a-f]{1,8}")


def _base(name: str) -> str | None:
    """``BASE`` of a recorder's spool file name (``BASE[.sNNNN].jsonl...``), or None."""
    i = name.find(".jsonl")
    if i < 0:
        return None
    base = _SEGMENT.sub("", name[:i])
    return base if _RECORDER_BASE.fullmatch(base) else None


def writer_gone(directory: str, base: str, journals: list[str], now_s: float) -> bool:
    """Whether the process that wrote ``BASE`` (its journals' paths ``journals``) is gone."""
    try:
        fd = os.open(tail_path(os.path.join(directory, base + ".jsonl")), os.O_RDONLY)
    except FileNotFoundError:
        fd = None
    except OSError:
        return False
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True  # nobody holds it
        except BlockingIOError:
            return False
        except OSError:
            pass  # no locks here: by age
        finally:
            os.close(fd)
    try:
        return all(now_s - os.stat(p).st_mtime >= QUIET_S for p in journals)
    except OSError:
        return False


def _sent(journal: str, sidecars: list[str]) -> bool:
    """Whether every exporter's sidecar of ``journal`` says it was sent to its end."""
    try:
        size = os.path.getsize(journal)
        for s in sidecars:
            with open(s, encoding="ascii") as f:
                if int(f.read().strip() or 0) < size:
                    return False
    except (OSError, ValueError):
        return False
    return True


def _gz_ok(path: str) -> bool:
    """Whether the gzip file ``path`` decompresses to its end (its CRC checked); synced."""
    try:
        with open(path, "rb") as f:
            z = zlib.decompressobj(31)
            while chunk := f.read(_CHUNK >> 2):
                z.decompress(chunk)
            if not z.eof:
                return False
            os.fsync(f.fileno())
        return True
    except (OSError, zlib.error):
        return False


def compact_journal(journal: str, level: int = LEVEL) -> bool:
    """Write ``journal``'s bytes gzip-compressed as ``journal.gz`` (through a synced
    ``.gz.tmp``, renamed into place); True if it is there."""
    tmp = journal + ".gz.tmp"
    try:
        z = zlib.compressobj(level, zlib.DEFLATED, 31)
        with open(journal, "rb") as src, open(tmp, "xb") as out:  # not two at once
            while chunk := src.read(_CHUNK):
                out.write(z.compress(chunk))
            out.write(z.flush())
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, journal + ".gz")
        return True
    except FileExistsError:  # another process of the rank compacts it now
        return False
    except (OSError, zlib.error) as exc:
        _log.debug("goodput: cannot compact %s: %s", journal, exc)
        try:
            os.remove(tmp)
        except OSError:
            pass
        return False


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError as exc:
        _log.debug("goodput: cannot remove %s: %s", path, exc)


def tidy(directory: str, index: int, own_base: str, adopt, compact: bool = True) -> dict:
    """Finish what earlier processes of rank ``index`` left in ``directory`` (see the module
    docstring); ``own_base``: this attempt's ``BASE`` (left alone); ``adopt(journal)``: hands
    a journal whose ``.gz`` is in place to the writer to retire; without ``compact`` (the
    spool's segments are not compacted) only ``.gz.tmp`` and sidecars are removed.

    Returns counts: ``tmp_removed``, ``compacted``, ``adopted``, ``bad_gz``,
    ``sidecars_removed``.
    """
    counts = dict.fromkeys(("tmp_removed", "compacted", "adopted", "bad_gz",
                            "sidecars_removed"), 0)
    try:
        names = os.listdir(directory)
    except OSError:
        return counts
    prefix = f"spans-p{index:05d}-a"
    bases: dict[str, list[str]] = {}
    for name in names:
        if name.startswith(prefix):
            base = _base(name)
            if base is not None and base != own_base:
                bases.setdefault(base, []).append(name)
    now = time.time()
    present = set(names)
    dirsync = False
    for base, files in sorted(bases.items()):
        journals = sorted(n for n in files if n.endswith(".jsonl"))
        paths = [os.path.join(directory, n) for n in journals]
        gone = writer_gone(directory, base, paths, now)
        for name in files:
            if name.endswith(".jsonl.gz.tmp") and gone:
                _remove(os.path.join(directory, name))
                counts["tmp_removed"] += 1
            elif ".jsonl." in name and name.endswith(".offset") and \
                    name[: name.index(".jsonl.") + 6] not in present:
                _remove(os.path.join(directory, name))
                counts["sidecars_removed"] += 1
        for name, path in zip(journals, paths, strict=True) if compact else ():
            compacted = name + ".gz" in present
            if compacted and not _gz_ok(path + ".gz"):  # (a crash before it was synced)
                _remove(path + ".gz")
                counts["bad_gz"] += 1
                compacted = False
            if not compacted:
                if not gone or not compact_journal(path):
                    continue
                counts["compacted"] += 1
            dirsync = True
            sidecars = [os.path.join(directory, n) for n in files
                        if n.startswith(name + ".") and n.endswith(".offset")]
            if _sent(path, sidecars):
                adopt(path)
                counts["adopted"] += 1
    if dirsync:
        sync_dir(directory)
    return counts
