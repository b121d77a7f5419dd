"""Read an attempt's spool tail: the records a killed process had not yet flushed.

The recorder writes each record, on the recording thread, into ``BASE.tail`` beside the
journal ``BASE.jsonl`` (``src/goodput/tail.py``; the layout is in :mod:`goodput.schema`,
``TAIL_*``; ``docs/span-schema.md``, "The tail"), and after each journal write how far the
journal has got (a sequence number) and the step then in flight. :func:`tail_lines` turns
the records after that point into the OTLP JSON lines the journal would have held, written
with the journal's own line template (the attempt's resource), so the reader makes the same
rows of them as of the journal:

- a phase's end: its span;
- a phase's start with no end after it: a ``goodput.open`` record (the processor extends
  it to the process's last sign of life, as the journal's open records);
- a step start (``goodput.step_start``): the step before it ends there (the one in flight
  at the last flush, from the tail's state, included); the last one is an open record.

A tail is read only when its writer is gone: the writer holds an exclusive ``flock`` on it
while it lives (the kernel drops it however the process ends), so the records of a live
process come from its journal alone, and a tail read once is never read again by a tailing
reader (``goodput serve --spool-dir``) as the journal grows. A tail whose attempt ended
cleanly does not exist (the recorder removes it). Span ids are the tail's id base plus the
record's sequence number, in one trace of the tail's own.

Nothing raises for bad input: a tail that is not one (wrong magic, version, sizes) gives
no line, and records that are torn (their sequence number written last does not match
their slot) or overwritten are left out.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import struct
import time
import zlib
from pathlib import Path

import numpy as np

from goodput import schema

__all__ = ["drop_unfinished", "is_tail", "tail_lines"]

_REC = struct.Struct(schema.TAIL_RECORD)
_HEAD = struct.Struct(schema.TAIL_HEAD)
_STATE = struct.Struct(schema.TAIL_STATE)
_TMPL = struct.Struct(schema.TAIL_TEMPLATE)
_SEQ = struct.Struct("<Q")
_BATCH = 512  # spans per line, as the journal
_U64 = (1 << 64) - 1


def is_tail(name: str) -> bool:
    """Whether a file name is a spool tail's (``*.tail``)."""
    return name.endswith(schema.TAIL_SUFFIX)


def writer_alive(f) -> bool:
    """Whether the writer of the open tail file ``f`` still holds its lock (is alive)."""
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no locks on this file system: as if gone (the header says so too)
        return False
    return False


_UNFINISHED = re.compile(r"(\.s\d{4})?\.jsonl\.gz\.tmp$")
UNFINISHED_AGE_S = 60.0  # a .gz.tmp is written in one go: one this old is no write under way


def drop_unfinished(root) -> int:
    """Remove the ``*.jsonl.gz.tmp`` files under ``root`` whose writer is gone: a compacted
    segment that a process was killed writing (the recorder builds it in memory and writes
    it in one go), or that a recorder before issue 40 left; no reader reads one, and its
    journal holds every span. Gone: its tail (``BASE.tail``) is missing or not locked, and
    the file is :data:`UNFINISHED_AGE_S` old. A file that cannot be removed (a read-only run
    directory) is left. Returns how many went; never raises."""
    n, now = 0, time.time()
    try:
        found = list(Path(root).rglob("*.jsonl.gz.tmp"))
    except OSError:
        return 0
    for p in found:
        try:
            if now - p.stat().st_mtime < UNFINISHED_AGE_S:
                continue
            try:
                with open(_UNFINISHED.sub("", str(p)) + schema.TAIL_SUFFIX, "rb") as f:
                    if writer_alive(f):
                        continue
            except FileNotFoundError:
                pass
            os.remove(p)
            n += 1
        except OSError:
            continue
    return n


