"""The reader's fastest path: the recorder's own spans read from the JSON text, not parsed.

Most of a spool is lines the recorder wrote, with ``goodput.step`` and
``goodput.data_loading`` spans of one exact form (``docs/span-schema.md``), e.g.::

    {"traceId":"<32 hex>","spanId":"<16 hex>","parentSpanId":"<16 hex>","name":"goodput.step",
     "kind":1,"startTimeUnixNano":"<19 digits>","endTimeUnixNano":"<19 digits>",
     "attributes":[{"key":"goodput.step","value":{"intValue":"<digits>"}}]}

Parsing them (orjson) and reading the parsed dicts cost about 1 us a span. :func:`scan`
reads a chunk of lines at once with numpy instead: each line's spans array is cut at
``},{``, and each piece that is byte for byte one of these forms (:data:`_VARIANTS`: every
goodput kind without attributes, a step with its step number, each of these also with
``goodput.open`` true last (the span in flight at a flush); lowercase hex ids, decimal
times) gives its row directly. The leading run of such spans of a line's first spans list
is taken out of the line, and after it one more span that is a form and ends at a ``}``
followed by ``]`` (the list's last span: a journal line is often all forms) or by ``,{``
(a span with two attributes, cut in two at ``},{``). The rest of the line (the skeleton,
with the other spans and the resource; its first spans list may be left empty) is parsed
by orjson as before, and the reader puts the taken rows before that list's other spans.

This gives exactly what parsing the whole line gives, because it is done only when the cut
cannot change the meaning of the line: no backslash in the line (no escaped character,
so every key is written as it reads), the text before the cut is exactly
``{"resourceSpans":[{"scopeSpans":[{"scope":{"name":"...","version":"..."},"spans":[``
(so the array cut is the first resource's first scope's spans list), and the rest of the
line holds none of the keys ``"resourceSpans"``, ``"scopeSpans"``, ``"scope"``, ``"spans"``
(so no duplicate key replaces what was cut; checked as ``pans":`` and ``"scope":``, which
refuses a little more). A span taken is a JSON object of its own (its strings hold no
quote: it ends where its form ends), so the line is valid JSON exactly when its skeleton
is; the reader parses the skeleton, and where that fails, the whole line as before (for
the same error message).
"""

from __future__ import annotations

import re

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from goodput import schema

from . import rows as tl
from .attrs import _KIND_ATTRS, flag_bit

__all__ = ["Taken", "scan"]

_PREFIX = re.compile(rb'\{"resourceSpans":\[\{"scopeSpans":\[\{"scope":\{"name":"[^"\\\x00-\x1f]*",'
                     rb'"version":"[^"\\\x00-\x1f]*"\},"spans":\[')
_CUT = b'"spans":[{'
_PAD = bytes(8)
_I64_MAX = (1 << 63) - 1

_IS_HEX = np.zeros(256, bool)
_IS_HEX[list(b"0123456789abcdef")] = True
_IS_DIGIT = np.zeros(256, bool)
_IS_DIGIT[list(b"0123456789")] = True
_HEX_VALUE = np.zeros(256, np.uint64)
_HEX_VALUE[list(b"0123456789abcdef")] = np.arange(16, dtype=np.uint64)


class Taken:
    """The spans taken out of one line's first spans list: ``n`` rows (``tidx`` to be
    filled), and each row's trace id as an index ``tcodes`` into ``tids`` (a list shared by
    the lines of one :func:`scan`)."""

    __slots__ = ("n", "rows", "tids", "tcodes")

    def __init__(self, rows, tids, tcodes):
        self.n, self.rows, self.tids, self.tcodes = len(rows), rows, tids, tcodes


class _Variant:
    """One form of a span's text between its braces: fixed bytes and fields."""

    def __init__(self, kind: int, name: str, step_digits: int | None, flags: int | None):
        parts = ['"traceId":"', ("tid", 32), '","spanId":"', ("sid", 16),
                 '","parentSpanId":"', ("parent", 16),
                 f'","name":"{name}","kind":1,"startTimeUnixNano":"', ("start", 19),
                 '","endTimeUnixNano":"', ("end", 19), '"']
        attrs = []
        if step_digits:
            attrs += [f'{{"key":"{schema.ATTR_STEP}","value":{{"intValue":"',
                      ("ival", step_digits), '"}}']
        if flags is not None:  # an open span (the phase in flight at a flush)
            attrs += [","] if attrs else []
            attrs += [f'{{"key":"{schema.ATTR_OPEN}","value":{{"boolValue":true}}}}']
        if attrs:
            parts += [',"attributes":['] + attrs + [']']
        text, fields = b"", {}
        holes = []
        for p in parts:
            if isinstance(p, str):
                text += p.encode()
                continue
            field, width = p
            fields[field] = slice(len(text), len(text) + width)
            holes.extend(range(len(text), len(text) + width))
            text += b"0" * width
        self.kind, self.length, self.fields, self.flags = kind, len(text), fields, flags or 0
        self.width, self._mask, self._fixed = fixed_words(text, holes)

    def matches(self, text: np.ndarray) -> np.ndarray:
        """Per row of ``text`` (C-contiguous uint8, ``width`` columns: a span's text from
        its first byte, and what follows it to the width): its fixed bytes are this
        form's? 8 bytes a step."""
        return _rows_all((text.view(np.uint64) & self._mask) == self._fixed)


