"""What the log importers share: input files read entry by entry, problems, errors, times.

Input files are JSON lines (one JSON value per line) or one JSON array (``gcloud logging
read --format=json`` writes one, pretty-printed). :class:`EntryReader` yields the elements
with their position, so that every problem can be reported as ``file:line`` (for an array,
the line where the element starts, and its index).
"""

from __future__ import annotations

import json
import json.scanner
import os
import re
from collections import Counter
from datetime import datetime, timedelta, timezone, tzinfo

try:  # optional speed-up, never a dependency (as in goodput_processor.read.reader)
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

__all__ = ["InputError", "LogImportError", "OutputExistsError", "EntryReader", "Payloads",
           "Problems",
           "MAX_EXAMPLES", "as_int", "check_readable", "iso_to_ns", "unwrap", "where"]

#: Examples of problems kept (the counts are complete).
MAX_EXAMPLES = 20


class LogImportError(Exception):
    """Base class of the errors ``goodput import`` raises; ``str(err)`` is one line."""


class InputError(LogImportError):
    """An input file is missing, unreadable, empty, of an unknown format, or yields nothing."""


class OutputExistsError(LogImportError):
    """The target job directory already holds spans (pass ``overwrite=True``)."""


class Problems:
    """Problems with the input, counted by reason, with up to :data:`MAX_EXAMPLES` examples.

    Each example is ``"<file>:<line>: <reason>: <detail>"`` (arrays:
    ``"<file>:<line> (element <i>): ..."``).
    """

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.examples: list[str] = []

    def add(self, where: str, reason: str, detail: str = "", n: int = 1) -> None:
        """Count ``n`` problems of ``reason`` at ``where`` (``"file:line"``)."""
        self.counts[reason] += n
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{where}: {reason}" + (f": {detail}" if detail else ""))

    def __len__(self) -> int:
        return sum(self.counts.values())


def where(path: str, line: int, element: int = -1) -> str:
    """``"path:line"``, or ``"path:line (element i)"`` for an element of a JSON array."""
    return f"{path}:{line}" + (f" (element {element})" if element >= 0 else "")


_WS = re.compile(r"[ \t\n\r]*")
#: Characters read at a time from a JSON array file.
_CHUNK_CHARS = 8 << 20
_DECODER = json.JSONDecoder()
_SCAN = json.scanner.make_scanner(_DECODER)