def tail_lines(path: str, when_alive: bool = False) -> list[bytes] | None:
    """The OTLP JSON lines (bytes, each ending in ``\\n``) of the records of the tail
    ``path`` that its journal lacks; ``[]`` if none (or not a readable tail).

    Returns None while the writer lives (unless ``when_alive``): its journal will have
    them. Never raises for bad input; an unreadable file gives ``[]``.
    """
    try:
        with open(path, "rb") as f:
            if not when_alive and writer_alive(f):
                return None
            data = f.read()
    except OSError:
        return []
    try:
        return _lines(data)
    except (struct.error, ValueError, TypeError, KeyError, IndexError, UnicodeDecodeError):
        return []


def _lines(data: bytes) -> list[bytes]:
    (magic, version, rec_size, ring, blobs, tmpl_size, _flags, id_base,
     trace) = _HEAD.unpack_from(data, 0)
    ring_at = schema.TAIL_DATA_AT + 2 * tmpl_size
    blob_at = ring_at + ring * rec_size
    if (magic != schema.TAIL_MAGIC or version != schema.TAIL_VERSION
            or rec_size != _REC.size or not ring or len(data) < blob_at + blobs):
        return []
    template = _template(data, tmpl_size)
    if template is None:
        return []
    state = _state(data)
    if state is None:
        return []
    flushed, pending = state
    recs = _records(data, ring_at, ring, flushed)
    if not recs:
        return []
    spans = _spans(recs, pending, data, blob_at, blobs, trace.hex(), id_base)
    prefix, suffix = template
    return [(prefix + ",".join(spans[i : i + _BATCH]) + suffix).encode()
            for i in range(0, len(spans), _BATCH)]


#: A ring slot (``schema.TAIL_RECORD``, little-endian): word, value, t0, t1, seq.
_SLOT = np.dtype([("word", "<u8"), ("value", "<i8"), ("t0", "<i8"), ("t1", "<i8"),
                  ("seq", "<u8")])


def _records(data: bytes, ring_at: int, ring: int, flushed: int) -> list[tuple]:
    """The ring's records the journal lacks, sorted by sequence number: ``(seq, kind,
    flags, name id, blob length, blob offset, value, t0, t1)`` (``t1`` is ``t0`` for a
    begin), of the slots whose ``seq`` is past ``flushed``, in their own slot (``seq %
    ring``; a torn or overwritten one is not) and of a known kind. The slots are selected
    with numpy (most of a ring is records the journal has); the few left are unpacked one
    by one, as they always were.

    Raises:
        ValueError: ``data`` is shorter than the ring.
    """
    slots = np.frombuffer(data, _SLOT, ring, ring_at)
    seq = slots["seq"]
    kind = slots["word"] & np.uint64(0xFF)
    keep = ((seq > np.uint64(flushed)) & (seq % np.uint64(ring) == np.arange(ring, dtype=np.uint64))
            & (kind >= 1) & (kind <= 3))
    recs = []
    for i in np.flatnonzero(keep).tolist():
        word, value, t0, t1, seq = _REC.unpack_from(data, ring_at + i * _REC.size)
        kind = word & 0xFF
        recs.append((seq, kind, word >> 8 & 0xFF, word >> 16 & 0xFFFF, word >> 32 & 0xFFFF,
                     word >> 48, value, t0, t0 if kind == schema.TAIL_BEGIN else t1))
    recs.sort()
    return recs


def _template(data: bytes, size: int) -> tuple[str, str] | None:
    """(prefix, suffix) of the newest whole copy of the line template."""
    best = None
    for i, at in enumerate(schema.TAIL_TEMPLATE_AT):
        gen, n, crc = _TMPL.unpack_from(data, at)
        start = schema.TAIL_DATA_AT + i * size
        text = data[start : start + n]
        if gen and n <= size and zlib.crc32(text) == crc and (best is None or gen > best[0]):
            best = (gen, text)
    if best is None:
        return None
    prefix, _, suffix = best[1].decode().partition("\x00")
    return prefix, suffix


