"""Wall-clock times of plain log lines, shared by the plain-log sources (``megatron-log``,
``nemo-log``, ``maxtext-log``).

A line taken with ``kubectl logs --timestamps`` (or read from a container runtime's log
file, CRI format) begins with the time the runtime received it, RFC 3339 with up to
nanoseconds: ``2026-12-07T14:42:39.123456789Z <the program's line>``. Many programs also
print a naive local date and time of their own inside the line (Megatron-LM's
``[2026-12-07 14:42:39.123456]``, NeMo's ``[NeMo I 2026-12-07 14:42:39 ...]``); a naive
time is read as UTC, which is what a container's clock says unless ``TZ`` was set.

All times are integer nanoseconds since the Unix epoch.
"""

from __future__ import annotations

import calendar
import re

__all__ = ["CRI_STREAM", "MAX_SECONDS", "MAX_STEP", "RFC3339", "naive_ns", "split_prefix"]

#: Times from 2262 on do not fit int64 nanoseconds: such a time is not read.
_MAX_NS = 1 << 62
#: Step numbers above this (int64 attributes downstream) are not read: the line is malformed.
MAX_STEP = (1 << 62) - 1
#: Durations above this many seconds (a year) are not read: the line is malformed.
MAX_SECONDS = 365 * 86400.0

#: ``kubectl logs --timestamps`` prefix: RFC 3339 date-time with optional fraction and zone.
RFC3339 = re.compile(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?"
                     r"(Z|z|[+-]\d\d:?\d\d)?")
#: What a CRI log file line has after the time: the stream and a full/partial tag.
CRI_STREAM = re.compile(r"(?:stdout|stderr) [FP] ")
_NAIVE = re.compile(r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")


def _ns(m: re.Match, zone: str | None) -> int | None:
    try:
        y, mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 7))
        if not (1 <= mo <= 12 and 1 <= d <= 31 and h <= 23 and mi <= 59 and s <= 60):
            return None
        secs = calendar.timegm((y, mo, d, h, mi, s, 0, 0, 0))
    except (TypeError, ValueError, OverflowError):
        return None
    frac = m.group(7) or ""
    ns = secs * 1_000_000_000 + (int(frac.ljust(9, "0")) if frac else 0)
    if zone and zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        ns -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60) * 1_000_000_000
    return ns if 0 <= ns < _MAX_NS else None


def split_prefix(line: str) -> tuple[int | None, str, bool]:
    """``(time_ns, rest, malformed)`` of one log line: the time of a leading RFC 3339
    timestamp (``kubectl logs --timestamps``; a CRI file's ``stdout F`` tag after it is
    dropped too) and the program's own line after it; ``(None, line, False)`` when the line
    has no such prefix; ``malformed`` is True when it begins like one but is not a valid
    time (the line is then returned whole)."""
    if len(line) < 20 or not line[0].isdigit() or line[4:5] != "-":
        return None, line, False
    m = RFC3339.match(line)
    if m is None or m.group(8) is None:
        # a date without a zone at the start is a program's own line (e.g. absl, NeMo)
        if m is None and re.match(r"\d{4}-\d\d-\d\dT", line):
            return None, line, True
        return None, line, False
    ns = _ns(m, m.group(8))
    if ns is None:
        return None, line, True
    rest = line[m.end():]
    if rest.startswith(" "):
        rest = rest[1:]
    c = CRI_STREAM.match(rest)
    if c is not None:
        rest = rest[c.end():]
    return ns, rest, False


def naive_ns(text: str) -> int | None:
    """The first naive ``YYYY-MM-DD HH:MM:SS[.ffffff]`` in ``text`` as UTC ns, else None."""
    m = _NAIVE.search(text)
    return _ns(m, None) if m is not None else None
