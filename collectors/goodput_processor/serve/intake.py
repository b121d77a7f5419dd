"""Taking spans in, for :class:`~goodput_processor.serve.store.LiveStore`: readiness, the
write-ahead log's replay, admission, and the three ways spans arrive (protobuf and OTLP
JSON requests, spool lines).

Durable ingest: with a :class:`~goodput_processor.serve.wal.WriteAheadLog`, a request's
spans are appended to the log (one line per job) before they are taken in and before the
receiver acknowledges the request; :meth:`SpanIntake.replay` rebuilds exactly that state
after a restart. A request that cannot be logged is refused (:class:`~goodput_processor.
serve.limits.Refused`, retryable), never acknowledged and dropped.

Admission (:meth:`SpanIntake._admit`, under the store's lock): not ready, a job name over
``--max-attribute-bytes``, a retired job, no job slot left (:mod:`.slots`) or a job over
its rate refuse the request before anything of it is logged or taken in."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

from ..read import reader as rd
from ..read import rows as tl
from .decode import ingest_pb
from .encode import json_line, pb_line, split_json, split_pb
from .foreign import own_only_json, own_only_pb
from .limits import Refused
from .malformed import check_traces_json
from .slots import current_client, made_progress
from .wal import ReplayStats, job_slug

__all__ = ["SpanIntake"]

_log = logging.getLogger("goodput_processor.serve.store")  # (the store's log)


class SpanIntake:
    """The intake side of a :class:`~goodput_processor.serve.store.LiveStore` (a base class
    of it: it uses the store's ``_lock``, ``_reader``, ``_rows``, ``_last_seen``,
    ``_file_job``, ``_rate``, ``_ready``, ``limits``, ``wal``, ``slots``, ``stats``,
    ``serve_skips``, ``replayed``, :meth:`~goodput_processor.serve.store.LiveStore.jobs`,
    ``_retire_jobs`` and the sources' ``_foreign_spans``). See the module docstring."""

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

    def _admit(self, groups: dict[str, tuple[list, int]], dry: bool = False) -> None:
        """Refuse (raise :class:`Refused`) a request that may not be taken in; under lock.
        ``dry``: check only (no rate paid, no slot claimed: :meth:`_precheck`)."""
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
        if dry:
            return
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

    def _precheck(self, groups) -> None:
        """With a log, before a request's log lines are made (the most CPU of taking it in
        after the parse): the refusals that do not need them (:meth:`_admit`, ``dry``), so
        that a refused request (a flood of new job names, a job over its rate) costs its
        parse only (issue 38: making the lines of refused requests of 25 new jobs each took
        13% of serve's CPU under a flood of job names). Checked again when it is taken in.

        Raises:
            Refused: as :meth:`_admit`.
        """
        if self.wal is not None:
            with self._lock:
                self._admit(groups, dry=True)

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
        self._precheck(groups)
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
        self._precheck(groups)
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