def check_readable(path: str) -> int:
    """Size in bytes of input file ``path``; raises :class:`InputError` if it cannot be read."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from e
    if not os.path.isfile(path):
        raise InputError(f"cannot read {path}: not a regular file")
    if not os.access(path, os.R_OK):
        raise InputError(f"cannot read {path}: permission denied")
    return st.st_size


class EntryReader:
    """Iterate over the JSON values of one input file: ``(value, line, element)``.

    ``element`` is the index in a JSON array, -1 for JSON lines. Lines that are not JSON
    and an array element that does not parse (the rest of the array cannot be found then)
    are counted in ``problems`` as ``"not JSON"``. After the iteration, ``entries`` is the
    number of values yielded and ``nonempty`` tells whether the file held anything at all.

    Args:
        path: the file.
        problems: where to count unparseable input.
        progress: optional ``callback(nbytes)`` called now and then with bytes read since
            the previous call.

    Bytes that are not UTF-8 are read as U+FFFD. A JSON array is parsed from chunks of
    the file, so memory does not grow with its size.

    Raises:
        InputError: the file cannot be read.
    """

    def __init__(self, path: str, problems: Problems, progress=None) -> None:
        self.path, self.problems, self.progress = path, problems, progress
        self.entries = 0
        self.nonempty = False

    def __iter__(self):
        try:
            with open(self.path, "rb") as f:
                head = f.read(4096).lstrip()
                if head.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte order mark
                    head = head[3:].lstrip()
            # Invalid UTF-8 becomes U+FFFD: such an entry still parses, or is reported.
            with open(self.path, encoding="utf-8-sig", errors="replace") as f:
                yield from (self._array(f) if head.startswith(b"[") else self._lines(f))
        except OSError as e:
            raise InputError(f"cannot read {self.path}: {e.strerror or e}") from e

    def _lines(self, f):
        path, progress = self.path, self.progress
        scan, fast = _SCAN, _loads is json.loads
        raw = f.buffer
        done = 0
        for lineno, line in enumerate(f, 1):
            if progress is not None and not lineno & 0x3FFF:
                pos = raw.tell()
                progress(pos - done)
                done = pos
            try:
                if fast:  # the C scanner without json.loads' wrappers
                    value, end = scan(line, 0)
                    if line[end:].strip():
                        raise ValueError("extra data")
                else:
                    value = _loads(line)
            except (StopIteration, ValueError, RecursionError):
                if not line.strip():
                    continue
                try:  # leading blanks; else json's own message for the problem
                    value = json.loads(line)
                except (ValueError, RecursionError) as e:
                    self.nonempty = True
                    self.problems.add(where(path, lineno), "not JSON", _short(e))
                    continue
            self.nonempty = True
            self.entries += 1
            yield value, lineno, -1
        if progress is not None:
            progress(raw.tell() - done)

    def _array(self, f):
        """Elements of a JSON array, parsed from chunks of the file (memory: one chunk and
        the element being parsed, not the whole file)."""
        ws, scan, progress, raw = _WS.match, _DECODER.raw_decode, self.progress, f.buffer
        buf, eof, done = "", False, 0
        pos = line = counted = 0  # line: newlines before buf[counted]

        def more() -> None:  # drop what was consumed, read the next chunk
            nonlocal buf, eof, pos, counted, line, done
            line += buf.count("\n", counted, pos)
            chunk = f.read(_CHUNK_CHARS)
            eof = len(chunk) < _CHUNK_CHARS
            buf, pos, counted = buf[pos:] + chunk, 0, 0
            if progress is not None:
                now = raw.tell()
                progress(now - done)
                done = now

        def here(element: int = -1) -> str:
            return where(self.path, 1 + line + buf.count("\n", counted, pos), element)

        more()
        while True:  # up to the "[" (the caller saw it)
            pos = ws(buf, pos).end()
            if pos < len(buf) or eof:
                break
            more()
        pos += 1
        element, state = 0, "first"  # first: a value or "]"; value: a value; sep: "," or "]"
        last_line = 1 + line + buf.count("\n", counted, pos)  # where the last element ends
        while True:
            pos = ws(buf, pos).end()
            if pos == len(buf):
                if not eof:
                    more()
                    continue
                self.nonempty = True
                self.problems.add(where(self.path, last_line), "not JSON", "the array is not "
                                  "closed with ']' after this element (a cut-off export?)")
                return
            if state != "value" and buf.startswith("]", pos):
                pos += 1
                while True:
                    pos = ws(buf, pos).end()
                    if pos < len(buf) or eof:
                        break
                    more()
                if pos < len(buf):
                    self.nonempty = True
                    self.problems.add(here(), "not JSON", "text after the end of the array")
                return
            if state == "sep":
                if not buf.startswith(",", pos):
                    self.problems.add(here(element), "not JSON", "expected ',' or ']' after "
                                      "an array element; the rest of the array cannot be read")
                    return
                pos += 1
                state = "value"
                continue
            self.nonempty = True
            try:
                value, end = scan(buf, pos)
                if end == len(buf) and not eof:
                    raise ValueError("maybe cut at the chunk's end")
            except (ValueError, RecursionError) as e:
                if not eof:
                    more()
                    continue
                self.problems.add(here(element), "not JSON",
                                  f"{_short(e)}; the rest of the array ({len(buf) - pos} "
                                  "characters) cannot be read")
                return
            self.entries += 1
            yield value, 1 + line + buf.count("\n", counted, pos), element
            line += buf.count("\n", counted, end)
            counted = pos = end
            last_line = 1 + line
            element += 1
            state = "sep"


_I64 = 2**63


def as_int(v) -> int | None:
    """``v`` as an int64 (an int, an integral float or a decimal string), else None."""
    t = type(v)
    if t is float:
        if not v.is_integer():
            return None
        v = int(v)
    elif t is str:
        text = v.strip()
        if not text.lstrip("-").isdigit():
            return None
        v = int(text)
    elif t is not int:
        return None
    return v if -_I64 < v < _I64 else None


def _short(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 120 else text[:117] + "..."


def unwrap(value):
    """``(payload, logentry_timestamp)`` of one input element.

    A Cloud Logging ``LogEntry`` (``gcloud logging read --format=json``, log sinks) has the
    payload under ``jsonPayload`` and its own ``timestamp`` (an RFC 3339 string); anything
    else is taken as a bare payload (timestamp None). Returns ``(None, None)`` for a value
    that is not a JSON object or whose ``jsonPayload`` is not one.
    """
    if type(value) is not dict:
        return None, None
    payload = value.get("jsonPayload")
    if payload is None:
        return value, None
    if type(payload) is not dict:
        return None, None
    return payload, value.get("timestamp")


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_US = timedelta(microseconds=1)
_ISO = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt ](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?\s*(Z|z|[+-]\d\d:?\d\d)?$")


class Payloads:
    """Every JSON object of every file in ``paths``, with its place, as the importers read it.

    Iterating yields ``(file index, path, line, element, payload, LogEntry timestamp)``
    (:func:`unwrap` gives the last two); a value that is not an object is reported to
    ``problems`` and skipped. ``entries`` counts every JSON value read.

    Raises:
        InputError: a file holds no entry at all (``what`` names what was expected).
    """

    def __init__(self, paths, problems: Problems, progress=None, what: str = "log entries"):
        self.paths, self.problems, self.progress, self.what = paths, problems, progress, what
        self.entries = 0

    def __iter__(self):
        for fi, path in enumerate(self.paths):
            reader = EntryReader(path, self.problems, self.progress)
            for value, line, element in reader:
                self.entries += 1
                payload, logts = unwrap(value)
                if payload is None:
                    self.problems.add(where(path, line, element), "not an object",
                                      f"expected a JSON object, got {type(value).__name__}"
                                      if type(value) is not dict
                                      else "jsonPayload is not an object")
                    continue
                yield fi, path, line, element, payload, logts
            if not reader.nonempty:
                raise InputError(f"{path} is empty: no {self.what} to import")


def iso_to_ns(text: str, tz: tzinfo | None = None) -> int:
    """Nanoseconds since the Unix epoch of an ISO 8601 date-time string.

    A time without an offset is local time in ``tz`` (None = UTC). Precision: microseconds
    (digits beyond them are dropped). Raises ValueError (or TypeError) on anything else.
    """
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:  # Python 3.10: no "Z", only 3 or 6 fraction digits
        dt = _iso_fallback(text)
    if dt.tzinfo is None:
        if tz is None or tz is timezone.utc:
            return (dt - _EPOCH_NAIVE) // _US * 1000
        dt = dt.replace(tzinfo=tz)
    return (dt - _EPOCH) // _US * 1000


def _iso_fallback(text: str) -> datetime:
    m = _ISO.match(text.strip())
    if not m:
        raise ValueError(f"not an ISO 8601 date-time: {text!r}")
    y, mo, d, h, mi, s, frac, off = m.groups()
    us = int((frac or "0")[:6].ljust(6, "0"))
    tzi = None
    if off:
        if off in ("Z", "z"):
            tzi = timezone.utc
        else:
            sign = -1 if off[0] == "-" else 1
            digits = off[1:].replace(":", "")
            tzi = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    return datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), us, tzinfo=tzi)
