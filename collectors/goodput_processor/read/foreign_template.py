"""A foreign producer's spans read from the text of the Collector's OTLP JSON lines.

The OpenTelemetry Collector's file exporter writes one OTLP JSON request a line, and a
training loop's spans (Megatron-LM's ``megatron.train.iteration``, one a step) fill most of
it, each the same text but for its ids, times and step number, e.g. (one line here)::

    {"traceId":"<32>","spanId":"<16 hex>","parentSpanId":"<16>","name":"megatron.train.
    iteration","kind":1,"startTimeUnixNano":"<digits>","endTimeUnixNano":"<digits>",
    "attributes":[...{"key":"megatron.iteration","value":{"intValue":"<digits>"}}...],
    "status":{}}

Parsing such a line (orjson) and reading each span's dict cost about 4 us a span.
:func:`scan` reads the leading run of such spans of a line's first spans list with numpy
instead, as :mod:`goodput_processor.read.template` reads the recorder's own spans (its
:func:`~goodput_processor.read.template._decimal`, ``_hex`` and ``_plain``): the text of
each span is compared, 8 bytes a step, with a form learnt from the list's first span, and
its fields are read from the columns of the form's holes.

The form (:class:`_Template`) is learnt from the first span itself: parsed alone (the
``json`` module's ``raw_decode`` of its text), it must be one of the names asked for, with a
str ``spanId``, ``startTimeUnixNano`` and ``endTimeUnixNano`` and the int attribute asked for
as a str ``intValue``, and written exactly as ``orjson.dumps`` or ``json.dumps`` (with its
spaces) writes that dict; then its ``traceId``, ``spanId``, ``parentSpanId``, times and
step number are the holes, and every other byte is fixed (the names and values of the other
attributes, the status, the flags). A span taken is byte for byte the form but for its
holes, and a hole holds no quote (digits; 16 lowercase hex digits; printable ASCII), so
each span taken is a JSON object whose dict is the first span's but for these fields.

The line with the spans taken replaced by :data:`~goodput_processor.importers.sources.
driver.TAKEN` (the skeleton) is parsed as before; the cut is done only in a line with no
backslash (no escaped character anywhere, so no string holds a quote and no key is written
otherwise than it reads), and the driver uses the skeleton only where :data:`TAKEN` is the
first item of its first resource's first scope's spans list once parsed (no duplicate key
replaced the list the spans were cut from), else it parses the whole line.
"""

from __future__ import annotations

import json
import re

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..importers.sources.base import SpanColumns
from ..importers.sources.driver import TAKEN
from .template import _decimal, _hex, _plain, fixed_words

try:  # optional speed-up, never a dependency (as in goodput_processor.read.reader)
    import orjson

    _loads = orjson.loads

    def _compact(d) -> bytes:
        return orjson.dumps(d)
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

    def _compact(d) -> bytes:
        return json.dumps(d, ensure_ascii=False, separators=(",", ":")).encode()

__all__ = ["scan"]

#: The first span's text read to learn a form, at most.
_MODEL_BYTES = 1 << 14
#: Step numbers of 1 to 18 digits (so that the step, one more, stays below 2**63).
_MAX_DIGITS = 18
_DIGITS = re.compile(rb"[0-9]{1,19}")
_DECODER = json.JSONDecoder()


def _spaced(d) -> bytes:
    return json.dumps(d, ensure_ascii=False).encode()


class _Form:
    """One form's fixed bytes and holes for a step number of ``digits`` digits: the span's
    text followed by ``tail`` (``,`` before the next span, ``]`` after the last)."""

    __slots__ = ("length", "fields", "width", "_mask", "_fixed")

    def __init__(self, parts: list, digits: int, tail: bytes):
        text, fields, holes = b"", {}, []
        for p in parts:
            if isinstance(p, bytes):
                text += p
                continue
            field, width = p
            width = digits if field == "ival" else width
            fields[field] = slice(len(text), len(text) + width)
            holes.extend(range(len(text), len(text) + width))
            text += b"0" * width
        self.length, self.fields = len(text), fields
        text += tail
        self.width, self._mask, self._fixed = fixed_words(text, holes)

    def matches(self, text: np.ndarray) -> np.ndarray:
        """Per row of ``text`` (uint8, C-contiguous, :attr:`width` columns): its fixed
        bytes are this form's?"""
        return ((text.view(np.uint64) & self._mask) == self._fixed).all(1)


