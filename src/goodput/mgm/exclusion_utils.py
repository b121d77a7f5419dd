"""``ml_goodput_measurement.exclusion_utils`` (0.2.3): exclusion intervals.

Same functions, same behaviour: :func:`normalize_intervals` keeps the UTC-aware intervals
whose start is before their end (the others are logged and skipped), sorts and merges them
and returns POSIX seconds; :func:`get_exclusion_overlap` is the total overlap of a range
with them.
"""

from __future__ import annotations

import datetime
import logging

__all__ = ["get_exclusion_overlap", "normalize_intervals"]

log = logging.getLogger(__name__)


def normalize_intervals(
    intervals: list[tuple[datetime.datetime, datetime.datetime]],
) -> list[tuple[float, float]]:
    """Sorted, merged ``(start, end)`` POSIX seconds of the valid ``intervals`` (UTC-aware
    datetimes with start < end)."""
    valid = []
    for start, end in intervals or ():
        if start.tzinfo != datetime.timezone.utc or end.tzinfo != datetime.timezone.utc:
            log.warning("Skipping interval [%s , %s]: Timezone is not UTC", start, end)
            continue
        if start >= end:
            log.warning("Skipping interval [%s , %s]: Start time is after or equal to End "
                        "time.", start, end)
            continue
        valid.append((start, end))
    merged: list[list] = []
    for start, end in sorted(valid):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s.timestamp(), e.timestamp()) for s, e in merged]


def get_exclusion_overlap(start: float, end: float,
                          exclusions: list[tuple[float, float]]) -> float:
    """Seconds of ``[start, end]`` (POSIX seconds) inside the ``exclusions``."""
    total = 0.0
    for a, b in exclusions:
        lo, hi = max(start, a), min(end, b)
        if lo < hi:
            total += hi - lo
    return total
