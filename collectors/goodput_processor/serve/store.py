"""Live per-job state of ``goodput serve``: spans taken in batch by batch, results on demand.

:class:`LiveStore` holds one :class:`goodput_processor.reader._Reader`: per job, per
(attempt, process), a growable ``array('q')`` of span rows (:data:`~goodput_processor.
timeline.COLUMNS`, 9 int64 = 72 bytes per span). Taking in a batch appends its rows, so its
cost grows with the batch, never with the job's history. The accounting
(:func:`goodput_processor.accounting.account`, the same code as ``goodput report``) runs
only when results are asked for, on a copy of the job's rows taken under the lock, and at
most once per ``min_interval_s`` per job unless an explicit ``now_ns`` is given.

Jobs are independent: nothing in one job's result depends on another job's spans, so
instances can be sharded by job (``service.name``) behind a Collector.
"""

from __future__ import annotations

import sys
import threading
import time
from array import array
from collections import Counter
from dataclasses import replace

import numpy as np

from .. import reader as rd
from .. import timeline as tl
from ..accounting import account
from ..report import JobResult
from ..timeline import JobSpans
from .decode import ingest_pb

__all__ = ["LiveStore"]


class LiveStore:
    """Thread-safe live state of every job seen, from OTLP requests and spool lines.

    Args:
        ideal_step_time_s: ideal step time in seconds for the accounting (None = median
            of kept step times, as ``goodput report``).
        min_interval_s: results of a job are recomputed at most this often (seconds,
            >= 0) when :meth:`results` is called without ``now_ns``.

    Raises:
        ValueError: ``ideal_step_time_s`` is not a finite number > 0, or
            ``min_interval_s`` < 0.
    """

    def __init__(self, ideal_step_time_s: float | None = None, min_interval_s: float = 1.0):
        if ideal_step_time_s is not None and not (0 < ideal_step_time_s < float("inf")):
            raise ValueError(f"ideal step time must be a finite number > 0 seconds, got "
                             f"{ideal_step_time_s!r}")
        if not min_interval_s >= 0:
            raise ValueError(f"min_interval_s must be >= 0 seconds, got {min_interval_s!r}")
        self.ideal_step_time_s = ideal_step_time_s
        self.min_interval_s = float(min_interval_s)
        self._reader = rd._Reader()
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, JobResult]] = {}  # job -> (monotonic s, result)
        #: Counters: ``requests``, ``spans`` (of any scope), ``lines`` (spool lines), and
        #: ``refused_<reason>`` for requests the receivers refused (see :meth:`count`).
        self.stats: Counter = Counter()

    # --- taking spans in -------------------------------------------------------

    def ingest_request(self, req, source: str = "otlp") -> int:
        """Take in a protobuf ``ExportTraceServiceRequest``; returns its number of spans."""
        with self._lock:
            self.stats["requests"] += 1
            where = (source, f"request {self.stats['requests']}")
            n = ingest_pb(self._reader, req, where)
            self.stats["spans"] += n
        return n

    def ingest_json(self, req: dict, where: tuple) -> None:
        """Take in one OTLP JSON ``ExportTraceServiceRequest`` (a dict).

        Raises:
            ValueError: ``req`` is not a dict with ``resourceSpans`` (nothing is stored).
        """
        if not isinstance(req, dict) or "resourceSpans" not in req:
            got = f"{type(req).__name__}" + (f" with keys {sorted(req)[:5]}"
                                             if isinstance(req, dict) else "")
            raise ValueError(f"expected a JSON object with \"resourceSpans\" (an OTLP "
                             f"ExportTraceServiceRequest), got {got}")
        with self._lock:
            self.stats["requests"] += 1
            try:
                self._reader._request(req, where)
            except (TypeError, AttributeError, KeyError, ValueError, OverflowError) as e:
                self._reader._skip(None, "malformed", where, f"bad OTLP structure ({e!r})")

    def ingest_line(self, line: bytes, where: tuple) -> None:
        """Take in one complete spool line (OTLP JSON); a bad line is counted as malformed."""
        if not line.strip():
            return
        try:
            req = rd._loads(line)
            self.ingest_json(req, where)
        except (ValueError, RecursionError) as e:
            with self._lock:
                self._reader._skip(None, "malformed", where, f"not an OTLP JSON line ({e})")
        with self._lock:
            self.stats["lines"] += 1

    def count(self, key: str, n: int = 1) -> int:
        """Add ``n`` to counter ``key`` of :attr:`stats` (thread-safe); returns the new value.

        The receivers count refused requests as ``refused_unauthenticated``,
        ``refused_too_large``, ``refused_malformed``, ``refused_unsupported`` and
        ``refused_unavailable``.
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
        """A copy of job ``name``'s spans, deduplicated, as ``read_run_dir`` gives them.

        Raises:
            KeyError: no job of that name has been seen.
        """
        with self._lock:
            job = self._reader.jobs[name]
            procs = {}
            for key, p in job.processes.items():
                data = np.frombuffer(p._buf, np.int64).reshape(-1, tl.NCOLS).copy()
                procs[key] = replace(p, data=data, run=dict(p.run), _buf=array("q"))
            skipped = Counter(job.skipped) + Counter(self._reader.skipped)
            raw = self._reader._examples
            examples = [":".join(map(str, ex[:-1])) + ": " + ex[-1]
                        for ex in (raw.get(name, []) + raw.get(None, []))[: rd._MAX_EXAMPLES]]
            out = JobSpans(name, skipped=skipped, examples=examples,
                           strings=list(self._reader.strings),
                           schema_versions=set(job.schema_versions))
        for key, p in procs.items():
            p.data, ndup = tl.drop_duplicates(p.data)
            if ndup:
                out.skipped["duplicate"] += ndup
            out.processes[key] = p
        return out

    def results(self, now_ns: int | None = None, job: str | None = None) -> list[JobResult]:
        """Current :class:`JobResult` of every job (or only ``job``), sorted by job name.

        With ``now_ns`` (ns since the epoch) every job is accounted now, exactly as
        ``goodput report`` would with the same ``now_ns``; without, a job's result is
        reused if it was computed less than ``min_interval_s`` ago.

        Raises:
            KeyError: ``job`` is given and has not been seen.
        """
        names = self.jobs()
        if job is not None:
            if job not in names:
                raise KeyError(f"no job named {job!r} (jobs: {', '.join(names) or 'none'})")
            names = [job]
        out = []
        for name in names:
            cached = self._cache.get(name)
            mono = time.monotonic()
            if now_ns is None and cached is not None and mono - cached[0] < self.min_interval_s:
                out.append(cached[1])
                continue
            result = account(self.snapshot(name), self.ideal_step_time_s, now_ns)
            if now_ns is None:
                self._cache[name] = (mono, result)
            out.append(result)
        return out

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held by each job's span buffers (``sys.getsizeof``, over-allocation included)."""
        with self._lock:
            return {name: sum(sys.getsizeof(p._buf) for p in job.processes.values())
                    for name, job in self._reader.jobs.items()}

    def report_json(self, now_ns: int | None = None, job: str | None = None) -> str:
        """The current report as the JSON of ``goodput report --format json``."""
        from ..report import to_json

        return to_json(self.results(now_ns, job))

