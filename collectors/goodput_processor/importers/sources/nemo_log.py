"""NeMo's DLLogger JSON lines and its stdout (no telemetry) as goodput spans: ``goodput
import --from dllogger dllogger.json...`` and ``--from nemo-log`` (the same translator;
the two kinds of file may be given together and are merged by time).

What it reads:

- **DLLogger** (NVIDIA/dllogger 1.0.0, 0478734; NeMo's ``DLLogger`` Lightning logger,
  ``exp_manager.dllogger_logger_kwargs``, NeMo 8cfedd7): one ``DLLL {json}`` line per
  Lightning ``log_metrics``, with ``timestamp`` (s since the epoch), ``elapsedtime`` (s
  since ``dllogger.init``, i.e. since the logger was built in this process), ``step``
  (Lightning's global step before the batch) and ``data``. NeMo's ``TimingCallback`` puts
  ``train_step_timing in s`` (the batch's time, ``on_train_batch_start`` to ``_end``) in
  it: each such record is a ``goodput.step`` of that many seconds ending at the record's
  time, numbered ``step + 1`` (the optimizer steps done after it: what a Lightning
  checkpoint's ``step=N`` counts). Records ``log_every_n_steps`` apart leave steps in
  between: they become one stretch (``goodput.step.count``) from the previous step's end to
  this step's start (warning ``dllogger_steps_between_records``; it also holds whatever
  else ran then, such as validation or a checkpoint save). Each process's
  ``timestamp - elapsedtime`` (its ``dllogger.init``) is a new **attempt**; a step number
  that goes back without one is one too (``nemo_log_attempt_from_rewind``).
- **stdout** (``kubectl logs --timestamps``: an RFC 3339 prefix per line): Lightning's
  ``Restoring states from the checkpoint path at P`` ... ``Restored all states from the
  checkpoint at P`` (Lightning 2.x ``checkpoint_connector``, printed under NeMo too):
  ``goodput.checkpoint_restore`` with the step of ``step=N`` in ``P``; ``Trainer.fit``
  stopped: a clean end (``goodput.job_end``). A file's first line is when its container
  started (the start of an attempt); its other lines show the attempt alive.

What it can show: attempts, steps (each logged one; the ones between records as a
stretch), checkpoint restore, wasted progress and infrastructure recovery of a restart
(the killed attempt is last seen at its last record or line). What it cannot show:
checkpoint saves, data loading, validation and initialisation apart from the time between
records (``other``), other ranks (DLLogger writes on rank 0 only), a step's time when
``TimingCallback`` was given a ``buffer_size`` (it then reports a sliding mean), and
records lost at a kill (``logger.save()`` flushes after every ``log_metrics``, so at most
the record being written).

Recovery phases of a restart: rescheduling (the killed run's last record or line to the
new container's first line, or to its ``dllogger.init``), restore (with stdout), the time
to the first step and the first steps' excess show; detection and termination are 0 (no
record says when the failure was seen or the old process ended).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from goodput import schema

from .base import Source, Translator
from .logtime import MAX_SECONDS, MAX_STEP, split_prefix

__all__ = ["DLLOGGER_SOURCE", "SOURCE", "NemoLogTranslator", "sniff_dllogger", "sniff_nemo"]

_NS = 1_000_000_000
#: Two records whose ``timestamp - elapsedtime`` differ by less than this have one init.
_SAME_INIT_NS = 5_000_000
_STEP_KEY = "train_step_timing in s"
_RESTORING = re.compile(r"Restoring states from the checkpoint path at (.+)$")
_RESTORED = re.compile(r"Restored all states from the checkpoint at (.+)$")
_CKPT_STEP = re.compile(r"step=(\d+)")


def sniff_dllogger(head: bytes) -> bool:
    """Whether a file's first bytes are DLLogger JSON lines."""
    return head.lstrip().startswith(b"DLLL {") or b"\nDLLL {" in head


def sniff_nemo(head: bytes) -> bool:
    """Whether a file's first bytes look like a NeMo / Lightning training's stdout."""
    return b"[NeMo " in head or b"Restoring states from the checkpoint path at" in head


@dataclass
class _Event:
    t: int
    order: tuple
    kind: str            # init, step, restoring, restored, done, file_start, alive
    n: int = 0           # step
    dur: int = 0         # ns
    where: str = ""


