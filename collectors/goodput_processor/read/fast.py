"""The reader's fast path: spans lists to span rows a batch at a time, not span by span.

:meth:`goodput_processor.read.spans.SpanRows._spans_slow` reads spans one by one (about
1.2 us of Python per span). A :class:`Batch` takes the spans lists of one process line by
line (after the spans :mod:`~goodput_processor.read.template` took from the line's text, if
any; structure and unknown spans are only counted, as the slow path does),
each reduced at once to a few objects (joined texts of its times, ids and integer
attributes, its kinds as small integers: nothing of the parsed line is kept, so its memory
is reused while it is in the CPU's cache), and makes rows of them with a few numpy calls.

It does so only for clean input: every span of a goodput kind has integer times
in ``0 <= start <= end < 2**63``, a 16-hex-digit ``spanId``, a 32-character ``traceId``
and attributes the slow path reads without an error, and every value fits int64. A list
that is not clean is refused by :meth:`Batch.add` before anything changes, and a batch
that turns out not clean gives None from :meth:`Batch.rows`; the reader then reads those
lists with the slow path, which counts what it skips as it always did. So the rows, counts
and examples are the slow path's, byte for byte, either way.

What has side effects (the reader's trace and string tables, ``goodput serve``'s limits) is
left to the reader, in span order: :meth:`Batch.rows` gives the trace ids and string
attributes it found, and the reader numbers them (``SpanRows._add_rows``).
"""

from __future__ import annotations

from array import array
from itertools import chain, compress, repeat
from operator import itemgetter

import numpy as np

from goodput import schema

from . import rows as tl

__all__ = ["Batch", "FastRows"]

_STRUCTURE = frozenset(schema.STRUCTURE)
_NONE = tl.NONE
_I64_MAX = (1 << 63) - 1
_NCOLS = tl.NCOLS
_KEY = itemgetter("key")
_NAME = itemgetter("name")
_VALUE = itemgetter("value")
_DIGITS_SPACE = b"0123456789 "
# What reading a span or attribute that is not clean raises (as in the slow path).
_ERRORS = (KeyError, TypeError, ValueError, AttributeError, OverflowError, IndexError)


class FastRows:
    """What :meth:`Batch.rows` read.

    ``rows``: n x NCOLS int64 (``sidx`` -1, ``tidx`` to be filled by the caller);
    ``tids``: the rows' trace ids in order of first appearance; ``tcodes``: each row's
    index in ``tids`` (None: all rows have ``tids[0]``); ``strings``: ``(row, [(value,
    kind), ...])`` of the rows with string attributes, in order (the caller numbers them,
    in that order); ``unknown``: spans of a name not in the schema (structure spans not
    counted).
    """

    __slots__ = ("rows", "tids", "tcodes", "strings", "unknown")

    def __init__(self, rows, tids, tcodes, strings, unknown):
        self.rows, self.tids, self.tcodes = rows, tids, tcodes
        self.strings, self.unknown = strings, unknown


def _ints(text: bytes | str, n: int) -> np.ndarray | None:
    """int64 array of ``int(v)`` for the ``n`` space-separated values of ``text``, or None
    when a value holds a space (the values cannot be told apart).

    Raises ValueError or OverflowError where ``int(v)`` fails or is past int64.
    """
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogatepass")
    if text.count(b" ") != n - 1:
        return None
    # Plain ASCII decimal digits, one run per value: numpy parses them as int() does.
    if n and not text.translate(None, _DIGITS_SPACE):
        out = np.fromstring(text, np.int64, sep=" ")
        if len(out) == n and not (out == _I64_MAX).any():  # numpy saturates past int64
            return out
    values = text.decode("utf-8", "surrogatepass").split(" ")
    return np.array(list(map(int, values)), np.int64)


