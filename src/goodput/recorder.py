"""The recorder: a cheap hot path on the training thread, spans encoded off it.

The training thread only reads the clock and appends a tuple to a deque
(``collections.deque.append`` is thread-safe). A background thread drains the
deque every flush interval (or at once after a checkpoint save), encodes the
records as OpenTelemetry spans in OTLP/JSON text (:mod:`goodput.encode`; no SDK span
objects) and appends them to the spool (:mod:`goodput.segments`). Lifecycle
records (attempt start and end, step starts) go through the same deque, so
their order with the phases is kept. Exporters other than the spool read the spool
and get SDK ``ReadableSpan`` objects decoded from its lines (:mod:`goodput.forward`).
Opening and closing an attempt, and its files, are in :mod:`goodput.attempt_files`.

Each attempt has its own resource (it carries the attempt number) and its own spool
files; its spans are grouped into traces by :mod:`goodput.traces` (a window root per
trace). Every failure is counted in :meth:`Recorder.stats` and written on the next
heartbeat or end marker; nothing raises into training.

The recorder installs no signal handler: a Python handler runs only when the main thread
is back in the interpreter, so one would keep a rank blocked in native code (a
``TCPStore`` wait, a collective) alive after SIGTERM until the launcher's SIGKILL. A
process ended by a signal leaves no end marker. Each record also goes, on the recording
thread, into the attempt's spool tail (:mod:`goodput.tail`: a memory-mapped file, in the
OS's page cache at once), with a sequence number; after each journal write the background
thread writes into the tail how far the journal got. So a SIGKILL loses nothing recorded:
the processor takes the records the journal lacks from the tail, and ends the attempt at
its last record. Phases in flight are in the tail from their start (and in the journal as
``goodput.open`` records written at each flush).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import sys
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from opentelemetry.sdk.resources import Resource

from goodput import config, export, fork, forwarding, schema
from goodput.attempt_files import START as _START
from goodput.attempt_files import AttemptFiles
from goodput.tail import NULL as _NO_TAIL
from goodput.tail import InFlight

if TYPE_CHECKING:
    from goodput.encode import Encoder
    from goodput.segments import MemorySink, SpoolWriter
    from goodput.traces import TraceWindows

_log = logging.getLogger(__name__)

# Control records share the deque with phase records (name, t0, t1, attrs, error).
_END = "<job_end>"
_STEP_START = "<step_start>"
_SYNC = "<sync>"


class Recorder(AttemptFiles):
    """Records the phases of one training process as OpenTelemetry spans.

    Use the module functions (:func:`goodput.configure`, :func:`goodput.step`, ...)
    rather than this class directly. Times are integers in ns since the epoch.

    Args:
        job_name: the job; ``OTEL_SERVICE_NAME`` / ``GOODPUT_JOB_NAME`` win.
        run_dir: spool directory; see :mod:`goodput.config`.
        process_index, process_count: rank and size of the job's host processes.
        flush_interval_s: how often spans are written (seconds, 0.01 to 3600, default
            1); a process killed with SIGKILL loses at most this much.
        exporters: extra ``SpanExporter`` objects, in addition to those named by
            ``traces_exporter``; each is fed from the spool by a
            :class:`goodput.forward.Forwarder` (retried through outages).
        traces_exporter: exporter names (see :mod:`goodput.export`); default
            ``GOODPUT_TRACES_EXPORTER``, else ``OTEL_TRACES_EXPORTER``.
        trace_window_s, trace_window_spans: a window (one trace) closes after this
            many seconds (> 0, default 60) or child spans (>= 1, default 500).
        spool: write the local spool (default: yes unless ``GOODPUT_SPOOL=0``).
        handle_signals: ignored (kept for compatibility): no signal handler is installed.
        resource_attributes: extra resource attributes (str -> str/bool/int/float or a
            sequence of one of those) on every span; the schema's own attributes win.

    Never raises: a setting out of its range, of the wrong type, or an exporter that
    cannot be made is warned about once (naming it and what is used instead) and replaced
    by its default (:mod:`goodput.config`, ``docs/recording.md``).
    """

    def __init__(
        self,
        job_name: str | None = None,
        run_dir=None,
        process_index: int | None = None,
        process_count: int | None = None,
        flush_interval_s: float | None = None,
        exporters=None,
        spool: bool | None = None,
        handle_signals: bool | None = None,
        traces_exporter=None,
        trace_window_s: float | None = None,
        trace_window_spans: int | None = None,
        resource_attributes=None,
    ):
        self.job_name = config.job_name(job_name)
        if config.sdk_disabled():
            _log.warning("goodput: OTEL_SDK_DISABLED=true turns the OpenTelemetry SDK off: "
                         "nothing is recorded for job %s (unset it to measure goodput)",
                         self.job_name)
        #: Rank and size: the framework's when it is already initialised, else what the
        #: arguments or the environment said (then the framework's once known).
        self.process_index, self._index_source = config.process_index(process_index)
        self.process_count = config.process_count(process_count, self.process_index)
        found = config.framework_identity()
        if found is not None:
            (self.process_index, self.process_count), self._index_source = found, "framework"
        self.flush_interval_s = config.flush_interval_s(flush_interval_s)
        self.spool = config.spool_enabled(spool)
        self.run_dir = config.run_dir(run_dir, self.job_name) if self.spool else None
        #: Where the spool goes was nobody's choice: said once, at the first attempt.
        self._say_where = self.spool and (
            self.job_name == config.DEFAULT_JOB_NAME
            or self.run_dir == schema.default_run_dir(self.job_name))
        self._window_ns = int(config.trace_window_s(trace_window_s) * 1e9)
        self._window_spans = config.trace_window_spans(trace_window_spans)
        extra = export.given(exporters) + export.named(traces_exporter)
        self._resource_extra = {**config.resource_attributes(resource_attributes),
                                **export.resource_attributes(extra)}
        self._forward = forwarding.Forwarding(extra, self.run_dir, self.process_index,
                                           poll_s=self.flush_interval_s)

        self._q: deque = deque()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._draining = False
        self._tidy: threading.Thread | None = None  # goodput.leftovers, at an attempt's start

        self.attempt: int | None = None  # current attempt, None when none is open
        self._next_attempt: int | None = None
        self._attempt_source = "process"
        self._resource = None  # of the open attempt (an SDK Resource)
        self._encoder: Encoder | None = None  # of the open attempt
        self._windows: TraceWindows | None = None  # of the open attempt
        self._sink: SpoolWriter | MemorySink | None = None  # where its spans go
        self._spool_failures_counted = 0  # of the current attempt's spool file
        self._compact_failures = 0  # of the attempts closed
        self._pending_step: tuple[int, int] | None = None
        self._last_tick = time.time_ns()
        self._sync_requested = False
        self._exception_seen = False
        self._prev_excepthook = None
        #: Phases in flight on the training thread (see :meth:`phase_begin`).
        #: Sequence numbers of the records (1, 2, ...: a C counter, safe from any thread), in
        #: the deque's tuples and the tail; the largest drained one, and the tail it went to.
        self._next_seq = itertools.count(1).__next__
        self._drained_seq = 0
        self._tail = _NO_TAIL
        self._open: set = InFlight()  # adding a phase writes its start to the tail
        self._open.tail, self._open.next_seq = _NO_TAIL, self._next_seq
        self._tail_suffix: str | None = None  # the line template the tail holds
        self._tail_failures = self._tail_overruns = 0  # of the attempts closed
        self._tail_encoder = None  # the encoder whose line template the tail holds
        self._open_written: dict[tuple, bool] = {}  # (name, start) of those written
        self._identity_written: tuple[int, int] | None = None
        self.next_step = 0
        self._shut = False

        self._counts = {"recorded": 0, "spans": 0, "errors": 0, "dropped": 0, "export_failures": 0}
        #: pid of the process this recorder was made in, when this is a fork of it
        self.forked_from: int | None = None
        fork.track(self)

    # --- hot path ---------------------------------------------------------

    def record(self, name: str, start_ns: int, end_ns: int, attrs=None, error=None) -> None:
        """Append one finished phase (span name from :mod:`goodput.schema`). Never raises."""
        s = self._next_seq()
        self._q.append((name, start_ns, end_ns, attrs, error, s))
        self._tail.end(s, name, start_ns, end_ns, attrs, error)
        if not s & 1023:  # keep the tail's ring from being overrun before a flush
            self._wake.set()

    def phase_begin(self, entry) -> None:
        """A phase is in flight until :meth:`phase_end`: ``entry`` is an object hashed by
        identity with the span name, start ns and attributes as ``name``, ``_t0`` and
        ``attrs`` (a :class:`goodput.phases.Phase`). The first flush while it is in flight
        writes it as a ``goodput.open`` record; its start is in the spool tail at once, so a
        process killed inside it leaves its start in the spool. Never raises.
        """
        try:
            self._open.add(entry)
        except TypeError as exc:  # not hashable
            self.error("phase in flight not tracked: %s", exc)

    def phase_end(self, entry) -> None:
        """The phase ``entry`` given to :meth:`phase_begin` is over. Never raises."""
        self._open.discard(entry)

    def step_start(self, step: int, at_ns: int) -> None:
        """Mark the start of ``step`` (and the end of the step before). Never raises."""
        s = self._next_seq()
        self._q.append((_STEP_START, at_ns, at_ns, step, None, s))
        self._tail.step_start(s, step, at_ns)

    def request_sync(self) -> None:
        """Ask the background thread to write and fsync now (after a checkpoint save)."""
        self._q.append((_SYNC, 0, 0, None, None, 0))
        self._wake.set()

    def error(self, message: str, *args) -> None:
        """Count a recorder error and log it (the first few) instead of raising."""
        self._counts["errors"] += 1
        if self._counts["errors"] <= 10:
            _log.warning("goodput: " + message, *args)

    # --- lifecycle ----------------------------------------------------------

    def job_start(self, at_ns: int | None = None) -> None:
        """Begin a new attempt (ending the open one, reason ``restart``); written at once."""
        self.start()
        self._q.append((_START, time.time_ns() if at_ns is None else at_ns, 0, None, None, 0))
        self.flush(exporters=False)

    def job_end(self, at_ns: int | None = None, reason: str = "explicit") -> None:
        """End the open attempt at ``at_ns`` (default: now) and write everything."""
        self._q.append((_END, time.time_ns() if at_ns is None else at_ns, 0, reason, None, 0))
        self.flush(exporters=False)

    def flush(self, timeout_s: float = 5.0, exporters: bool = True) -> bool:
        """Drain and write everything recorded so far, on the calling thread.

        With ``exporters``, also wait (within ``timeout_s`` in all) until the other
        exporters have sent it. Returns False if the export lock could not be taken, or
        the exporters did not finish, within ``timeout_s``.
        """
        if self.forked_from is not None:  # the parent's files and lock: not this process's
            return True
        deadline = time.monotonic() + timeout_s
        if not self._lock.acquire(timeout=timeout_s):
            self.error("flush timed out after %.1f s", timeout_s)
            return False
        try:
            if self._draining:  # re-entered from a signal handler mid-drain
                return False
            self._drain_and_write()
        finally:
            self._lock.release()
        return not exporters or self._forward.wait(deadline - time.monotonic())

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """End the open attempt (reason ``exit``), write everything, stop the thread.

        Phases still in flight are recorded as ending now, with error status. Restores the
        ``sys.excepthook`` it replaced. Safe to call twice.
        """
        if self._shut:
            return
        self._shut = True
        now = time.time_ns()
        for name, t0, attrs in self._in_flight():
            self.record(name, t0, max(now, t0), attrs, "unfinished")
        self._open.clear()
        if self.attempt is not None or self._q:
            reason = "exception" if self._exception_seen else "exit"
            self._q.append((_END, now, 0, reason, None, 0))
        self._stop.set()
        self._wake.set()
        self.flush(timeout_s, exporters=False)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        try:
            self._forward.shutdown(timeout_s)
        except Exception as exc:
            self.error("exporter shutdown failed: %s", exc)
        self._restore_hooks()

    def _restore_hooks(self) -> None:
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook or sys.__excepthook__
        atexit.unregister(self.shutdown)

    def stats(self) -> dict:
        """Counters: ``recorded`` phases, ``spans`` exported, ``errors``, ``dropped``,
        ``export_failures``; plus ``attempt``, ``spool_path`` (the journal segment being
        written), ``compact_failures`` (spool segments left uncompacted, nothing lost),
        ``tail_path`` (the spool tail, :mod:`goodput.tail`), ``tail_failures`` (records the
        tail could not take: a SIGKILL before their flush would lose them),
        ``tail_overruns`` (records overwritten in the tail's ring before their flush) and
        ``exporters`` (per exporter: ``sent``, ``failures``, ``dropped``, ``bad_lines``,
        ``pending_bytes``)."""
        out = dict(self._counts)
        out["dropped"] += self._forward.dropped
        out["exporters"] = self._forward.stats()
        out["attempt"] = self.attempt
        sink = self._sink
        out["spool_path"] = sink.path if sink is not None else None
        out["compact_failures"] = self._compact_failures + (sink.compact_failures if sink
                                                            is not None else 0)
        tail = self._tail
        out["tail_path"] = tail.path
        out["tail_failures"] = self._tail_failures + tail.failures
        out["tail_overruns"] = self._tail_overruns + tail.overruns
        return out

    def start(self) -> None:
        """Start the background thread and the exit hook (once); no signal handler."""
        if self._thread is not None or self.forked_from is not None:
            return
        self._thread = threading.Thread(target=self._run, name="goodput-export", daemon=True)
        self._thread.start()
        atexit.register(self.shutdown)
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook

    def _excepthook(self, exc_type, exc, tb):
        self._exception_seen = True
        (self._prev_excepthook or sys.__excepthook__)(exc_type, exc, tb)

    # --- background side ------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            if self._lock.acquire(timeout=self.flush_interval_s):
                try:
                    self._drain_and_write(heartbeat=True)
                except Exception as exc:  # keep the thread alive whatever happens
                    self.error("export loop failed: %s", exc)
                finally:
                    self._lock.release()

    def _drain_and_write(self, heartbeat: bool = False) -> None:
        self._draining = True
        try:
            if self._windows is not None:  # the rank learned since: on what is drained now
                self._write_identity(time.time_ns())
            drained = self._drain()
            now = time.time_ns()
            if self._windows is not None:
                self._write_identity(now)
                written = self._write_open(now)
                if heartbeat and drained == 0 and not written:  # a sign of life each flush
                    self._emit(schema.HEARTBEAT, self._last_tick, now, self._health())
            if self._windows is not None:
                self._windows.close_if_older(now)
            self._last_tick = now
            self._write()
        finally:
            self._draining = False

    def _drain(self) -> int:
        n = 0
        q = self._q
        while True:
            try:
                name, t0, t1, attrs, err, seq = q.popleft()
            except IndexError:
                return n
            n += 1
            if seq > self._drained_seq:
                self._drained_seq = seq
            try:
                if name is _STEP_START:
                    self._on_step_start(attrs, t0)
                elif name is _START:
                    self._open_attempt(t0)
                elif name is _END:
                    self._close_attempt(t0, attrs)
                elif name is _SYNC:
                    self._sync_requested = True
                elif self._windows is None:
                    self._counts["dropped"] += 1
                    self.error("%s recorded while no attempt is open: dropped", name)
                else:
                    self._counts["recorded"] += 1
                    self._emit(name, t0, t1, attrs, err)
            except Exception as exc:
                self.error("cannot record %s: %s", name, exc)

    def _emit(self, name, t0, t1, attrs=None, err=None, is_open=False) -> None:
        self._windows.emit(name, t0, t1, attrs, err, is_open)
        self._counts["spans"] += 1

    def _write_open(self, now: int) -> int:
        """Write a ``goodput.open`` record (ending ``now``) for each phase in flight that has
        none yet; returns how many it wrote. One record per phase: the processor extends it
        to the process's last sign of life (the heartbeats that follow)."""
        entries = self._in_flight()
        if self._pending_step is not None:
            step, t0 = self._pending_step
            entries.append((schema.STEP, t0, {schema.ATTR_STEP: step}))
        before, self._open_written = self._open_written, {}
        n = 0
        for name, t0, attrs in entries:
            key = (name, t0)
            self._open_written[key] = True
            if key not in before and t0 <= now:
                self._emit(name, t0, now, {**(attrs or {}), schema.ATTR_OPEN: True}, None, True)
                n += 1
        return n

    def _in_flight(self) -> list[tuple]:
        """``(name, start ns, attrs)`` of each phase in flight (any thread)."""
        out = []
        for e in list(self._open):  # one C call: safe while the training thread adds
            if e._t0 is not None:
                out.append((e.name, e._t0, e.attrs))
        return out

    def _write_identity(self, now: int) -> None:
        """Write a ``goodput.identity`` marker when the framework's rank becomes known (or
        changes); spans written from then on carry a resource with that rank and count
        (:meth:`_new_identity`)."""
        found = config.framework_identity()
        if found is None or found == self._identity_written:
            return
        self._identity_written = found
        res = self._resource
        if res is not None and (res.attributes.get(schema.RES_PROCESS_INDEX),
                                res.attributes.get(schema.RES_PROCESS_COUNT)) != found:
            self._new_identity(found)
        (self.process_index, self.process_count), self._index_source = found, "framework"
        self._emit(schema.IDENTITY, now, now, {schema.RES_PROCESS_INDEX: found[0],
                                               schema.RES_PROCESS_COUNT: found[1]})
        self._sync_requested = True

    def _new_identity(self, found: tuple[int, int]) -> None:
        """The open attempt's resource from now on says rank and size ``found`` (index
        source ``framework``): the spans encoded so far are written under the old one (their
        window closed, the journal flushed), those after under the new one. The rest of the
        resource (``service.instance.id``, pid, process start) is unchanged: the processor
        reads both as one process."""
        try:
            self._windows.close()
            self._sink.flush()
            attrs = dict(self._resource.attributes)
            attrs[schema.RES_PROCESS_INDEX], attrs[schema.RES_PROCESS_COUNT] = found
            attrs[schema.RES_PROCESS_INDEX_SOURCE] = "framework"
            self._resource = Resource(attrs, self._resource.schema_url)
            self._encoder.set_resource(attrs)
        except Exception as exc:  # the marker still says it
            self.error("resource not updated with the framework's rank: %s", exc)

    def _on_step_start(self, step: int, at: int) -> None:
        if self._windows is None:
            self._counts["dropped"] += 1
            self.error("step_start(%s) while no attempt is open: dropped", step)
            return
        self._close_pending_step(at)
        self._pending_step = (step, at)

    def _close_pending_step(self, at: int) -> None:
        if self._pending_step is not None:
            step, t0 = self._pending_step
            self._pending_step = None
            self._counts["recorded"] += 1
            self._emit(schema.STEP, t0, at, {schema.ATTR_STEP: step})

    def _health(self) -> dict:
        return {
            schema.ATTR_RECORDER_ERRORS: self._counts["errors"],
            schema.ATTR_RECORDER_DROPPED: self._counts["dropped"] + self._forward.dropped,
        }

    def _now(self) -> int:
        """The time, ns since the epoch (through this module's ``time``: a benchmark that
        replaces it with a simulated clock, ``benchmarks/recorded_job.py``, moves both)."""
        return time.time_ns()

    @property
    def resource(self):
        """The OpenTelemetry ``Resource`` of the open attempt (None when none is open)."""
        return self._resource
