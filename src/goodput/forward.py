"""Remote exporters fed from the durable spool, so an outage loses nothing.

Each exporter named by ``traces_exporter`` (or passed in ``exporters=``) gets a
:class:`Forwarder`: a background thread that reads this process's spool journal files
(``spans-p<index>-a<attempt>-<pid>-<id>.jsonl`` and its later segments ``...-<id>.s<n>.jsonl``,
written by the recorder, see :mod:`goodput.segments`; a journal whose segment was compacted
is deleted only once every forwarder has sent it) from a committed byte offset, turns
each OTLP JSON line back into SDK spans and exports them, up to 512 spans a call. After
a successful export the offset is written to a small sidecar file
``<spool file>.<exporter key>.offset`` (atomically, by rename). While the endpoint is
down, slow or answering errors, the forwarder retries the same batch with exponential
backoff; the spool keeps growing on disk and nothing is dropped. When the endpoint
returns, the backlog is sent in order. A process that stops before its backlog is
sent leaves the sidecar behind: the next process of the same rank in the same run
directory (the next attempt) finishes those lines first. Delivery is at least once: a
crash between an export and its offset write sends that batch again (the processor
drops duplicate span ids).

Spool lines become SDK spans again with :func:`goodput.decode.decode_line`; the forwarders
of one recorder are held by :class:`goodput.forwarding.Forwarding`.

When there is no spool (``GOODPUT_SPOOL=0``), or a spool write fails (disk full, run
directory not writable), spans go to a bounded in-memory queue instead
(``max_queue_spans``, default ``OTEL_BSP_MAX_QUEUE_SIZE`` or 8192). Only spans that do not
fit there, or that are still queued when the process ends, are lost; they are counted in
:attr:`goodput.forwarding.Forwarding.dropped`, which the recorder adds to
``goodput.recorder.dropped``.

The training thread never touches any of this: the recorder's own thread only appends
to the spool and calls :meth:`Forwarding.notify`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import deque

from opentelemetry.sdk.trace.export import SpanExportResult

from goodput.decode import decode_line

_log = logging.getLogger(__name__)

BATCH_SPANS = 512
_READ_BYTES = 4 << 20  # most bytes read from a spool file per batch
_KEY_RE = re.compile(r"[^A-Za-z0-9_.-]+")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        _log.warning("goodput: ignoring %s=%r: not a number > 0", name, raw)
        return default
    return value


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
    return value


# --- one exporter ----------------------------------------------------------------------


class _File:
    """A spool file being forwarded: path, committed offset, sidecar, whether still written."""

    __slots__ = ("path", "offset", "sidecar", "open")

    def __init__(self, path: str, offset: int, sidecar: str, is_open: bool):
        self.path, self.offset, self.sidecar, self.open = path, offset, sidecar, is_open


class Forwarder:
    """Sends one exporter everything in this process's spool files (and memory queue).

    Args:
        exporter: an OpenTelemetry ``SpanExporter``.
        key: names the exporter in sidecar files and messages (``otlp``, ...).
        run_dir: the spool directory; None: memory queue only.
        process_index: this process's rank (only its own spool files are read).
        poll_s: how often to look for new lines without being notified (> 0).
        backoff_s, backoff_max_s: first and longest wait between retries of a failed
            export (> 0; default ``GOODPUT_EXPORT_BACKOFF_S`` = 1 and
            ``GOODPUT_EXPORT_BACKOFF_MAX_S`` = 30).
        max_queue_spans: most spans held in memory (> 0).

    Raises:
        ValueError: a number is not > 0 (the message names it).
    """

    def __init__(self, exporter, key: str, run_dir=None, process_index: int = 0,
                 poll_s: float = 1.0, backoff_s: float | None = None,
                 backoff_max_s: float | None = None, max_queue_spans: int | None = None):
        self.exporter = exporter
        self.key = _KEY_RE.sub("_", key) or "exporter"
        self.run_dir = os.fspath(run_dir) if run_dir is not None else None
        self.process_index = process_index
        self.poll_s = _positive(poll_s, "poll_s")
        self.backoff_s = _positive(backoff_s if backoff_s is not None else
                                   _env_float("GOODPUT_EXPORT_BACKOFF_S", 1.0), "backoff_s")
        self.backoff_max_s = _positive(
            backoff_max_s if backoff_max_s is not None
            else _env_float("GOODPUT_EXPORT_BACKOFF_MAX_S", 30.0), "backoff_max_s")
        self.max_queue_spans = int(_positive(
            max_queue_spans if max_queue_spans is not None
            else _env_float("OTEL_BSP_MAX_QUEUE_SIZE", 8192), "max_queue_spans"))
        # counters (read by the recorder's stats)
        self.sent = 0  # spans the exporter accepted
        self.failures = 0  # failed export calls (each retried)
        self.dropped = 0  # spans lost: memory queue full, or still queued at the end
        self.bad_lines = 0  # spool lines that could not be decoded (skipped)
        self._files: dict[str, _File] = {}
        self._scanned = False
        self._queue: deque = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()  # drain what is there, then stop
        self._abort = threading.Event()  # stop now
        self._down_since: float | None = None
        self._cond = threading.Condition()
        self._asked = 0  # generation asked for by wait()
        self._queued = 0  # spans taken off the memory queue (sent)
        self._done = 0  # generation at the start of the last pump that found nothing to send
        self._sidecar_warned = False
        self._thread = threading.Thread(target=self._run, name=f"goodput-forward-{self.key}",
                                        daemon=True)
        self._thread.start()

    # --- called from the recorder's thread --------------------------------------

    def attach(self, path: str) -> None:
        """``path`` is the new spool file of this process (the previous one is complete)."""
        path = os.fspath(path)
        with self._lock:
            if not self._scanned:
                self._scan()
            for f in self._files.values():
                f.open = False
            f = self._files.get(path)
            if f is None:
                f = self._files[path] = _File(path, 0, f"{path}.{self.key}.offset", True)
                self._commit(f)  # marks the file as ours to finish after a restart
            f.open = True
        self._wake.set()

    def detach(self) -> None:
        """The current spool file is complete (the attempt ended)."""
        with self._lock:
            for f in self._files.values():
                f.open = False
        self._wake.set()

    def enqueue(self, spans) -> int:
        """Hold ``spans`` in memory for export; returns how many did not fit (dropped)."""
        with self._lock:
            room = self.max_queue_spans - len(self._queue)
            take = list(spans)[: max(room, 0)]
            self._queue.extend(take)
            lost = len(spans) - len(take)
            self.dropped += lost
        if lost:
            _log.warning("goodput: %s: memory queue full (%d spans): %d spans dropped",
                         self.key, self.max_queue_spans, lost)
        self._wake.set()
        return lost

    def notify(self) -> None:
        self._wake.set()

    def wait(self, timeout_s: float) -> bool:
        """Wait until everything written so far is sent (or ``timeout_s``); True if it is."""
        with self._lock:
            sizes = {}
            for f in self._files.values():
                try:
                    sizes[f] = os.path.getsize(f.path)
                except OSError:
                    pass
            queued = self._queued + len(self._queue)
        with self._cond:
            self._asked += 1
            target = self._asked

        def done() -> bool:  # sent up to the sizes of now, or found nothing at all to send
            caught_up = self._queued >= queued and all(f.offset >= n for f, n in sizes.items())
            return caught_up or self._done >= target or not self._thread.is_alive()

        self._wake.set()
        with self._cond:
            return self._cond.wait_for(done, max(timeout_s, 0))

    def sent_all(self, path: str) -> bool:
        """Whether the closed spool file ``path`` is sent to its end (or was never ours)."""
        with self._lock:
            f = self._files.get(os.fspath(path))
        if f is None:
            return True
        if f.open:
            return False
        try:
            return f.offset >= os.path.getsize(f.path)
        except OSError:
            return True

    def pending_bytes(self) -> int:
        """Spool bytes not yet sent (0 without a spool)."""
        total = 0
        with self._lock:
            files = list(self._files.values())
        for f in files:
            try:
                total += max(os.path.getsize(f.path) - f.offset, 0)
            except OSError:
                pass
        return total

    def shutdown(self, timeout_s: float) -> None:
        """Send what is left for up to ``timeout_s``, then stop and shut the exporter down.

        Unsent spool lines stay on disk (the next attempt sends them); unsent spans of the
        memory queue are counted as dropped.
        """
        self.detach()
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)
        self._abort.set()
        try:
            self.exporter.shutdown()  # interrupts an export that is still retrying
        except Exception as exc:
            _log.warning("goodput: %s: exporter shutdown failed: %s", self.key, exc)
        self._thread.join(1.0)
        with self._lock:
            lost, self._queue = len(self._queue), deque()
            self.dropped += lost
        left = self.pending_bytes()
        if lost or left:
            _log.warning(
                "goodput: %s: not everything was sent before exit: %d bytes of spool lines "
                "stay in %s and are sent by the next attempt in that run directory; "
                "%d spans held in memory are lost", self.key, left, self.run_dir, lost)

    # --- the thread -----------------------------------------------------------

    def _run(self) -> None:
        delay = self.backoff_s
        while not self._abort.is_set():
            with self._cond:
                gen = self._asked
            try:
                result = self._pump()
            except Exception as exc:  # keep forwarding whatever happens
                _log.warning("goodput: %s: forwarding failed: %s", self.key, exc)
                result = False
            if result is None:  # nothing to send
                delay = self.backoff_s
                with self._cond:
                    self._done = gen
                    self._cond.notify_all()
                if self._stop.is_set():
                    return
                self._wake.wait(self.poll_s)
                self._wake.clear()
            elif result:  # sent a batch: go on at once
                delay = self.backoff_s
            else:  # failed: wait, then retry the same batch
                if self._abort.wait(delay):
                    return
                delay = min(delay * 2, self.backoff_max_s)

    def _pump(self) -> bool | None:
        """Export one batch: True sent, False failed, None nothing to send."""
        with self._lock:
            batch = list(self._queue)[:BATCH_SPANS]
        if batch:
            if not self._export(batch):
                return False
            with self._lock:
                for _ in batch:
                    self._queue.popleft()
            with self._cond:
                self._queued += len(batch)
                self._cond.notify_all()
            return True
        with self._lock:
            files = sorted(self._files.values(), key=lambda f: f.path)
        for f in files:
            spans, end = self._read(f)
            if spans:
                if not self._export(spans):
                    return False
            if end != f.offset:
                self._commit(f, end)
                with self._cond:
                    f.offset = end
                    self._cond.notify_all()
                return True
            if not f.open and self._complete(f):
                with self._lock:
                    self._files.pop(f.path, None)
        return None

    def _read(self, f: _File) -> tuple[list, int]:
        """Spans of whole lines from ``f.offset`` (up to 512), and the offset after them."""
        try:
            with open(f.path, "rb") as fh:
                fh.seek(f.offset)
                data = fh.read(_READ_BYTES)
        except FileNotFoundError:
            return [], f.offset
        spans: list = []
        pos = 0
        while len(spans) < BATCH_SPANS:
            nl = data.find(b"\n", pos)
            if nl < 0:
                break
            line = data[pos:nl]
            if line.strip():
                try:
                    decoded = decode_line(line)
                except ValueError as exc:
                    self.bad_lines += 1
                    if self.bad_lines <= 3:
                        _log.warning("goodput: %s: skipping line at byte %d of %s: %s",
                                     self.key, f.offset + pos, f.path, exc)
                    decoded = []
                if spans and len(spans) + len(decoded) > BATCH_SPANS:
                    break
                spans.extend(decoded)
            pos = nl + 1
        if pos == 0 and len(data) == _READ_BYTES:  # one line longer than a read: skip it
            self.bad_lines += 1
            _log.warning("goodput: %s: skipping a line over %d bytes in %s",
                         self.key, _READ_BYTES, f.path)
            return [], self._skip_line(f)
        return spans, f.offset + pos

    def _skip_line(self, f: _File) -> int:
        with open(f.path, "rb") as fh:
            fh.seek(f.offset)
            pos = f.offset
            while chunk := fh.read(_READ_BYTES):
                nl = chunk.find(b"\n")
                if nl >= 0:
                    return pos + nl + 1
                pos += len(chunk)
        return f.offset

    def _complete(self, f: _File) -> bool:
        """A closed file is done when only a torn last line (no newline) is left."""
        try:
            size = os.path.getsize(f.path)
        except OSError:
            return True
        if size > f.offset:
            with open(f.path, "rb") as fh:
                fh.seek(f.offset)
                while chunk := fh.read(1 << 20):
                    if b"\n" in chunk:
                        return False
        return True

    def _export(self, spans) -> bool:
        try:
            ok = self.exporter.export(spans) == SpanExportResult.SUCCESS
            err = "the exporter returned FAILURE"
        except Exception as exc:  # an exporter may raise (bad endpoint, ...)
            ok, err = False, f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        if ok:
            self.sent += len(spans)
            if self._down_since is not None:
                _log.warning("goodput: %s: export works again after %.1f s; sending the "
                             "backlog", self.key, now - self._down_since)
                self._down_since = None
            return True
        self.failures += 1
        if self._down_since is None:
            self._down_since = now
            where = "in the spool" if self.run_dir else "in memory"
            _log.warning("goodput: %s: export failed (%s); the spans stay %s and are "
                         "retried with backoff; training is not affected",
                         self.key, err, where)
        return False

    def _commit(self, f: _File, offset: int | None = None) -> None:
        try:
            os.makedirs(os.path.dirname(f.sidecar) or ".", exist_ok=True)
            tmp = f.sidecar + ".tmp"
            with open(tmp, "w", encoding="ascii") as fh:
                fh.write(f"{f.offset if offset is None else offset}\n")
            os.replace(tmp, f.sidecar)
        except OSError as exc:
            if not self._sidecar_warned:
                self._sidecar_warned = True
                _log.warning("goodput: %s: cannot write %s (%s): forwarding goes on, but a "
                             "restart may send some spans twice", self.key, f.sidecar, exc)

    def _scan(self) -> None:
        """Spool files of this rank that an earlier process left partly sent."""
        self._scanned = True
        if self.run_dir is None:
            return
        try:
            names = os.listdir(self.run_dir)
        except OSError:
            return
        prefix, suffix = f"spans-p{self.process_index:05d}-a", f".jsonl.{self.key}.offset"
        for name in sorted(names):
            if not (name.startswith(prefix) and name.endswith(suffix)):
                continue
            sidecar = os.path.join(self.run_dir, name)
            path = sidecar[: -len(f".{self.key}.offset")]
            try:
                with open(sidecar, encoding="ascii") as fh:
                    offset = int(fh.read().strip() or 0)
            except (OSError, ValueError):
                offset = 0
            f = _File(path, max(offset, 0), sidecar, False)
            if not self._complete(f):
                self._files[path] = f
                _log.info("goodput: %s: resuming %s at byte %d", self.key, path, offset)