def fixed_words(text: bytes, holes: list[int]) -> tuple[int, np.ndarray, np.ndarray]:
    """A form's fixed bytes for a word-wise compare: ``(width, mask, fixed)``, ``width`` the
    length of ``text`` rounded up to whole 8-byte words, ``mask`` and ``fixed`` uint64 arrays
    of ``width // 8`` words (``mask`` 0 on the ``holes``' byte offsets and past the text,
    ``fixed`` the text's bytes under the mask). A row's text matches when
    ``(row & mask) == fixed`` in every word."""
    width = -(-len(text) // 8) * 8
    mask = np.zeros(width, np.uint8)
    mask[:len(text)] = 255
    mask[holes] = 0
    fixed = np.zeros(width, np.uint8)
    fixed[:len(text)] = np.frombuffer(text, np.uint8)
    return width, mask.view(np.uint64), (fixed & mask).view(np.uint64)


def _variants() -> dict[int, list[_Variant]]:
    """The forms by length: each kind without attributes, and with ``goodput.open`` true
    (the flag it sets, as the reader reads it: ``F_OPEN`` where the kind reads it, else
    none); a step also with its step number (1 to 19 digits) before that."""
    out: dict[int, list[_Variant]] = {}
    for kind, name in enumerate(tl.KIND_NAMES):
        slot = _KIND_ATTRS[kind].get(schema.ATTR_OPEN)  # None: the attribute read past
        opened = 0 if slot is None else flag_bit(slot, True) if slot >= 3 else None
        forms = [None] + (list(range(1, 20)) if name == schema.STEP else [])
        for digits in forms:
            for flags in (None, opened) if opened is not None else (None,):
                v = _Variant(kind, name, digits, flags)
                out.setdefault(v.length, []).append(v)
    return out


_VARIANTS: dict[int, list[_Variant]] = {}
_LENGTHS = np.empty(0, np.int64)  # the forms' lengths, sorted
_IS_LENGTH = np.zeros(1, bool)  # by length: a form's? (the last: any longer one)


def _forms() -> dict[int, list[_Variant]]:
    global _LENGTHS, _IS_LENGTH
    if not _VARIANTS:
        _VARIANTS.update(_variants())
        _LENGTHS = np.array(sorted(_VARIANTS), np.int64)
        _IS_LENGTH = np.zeros(_LENGTHS[-1] + 2, bool)
        _IS_LENGTH[_LENGTHS] = True
    return _VARIANTS
_POW10 = 10 ** np.arange(18, -1, -1, dtype=np.int64)
_POW16 = (1 << np.arange(60, -1, -4, dtype=np.uint64)).view(np.int64)


def _rows_all(ok: np.ndarray) -> np.ndarray:
    """Per row of a boolean matrix, all True? (one reduction when all are, the usual)."""
    return np.ones(len(ok), bool) if ok.all() else ok.all(1)


def _decimal(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(all ASCII digits and below 2**63?, int64 value) of each row of ``a`` (at most 19
    columns)."""
    d = a - np.uint8(48)
    value = d.astype(np.int64) @ _POW10[-a.shape[1]:]  # past 2**63: wraps, below 0
    return _rows_all(d < 10) & (value >= 0), value


def _hex(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(all lowercase hex digits?, int64 value, wrapped past 2**63, of 16 columns) of each
    row of ``a``."""
    d = a - np.uint8(48)
    letter = d >= 49  # 'a' - '0'
    ok = _rows_all((d < 10) | (letter & (d < 55)))
    if a.shape[1] != 16:
        return ok, None
    return ok, (d - letter * np.uint8(39)).astype(np.int64) @ _POW16


def _plain(a: np.ndarray) -> np.ndarray:
    """Per row of ``a``: all its bytes printable ASCII, none a quote (a JSON string's
    characters as they are written; the line has no backslash)?"""
    return _rows_all((a - np.uint8(0x23)) < 0x5C)  # '#' to '~'


def _good_prefix(prefix: bytes, seen: set) -> bool:
    if prefix in seen:
        return True
    if not _PREFIX.fullmatch(prefix):
        return False
    if len(seen) < 64:
        seen.add(prefix)
    return True


_SEEN: set[bytes] = set()


def scan(lines: list[bytes]) -> list[tuple[bytes, Taken] | None]:
    """Per line: ``(skeleton, taken)`` when spans could be taken out of it (parse the
    skeleton, and put ``taken`` before its first spans list's spans), else None."""
    out: list = [None] * len(lines)
    forms = _forms()
    lines_at, cuts, first_at, ends = [], [], [], []  # per line with a cut
    offset = 0
    for j, line in enumerate(lines):
        at = line.find(_CUT)
        if at >= 0 and b"\\" not in line and _good_prefix(line[:at + 9], _SEEN):
            lines_at.append(j)
            cuts.append(at)
            first_at.append(offset + at + 10)  # the first span's text, after its brace
            ends.append(offset + len(line))
        offset += len(line)
    if not lines_at:
        return out
    buf = np.frombuffer(b"".join([*lines, _PAD]), np.uint8)  # a form's width past the end
    # each "},{" between spans: the position of its "{"
    brace = np.flatnonzero(buf == 123)
    brace = brace[brace >= 2]
    brace = brace[(buf[brace - 1] == 44) & (buf[brace - 2] == 125)]
    first = np.array(first_at, np.int64)
    end = np.array(ends, np.int64)
    lo, hi = np.searchsorted(brace, np.stack((first, end)))
    # Per line: its pieces, each the text of a span followed by "},{" (the leading ones
    # are its first spans list's spans, the others are not forms), then one slot for the
    # span after the last piece taken: one with a "},{" in it (two attributes), or the
    # last of the list (followed by "}]").
    m, count = len(lines_at), hi - lo
    line_of = np.repeat(np.arange(m), count)
    piece_base = np.cumsum(count) - count  # per line: its first piece
    base = piece_base + np.arange(m)  # per line: its first slot
    nslots = int(count.sum()) + m
    pieces = np.arange(nslots - m) + np.repeat(lo - piece_base, count)  # into brace
    starts = brace[pieces - 1] + 1
    has = count > 0
    starts[piece_base[has]] = first[has]
    slot_start = np.empty(nslots, np.int64)  # where the span of each slot would start
    slot_start[np.arange(nslots - m) + line_of] = starts
    slot_start[base + count] = np.where(has, brace[np.maximum(hi - 1, 0)] + 1, first) \
        if len(brace) else first
    rows = np.empty((nslots, tl.NCOLS), np.int64)
    tid_bytes = np.zeros((nslots, 32), np.uint8)
    ok = np.zeros(nslots, bool)
    # the pieces that can be taken: those before the first of a line that is no form's
    # length (the rest of the line: the other spans and the resource)
    lens = brace[pieces] - 2 - starts
    slots = np.arange(nslots - m) + line_of
    known = _IS_LENGTH[np.minimum(lens, len(_IS_LENGTH) - 1)]
    if not known.all():
        stop = np.minimum.reduceat(np.where(known, nslots, np.arange(nslots - m)),
                                   piece_base[has])
        known &= np.arange(nslots - m) < np.repeat(stop, count[has])
        starts, lens, slots = starts[known], lens[known], slots[known]
    _read(buf, forms, starts, lens, slots, rows, tid_bytes, ok)
    taken = np.minimum.reduceat(np.where(ok, nslots, np.arange(nslots)), base) - base
    # the span after them, when a form ends at a "}" followed by "]" or ",{"
    at = slot_start[base + taken]
    pos = at[:, None] + _LENGTHS
    fits = pos + 2 < end[:, None]
    pos = np.minimum(pos, len(buf) - 3)
    after = buf[pos + 1]
    li, ki = np.nonzero(fits & (buf[pos] == 125) & (
        (after == 93) | ((after == 44) & (buf[pos + 2] == 123))))
    last_end = np.full(m, -1, np.int64)
    if len(li):  # a few per line (a "}]" inside the span's attributes too)
        got = np.empty((len(li), tl.NCOLS), np.int64)
        got_tids = np.zeros((len(li), 32), np.uint8)
        got_ok = np.zeros(len(li), bool)
        _read(buf, forms, at[li], _LENGTHS[ki], np.arange(len(li)), got, got_tids, got_ok)
        # one per line at most (a span read as a form ends there: it cannot end elsewhere)
        got_ok &= np.bincount(li[got_ok], minlength=m)[li] == 1
        li, ki = li[got_ok], ki[got_ok]
        slots = base[li] + taken[li]
        rows[slots] = got[got_ok]
        tid_bytes[slots] = got_tids[got_ok]
        ok[slots] = True
        last_end[li] = at[li] + _LENGTHS[ki]  # its "}"
        taken[li] += 1
    if not ok.any():
        return out
    # trace ids: numbered by runs of equal ones (a line has one or a few)
    n = nslots
    words = tid_bytes.view(np.uint64)
    new_run = np.ones(n, bool)
    new_run[1:] = (words[1:] != words[:-1]).any(1)
    runs = np.flatnonzero(new_run)
    numbers: dict = {}
    run_codes = [numbers.setdefault(key, len(numbers))
                 for key in map(bytes, tid_bytes[runs])]
    codes = np.repeat(np.array(run_codes, np.int64), np.diff(np.append(runs, n)))
    tids = [t.decode("ascii") for t in numbers]
    line_start = np.array([e - len(lines[j]) for j, e in zip(lines_at, ends, strict=True)],
                          np.int64)
    # where the rest of each line starts: the first span not taken (after its "{", kept
    # from the cut), or the list's end ("]": the "{" of the cut left out)
    closes = np.zeros(m, bool)
    closes[last_end >= 0] = buf[last_end[last_end >= 0] + 1] == 93
    rests = np.where(last_end >= 0, last_end + np.where(closes, 1, 3),
                     slot_start[base + np.minimum(taken, count)]) - line_start
    for j, cut, b, k, rest, whole in zip(lines_at, cuts, base.tolist(), taken.tolist(),
                                         rests.tolist(), closes.tolist(), strict=True):
        if not k:
            continue
        line = lines[j]
        tail = line[rest:]
        if b'pans":' in tail or b'"scope":' in tail:  # "spans", "scopeSpans",
            # "resourceSpans" or "scope" again, replacing what was cut: keep out
            continue
        out[j] = (line[:cut + (9 if whole else 10)] + tail,
                  Taken(rows[b:b + k], tids, codes[b:b + k]))
    return out


def _read(buf: np.ndarray, forms: dict, starts: np.ndarray, lens: np.ndarray,
          slots: np.ndarray, rows: np.ndarray, tid_bytes: np.ndarray, ok: np.ndarray):
    """Read the texts ``buf[starts[i]:starts[i] + lens[i]]`` that are one of the forms
    into ``rows[slots[i]]`` (its trace id's text into ``tid_bytes[slots[i]]``), and set
    ``ok[slots[i]]``; the others are left as they are."""
    for length in np.flatnonzero(np.bincount(lens)).tolist():
        variants = forms.get(length)
        if not variants:
            continue
        idx = np.flatnonzero(lens == length)
        text = sliding_window_view(buf, variants[0].width)[starts[idx]]
        for v in variants:
            good = v.matches(text)
            if not good.any():
                continue
            every = bool(good.all())
            t, at = (text, idx) if every else (text[good], idx[good])
            if not every:  # the next form looks at the others
                text, idx = np.ascontiguousarray(text[~good]), idx[~good]
            f = v.fields
            fits, start = _decimal(t[:, f["start"]])
            digits, end = _decimal(t[:, f["end"]])
            fits &= digits & (start <= end)
            hexes, sid = _hex(t[:, f["sid"]])
            tid = np.ascontiguousarray(t[:, f["tid"]])
            fits &= hexes & _plain(tid) & _plain(t[:, f["parent"]])  # read as they are
            ival = tl.NONE
            if "ival" in f:
                digits, ival = _decimal(t[:, f["ival"]])
                fits &= digits
            if not fits.all():
                at, start, end, sid, tid = (x[fits] for x in (at, start, end, sid, tid))
                if "ival" in f:
                    ival = ival[fits]
            block = np.empty((len(at), tl.NCOLS), np.int64)
            block[:, tl.C_START] = start
            block[:, tl.C_END] = end
            block[:, tl.C_KIND] = v.kind
            block[:, tl.C_IVAL] = ival
            block[:, tl.C_AUX] = tl.NONE
            block[:, tl.C_FLAGS] = v.flags
            block[:, tl.C_SIDX] = -1
            block[:, tl.C_SID] = sid  # int(spanId, 16), less 2**64 past 2**63
            at = slots[at]
            rows[at] = block
            tid_bytes[at] = tid
            ok[at] = True
            if every:
                break
