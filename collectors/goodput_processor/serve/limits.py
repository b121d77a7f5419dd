"""The ceilings of ``goodput serve``: what one client, one job or one request may take.

Every limit is a flag of ``goodput serve`` (``docs/serve.md``, "Limits") with a default
that fits one processor instance of a sharded deployment. Past a limit a request is
refused with the OTLP *retryable* status (gRPC ``UNAVAILABLE``, HTTP ``503`` with
``Retry-After``), so the Collector's retry queue or the exporter's backoff holds the data,
or the job is marked over its limit in its report: never dropped silently, never
unbounded.

- :class:`Limits`: the values.
- :class:`Refused`: raised by the store (before anything of the request is stored) and
  by the receivers; carries the reason counted in ``stats["refused_<reason>"]``.
- :class:`ByteBudget`: bytes of request bodies held in memory across all requests (the
  last 16th of them for small requests only).
- :class:`RateLimiter`: spans per second per job (a token bucket per job).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

__all__ = ["SMALL_REQUEST_BYTES", "ByteBudget", "Limits", "RateLimiter", "Refused"]


@dataclass(frozen=True)
class Limits:
    """Ceilings of one ``goodput serve`` instance (each a ``goodput serve`` flag).

    Attributes:
        max_connections: HTTP connections served at once (more are answered ``503`` and
            closed at once); also the gRPC calls in flight (more get ``UNAVAILABLE``).
        max_inflight_bytes: bytes of request bodies (compressed, as received, plus what
            they inflate to) held across all requests at once; a request that does not
            fit waits for none: it gets the retryable status.
        max_message_bytes: the largest request, after gzip decompression.
        request_timeout_s: seconds a client may take to send one request's headers and
            body (a slow-loris client is cut off after it).
        max_jobs: jobs tracked; spans of a new job past it are refused (retryable: a
            finished job leaves after ``--retention``).
        max_jobs_per_client: jobs one client (peer address) may hold of ``max_jobs``
            (None: half of ``max_jobs``, at least 1); see :mod:`.slots`.
        idle_without_progress_s: when job slots are short, a job with no kept step that
            has sent nothing for this many seconds leaves (final) before a new job is
            refused.
        max_custom_types: distinct custom badput types per job; spans of further types
            are counted as ``skipped.over_limit`` and the job carries an ``over_limit``
            warning.
        max_attribute_bytes: longest string attribute value kept (longer ones are cut to
            it, counted, and warned about as ``over_limit``).
        max_job_spans_per_s: spans per second one job may send, averaged over
            ``burst_s`` seconds (a token bucket of ``rate x burst_s`` spans).
        burst_s: seconds of ``max_job_spans_per_s`` a job may send at once.
    """

    max_connections: int = 256
    max_inflight_bytes: int = 256 << 20
    max_message_bytes: int = 16 << 20
    request_timeout_s: float = 30.0
    max_jobs: int = 1000
    max_jobs_per_client: int | None = None
    idle_without_progress_s: float = 300.0
    max_custom_types: int = 64
    max_attribute_bytes: int = 1024
    max_job_spans_per_s: float = 100_000.0
    burst_s: float = 10.0

    def __post_init__(self):
        for name in ("max_connections", "max_inflight_bytes", "max_message_bytes",
                     "max_jobs", "max_custom_types", "max_attribute_bytes"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v > 0):
                raise ValueError(f"{name} must be an integer > 0, got {v!r}")
        if self.max_jobs_per_client is not None and not (
                isinstance(self.max_jobs_per_client, int) and self.max_jobs_per_client > 0):
            raise ValueError(f"max_jobs_per_client must be an integer > 0 or None, got "
                             f"{self.max_jobs_per_client!r}")
        if not (isinstance(self.idle_without_progress_s, (int, float))
                and 0 <= self.idle_without_progress_s < float("inf")):
            raise ValueError(f"idle_without_progress_s must be a finite number >= 0, got "
                             f"{self.idle_without_progress_s!r}")
        for name in ("request_timeout_s", "max_job_spans_per_s", "burst_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < float("inf")):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")


class Refused(Exception):
    """A request refused before any of it was stored or acknowledged.

    Args:
        reason: counted as ``stats["refused_<reason>"]`` (``unavailable``, ``too_large``,
            ``over_jobs``, ``over_client_jobs``, ``retired``, ``rate``, ``wal``,
            ``connections``, ``inflight``, ...).
        message: one line for the client and the log.
        retryable: True: the client should send it again later (gRPC ``UNAVAILABLE``,
            HTTP ``503`` with ``Retry-After``); False: it never will be accepted (gRPC
            ``INVALID_ARGUMENT``, HTTP ``400``).
        retry_after_s: seconds to suggest in ``Retry-After`` (rounded up, at least 1).
    """

    def __init__(self, reason: str, message: str, retryable: bool = True,
                 retry_after_s: float = 1.0):
        super().__init__(message)
        self.reason, self.message = reason, message
        self.retryable, self.retry_after_s = retryable, retry_after_s


#: A request holding at most this many bytes of the budget (its body and parse estimate)
#: is *small*: an exporter's batch of some 300 spans (64 KiB, estimated at ~0.9 MiB).
SMALL_REQUEST_BYTES = 1 << 20


class ByteBudget:
    """Bytes held in memory by requests in flight, across all of them (thread-safe).

    The last :attr:`reserve` bytes are for small requests (:data:`SMALL_REQUEST_BYTES`):
    requests with large bodies (slow-loris bodies holding their ``Content-Length``, gRPC
    calls being read) fill at most ``capacity - reserve``, so an exporter's batch finds
    room while they hold the rest (issue 38: a healthy HTTP export refused ``503`` lost its
    connection, then found the connection cap full, and was acknowledged seconds later).

    Args:
        capacity: bytes (> 0).
        reserve: bytes only small requests may take (default a 16th of ``capacity``, at
            most 16 MiB).
    """

    def __init__(self, capacity: int, reserve: int | None = None):
        if not capacity > 0:
            raise ValueError(f"capacity must be > 0 bytes, got {capacity!r}")
        self.capacity = int(capacity)
        self.reserve = (min(self.capacity // 16, 16 << 20) if reserve is None
                        else max(0, min(int(reserve), self.capacity)))
        self.used = 0
        self._lock = threading.Lock()

    def acquire(self, n: int, small: bool = False, own: int = 0) -> bool:
        """Take ``n`` bytes if they fit now; False (nothing taken) if not. Never waits.
        ``small``: for a small request, which may take the :attr:`reserve` too, as may a
        request that holds all that is held (``own``: the bytes it holds already), so that
        one needing more than ``capacity - reserve`` is taken in when it comes alone."""
        with self._lock:
            keep = 0 if small or self.used <= own else self.reserve
            if n > self.capacity - self.used - keep:
                return False
            self.used += n
            return True

    def release(self, n: int) -> None:
        """Give back ``n`` bytes taken by :meth:`acquire`."""
        with self._lock:
            self.used = max(0, self.used - n)


class RateLimiter:
    """A token bucket per key (job): ``rate`` tokens per second, ``rate x burst_s`` at most.

    Not thread-safe: the store calls it under its lock. Keys are forgotten with
    :meth:`forget`.
    """

    def __init__(self, rate: float, burst_s: float, clock=time.monotonic):
        self.rate, self.capacity, self._clock = float(rate), float(rate) * float(burst_s), clock
        self._buckets: dict[str, list[float]] = {}  # key -> [tokens, time]

    def wait_s(self, costs: dict[str, int]) -> float:
        """Seconds until every key can pay its cost (0.0: now), refilling first."""
        now, worst = self._clock(), 0.0
        for key, cost in costs.items():
            b = self._buckets.get(key)
            if b is None:
                b = self._buckets[key] = [self.capacity, now]
            b[0] = min(self.capacity, b[0] + (now - b[1]) * self.rate)
            b[1] = now
            if cost > b[0]:
                worst = max(worst, (min(cost, self.capacity) - b[0]) / self.rate)
        return worst

    def take(self, costs: dict[str, int]) -> None:
        """Pay ``costs`` (after :meth:`wait_s` said 0.0; a cost over the capacity empties
        the bucket, so one huge request is admitted once per ``burst_s``)."""
        for key, cost in costs.items():
            b = self._buckets[key]
            b[0] = max(0.0, b[0] - cost)

    def forget(self, key: str) -> None:
        """Drop ``key``'s bucket (a job that left)."""
        self._buckets.pop(key, None)
