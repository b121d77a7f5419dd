"""Opening and closing an attempt, and where its spans go: spool, tail and exporters.

:class:`AttemptFiles` is the part of :class:`goodput.recorder.Recorder` that opens an
attempt (its resource, :class:`~goodput.encode.Encoder` and trace windows; its journal,
:class:`~goodput.segments.SpoolWriter`, or :class:`~goodput.segments.MemorySink` without a
spool; its tail, :mod:`goodput.tail`; the exporters' forwarders attached to its files; and
:mod:`goodput.leftovers` started over what earlier attempts of the rank left), writes each
flush's spans and tells the tail how far the journal got, and closes the attempt (its end
marker written, its last segment compacted, its tail removed). It runs on the recorder's
background thread, or on the thread that flushes, always under the recorder's lock, and
uses the recorder's attributes (``_q`` records drained, ``_windows``, ``_sink``, ``_tail``,
``_forward``, ``_counts`` ...): it is one class split in two files by concept, not a
component of its own.
"""

from __future__ import annotations

import logging
import os
import threading

from goodput import config, leftovers, schema
from goodput.decode import decode_line
from goodput.encode import Encoder
from goodput.segments import MemorySink, SpoolWriter
from goodput.tail import NULL as _NO_TAIL
from goodput.tail import open_tail
from goodput.traces import AttemptIds, TraceWindows

_log = logging.getLogger(__name__)

START = "<job_start>"  # the control record that opens an attempt (in the recorder's deque)
VERSION = "0.1.0"  # the instrumentation scope's version


