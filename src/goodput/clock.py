"""Wall-clock times given by users, as integer nanoseconds since the Unix epoch.

Kept apart from :mod:`goodput.phases` and :mod:`goodput.api` so that both can use it
without importing each other.
"""

from __future__ import annotations

import datetime as _dt

__all__ = ["to_ns"]

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def to_ns(value, name: str = "time") -> int:
    """A ``datetime`` or epoch seconds as integer ns since the epoch.

    Raises:
        TypeError: ``value`` is neither; ValueError: it is NaN, infinite or negative.
    """
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.astimezone()
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not value == value or value in (float("inf"), float("-inf")) or value < 0:
            raise ValueError(f"{name} must be finite seconds since the epoch, got {value!r}")
        return int(value) * 1_000_000_000 if isinstance(value, int) else round(value * 1e9)
    raise TypeError(
        f"{name} must be a datetime or seconds since the epoch, "
        f"got {type(value).__name__} {value!r}"
    )