_SENTINELS = {"tid": "@@goodput.t@@", "sid": "@@goodput.s@@", "parent": "@@goodput.p@@",
              "start": "@@goodput.b@@", "end": "@@goodput.e@@", "ival": "@@goodput.i@@"}


class _Template:
    """A form learnt from one span (see the module docstring): ``parts`` (fixed bytes and
    ``(field, width)`` holes), ``sep`` (between spans), ``head`` (the bytes before the
    first hole), ``key`` (the names and attribute it was learnt for), ``ival_at`` (the
    step number hole's offset, None where it has none: not a template)."""

    def __init__(self, key, parts: list, sep: bytes):
        self.key, self.parts, self.sep = key, parts, sep
        self.head = parts[0] if isinstance(parts[0], bytes) else b""
        self.ival_at = _ival_offset(parts)
        self._forms: dict = {}

    def form(self, digits: int, last: bool) -> _Form:
        got = self._forms.get((digits, last))
        if got is None:
            got = self._forms[digits, last] = _Form(self.parts, digits,
                                                    b"]" if last else self.sep)
        return got

    def fits_first(self, line: bytes, s0: int) -> bool:
        """Whether the span at ``line[s0]`` has this form's fixed bytes (its holes are
        read later)."""
        at = s0
        for p in self.parts:
            if isinstance(p, bytes):
                if not line.startswith(p, at):
                    return False
                at += len(p)
            elif p[0] == "ival":
                m = _DIGITS.match(line, at)
                if m is None:
                    return False
                at = m.end()
            else:
                at += p[1]
        return True



def _ival_offset(parts: list) -> int | None:
    """The offset of the step number's hole in a span's text (the holes before it are fixed
    widths), or None where ``parts`` has none."""
    at = 0
    for p in parts:
        if isinstance(p, bytes):
            at += len(p)
        elif p[0] == "ival":
            return at
        else:
            at += p[1]
    return None


def _learn(line: bytes, s0: int, key) -> _Template | None:
    """The template of the span whose text starts at ``line[s0]`` (a ``{``), or None where
    it is none (see the module docstring)."""
    names, attr = key
    window = line[s0:s0 + _MODEL_BYTES]
    decoded = window.decode("utf-8", "replace")
    try:
        d, end = _DECODER.raw_decode(decoded)
    except ValueError:
        return None
    if type(d) is not dict or d.get("name") not in names:
        return None
    text = window[:len(decoded[:end].encode())]
    sid, start, stop = d.get("spanId"), d.get("startTimeUnixNano"), d.get("endTimeUnixNano")
    if not (type(sid) is str and len(sid) == 16 and type(start) is str and start.isdigit()
            and type(stop) is str and stop.isdigit()):
        return None
    kv = None
    attrs = d.get("attributes")
    for item in attrs if type(attrs) is list else ():
        if type(item) is dict and item.get("key") == attr:
            kv = item
            break
    value = kv.get("value") if kv is not None else None
    if type(value) is not dict or type(value.get("intValue")) is not str:
        return None
    tid, parent = d.get("traceId"), d.get("parentSpanId")
    widths = {"tid": len(tid) if type(tid) is str else 0, "sid": 16,
              "parent": len(parent) if type(parent) is str else 0, "start": len(start),
              "end": len(stop), "ival": 0}
    for dump, sep in ((_compact, b","), (_spaced, b", ")):
        if dump(d) != text:
            continue
        marked = _loads(text)  # a copy, its variable fields replaced by sentinels
        for field, k in (("tid", "traceId"), ("sid", "spanId"), ("parent", "parentSpanId"),
                         ("start", "startTimeUnixNano"), ("end", "endTimeUnixNano")):
            if type(marked.get(k)) is str:
                marked[k] = _SENTINELS[field]
        for item in marked["attributes"]:
            if type(item) is dict and item.get("key") == attr:
                item["value"]["intValue"] = _SENTINELS["ival"]
                break
        out = dump(marked)
        parts: list = []
        if any(out.count(s.encode()) > 1 for s in _SENTINELS.values()):
            return None
        pattern = re.compile(b"|".join(re.escape(s.encode()) for s in _SENTINELS.values()))
        by_text = {s.encode(): f for f, s in _SENTINELS.items()}
        at = 0
        for m in pattern.finditer(out):
            parts.append(out[at:m.start()])
            field = by_text[m.group()]
            parts.append((field, widths[field]))
            at = m.end()
        parts.append(out[at:])
        tmpl = _Template(key, [p for p in parts if p != b""], sep)
        return tmpl if tmpl.ival_at is not None else None
    return None