class AttemptFiles:
    """An attempt's opening, closing and files, for :class:`goodput.recorder.Recorder`."""

    def _open_attempt(self, at: int) -> None:
        if self._windows is not None:
            self._close_attempt(at, "restart")
        if self._next_attempt is None:
            self._next_attempt, self._attempt_source = config.attempt_hint()
        self.attempt = self._next_attempt
        self._next_attempt += 1
        found = config.framework_identity()  # known already: the resource says it
        if found is not None:
            (self.process_index, self.process_count), self._index_source = found, "framework"
        resource = config.make_resource(
            self.job_name, self.attempt, self.process_index, self.process_count,
            self._resource_extra, attempt_source=self._attempt_source,
            index_source=self._index_source,
        )
        encoder = self._encoder = Encoder(resource.attributes, schema.SCOPE_NAME, VERSION)
        if config.sdk_disabled():  # the SDK's tracers would record nothing: neither do we
            self._sink = MemorySink(encoder)
        elif self.spool:
            path = config.spool_path(self.run_dir, self.process_index, self.attempt,
                                     resource.attributes[schema.RES_SERVICE_INSTANCE_ID])
            segment_bytes = config.spool_segment_bytes()
            self._sink = SpoolWriter(path, encoder, segment_bytes,
                                     on_segment=self._forward.attach,
                                     on_failed=self._spool_line_failed,
                                     segment_ns=config.spool_segment_ns(), clock=self._now)
            self._forward.attach(path)
            self._start_tidy(path, segment_bytes is not None)
            self._tail = open_tail(path, encoder.prefix, encoder.suffix, self._drained_seq)
            self._open.tail = self._tail
            self._tail_encoder, self._tail_suffix = encoder, encoder.suffix
            if self._say_where:  # the default job name or run directory: say where it goes
                self._say_where = False
                _log.warning("goodput: recording job %r to %s (the default %s; set "
                             "goodput.configure(job_name=..., run_dir=...) or "
                             "GOODPUT_JOB_NAME / GOODPUT_RUN_DIR)", self.job_name,
                             os.path.abspath(self.run_dir),
                             "job name" if self.job_name == config.DEFAULT_JOB_NAME
                             else "run directory")
        else:
            self._sink = MemorySink(encoder, self._hold_line if self._forward.forwarders
                                    else None)
        self._spool_failures_counted = 0
        self._resource = resource
        self._windows = TraceWindows(encoder, AttemptIds(), self._window_ns,
                                     self._window_spans, self._sink)
        interval_ms = int(self.flush_interval_s * 1000)
        self._emit(schema.JOB_START, at, at, {schema.ATTR_HEARTBEAT_INTERVAL_MS: interval_ms})
        now = self._now()
        if now > at:  # alive now: the start marker is back-dated to the process start
            self._emit(schema.HEARTBEAT, at, now, self._health())
        self._identity_written = None  # the new attempt's spool gets it too
        self._open_written = {}
        self._write_identity(at)
        self._sync_requested = True

    def _start_tidy(self, path: str, compact: bool) -> None:
        """Finish what earlier attempts of this rank left in the spool, on a thread of its
        own (:mod:`goodput.leftovers`); one at a time."""
        if self._tidy is not None and self._tidy.is_alive():
            return
        base = os.path.basename(path)[: -len(".jsonl")]
        self._tidy = threading.Thread(
            target=leftovers.tidy, name="goodput-tidy", daemon=True,
            args=(self.run_dir, self.process_index, base, self._sink.adopt, compact))
        try:
            self._tidy.start()
        except RuntimeError as exc:  # no thread can be started (interpreter shutting down)
            self.error("spool leftovers not tidied: %s", exc)

    def _spool_line_failed(self, line: str) -> None:
        """A spool line could not be written: its spans go to the exporters' memory queues
        (or are counted as lost)."""
        try:
            self._forward.spool_failed(decode_line(line))
        except ValueError as exc:
            self.error("spans of a failed spool write lost: %s", exc)

    def _hold_line(self, line: str) -> None:
        """No spool: a line's spans go to the exporters' memory queues."""
        try:
            self._forward.hold(decode_line(line))
        except ValueError as exc:
            self.error("spans for the exporters lost: %s", exc)

    def _close_attempt(self, at: int, reason: str) -> None:
        if self._windows is None:
            return
        self._close_pending_step(at)
        attrs = {schema.ATTR_END_REASON: reason, **self._health()}
        self._emit(schema.JOB_END, at, at, attrs)
        self._windows.close()
        self._write()
        self._windows = None
        self._sink.close()  # syncs and closes the spool file
        self._forward.detach()
        self._count_spool_failures()
        self._close_tail()
        self._compact_failures += self._sink.compact_failures
        self._sink = None
        self._resource = None
        self.attempt = None

    def _write(self) -> None:
        sink = self._sink
        if sink is None:
            return
        written = sink.flush()
        self._forward.notify()
        if self._sync_requested:
            sink.sync()
        self._count_spool_failures()
        self._sync_requested = False
        if written:
            self._tail_flushed()
        if sink.retired or sink.adopted:
            sink.reap(self._now(), self._forward.sent, self._forward.forget)

    def _tail_flushed(self) -> None:
        """Tell the tail that the journal holds every record drained so far, and the step
        in flight then (and the line template again if the resource changed)."""
        tail, enc = self._tail, self._tail_encoder
        if enc is not None and enc.suffix is not self._tail_suffix:
            self._tail_suffix = enc.suffix
            tail.template(enc.prefix, enc.suffix)
        tail.flushed(self._drained_seq, self._pending_step)

    def _close_tail(self) -> None:
        """The attempt ended: its journal holds everything, the tail goes (it stays, for the
        processor, if the journal lost a write)."""
        tail, self._tail, self._tail_encoder = self._tail, _NO_TAIL, None
        self._open.tail = _NO_TAIL
        self._tail_failures += tail.failures
        self._tail_overruns += tail.overruns
        if self._sink is not None and self._sink.failures:
            tail._close()
        else:
            tail.remove()

    def _count_spool_failures(self) -> None:
        """Add the current spool file's new write failures to the counters."""
        if self._sink is None:
            return
        new = self._sink.failures - self._spool_failures_counted
        if new:
            self._counts["export_failures"] += new
            self._counts["errors"] += new
        self._spool_failures_counted = self._sink.failures

