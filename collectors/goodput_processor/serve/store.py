"""Live per-job state of ``goodput serve``: spans taken in batch by batch, results on demand.

:class:`LiveStore` holds one :class:`goodput_processor.read.reader._Reader`: per job, per
(attempt, process), a growable ``array('q')`` of span rows (:data:`~goodput_processor.
read.rows.COLUMNS`, 9 int64 = 72 bytes per span). Taking in a batch appends its rows, so its
cost grows with the batch, never with the job's history. The store is one object with
three sides, each in its own module:

- taking spans in (readiness, the write-ahead log, admission, requests and spool lines):
  :class:`~goodput_processor.serve.intake.SpanIntake`;
- results on demand (snapshots, the accounting memos, results kept between polls,
  isolation of a failing job): :class:`~goodput_processor.serve.live_results.LiveResults`;
- foreign producers' spans and log records, through the sources:
  :class:`~goodput_processor.serve.foreign.ForeignIntake`.

This module holds the state they share, the counters, and what ends a job's stay.

Compaction (:meth:`LiveStore.compact`, :mod:`goodput_processor.serve.compaction`): what a
process that has gone quiet (a finished attempt's) can no longer change is packed, and polls
go on without reading it; with a :class:`~goodput_processor.serve.spill.Spill`, its packed
rows are kept on disk.

Ceilings (:class:`~goodput_processor.serve.limits.Limits`): jobs tracked, spans per second
per job, job-name length (refused requests), custom types per job and string attribute
size (cut and reported as ``over_limit``). Idle jobs leave after ``retention_s``
(:meth:`LiveStore.retire_idle`), for good. Job slots per client, which jobs leave first
when they are short, and the refusal of retired jobs' late spans: :mod:`.slots`.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter

from ..read import reader as rd
from ..read.heap import trim_heap, trim_heap_if_grown
from ..results.job import JobResult
from ..results.report_json import job_to_dict
from . import compaction
from .foreign import ForeignIntake
from .intake import SpanIntake
from .limits import Limits, RateLimiter
from .live_results import LiveResults
from .malformed import ServeSkips
from .rows import ProcessRows
from .slots import JobSlots
from .spill import Spill
from .wal import ReplayStats, WriteAheadLog, job_slug

__all__ = ["LiveStore"]

_log = logging.getLogger(__name__)


class LiveStore(SpanIntake, LiveResults, ForeignIntake):
    """Thread-safe live state of every job seen, from OTLP requests and spool lines.

    Spans come in through :class:`~goodput_processor.serve.intake.SpanIntake`
    (:meth:`ingest_request`, :meth:`ingest_json`, :meth:`ingest_line`, :meth:`replay`,
    :meth:`ready`) and results go out through :class:`~goodput_processor.serve.
    live_results.LiveResults` (:meth:`results`, :meth:`account`, :meth:`snapshot`,
    :meth:`snapshot_windows`, :meth:`report_json`).

    Foreign producers' spans and log records are read through the sources
    (:class:`~goodput_processor.serve.foreign.ForeignIntake`: :meth:`ingest_logs`,
    :meth:`ingest_logs_json`, :meth:`sources_summary`).

    Args:
        ideal_step_time_s: ideal step time in seconds for the accounting (None = median
            of kept step times, as ``goodput report``).
        min_interval_s: results of a job are recomputed at most this often (seconds,
            >= 0) when :meth:`results` is called without ``now_ns``.
        limits: the ceilings (default :class:`Limits`' defaults).
        wal: the write-ahead log; when given, the store is not ready (requests are refused
            as retryable) until :meth:`replay` has read it back.
        retention_s: a job with no new span for this many seconds leaves at the next
            :meth:`retire_idle` (None: jobs stay).
        pack_after_s: a process with no new span for this many seconds has its rows
            packed at the next :meth:`compact` (None: never).
        spill: where packed rows are kept on disk (:class:`~goodput_processor.serve.
            spill.Spill`; None: in memory).

    Raises:
        ValueError: ``ideal_step_time_s`` is not a finite number > 0, ``min_interval_s``
            < 0, ``retention_s`` not > 0, or ``pack_after_s`` < 0.
    """

    def __init__(self, ideal_step_time_s: float | None = None, min_interval_s: float = 1.0, *,
                 limits: Limits | None = None, wal: WriteAheadLog | None = None,
                 retention_s: float | None = None, pack_after_s: float | None = 60.0,
                 spill: Spill | None = None):
        if ideal_step_time_s is not None and not (0 < ideal_step_time_s < float("inf")):
            raise ValueError(f"ideal step time must be a finite number > 0 seconds, got "
                             f"{ideal_step_time_s!r}")
        if not min_interval_s >= 0:
            raise ValueError(f"min_interval_s must be >= 0 seconds, got {min_interval_s!r}")
        if retention_s is not None and not retention_s > 0:
            raise ValueError(f"retention_s must be > 0 seconds, got {retention_s!r}")
        if pack_after_s is not None and not pack_after_s >= 0:
            raise ValueError(f"pack_after_s must be >= 0 seconds, got {pack_after_s!r}")
        self.pack_after_s, self.spill = pack_after_s, spill
        self.ideal_step_time_s = ideal_step_time_s
        self.min_interval_s = float(min_interval_s)
        self.limits = limits or Limits()
        self.wal, self.retention_s = wal, retention_s
        self._reader = rd._Reader(self.limits.max_attribute_bytes, self.limits.max_custom_types)
        self._rate = RateLimiter(self.limits.max_job_spans_per_s, self.limits.burst_s)
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()  # (:meth:`count` only)
        self._cache: dict[str, tuple[float, JobResult]] = {}  # job -> (monotonic s, result)
        self._rows: dict[str, dict[tuple, ProcessRows]] = {}  # job -> process -> rows taken
        self._dups: Counter = Counter()  # job -> duplicates dropped from its rows
        #: job -> {windows (None: account) -> (version, now, result)}: nothing running
        self._done: dict[str, dict] = {}
        self._memos: dict[str, tuple] = {}  # job -> (lock, {windows: AccountingMemo})
        self._last_seen: dict[str, float] = {}  # job -> wall-clock s of its last span
        self._reach: dict[str, int] = {}  # job -> ns: its windows' parts before are packed
        #: (job, windows) of memos not accounted since a compaction (see give_back_heap)
        self._trim_after: set = set()
        self._trim_due = False
        #: Counters: ``requests``, ``spans`` (of any scope), ``lines`` (spool lines), and
        #: ``refused_<reason>`` for requests refused (see :meth:`count`).
        self.stats: Counter = Counter()
        #: Records no job owns (``stats["skipped_<reason>"]``; see :mod:`.malformed`).
        self.serve_skips = ServeSkips(self.stats)
        self._file_job: dict[str, str] = {}  # spool/log file -> the last job it named
        #: Accounting failures per job (the job is reported with ``error`` set).
        self.job_errors: Counter = Counter()
        #: What the last :meth:`replay` read (None before).
        self.replayed: ReplayStats | None = None
        self._ready = wal is None
        #: Who holds the job slots; retired jobs (:mod:`~goodput_processor.serve.slots`).
        self.slots = JobSlots(self.limits, wal.results_dir if wal is not None else None)
        self._init_sources()

    def count(self, key: str, n: int = 1) -> int:
        """Add ``n`` to counter ``key`` of :attr:`stats` (thread-safe); returns the new value.

        The receivers count refused requests as ``refused_<reason>`` (``unauthenticated``,
        ``too_large``, ``malformed``, ``unsupported``, ``unavailable``, and the reasons of
        :class:`Refused`).
        """
        with self._count_lock:  # (not the store's lock, held while a request is taken in:
            self.stats[key] += n  # a refusal never waits behind an ingest; no other code
            return self.stats[key]  # adds to the keys counted here)

    # --- jobs, retirement, compaction -------------------------------------------

    def jobs(self) -> list[str]:
        """Names of the jobs seen so far, sorted."""
        with self._lock:
            return sorted(self._reader.jobs)

    def retire_idle(self, now_s: float | None = None) -> list[JobResult]:
        """Jobs with no new span for ``retention_s`` leave for good: their final result
        (``"final": true``) is written to the log's ``results/`` (with a log), their spans
        and segments are dropped, and spans for them that arrive later are refused
        (:mod:`~goodput_processor.serve.slots`). Returns the final results of the jobs that
        left (none without ``retention_s``)."""
        if self.retention_s is None:
            return []
        now_s = time.time() if now_s is None else now_s
        with self._lock:
            idle = sorted(n for n, t in self._last_seen.items()
                          if now_s - t >= self.retention_s and n in self._reader.jobs)
        return self._retire_jobs(idle, f"no span for {self.retention_s:g} s (--retention)")

    def _retire_jobs(self, names: list[str], why: str) -> list[JobResult]:
        """Retire the jobs ``names`` (not under the lock) because ``why``; returns their
        final results. A job whose result cannot be written stays (logged)."""
        out = []
        for name in names:
            with self._lock:
                if name not in self._reader.jobs or name in self.slots.retiring:
                    continue
                self.slots.retiring.add(name)
            try:
                result = self._retire(name, why)
            finally:
                with self._lock:
                    self.slots.retiring.discard(name)
            if result is not None:
                out.append(result)
        return out

    def _retire(self, name: str, why: str) -> JobResult | None:
        result = self.account(name, time.time_ns())
        if self.wal is not None:
            doc = job_to_dict(result)
            doc["final"], doc["retired"] = True, why
            try:
                self.wal.retire(name, json.dumps(doc).encode())
            except OSError as e:
                _log.error("goodput serve: cannot write the final result of job %r "
                           "(%s); it stays", name, e.strerror or e)
                return None
        with self._lock:
            self.slots.retire(name, why)
            self._reader.jobs.pop(name, None)
            self._reader._examples.pop(name, None)
            self._last_seen.pop(name, None)
            self._cache.pop(name, None)
            self._rows.pop(name, None)
            self._dups.pop(name, None)
            self._done.pop(name, None)
            self._memos.pop(name, None)
            self.foreign.forget(name)
            self._reach.pop(name, None)
            self._source_job_warnings.pop(name, None)
            self._rate.forget(name)
        if self.spill is not None:
            self.spill.forget(name)
        _log.info("goodput serve: job %r retired: %s", name, why)
        return result

    def final_report(self, name: str) -> dict | None:
        """The final report of retired job ``name`` (:meth:`~goodput_processor.serve.slots.
        JobSlots.final_report`); None when there is none (or no log)."""
        return self.slots.final_report(job_slug(name))

    def compact(self, min_quiet_s: float | None = None, min_rows: int = 4096,
                map_least: int | None = None) -> int:
        """Compact the processes that have taken no new row for ``min_quiet_s`` seconds
        (default ``pack_after_s``; None: nothing is packed) and have at least ``min_rows``
        rows, and with a spill map the kept steps of at least ``map_least`` steps
        (:func:`goodput_processor.serve.compaction.compact`); returns the rows packed.
        ``goodput serve`` calls it every maintenance round."""
        min_quiet_s = self.pack_after_s if min_quiet_s is None else min_quiet_s
        if min_quiet_s is None:
            return 0
        return compaction.compact(self, min_quiet_s, min_rows, map_least)

    def give_back_heap(self) -> bool:
        """Give the C heap's free pages back to the system if this process holds some that
        it may not need (``goodput serve``'s maintenance round calls it; returns whether
        it trimmed): once after the first accounting of each memo that a compaction
        changed (that accounting lets go of the results the compaction left in the memo,
        which frees memory without the process growing), else when the process has grown
        (:func:`~goodput_processor.read.heap.trim_heap_if_grown`)."""
        with self._lock:
            due, self._trim_due = self._trim_due, False
        if due:
            trim_heap()
            return True
        return trim_heap_if_grown()

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held by each job's span rows: the reader's buffers (``sys.getsizeof``) and
        the store's arrays, over-allocation included (not the memo)."""
        with self._lock:
            return {name: sum(sys.getsizeof(p._buf) for p in job.processes.values())
                    + sum(r.nbytes() for r in self._rows.get(name, {}).values())
                    for name, job in self._reader.jobs.items()}