class Batch:
    """Spans lists of one process on their way to rows (see the module).

    The ``kind_codes``/``kind_attrs``/``attr_value``/``as_int``/``flag_bit`` given are the
    reader's, so that both paths read attributes with the same code.
    """

    def __init__(self, kind_codes: dict, kind_attrs: tuple, attr_value, as_int, flag_bit):
        self._codes = {**dict.fromkeys(_STRUCTURE, -1), **kind_codes}
        self._kind_attrs, self._attr_value = kind_attrs, attr_value
        self._as_int, self._flag_bit = as_int, flag_bit
        self.clear()

    def clear(self) -> None:
        """Forget every list added."""
        self.n = 0  # spans
        self._kinds: list[int] = []  # per span: kind code, -1 structure, -2 unknown
        self._starts: list[str] = []  # per list: its times, ids, joined
        self._ends: list[str] = []
        self._hexes: list[str] = []
        self._tids: list[tuple] = []  # per list: (its trace ids once each, codes or None)
        # Integer attributes: their rows within their list, slots (0 ival, 1 aux), per
        # list (first row, count) and the values joined.
        self._int_rows, self._int_slots = array("q"), array("q")
        self._int_lists: list[tuple[int, int]] = []
        self._int_texts: list[str] = []
        self._patches: list[tuple] = []  # (flat position, value, or into it?) in order
        self._strings: list[tuple] = []  # (row, [(value, kind), ...]) in order
        self._unknown = 0
        # In order: spans taken from a line's text (read_template.Taken) and the number
        # of spans of each list added (when any was taken; else they are all lists).
        self._segments: list = []
        self._taken = 0
        self.total = 0  # spans, taken ones included

    def add(self, spans: list, taken=None) -> bool:
        """Take a spans list, after the spans ``taken`` from its line's text if any
        (:class:`~goodput_processor.read.template.Taken`); False (and nothing taken) when
        the list is not clean."""
        try:
            kinds = list(map(self._codes.get, map(_NAME, spans)))
            unknown = kinds.count(None)
            if unknown or -1 in kinds:  # structure and unknown spans: read past (counted)
                spans = [sp for sp, k in zip(spans, kinds, strict=True) if k is not None and k >= 0]
                kinds = [k for k in kinds if k is not None and k >= 0]
            if not spans:
                if taken is not None:
                    self._take(taken)
                self._unknown += unknown
                return True
            got = [(sp["startTimeUnixNano"], sp["endTimeUnixNano"], sp["spanId"], sp["traceId"],
                    sp.get("attributes"), sp.get("status")) for sp in spans]
            starts, ends, hsids, tids, attrs, statuses = zip(*got, strict=True)
            if set(map(len, hsids)) != {16} or set(map(len, tids)) != {32}:
                return False
            hexes, starts, ends = "".join(hsids), " ".join(starts), " ".join(ends)
            uniq = dict.fromkeys(tids)
            tcodes = None
            if len(uniq) > 1:
                local = {t: j for j, t in enumerate(uniq)}
                tcodes = list(map(local.__getitem__, tids))
            base = self.n
            attributes = self._attributes(attrs, kinds, base) if any(attrs) else None
            patches = attributes[3] if attributes else []
            if any(statuses):
                for i in compress(range(len(kinds)), statuses):
                    if kinds[i] >= 0:
                        code = statuses[i].get("code")
                        if code == 2 or code == "STATUS_CODE_ERROR":
                            patches.append(((base + i) * _NCOLS + tl.C_FLAGS, tl.F_ERROR, True))
        except _ERRORS:
            return False
        if taken is not None:
            self._take(taken)
        if self._taken:
            self._segments.append(len(kinds))
        self.total += len(kinds)
        self.n += len(kinds)
        self._kinds += kinds
        self._starts.append(starts)
        self._ends.append(ends)
        self._hexes.append(hexes)
        self._tids.append((list(uniq), tcodes, len(kinds)))
        if attributes:
            int_rows, int_slots, text, _, strings = attributes
            if int_rows:
                self._int_rows.fromlist(int_rows)
                self._int_slots.fromlist(int_slots)
                self._int_lists.append((base, len(int_rows)))
                self._int_texts.append(text)
            self._strings += strings
        self._patches += patches
        self._unknown += unknown
        return True

    def _take(self, taken) -> None:
        if not self._taken and self.n:
            self._segments.append(self.n)  # the lists before the first spans taken
        self._segments.append(taken)
        self._taken += taken.n
        self.total += taken.n

    def _attributes(self, attrs: tuple, kinds: list, base: int):
        """The attributes of one list's goodput spans: (rows in the list and slots of the
        integer values, their texts joined, patches, strings), or None for none."""
        has = [i for i in compress(range(len(attrs)), attrs) if kinds[i] >= 0]
        if not has:
            return None
        sel = list(map(attrs.__getitem__, has))
        flat = list(chain.from_iterable(sel))
        owners = has if len(flat) == len(has) else list(
            chain.from_iterable(map(repeat, has, map(len, sel))))
        slots = list(map(dict.get, map(self._kind_attrs.__getitem__,
                                       map(kinds.__getitem__, owners)), map(_KEY, flat)))
        nint, nnone = slots.count(0) + slots.count(1), slots.count(None)
        used = [j for j, s in enumerate(slots) if s is not None] if nnone else range(len(slots))
        if nint == len(slots):  # integers only (steps): all at once
            ints, rest, int_rows, int_slots = used, (), owners, slots
        else:
            ints = [j for j in used if slots[j] < 2]
            rest = [j for j in used if slots[j] >= 2]
            int_rows, int_slots = [owners[j] for j in ints], [slots[j] for j in ints]
        values = list(map(_VALUE, map(flat.__getitem__, ints)))
        xs = list(map(dict.get, values, repeat("intValue")))
        if None in xs:
            return self._attributes_loop(attrs, has, kinds, base)
        try:
            text = " ".join(xs)
        except TypeError:  # JSON numbers
            return self._attributes_loop(attrs, has, kinds, base)
        patches, strings = [], []
        attr_value = self._attr_value
        for j in rest:  # strings and flags: few
            i, v, slot = base + owners[j], flat[j]["value"], slots[j]
            if slot == 2:
                if not strings or strings[-1][0] != i:
                    strings.append((i, []))
                strings[-1][1].append((str(attr_value(v)), kinds[i - base]))
            else:
                patches.append((i * _NCOLS + tl.C_FLAGS, self._flag_bit(slot, attr_value(v)),
                                True))
        return int_rows, int_slots, text, patches, strings

    def _attributes_loop(self, attrs: tuple, has: list, kinds: list, base: int):
        """:meth:`_attributes` span by span, as ``SpanRows._spans_slow`` reads them, less
        the side effects."""
        patches, strings = [], []
        attr_value, as_int = self._attr_value, self._as_int
        for i in has:
            wanted, found, at = self._kind_attrs[kinds[i]], None, (base + i) * _NCOLS
            for a in attrs[i]:
                slot = wanted.get(a["key"])
                if slot is None:
                    continue
                v = a["value"]
                if slot < 2:
                    x = v.get("intValue")
                    x = as_int(attr_value(v)) if x is None else int(x)
                    patches.append((at + tl.C_IVAL + slot, x, False))
                elif slot == 2:
                    if found is None:
                        found = []
                        strings.append((base + i, found))
                    found.append((str(attr_value(v)), kinds[i]))
                else:
                    patches.append((at + tl.C_FLAGS, self._flag_bit(slot, attr_value(v)), True))
        return [], [], "", patches, strings

    def rows(self) -> FastRows | None:
        """The rows of every list added, or None when they are not clean (the caller then
        reads them span by span)."""
        if not self.total:
            return None
        if self.n:
            rows = self._list_rows()
            if rows is None:
                return None
            kinds = rows[:, tl.C_KIND]
            keep = kinds >= 0
            segments = [(u, None if c is None else np.array(c, np.int64), m)
                        for u, c, m in self._tids]
        else:
            rows, keep, segments = np.empty((0, _NCOLS), np.int64), np.ones(0, bool), []
        strings = self._strings
        every = bool(keep.all())
        if self._taken:  # put the taken spans in their place
            parts, tid_parts, to_final = [], [], []
            keeps: list | None = None if every else []  # (all kept: the usual)
            at = done = 0
            lines = iter(segments)
            for seg in self._segments:
                if isinstance(seg, int):
                    parts.append(rows[at:at + seg])
                    if keeps is not None:
                        keeps.append(keep[at:at + seg])
                    if strings:
                        to_final.append(np.arange(done, done + seg))
                    covered = 0
                    while covered < seg:
                        line = next(lines)
                        tid_parts.append(line)
                        covered += line[2]
                    at += seg
                    done += seg
                else:
                    parts.append(seg.rows)
                    if keeps is not None:
                        keeps.append(np.ones(seg.n, bool))
                    tid_parts.append((seg.tids, seg.tcodes, seg.n))
                    done += seg.n
            if strings:
                final = np.concatenate(to_final).tolist()
                strings = [(final[i], values) for i, values in strings]
            rows, segments = np.concatenate(parts), tid_parts
            if keeps is not None:
                keep = np.concatenate(keeps)
        tids, tcodes = _trace_codes(segments, None if every else keep)
        if not every:
            rows = rows[keep]
            if strings:
                new_index = (np.cumsum(keep) - 1).tolist()
                strings = [(new_index[i], values) for i, values in strings]
        return FastRows(rows, tids if len(rows) else [], tcodes, strings, self._unknown)

    def _list_rows(self) -> np.ndarray | None:
        """The rows of the lists added (structure and unknown spans included), or None."""
        n = self.n
        try:
            kinds = np.array(self._kinds, np.int64)
            starts = _ints(" ".join(self._starts), n)
            ends = _ints(" ".join(self._ends), n)
            raw = bytes.fromhex("".join(self._hexes))  # whitespace would make it shorter
            if (starts is None or ends is None or len(raw) != 8 * n
                    or not (starts >= 0).all() or not (starts <= ends).all()):
                return None
            rows = np.empty((n, _NCOLS), np.int64)
            rows[:, tl.C_START] = starts
            rows[:, tl.C_END] = ends
            rows[:, tl.C_KIND] = kinds
            rows[:, tl.C_IVAL] = _NONE
            rows[:, tl.C_AUX] = _NONE
            rows[:, tl.C_FLAGS] = 0
            rows[:, tl.C_SIDX] = -1
            rows[:, tl.C_SID] = np.frombuffer(raw, ">i8")  # int(spanId, 16), less 2**64 past 2**63
            flat = rows.reshape(-1)
            if self._int_texts:
                values = _ints(" ".join(self._int_texts), len(self._int_rows))
                if values is None:
                    return None
                first, count = zip(*self._int_lists, strict=True)
                at = np.repeat(np.array(first, np.int64), count)
                at += np.frombuffer(self._int_rows, np.int64)
                at = at * _NCOLS + tl.C_IVAL + np.frombuffer(self._int_slots, np.int64)
                ordered = np.sort(at)
                if (ordered[1:] == ordered[:-1]).any():  # set twice in a span: the last wins
                    return None
                flat[at] = values
            for at, value, is_or in self._patches:
                if is_or:
                    flat[at] |= value
                else:
                    flat[at] = value
        except (ValueError, OverflowError, TypeError):
            return None
        return rows


def _trace_codes(segments: list, keep) -> tuple[list, np.ndarray | None]:
    """The trace ids of the rows kept in order of first appearance, and each row's index
    in them (None: one trace id). ``segments``: per run of rows in order, (trace ids, each
    row's index in them or None for the first, rows)."""
    ids: dict = {}
    mapped_of: dict = {}
    parts = []
    for uniq, codes, m in segments:
        if codes is None:
            parts.append(np.full(m, ids.setdefault(uniq[0], len(ids)), np.int64))
            continue
        mapped = mapped_of.get(id(uniq))
        if mapped is None:
            mapped = mapped_of[id(uniq)] = np.array(
                [ids.setdefault(t, len(ids)) for t in uniq], np.int64)
        parts.append(mapped[codes])
    if len(ids) == 1 and keep is None:
        return list(ids), None
    codes = np.concatenate(parts) if parts else np.empty(0, np.int64)
    if keep is not None:
        codes = codes[keep]
    every = list(ids)
    seen, first_at = np.unique(codes, return_index=True)
    ranked = seen[np.argsort(first_at)]
    renumber = np.empty(len(every), np.int64)
    renumber[ranked] = np.arange(len(ranked))
    return [every[j] for j in ranked.tolist()], renumber[codes]
