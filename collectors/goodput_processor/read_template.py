"""The reader's fastest path: the recorder's own spans read from the JSON text, not parsed.

Most of a spool is lines the recorder wrote, with ``goodput.step`` and
``goodput.data_loading`` spans of one exact form (``docs/span-schema.md``), e.g.::

    {"traceId":"<32 hex>","spanId":"<16 hex>","parentSpanId":"<16 hex>","name":"goodput.step",
     "kind":1,"startTimeUnixNano":"<19 digits>","endTimeUnixNano":"<19 digits>",
     "attributes":[{"key":"goodput.step","value":{"intValue":"<digits>"}}]}

Parsing them (orjson) and reading the parsed dicts cost about 1 us a span. :func:`scan`
reads a chunk of lines at once with numpy instead: each line's spans array is cut at
``},{``, and each piece that is byte for byte one of these forms (:data:`_VARIANTS`: every
goodput kind without attributes, a step with its step number; lowercase hex ids, decimal
times) gives its row directly. The leading run of such spans of a line's first spans list
is taken out of the line; the rest of the line (the skeleton, with the other spans and the
resource) is parsed by orjson as before, and the reader puts the taken rows before that
list's other spans.

This gives exactly what parsing the whole line gives, because it is done only when the cut
cannot change the meaning of the line: no backslash in the line (no escaped character,
so every key is written as it reads), the text before the cut is exactly
``{"resourceSpans":[{"scopeSpans":[{"scope":{"name":"...","version":"..."},"spans":[``
(so the array cut is the first resource's first scope's spans list), and the rest of the
line holds none of the keys ``"resourceSpans"``, ``"scopeSpans"``, ``"scope"``, ``"spans"``
(so no duplicate key replaces what was cut). A span taken is a JSON object of its own, so
the line is valid JSON exactly when its skeleton is; the reader parses the skeleton, and
where that fails, the whole line as before (for the same error message).
"""

from __future__ import annotations

import re

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from goodput import schema

from . import timeline as tl

__all__ = ["Taken", "scan"]

_PREFIX = re.compile(rb'\{"resourceSpans":\[\{"scopeSpans":\[\{"scope":\{"name":"[^"\\\x00-\x1f]*",'
                     rb'"version":"[^"\\\x00-\x1f]*"\},"spans":\[')