_TEMPLATES: list[_Template] = []


def _run(buf: np.ndarray, line_len: int, pos: int, form: _Form, stride: int,
         limit: int | None = None):
    """The spans of ``form`` from ``pos`` on, every ``stride`` bytes, as far as each is the
    form and its holes read: ``(count, positions, start, end, ival, sid)``."""
    n = max(0, (line_len - pos - form.length) // stride + 1)
    if limit is not None:
        n = min(n, limit)
    if not n:
        return 0, None
    at = pos + np.arange(n, dtype=np.int64) * stride
    text = sliding_window_view(buf, form.width)[at]
    ok = form.matches(text)
    f = form.fields
    fits, start = _decimal(text[:, f["start"]])
    good, end = _decimal(text[:, f["end"]])
    fits &= good & ok
    good, ival = _decimal(text[:, f["ival"]])
    fits &= good
    good, sid = _hex(text[:, f["sid"]])
    fits &= good
    for k in ("tid", "parent"):
        if k in f and f[k].stop > f[k].start:
            fits &= _plain(text[:, f[k]])
    k = int(np.argmin(fits)) if not fits.all() else n
    if not k:
        return 0, None
    return k, (at[:k], start[:k], end[:k], ival[:k], sid[:k])


def scan(line: bytes, key) -> tuple[bytes, SpanColumns] | None:
    """The leading spans of OTLP JSON line ``line``'s first spans list that are one form
    learnt from the first of them (``key``: ``(span names, int attribute)``, e.g. the
    ``megatron`` translator's ``template_names``), taken out: ``(skeleton, columns)`` (the
    line with them replaced by ``TAKEN``, and the spans as
    :class:`~goodput_processor.importers.sources.base.SpanColumns`, ``value`` the
    attribute), or None where none is taken (see the module docstring)."""
    if b"\\" in line:
        return None
    at = line.find(b'"spans":')
    if at < 0:
        return None
    s0 = at + 8 + (line[at + 8:at + 9] == b" ")
    if line[s0:s0 + 2] != b"[{":
        return None
    s0 += 1
    for t in _TEMPLATES:
        if t.key == key and t.fits_first(line, s0):
            return _take(line, s0, t)
    tmpl = _learn(line, s0, key)
    if tmpl is None:
        return None
    _TEMPLATES.insert(0, tmpl)
    del _TEMPLATES[8:]  # (a file has one or a few)
    return _take(line, s0, tmpl)


def _take(line: bytes, s0: int, tmpl: _Template):
    ival_at, sep = tmpl.ival_at, tmpl.sep
    width = max(tmpl.form(_MAX_DIGITS, False).width, tmpl.form(_MAX_DIGITS, True).width)
    buf = np.frombuffer(line + bytes(width), np.uint8)
    pos, runs, whole, size, tried = s0, [], False, len(line), 0
    while True:
        m = _DIGITS.match(line, pos + ival_at)
        digits = len(m.group()) if m else 0
        if not 1 <= digits <= _MAX_DIGITS:
            break
        if digits != tried:  # (with the digits of the run before, it stopped here)
            tried = digits
            form = tmpl.form(digits, False)
            k, got = _run(buf, size, pos, form, form.length + len(sep))
            if k:
                runs.append((got, form.length))
                pos += k * (form.length + len(sep))
                continue
        last = tmpl.form(digits, True)  # the list's last span, followed by "]"
        k, got = _run(buf, size, pos, last, last.length, limit=1)
        if k:
            runs.append((got, last.length))
            pos += last.length
            whole = True
        break
    if not runs:
        return None
    cols = [np.concatenate([r[0][i] for r in runs]) for i in range(5)]
    lengths = np.concatenate([np.full(len(r[0][0]), r[1], np.int64) for r in runs])
    where, start, end, ival, sid = cols

    def span(i: int) -> dict:
        at = int(where[i])
        return _loads(line[at:at + int(lengths[i])])

    skeleton = line[:s0] + TAKEN + (line[pos:] if whole else b"," + line[pos:])
    return skeleton, SpanColumns(start, end, ival, sid, span)
