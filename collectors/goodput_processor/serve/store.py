"""Live per-job state of ``goodput serve``: spans taken in batch by batch, results on demand.

:class:`LiveStore` holds one :class:`goodput_processor.reader._Reader`: per job, per
(attempt, process), a growable ``array('q')`` of span rows (:data:`~goodput_processor.
timeline.COLUMNS`, 9 int64 = 72 bytes per span). Taking in a batch appends its rows, so its
cost grows with the batch, never with the job's history. The accounting
(:func:`goodput_processor.accounting.account`, the same code as ``goodput report``) runs
only when results are asked for, on a copy of the job's rows taken under the lock, and at
most once per ``min_interval_s`` per job unless an explicit ``now_ns`` is given.

Durable ingest: with a :class:`~goodput_processor.serve.wal.WriteAheadLog`, a request's
spans are appended to the log (one line per job) before they are taken in and before the
receiver acknowledges the request; :meth:`LiveStore.replay` rebuilds exactly that state
after a restart. A request that cannot be logged is refused (:class:`~goodput_processor.
serve.limits.Refused`, retryable), never acknowledged and dropped.

Isolation: jobs are independent, nothing in one job's result depends on another job's
spans (so instances can be sharded by job behind a Collector), and a job whose accounting
fails is reported as failed (``JobResult.error``, counted in :attr:`LiveStore.job_errors`)
while every other job carries on.

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

import contextlib
import json
import logging
import sys
import threading
import time
from array import array
from collections import Counter
from types import SimpleNamespace

import numpy as np

from .. import reader as rd
from .. import timeline as tl
from ..accounting import account, isolated
from ..attempts import clock_ns
from ..heap import trim_heap, trim_heap_if_grown
from ..memo import AccountingMemo
from ..report import JobResult, job_to_dict
from ..timeline import JobSpans
from . import compaction
from .decode import ingest_pb
from .encode import json_line, pb_line, split_json, split_pb
from .foreign import ForeignIntake, own_only_json, own_only_pb
from .limits import Limits, RateLimiter, Refused
from .malformed import ServeSkips, check_traces_json
from .rows import PackedProcessSpans, ProcessRows
from .slots import JobSlots, current_client, made_progress
from .spill import Spill
from .wal import ReplayStats, WriteAheadLog, job_slug

__all__ = ["LiveStore"]

_log = logging.getLogger(__name__)


class LiveStore(ForeignIntake):
    """Thread-safe live state of every job seen, from OTLP requests and spool lines.

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

    # --- readiness and replay -----------------------------------------------------

    def ready(self) -> tuple[bool, str]:
        """``(True, "ready")``, or ``(False, why)``: replaying the log, it cannot write, or
        it refused a job's spans lately (:meth:`WriteAheadLog.refusals`: a file-size limit
        refuses one job while others write). Takes no lock (``/readyz``)."""
        if not self._ready:
            return False, "replaying the write-ahead log"
        if self.wal is not None and self.wal.error:
            return False, self.wal.error
        refused = self.wal.refusals() if self.wal is not None else None
        if refused:
            job, why = next(iter(refused.items()))
            more = f" (and {len(refused) - 1} more jobs)" if len(refused) > 1 else ""
            return False, f"spans of job {job!r}{more} refused: {why}"
        return True, "ready"

    def replay(self) -> ReplayStats:
        """Read the write-ahead log back into the store (once, before serving); then ready.

        Raises:
            RuntimeError: there is no log.
        """
        if self.wal is None:
            raise RuntimeError("no write-ahead log to replay")

        def take(line: bytes, where: tuple) -> None:
            self.ingest_line(line, where, count=False)

        st = self.wal.replay(take)
        for job in self.jobs():  # idle since its last segment was written
            try:
                self._last_seen[job] = max(p.stat().st_mtime for p in
                                           (self.wal.jobs_dir / job_slug(job)).iterdir())
            except (OSError, ValueError):
                self._last_seen[job] = time.time()
        self.replayed, self._ready = st, True
        _log.info("goodput serve: replayed %d lines (%d bytes, %d torn) of %d jobs from %s "
                  "in %.2f s", st.lines, st.bytes, st.torn, len(self.jobs()), self.wal.root,
                  st.seconds)
        return st

    # --- taking spans in -------------------------------------------------------

    def _admit(self, groups: dict[str, tuple[list, int]]) -> None:
        """Refuse (raise :class:`Refused`) a request that may not be taken in; under lock."""
        if not self._ready:
            raise Refused("unavailable", "goodput serve is replaying its write-ahead log",
                          retry_after_s=2.0)
        if not groups:
            return
        lim = self.limits
        for name in groups:
            if len(name.encode("utf-8", "surrogatepass")) > lim.max_attribute_bytes:
                raise Refused("job_name", f"job name of {len(name)} characters is over "
                              f"--max-attribute-bytes {lim.max_attribute_bytes}",
                              retryable=False)
        self._admit_jobs(groups)
        costs = {name: n for name, (_, n) in groups.items()}
        wait = self._rate.wait_s(costs)
        if wait > 0:
            raise Refused("rate", f"job {next(iter(costs))!r} is over "
                          f"{lim.max_job_spans_per_s:g} spans/s (--max-job-spans-per-second)",
                          retry_after_s=wait)
        self._rate.take(costs)
        for name in groups:  # (the first client of a job since serve started holds it)
            self.slots.claim(name, current_client())

    def _admit_jobs(self, groups: dict) -> None:
        """Under the lock (:meth:`_admit`): spans of a retired job are refused for good
        (in a request that holds other jobs' spans too, only they are left out of
        ``groups``, counted in ``stats["retired_spans"]``); spans of a job being retired
        are refused as retryable; new jobs that do not fit make room by retiring idle jobs
        without progress (the lock is let go meanwhile: :meth:`_admit` is the first thing
        done under it), else they are refused (:mod:`~goodput_processor.serve.slots`)."""
        slots, jobs = self.slots, self._reader.jobs
        slots.limits = self.limits  # (a test may swap the limits)
        slots.take_out_late(groups, jobs, self.stats, job_slug if self.wal else None)
        slots.make_room(groups, jobs, current_client(), self._last_seen, self._progress,
                        self._retire_jobs, self._lock, self.retention_s)

    def _new_from_line(self, known: int) -> None:
        """Under the lock: the jobs a spool line made (those after the first ``known``)
        are claimed by the tailer; one that was retired is dropped again (its spans
        counted in ``stats["retired_spans"]``). Not while replaying the log (what it
        holds of a retired job is decided by :meth:`~goodput_processor.serve.wal.
        WriteAheadLog.replay`)."""
        jobs = self._reader.jobs
        for name in list(jobs)[known:]:
            why = self.slots.retired(name, job_slug(name) if self.wal is not None else None)
            if why is None:
                self.slots.claim(name, current_client())
                continue
            job = jobs.pop(name)
            self._reader._examples.pop(name, None)
            self.stats["retired_spans"] += sum(len(p._buf) for p in
                                               job.processes.values()) // tl.NCOLS
            self.stats["retired_lines"] += 1
            if self.stats["retired_lines"] in (1, 10) or self.stats["retired_lines"] % 1000 == 0:
                _log.warning("goodput serve: a spool line: %s", self.slots.late(
                    name, why, None).message)

    def _progress(self, name: str) -> bool:
        """Under the lock: whether job ``name`` has a kept step."""
        return made_progress(self._reader.jobs[name], self._rows.get(name, {}))

    def _wal_lines(self, groups, encode) -> dict[str, bytes]:
        """Per job of ``groups``, its line for the log (:mod:`.encode`: what the accounting
        reads, strings cut to ``--max-attribute-bytes``); none without a log."""
        if self.wal is None:
            return {}
        cut = self.limits.max_attribute_bytes
        return {name: encode(rss, cut) for name, (rss, _) in groups.items()}

    def _log_lines(self, groups, lines: dict[str, bytes], take) -> None:
        """Under lock: per job, append its line to the log, then ``take`` its spans. A log
        that fails refuses the request (what was logged before it is taken in)."""
        for name, (rss, _) in groups.items():
            if self.wal is not None:
                try:
                    self.wal.append(name, lines[name])
                except OSError as e:
                    raise Refused("wal", f"goodput serve cannot write its write-ahead log "
                                  f"({e.strerror or e}); nothing of job {name!r} in this "
                                  "request was taken in", retry_after_s=5.0) from e
            take(rss)
            self._last_seen[name] = time.time()

    def ingest_request(self, req, source: str = "otlp") -> int:
        """Take in a protobuf ``ExportTraceServiceRequest``; returns its number of spans.

        Raises:
            Refused: not ready, over a limit, or the write-ahead log cannot write it.
        """
        if not own_only_pb(req.resource_spans):  # a foreign producer's: the sources read it
            req = self._foreign_spans(req.resource_spans, (
                source, f"request {self.stats['requests'] + 1}"), pb=True)
        groups = split_pb(req)
        lines = self._wal_lines(groups, pb_line)
        n = sum(c for _, c in groups.values())
        with self._lock:
            self._admit(groups)
            self.stats["requests"] += 1
            where = (source, f"request {self.stats['requests']}")
            self._log_lines(groups, lines, lambda rss: ingest_pb(
                self._reader, SimpleNamespace(resource_spans=rss), where))
            self.stats["spans"] += n
        return n

    def ingest_json(self, req: dict, where: tuple, durable: bool = True) -> None:
        """Take in one OTLP JSON ``ExportTraceServiceRequest`` (a dict).

        ``durable=False``: a spool line or a replayed log line, already on disk: neither
        logged again nor subject to the limits on requests; a part that is not OTLP is
        counted as ``malformed`` for the job its file named last (as ``goodput report``
        counts it), else in serve's own ``stats`` (:mod:`~goodput_processor.serve.
        malformed`), never in another job's report.

        Raises:
            ValueError: (``durable``) ``req`` is not OTLP down to its span objects
                (:func:`~goodput_processor.serve.malformed.check_traces_json`): nothing of
                it is stored, logged or translated.
            Refused: (``durable`` only) as :meth:`ingest_request`.
        """
        if not durable:
            with self._lock:
                self.stats["requests"] += 1
                known = len(self._reader.jobs)
                self._take_line(req, where)
                if len(self._reader.jobs) > known and self._ready:  # (the replay: .wal)
                    self._new_from_line(known)
            return
        check_traces_json(req)  # all or nothing, before the sources or the log see it
        if not own_only_json(req["resourceSpans"]):  # through the sources
            req = self._foreign_spans(req["resourceSpans"], where, pb=False)
        groups = split_json(req)
        lines = self._wal_lines(groups, json_line)
        with self._lock:
            self._admit(groups)
            self.stats["requests"] += 1
            self._log_lines(groups, lines, lambda rss: self._take_json(rss, where))
            self.stats["spans"] += sum(n for _, n in groups.values())

    def _take_json(self, rss: list, where) -> None:
        """Under the lock: read the OTLP JSON ``ResourceSpans`` ``rss`` of a checked request
        (what still fails is serve's to count, not a job's)."""
        try:
            self._reader._request({"resourceSpans": rss}, where)
        except (TypeError, AttributeError, KeyError, ValueError, OverflowError) as e:
            self.serve_skips.skip("malformed", where, f"bad OTLP structure ({e!r})")

    def _take_line(self, req, where: tuple) -> None:
        """Under the lock: read a spool or log line's request ``req``; ``where`` is
        ``(path, line number)``. What is not OTLP counts for the job the file named last."""
        if not isinstance(req, dict) or "resourceSpans" not in req:
            return self._line_skip(where, "expected a JSON object with \"resourceSpans\" "
                                   f"(an OTLP ExportTraceServiceRequest), got {type(req).__name__}")
        try:
            job = self._reader._request(req, where)
        except (TypeError, AttributeError, KeyError, ValueError, OverflowError) as e:
            return self._line_skip(where, f"bad OTLP structure ({e!r})")
        if job is not None:
            self._file_job[where[0]] = job.name

    def _line_skip(self, where: tuple, why: str) -> None:
        """Under the lock: a ``malformed`` line, for its file's last job if there is one."""
        job = self._reader.jobs.get(self._file_job.get(where[0], ""))
        if job is not None:
            self._reader._skip(job, "malformed", where, why)
        else:
            self.serve_skips.skip("malformed", where, why)

    def ingest_line(self, line: bytes, where: tuple, count: bool = True) -> None:
        """Take in one complete spool line (OTLP JSON); ``where`` is ``(path, line
        number)``. A bad line is counted as malformed (see :meth:`ingest_json`)."""
        if not line.strip():
            return
        try:
            req = rd._loads(line)
        except (ValueError, RecursionError) as e:
            with self._lock:
                self._line_skip(where, f"not an OTLP JSON line ({e})")
        else:
            self.ingest_json(req, where, durable=False)
        if count:
            with self._lock:
                self.stats["lines"] += 1

    def count(self, key: str, n: int = 1) -> int:
        """Add ``n`` to counter ``key`` of :attr:`stats` (thread-safe); returns the new value.

        The receivers count refused requests as ``refused_<reason>`` (``unauthenticated``,
        ``too_large``, ``malformed``, ``unsupported``, ``unavailable``, and the reasons of
        :class:`Refused`).
        """
        with self._lock:
            self.stats[key] += n
            return self.stats[key]

    # --- reading results --------------------------------------------------------

    def jobs(self) -> list[str]:
        """Names of the jobs seen so far, sorted."""
        with self._lock:
            return sorted(self._reader.jobs)

    def snapshot(self, name: str) -> JobSpans:
        """Job ``name``'s spans, deduplicated, as ``read_run_dir`` gives them.

        The rows that arrived since the last snapshot move from the reader's buffers to the
        store's own arrays (:class:`~goodput_processor.serve.rows.ProcessRows`), duplicates
        dropped; each process's ``data`` is a read-only view of them, which later arrivals
        never change. The cost follows what arrived, not the job's history. A process whose
        rows are packed (:meth:`compact`) is a :class:`~goodput_processor.serve.rows.
        PackedProcessSpans`: its ``data`` is inflated when read (the same rows).

        Raises:
            KeyError: no job of that name has been seen.
        """
        with self._lock:
            job = self._reader.jobs[name]
            rows = self._rows.setdefault(name, {})
            procs = {}
            for key, p in job.processes.items():
                r = rows.get(key)
                if r is None:
                    r = rows[key] = ProcessRows()
                if len(p._buf):
                    new = np.frombuffer(p._buf, np.int64).reshape(-1, tl.NCOLS).copy()
                    del p._buf[:]
                    self._dups[name] += r.append(new)
                if r.packed is not None:  # (inflated only if the accounting reads them)
                    procs[key] = PackedProcessSpans.of(p, r.packed, run=dict(p.run),
                                                       _buf=array("q"))
                else:
                    procs[key] = p.copy(data=r.view(), run=dict(p.run), _buf=array("q"))
            skipped = Counter(job.skipped)  # (what no job owns is serve's: serve_skips)
            if self._dups[name]:
                skipped["duplicate"] += self._dups[name]
            raw = self._reader._examples
            examples = [":".join(map(str, ex[:-1])) + ": " + ex[-1]
                        for ex in raw.get(name, [])[: rd._MAX_EXAMPLES]]
            out = JobSpans(name, skipped=skipped, examples=examples,
                           strings=list(self._reader.strings),
                           schema_versions=set(job.schema_versions),
                           over_limit=Counter(job.over_limit))
        out.processes.update(procs)
        return out

    @contextlib.contextmanager
    def memo(self, name: str, windows: bool = False):
        """Job ``name``'s :class:`~goodput_processor.memo.AccountingMemo`, held for one
        accounting (accountings of one job wait for each other; ``windows``: the memo of
        the accountings with rolling windows, kept apart but for what is kept per process,
        which both share: one copy of each process's resolved rows)."""
        with self._lock:
            lock, memos = self._memos.setdefault(name, (threading.Lock(), {}))
        with lock:
            if windows not in memos:
                shared = next(iter(memos.values())).processes if memos else None
                memos[windows] = AccountingMemo(shared)
            yield memos[windows]
        if self._trim_after:  # (this accounting let go of what a compaction left in it)
            with self._lock:
                if (name, windows) in self._trim_after:
                    self._trim_after.discard((name, windows))
                    self._trim_due = True

    def account(self, name: str, now_ns: int | None = None) -> JobResult:
        """Account job ``name`` now, isolated: an exception of the accounting gives a
        failed result (``error`` set, counted in :attr:`job_errors`), never raises.
        What the job's new spans cannot change comes from its memo (:meth:`memo`). A job
        with no attempt running is not accounted again while nothing of it changed: its
        result does not depend on a later now.

        Raises:
            KeyError: no job of that name has been seen.
        """
        now = clock_ns() if now_ns is None else now_ns
        with self.memo(name) as memo:
            spans = self.snapshot(name)
            version, result = self._finished(name, None, now)
            if result is not None:
                return result
            result = isolated(name, lambda: account(spans, self.ideal_step_time_s, now,
                                                    memo=memo),
                              lambda _e: self._count_error(name))
            self._keep_finished(name, None, version, now, result)
            return result

    def _finished(self, name: str, key, now: int):
        """``(version, result)``: the job's version now (:meth:`_version`, after
        :meth:`snapshot`) and the result kept under ``key`` for it when the job had no
        attempt running then and nothing of it changed since (else None)."""
        with self._lock:
            version = self._version(name)
            done = self._done.get(name, {}).get(key)
        if done is not None and done[0] == version and done[1] <= now:
            return version, done[2]
        return version, None

    def _keep_finished(self, name: str, key, version: tuple, now: int, out) -> None:
        """Keep ``out`` (a JobResult, or a JobSnapshot of one) under ``key`` while the job
        has no attempt running: its accounting does not depend on a later now."""
        result = getattr(out, "result", out)
        with self._lock:
            kept = self._done.setdefault(name, {})
            if (result.error is None and result.attempts
                    and result.attempts[-1].end_reason != "running"):
                kept[key] = (version, now, out)
            else:
                kept.pop(key, None)

    def _version(self, name: str) -> tuple:
        """What a job's result depends on besides now (under the lock, after
        :meth:`snapshot`): counts of its processes, rows taken and waiting, skips, examples
        and strings, and its resources' attributes."""
        job = self._reader.jobs[name]
        return (len(job.processes), sum(r.n for r in self._rows.get(name, {}).values()),
                sum(len(p._buf) for p in job.processes.values()),
                sum(job.skipped.values()), self._dups[name],
                len(self._reader._examples.get(name, ())), len(self._reader.strings),
                sum(job.over_limit.values()), len(job.schema_versions),
                hash(tuple((repr(p.run), p.host, p.process_count, p.pid, p.process_start_ns,
                            p.attempt_source, p.index_source, p.schema_version)
                           for p in job.processes.values())))

    def snapshot_windows(self, name: str, windows_s, now_ns: int | None = None):
        """Job ``name`` accounted with rolling windows (a :class:`~goodput_processor.metrics.
        JobSnapshot`, :func:`~goodput_processor.metrics.snapshot`), through its memo of
        windowed accountings, isolated like :meth:`account` (a failure gives a snapshot of
        a failed result, with no windows). Like :meth:`account`'s, a job with no attempt
        running is not accounted again while nothing of it changed: its windows end at its
        end, not at now.

        Raises:
            KeyError: no job of that name has been seen.
            ValueError: a window is not a number of seconds > 0.
        """
        from ..metrics import JobSnapshot, check_windows, snapshot

        windows = check_windows(windows_s)
        now = clock_ns() if now_ns is None else now_ns
        with self.memo(name, windows=True) as memo:
            spans = self.snapshot(name)
            version, snap = self._finished(name, windows, now)
            if snap is not None:
                return snap
            snap = isolated(name, lambda: snapshot(spans, windows, self.ideal_step_time_s,
                                                   now, memo),
                            lambda _e: self._count_error(name))
            # (isolated gives a failed JobResult instead of the snapshot when it raises)
            if not isinstance(snap, JobSnapshot):
                return JobSnapshot(snap)
            self._keep_finished(name, windows, version, now, snap)
        with self._lock:  # (how far back the windows reach: LiveStore.compact)
            self._reach[name] = snap.result.end_ns - round(2 * max(windows) * 1e9)
        return snap

    def _count_error(self, name: str) -> None:
        with self._lock:
            self.job_errors[name] += 1
            n = self.job_errors[name]
        if n == 1 or n % 100 == 0:
            _log.exception("goodput serve: accounting job %r failed (%d time(s)); it is "
                           "reported as failed, the other jobs carry on", name, n)

    def results(self, now_ns: int | None = None, job: str | None = None) -> list[JobResult]:
        """Current :class:`JobResult` of every job (or only ``job``), sorted by job name.

        With ``now_ns`` (ns since the epoch) every job is accounted now, exactly as
        ``goodput report`` would with the same ``now_ns``; without, a job's result is
        reused if it was computed less than ``min_interval_s`` ago. A job whose
        accounting fails comes back with ``error`` set (see :meth:`account`).

        Raises:
            KeyError: ``job`` is given and has not been seen.
        """
        if job is not None:
            with self._lock:
                known = job in self._reader.jobs
            if not known:
                with self._lock:
                    why = self.slots.retired(job, job_slug(job) if self.wal else None)
                if why is not None:
                    raise KeyError(f"job {job!r} was retired ({why}); its final report is in "
                                   "the write-ahead log's results/ and the report file")
                names = self.jobs()
                raise KeyError(f"no job named {job!r} (jobs: {', '.join(names[:20]) or 'none'}"
                               f"{', ...' if len(names) > 20 else ''})")
            return self.results_for([job], now_ns)
        return self.results_for(self.jobs(), now_ns)

    def results_for(self, names: list[str], now_ns: int | None = None) -> list[JobResult]:
        """:meth:`results` of the jobs ``names`` only, in that order (one page of the
        report: its cost follows the page, not the number of jobs). Names not (or no
        longer) tracked are left out."""
        out = []
        for name in names:
            cached = self._cache.get(name)
            mono = time.monotonic()
            if now_ns is None and cached is not None and mono - cached[0] < self.min_interval_s:
                out.append(cached[1])
                continue
            try:
                result = self.account(name, now_ns)
            except KeyError:  # retired meanwhile
                continue
            if now_ns is None:
                self._cache[name] = (mono, result)
            out.append(result)
        return out

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
        (:func:`~goodput_processor.heap.trim_heap_if_grown`)."""
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

    def report_json(self, now_ns: int | None = None, job: str | None = None) -> str:
        """The current report as the JSON of ``goodput report --format json``."""
        from ..report import to_json

        return to_json(self.results(now_ns, job))