_CUT = b'"spans":[{'
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

    def __init__(self, kind: int, name: str, step_digits: int | None):
        parts = ['"traceId":"', ("tid", 32), '","spanId":"', ("sid", 16),
                 '","parentSpanId":"', ("parent", 16),
                 f'","name":"{name}","kind":1,"startTimeUnixNano":"', ("start", 19),
                 '","endTimeUnixNano":"', ("end", 19), '"']
        if step_digits:
            parts += [f',"attributes":[{{"key":"{schema.ATTR_STEP}","value":{{"intValue":"',
                      ("ival", step_digits), '"}}]']
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
        self.kind, self.length, self.fields = kind, len(text), fields
        self.template = np.frombuffer(text, np.uint8)
        self.holes = np.zeros(len(text), bool)
        self.holes[holes] = True
        self._tiles = (np.empty(0, np.uint8), np.empty(0, np.uint8))

    def matches(self, text: np.ndarray) -> np.ndarray:
        """Per row of ``text`` (C-contiguous, ``length`` columns): its fixed bytes are
        this form's? All rows at once, 8 bytes a step, first; row by row if one is not."""
        size = text.size
        mask, fixed = self._tiles
        if len(mask) < size:  # the form's mask and fixed bytes, repeated
            rows = max(size // self.length, 2 * len(mask) // self.length, 256)
            one = np.where(self.holes, 0, 255).astype(np.uint8)
            mask, fixed = np.tile(one, rows), np.tile(self.template & one, rows)
            self._tiles = mask, fixed
        flat, words = text.reshape(-1), size // 8 * 8
        u64 = np.uint64
        if ((flat[:words].view(u64) & mask[:words].view(u64)) == fixed[:words].view(u64)).all() \
                and ((flat[words:] & mask[words:size]) == fixed[words:size]).all():
            return np.ones(len(text), bool)
        return _rows_all((text == self.template) | self.holes)


def _variants() -> dict[int, list[_Variant]]:
    out: dict[int, list[_Variant]] = {}
    for kind, name in enumerate(tl.KIND_NAMES):
        forms = [None] + (list(range(1, 20)) if name == schema.STEP else [])
        for digits in forms:
            v = _Variant(kind, name, digits)
            out.setdefault(v.length, []).append(v)
    return out


_VARIANTS = _variants()
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
    buf = np.frombuffer(b"".join(lines), np.uint8)
    # each "},{" between spans: the position of its "{"
    brace = np.flatnonzero(buf == 123)
    brace = brace[brace >= 2]
    brace = brace[(buf[brace - 1] == 44) & (buf[brace - 2] == 125)]
    lo_hi = np.searchsorted(brace, np.array(first_at + ends, np.int64).reshape(2, -1))
    starts_parts, lens_parts, cands = [], [], []
    n = 0
    for j, at, first, (lo, hi) in zip(lines_at, cuts, first_at, lo_hi.T.tolist(), strict=True):
        if hi == lo:  # one span or none: never one of its own (it runs to the line's end)
            continue
        b = brace[lo:hi]
        starts = np.concatenate(([first], b[:-1] + 1))
        starts_parts.append(starts)
        lens_parts.append(b - 2 - starts)
        cands.append((j, at, n, hi - lo, first - at - 10, int(b[-1]) + 1))
        n += hi - lo
    if not n:
        return out
    starts = np.concatenate(starts_parts)
    lens = np.concatenate(lens_parts)
    ok = np.zeros(n, bool)
    rows = np.empty((n, tl.NCOLS), np.int64)
    tid_bytes = np.zeros((n, 32), np.uint8)
    for length in np.flatnonzero(np.bincount(lens)).tolist():
        variants = _VARIANTS.get(length)
        if not variants:
            continue
        idx = np.flatnonzero(lens == length)
        text = sliding_window_view(buf, length)[starts[idx]]
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
            block[:, tl.C_FLAGS] = 0
            block[:, tl.C_SIDX] = -1
            block[:, tl.C_SID] = sid  # int(spanId, 16), less 2**64 past 2**63
            rows[at] = block
            tid_bytes[at] = tid
            ok[at] = True
            if every:
                break
    if not ok.any():
        return out
    # trace ids: numbered by runs of equal ones (a line has one or a few)
    words = tid_bytes.view(np.uint64)
    new_run = np.ones(n, bool)
    new_run[1:] = (words[1:] != words[:-1]).any(1)
    runs = np.flatnonzero(new_run)
    numbers: dict = {}
    run_codes = [numbers.setdefault(key, len(numbers))
                 for key in map(bytes, tid_bytes[runs])]
    codes = np.repeat(np.array(run_codes, np.int64), np.diff(np.append(runs, n)))
    tids = [t.decode("ascii") for t in numbers]
    # per line: the spans taken (up to its first that is not a form), where the rest starts
    firsts = np.array([c[2] for c in cands], np.int64)
    counts = np.array([c[3] for c in cands], np.int64)
    not_ok = np.where(ok, n, np.arange(n))
    taken = np.minimum(np.minimum.reduceat(not_ok, firsts) - firsts, counts)
    last = np.minimum(firsts + taken, n - 1)
    rests = np.where(taken < counts, starts[last], [c[5] for c in cands]) - [c[4] for c in cands]
    for (j, at, first, _, _, _), k, rest in zip(cands, taken.tolist(), rests.tolist(),
                                                strict=True):
        if not k:
            continue
        line = lines[j]
        tail = line[rest:]
        if (b'"spans":' in tail or b'"scopeSpans":' in tail or b'"resourceSpans":' in tail
                or b'"scope":' in tail):  # a key again, replacing what was cut: keep out
            continue
        out[j] = (line[:at + 10] + tail,
                  Taken(rows[first:first + k], tids, codes[first:first + k]))
    return out