def _state(data: bytes) -> tuple[int, tuple[int, int] | None] | None:
    """(last sequence number in the journal, the step in flight then) of the newest whole
    copy of the state."""
    best = None
    for at in schema.TAIL_STATE_AT:
        gen, flushed, step, t0, has, check = _STATE.unpack_from(data, at)
        if gen and gen == check and (best is None or gen > best[0]):
            best = (gen, flushed, (step, t0) if has else None)
    return None if best is None else best[1:]


def _attrs_json(attrs: dict) -> str:
    """Attributes as an OTLP/JSON ``KeyValue`` list's text (as the recorder encodes them)."""
    parts = []
    for k, v in attrs.items():
        if isinstance(v, bool):
            val = {"boolValue": v}
        elif isinstance(v, int):
            val = {"intValue": str(v)}
        elif isinstance(v, float):
            val = {"doubleValue": v}
        elif isinstance(v, list):
            val = {"arrayValue": {"values": [json.loads(_attrs_json({"": x}))["value"]
                                             for x in v]}}
        else:
            val = {"stringValue": str(v)}
        parts.append(json.dumps({"key": str(k), "value": val}, separators=(",", ":")))
    return ",".join(parts)


def _spans(recs, pending, data, blob_at, blobs, trace_hex, id_base) -> list[str]:
    """Span texts of the records (sorted by sequence number); see the module docstring."""
    names = schema.TAIL_NAMES
    out, begun = [], {}
    last = max(max(r[7], r[8]) for r in recs)  # the last sign of life in the tail

    def span(seq, name, t0, t1, attrs, err=None, salt=0):
        sid = (id_base + seq + salt) & _U64 or 1
        text = (f'{{"traceId":"{trace_hex}","spanId":"{sid:016x}","name":{json.dumps(name)},'
                f'"kind":1,"startTimeUnixNano":"{t0}","endTimeUnixNano":"{max(t0, t1)}"')
        if attrs:
            text += ',"attributes":[' + _attrs_json(attrs) + "]"
        if err is not None:
            text += ',"status":{"code":2,"message":' + json.dumps(str(err)) + "}"
        out.append(text + "}")

    step = pending  # (number, start) of the step in flight
    step_seq = None  # its start's record, when in the tail
    for seq, kind, flags, nid, blen, boff, value, t0, t1 in recs:
        attrs, err, name = {}, None, names[nid - 1] if 0 < nid <= len(names) else None
        if flags & schema.TAIL_F_BLOB:
            blob = data[blob_at + boff : blob_at + boff + blen]
            if boff + blen > blobs or len(blob) < 8 or _SEQ.unpack_from(blob)[0] != seq:
                if name is None:
                    continue  # overwritten, and the name was in it
            else:
                extra = json.loads(blob[8:])
                name = extra.get("n", name)
                attrs.update(extra.get("a") or {})
                err = extra.get("e")
        if flags & schema.TAIL_F_STEP:
            attrs[schema.ATTR_STEP] = value
        elif flags & schema.TAIL_F_CKPT_STEP:
            attrs[schema.ATTR_CHECKPOINT_STEP] = value
        if flags & (schema.TAIL_F_BLOCKING | schema.TAIL_F_ASYNC):
            attrs[schema.ATTR_BLOCKING] = bool(flags & schema.TAIL_F_BLOCKING)
        if kind == schema.TAIL_STEP_START:
            if step is not None:
                span(seq, schema.STEP, step[1], t0, {schema.ATTR_STEP: step[0]})
            step, step_seq = (value, t0), seq
        elif kind == schema.TAIL_BEGIN and name is not None:
            begun[(name, t0)] = (seq, attrs)
        elif name is not None:
            begun.pop((name, t0), None)
            span(seq, name, t0, t1, attrs, err)
    open_ = {schema.ATTR_OPEN: True}
    for (name, t0), (seq, attrs) in begun.items():
        span(seq, name, t0, last, {**attrs, **open_})
    if step_seq is not None:
        span(step_seq, schema.STEP, step[1], last, {schema.ATTR_STEP: step[0], **open_},
             salt=1 << 63)  # its record's id is the step it closed
    return out