@dataclass
class _Attempt:
    number: int
    start: int
    last_seen: int
    init: int | None = None
    prev_step: int | None = None
    prev_end: int | None = None
    restore: tuple | None = None     # (step, start)
    spans: list = field(default_factory=list)
    ended: bool = False


class NemoLogTranslator(Translator):
    """DLLogger records and NeMo/Lightning stdout lines -> goodput spans, one process per
    attempt (rank 0). Recognised lines are kept as small records and turned into spans at
    :meth:`finish`, every file merged by time."""

    def __init__(self, emitter, problems=None):
        super().__init__(emitter, problems)
        self.job: str | None = None
        self.events: list[_Event] = []
        self._file = -1
        self._first_line = True
        self._inits: list[int] = []

    def start_file(self, path: str) -> None:
        self._file += 1
        self._first_line = True
        if self.job is None:
            base = os.path.basename(path)
            for ext in (".gz", ".json", ".jsonl", ".log", ".txt", ".out", ".previous"):
                base = base[:-len(ext)] if base.endswith(ext) else base
            self.job = re.sub(r"[-_.]\d+$", "", base) or "nemo"

    def line(self, text: str, where: str) -> None:
        lineno = where.rsplit(":", 1)[-1]
        order = (self._file, int(lineno) if lineno.isdigit() else 0)
        if text.startswith("DLLL "):
            self._record(text[5:], order, where)
            return
        t, rest, bad = split_prefix(text)
        if bad:
            self.problems.add(where, "malformed", "a timestamp prefix that is not a time")
            return
        if rest.startswith("DLLL "):
            self._record(rest[5:], order, where)
            return
        if t is None:
            return
        kind, n = None, 0
        m = _RESTORING.search(rest)
        if m is not None:
            kind, n = "restoring", self._ckpt_step(m.group(1))
        else:
            m = _RESTORED.search(rest)
            if m is not None:
                kind, n = "restored", self._ckpt_step(m.group(1))
            elif "`Trainer.fit` stopped" in rest:
                kind = "done"
        if self._first_line:
            self._first_line = False
            self.events.append(_Event(t, order, "file_start"))
        self.events.append(_Event(t, order, kind or "alive", n, 0, where))

    @staticmethod
    def _ckpt_step(path: str) -> int:
        m = _CKPT_STEP.search(path)
        return int(m.group(1)) if m and int(m.group(1)) <= MAX_STEP else -1

    def _record(self, body: str, order: tuple, where: str) -> None:
        try:
            rec = json.loads(body)
        except ValueError:
            self.problems.add(where, "truncated" if not body.rstrip().endswith("}")
                              else "malformed", "DLLogger record is not JSON")
            return
        if not isinstance(rec, dict):
            self.problems.add(where, "malformed", "DLLogger record is not a JSON object")
            return
        if rec.get("type") != "LOG":
            return
        data, step = rec.get("data"), rec.get("step")
        try:
            ts = round(float(rec["timestamp"]) * _NS)
            elapsed = round(float(rec.get("elapsedtime", "nan")) * _NS)
        except (KeyError, TypeError, ValueError, OverflowError):
            self.problems.add(where, "malformed", "DLLogger record without a valid timestamp")
            return
        if not 0 < ts < 1 << 62 or not 0 <= elapsed < ts:
            self.problems.add(where, "malformed", "DLLogger timestamp out of range")
            return
        init = ts - elapsed
        if not any(abs(init - i) < _SAME_INIT_NS for i in self._inits):
            self._inits.append(init)
            self.events.append(_Event(init, (order[0], order[1] - 0.5), "init"))
        if not isinstance(data, dict) or _STEP_KEY not in data:
            return
        if isinstance(step, list) and len(step) == 1:
            step = step[0]
        try:
            dur = round(float(data[_STEP_KEY]) * _NS)
            step = int(step)
        except (TypeError, ValueError, OverflowError):
            self.problems.add(where, "malformed", f"{_STEP_KEY!r} or step is not a number")
            return
        if not (0 <= dur <= MAX_SECONDS * _NS and 0 <= step < MAX_STEP):
            self.problems.add(where, "malformed", "step or step time out of range")
            return
        self.events.append(_Event(ts, order, "step", step + 1, dur, where))

    # --- making spans -----------------------------------------------------------------

    def finish(self) -> None:
        evs = sorted(self.events, key=lambda e: (e.t, e.order))
        self.events = []
        self.cur: _Attempt | None = None
        self.number = 0
        self.pending_start: int | None = None   # a container's first line after cur's last
        for e in evs:
            self._event(e)
        self._close(self.cur)

    def _new(self, t: int, init: int | None = None) -> _Attempt:
        self._close(self.cur)
        start = t if self.pending_start is None else min(t, self.pending_start)
        self.pending_start = None
        self.cur = _Attempt(self.number, start, start, init)
        self.number += 1
        return self.cur

    def _event(self, e: _Event) -> None:
        a = self.cur
        if e.kind == "file_start":
            # a container's first line: the next attempt's start, unless the current one
            # has only just begun (its process's init came first)
            if (a is None or a.init is None or a.prev_step is not None or a.ended
                    or a.spans):
                self.pending_start = e.t if self.pending_start is None else self.pending_start
            return
        if e.kind == "alive":
            if a is None:
                self._new(e.t)
            elif self.pending_start is None:
                a.last_seen = max(a.last_seen, e.t)
            return
        if e.kind == "init":
            if (a is None or a.init is not None or a.prev_step is not None
                    or self.pending_start is not None):
                a = self._new(e.t, e.t)
            else:
                a.init, a.start = e.t, min(a.start, e.t)
            return
        if a is None or self.pending_start is not None or (e.kind == "restoring" and (
                a.prev_step is not None or a.ended
                or any(sp[0] == schema.CHECKPOINT_RESTORE for sp in a.spans))):
            a = self._new(e.t)   # a new container, or a restore after steps: a restart
        if e.kind == "step":
            if a.prev_step is not None and e.n <= a.prev_step:
                self.warn("nemo_log_attempt_from_rewind")
                a = self._new(e.t - e.dur)
            start = e.t - e.dur
            if a.prev_step is not None and e.n > a.prev_step + 1:
                self.warn("dllogger_steps_between_records")
                a.spans.append((schema.STEP, a.prev_end, max(a.prev_end, start),
                                {schema.ATTR_STEP: e.n - 1,
                                 schema.ATTR_STEP_COUNT: e.n - 1 - a.prev_step}, False))
            a.spans.append((schema.STEP, start, e.t, {schema.ATTR_STEP: e.n}, False))
            a.prev_step, a.prev_end = e.n, e.t
        elif e.kind == "restoring":
            a.restore = (e.n, e.t)
        elif e.kind == "restored":
            if a.restore is not None:
                step = e.n if e.n >= 0 else a.restore[0]
                a.spans.append((schema.CHECKPOINT_RESTORE, a.restore[1], e.t,
                                {schema.ATTR_CHECKPOINT_STEP: max(step, 0)}, False))
                if step < 0:
                    self.warn("nemo_log_restore_step_unknown")
            a.restore = None
        elif e.kind == "done":
            a.spans.append((schema.JOB_END, e.t, e.t, {schema.ATTR_END_REASON: "exit"}, False))
            a.ended = True
        a.last_seen = max(a.last_seen, e.t)

    def _close(self, a: _Attempt | None) -> None:
        if a is None:
            return
        if a.restore is not None:
            self.warn("nemo_log_restore_unfinished")
            a.spans.append((schema.CHECKPOINT_RESTORE, a.restore[1], a.last_seen,
                            {schema.ATTR_CHECKPOINT_STEP: max(a.restore[0], 0)}, True))
        if not a.ended:
            # killed (or still running): its end is its last record or line; the record
            # being written at a kill, and any time after it, is not in the input
            self.warn("nemo_log_end_from_last_record")
        key = self.emit.process(f"nemo-log\0{self.job}\0{a.number}", job=self.job or "nemo",
                                attempt=a.number, start_ns=a.start)
        self.emit.span(key, schema.JOB_START, a.start, a.start)
        self.emit.spans_then_alive(key, a.start, a.spans, a.last_seen, a.ended)


_CHECKED = ("NVIDIA/dllogger 0478734 (1.0.0) JSONStreamBackend; NeMo 8cfedd7 DLLogger + "
            "TimingCallback; Lightning 2.6.6 restore lines")

SOURCE = Source(name="nemo-log", imported_from="nemo-log", reads=frozenset({"lines"}),
                translator=NemoLogTranslator, sniff=sniff_nemo, doc="sources/nemo-log.md",
                checked=_CHECKED)

DLLOGGER_SOURCE = Source(name="dllogger", imported_from="dllogger",
                         reads=frozenset({"lines"}), translator=NemoLogTranslator,
                         sniff=sniff_dllogger, doc="sources/nemo-log.md", checked=_CHECKED)
