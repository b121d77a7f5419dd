"""Results on demand, for :class:`~goodput_processor.serve.store.LiveStore`: a job's
snapshot, its accounting memo, and the results kept between polls.

A snapshot moves the rows that arrived since the last one from the reader's buffers to the
store's own arrays (:class:`~goodput_processor.serve.rows.ProcessRows`), so its cost grows
with what arrived, never with the job's history. The accounting
(:func:`goodput_processor.account.accounting.account`, the same code as ``goodput report``) runs
only when results are asked for, on a copy of the job's rows taken under the lock, at most
once per ``min_interval_s`` per job unless an explicit ``now_ns`` is given, and not again
for a job with no attempt running while nothing of it changed.

Isolation: jobs are independent, nothing in one job's result depends on another job's
spans (so instances can be sharded by job behind a Collector), and a job whose accounting
fails is reported as failed (``JobResult.error``, counted in the store's ``job_errors``)
while every other job carries on."""

from __future__ import annotations

import contextlib
import logging
import operator
import threading
import time
from array import array
from collections import Counter

import numpy as np

from ..account.accounting import account, isolated
from ..model.attempts import clock_ns
from ..model.memo import AccountingMemo
from ..read import reader as rd
from ..read import rows as tl
from ..read.rows import JobSpans, ProcessSpans
from ..results.job import JobResult
from .rows import PackedProcessSpans, ProcessRows
from .wal import job_slug

__all__ = ["LiveResults"]

_log = logging.getLogger("goodput_processor.serve.store")  # (the store's log)


#: What a snapshot's copy of a process holds but its rows and ``run``: the fields of a
#: ``ProcessSpans`` but ``data``, ``_buf`` and ``run``, as a tuple.
_resource = operator.attrgetter(*(f for f in ProcessSpans.__dataclass_fields__
                                  if f not in ("data", "_buf", "run")))


class LiveResults:
    """The results side of a :class:`~goodput_processor.serve.store.LiveStore` (a base class
    of it: it uses the store's ``_lock``, ``_reader``, ``_rows``, ``_dups``, ``_memos``,
    ``_done``, ``_cache``, ``_reach``, ``_trim_after``, ``_trim_due``, ``job_errors``,
    ``ideal_step_time_s``, ``min_interval_s``, ``wal``, ``slots`` and
    :meth:`~goodput_processor.serve.store.LiveStore.jobs`). See the module docstring."""

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
                    continue
                ident = _resource(p)  # (a copy only read by accountings: the same rows
                snap = r.snap  # and resource, the same copy)
                if (snap is not None and snap[0] == r.n and snap[1] == ident
                        and snap[2].run == p.run):
                    procs[key] = snap[2]
                else:
                    procs[key] = p.copy(data=r.view(), run=dict(p.run), _buf=array("q"))
                    r.snap = (r.n, ident, procs[key])
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
        """Job ``name``'s :class:`~goodput_processor.model.memo.AccountingMemo`, held for one
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
        """Job ``name`` accounted with rolling windows (a
        :class:`~goodput_processor.exporters.metrics.JobSnapshot`,
        :func:`~goodput_processor.exporters.metrics.snapshot`), through its memo of
        windowed accountings, isolated like :meth:`account` (a failure gives a snapshot of
        a failed result, with no windows). Like :meth:`account`'s, a job with no attempt
        running is not accounted again while nothing of it changed: its windows end at its
        end, not at now.

        Raises:
            KeyError: no job of that name has been seen.
            ValueError: a window is not a number of seconds > 0.
        """
        from ..exporters.metrics import JobSnapshot, check_windows, snapshot

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

    def report_json(self, now_ns: int | None = None, job: str | None = None) -> str:
        """The current report as the JSON of ``goodput report --format json``."""
        from ..results.report_json import to_json

        return to_json(self.results(now_ns, job))
