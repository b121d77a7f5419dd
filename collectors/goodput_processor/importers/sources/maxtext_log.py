"""MaxText's training stdout (no telemetry) as goodput spans: ``goodput import --from
maxtext-log LOG...``.

What it reads (``src/maxtext/common/metric_logger.py`` and ``checkpointing.py`` of
AI-Hypercomputer/maxtext at e591f30cbbf217ed67ef71263ec0538239f9c3b8, 2026-08-22; absl
``I1207 14:00:00.123456 pid file:line]`` prefixes):

- ``completed step: N, seconds: S, TFLOP/s/device: ...``: step ``N`` took ``S`` seconds.
  MaxText measures ``S`` from the previous step's completion to this one's
  (``step_time_delta``; so it holds the previous step's checkpoint save and evaluation
  too), and prints the line one step late (``buffer_and_write_metrics`` flushes step N's
  metrics after step N+1 completed). The completions are therefore chained from the
  seconds (consecutive steps tile), and anchored where the lines allow: step N+1 had
  completed before line N was printed, so each line bounds the chain from above, and the
  tightest bound among the 16 lines before and after a step places it (so the 1 ms
  rounding of ``S`` does not add up over a long run, and a killed run's last line, printed
  one step late, is placed by the lines before it). A step's ``goodput.step`` runs from the previous
  completion to its own.
- ``Saved a checkpoint at step N.`` (``print_save_message``, synchronous save, printed
  when it is done): ``goodput.checkpoint_save`` from step N's completion (the save starts
  right after it) to the line.
- ``restoring from this run's directory step N``: ``goodput.checkpoint_restore`` of step
  N, from the line to the start of the training loop (MaxText prints no end of the
  restore: warning ``maxtext_log_restore_end_at_loop_start``; what runs between, such as
  building the data iterator, is counted in it).
- A file's first line is when its container started; a restore line, ``Creating
  checkpoint manager``, or a step number that goes back (``maxtext_log_attempt_from_
  rewind``) after steps begins a new **attempt**.

Times: the ``kubectl logs --timestamps`` prefix; without it, absl's prefix, which has no
year: the year of the importing machine's clock is taken (``maxtext_log_year_assumed``).

What it can show: attempts, each step's time (the first step's holds the compilation),
synchronous checkpoint saves, restores (to the loop's start), wasted progress and
infrastructure recovery (the killed attempt is last seen at its last line; the step
completed before the kill has no line yet). What it cannot show: compilation apart from
the first step, data loading, evaluation (inside the next step's seconds), asynchronous
saves (``Started an asynchronous checkpoint save``: no end is printed), steps hidden by
``hide_profiler_step_metric`` (their line has no seconds: the chain restarts after them),
other hosts (each host prints its own; import one host's log).

Recovery phases of a restart: rescheduling (the killed run's last line to the new
container's first line), restore (to the loop's start) and the first step's excess (its
compilation) show; detection and termination are 0 (nothing says when the failure was
seen or the old process ended).
"""

from __future__ import annotations

import calendar
import os
import re
import time
from dataclasses import dataclass, field

from goodput import schema

from .base import Source, Translator
from .logtime import MAX_SECONDS, MAX_STEP, split_prefix

__all__ = ["SOURCE", "MaxTextLogTranslator", "sniff"]

_NS = 1_000_000_000
#: Lines after a step whose bound may place it.
_WINDOW = 16
_STEP = re.compile(r"completed step: (\d+), seconds: (\d+(?:\.\d+)?)")
_HIDDEN = re.compile(r"completed profiler activation/deactivation step: (\d+)")
_SAVED = re.compile(r"Saved a checkpoint at step (\d+)\.")
_RESTORING = re.compile(r"restoring from this run's directory step (\d+)")
_ABSL = re.compile(r"[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ")


def sniff(head: bytes) -> bool:
    """Whether a file's first bytes look like MaxText's stdout."""
    return b"completed step: " in head and b", seconds: " in head or (
        b"restoring from this run's directory step" in head)


@dataclass
class _Event:
    t: int
    order: tuple
    kind: str            # step, hidden, saved, restoring, start, file_start, alive
    n: int = 0
    secs: int = 0        # ns


@dataclass
class _Attempt:
    number: int
    start: int
    last_seen: int
    records: list = field(default_factory=list)   # step / hidden events, in order
    saves: list = field(default_factory=list)     # (step, t)
    restore: tuple | None = None                  # (step, t)


class MaxTextLogTranslator(Translator):
    """MaxText stdout lines -> goodput spans, one process per attempt. Lines are kept as
    small records and turned into spans at :meth:`finish`, every file merged by time."""

    def __init__(self, emitter, problems=None):
        super().__init__(emitter, problems)
        self.job: str | None = None
        self.events: list[_Event] = []
        self._file = -1
        self._first = True
        self._year = time.gmtime().tm_year

    def start_file(self, path: str) -> None:
        self._file += 1
        self._first = True
        if self.job is None:
            base = os.path.basename(path)
            for ext in (".gz", ".log", ".txt", ".out", ".previous"):
                base = base[:-len(ext)] if base.endswith(ext) else base
            self.job = re.sub(r"[-_.]\d+$", "", base) or "maxtext"

    def _absl_time(self, text: str) -> int | None:
        m = _ABSL.match(text)
        if m is None:
            return None
        mo, d, h, mi, s = (int(m.group(i)) for i in range(1, 6))
        try:
            secs = calendar.timegm((self._year, mo, d, h, mi, s, 0, 0, 0))
        except (ValueError, OverflowError):
            return None
        if "maxtext_log_year_assumed" not in self.warnings:
            self.warn("maxtext_log_year_assumed")
        ns = secs * _NS + int(m.group(6)) * 1000
        return ns if 0 <= ns < 1 << 62 else None

    def line(self, text: str, where: str) -> None:
        t, rest, bad = split_prefix(text)
        if bad:
            self.problems.add(where, "malformed", "a timestamp prefix that is not a time")
            return
        if t is None:
            t = self._absl_time(rest)
            if t is None:
                return
        lineno = where.rsplit(":", 1)[-1]
        order = (self._file, int(lineno) if lineno.isdigit() else 0)
        if self._first:
            self._first = False
            self.events.append(_Event(t, order, "file_start"))
        ev = None
        if "completed " in rest:
            m = _STEP.search(rest)
            if m is not None:
                n, secs = int(m.group(1)), float(m.group(2))
                if n > MAX_STEP or secs > MAX_SECONDS:
                    self.problems.add(where, "malformed", "step or seconds out of range")
                    return
                ev = _Event(t, order, "step", n, round(secs * _NS))
            elif (m := _HIDDEN.search(rest)) is not None:
                ev = _Event(t, order, "hidden", int(m.group(1)))
            elif re.search(r"completed step: \d*(, s?e?c?o?n?d?s?:? ?[0-9.]*)?$", rest):
                self.problems.add(where, "truncated", "step line cut before its seconds")
                return
        elif (m := _SAVED.search(rest)) is not None:
            ev = _Event(t, order, "saved", int(m.group(1)))
        elif (m := _RESTORING.search(rest)) is not None:
            ev = _Event(t, order, "restoring", int(m.group(1)))
        elif "Creating checkpoint manager" in rest:
            ev = _Event(t, order, "start")
        if ev is not None and ev.n > MAX_STEP:
            self.problems.add(where, "malformed", "step out of range")
            return
        self.events.append(ev if ev is not None else _Event(t, order, "alive"))

    # --- making spans -----------------------------------------------------------------

    def finish(self) -> None:
        evs = sorted(self.events, key=lambda e: (e.t, e.order))
        self.events = []
        self.cur: _Attempt | None = None
        self.number = 0
        self.pending: int | None = None
        for e in evs:
            self._event(e)
        self._close(self.cur)

    def _new(self, t: int) -> _Attempt:
        self._close(self.cur)
        start = t if self.pending is None else min(t, self.pending)
        self.pending = None
        self.cur = _Attempt(self.number, start, start)
        self.number += 1
        return self.cur

    def _event(self, e: _Event) -> None:
        a = self.cur
        begun = a is not None and bool(a.records)
        if e.kind == "file_start":
            if a is None or begun:
                self.pending = e.t if self.pending is None else self.pending
            return
        if e.kind == "alive":
            if a is not None and self.pending is None:
                a.last_seen = max(a.last_seen, e.t)
            return
        if a is None or (e.kind in ("restoring", "start") and begun):
            a = self._new(e.t)
        elif e.kind in ("step", "hidden") and begun and e.n <= a.records[-1].n:
            self.warn("maxtext_log_attempt_from_rewind")
            a = self._new(e.t)
        if e.kind in ("step", "hidden"):
            a.records.append(e)
        elif e.kind == "saved":
            a.saves.append((e.n, e.t))
        elif e.kind == "restoring":
            a.restore = (e.n, e.t)
        a.last_seen = max(a.last_seen, e.t)

    def _completions(self, recs: list[_Event]) -> dict[int, tuple[int, int]]:
        """``{step: (start ns, end ns)}`` of the steps with seconds, chained per run of
        consecutive lines and placed by the tightest bound in the window."""
        out: dict[int, tuple[int, int]] = {}
        i = 0
        while i < len(recs):
            j = i
            while (j + 1 < len(recs) and recs[j + 1].kind == "step" and recs[j].kind == "step"
                   and recs[j + 1].n == recs[j].n + 1):
                j += 1
            seg = recs[i:j + 1]
            i = j + 1
            seg = [r for r in seg if r.kind == "step"]
            if not seg:
                continue
            cum, c = [], 0
            for r in seg:
                c += r.secs
                cum.append(c)
            # line k was printed after step k+1 completed (the last one: after step k)
            bound = [seg[k].t - cum[min(k + 1, len(seg) - 1)] for k in range(len(seg))]
            for k, r in enumerate(seg):
                base = min(bound[max(0, k - _WINDOW):k + _WINDOW + 1])
                out[r.n] = (base + cum[k] - r.secs, base + cum[k])
        return out

    def _close(self, a: _Attempt | None) -> None:
        if a is None:
            return
        steps = self._completions(a.records)
        key = self.emit.process(f"maxtext-log\0{self.job}\0{a.number}", job=self.job or "",
                                attempt=a.number, start_ns=a.start)
        first_start = min((s for s, _ in steps.values()), default=None)
        start = a.start if first_start is None else min(a.start, first_start)
        self.emit.span(key, schema.JOB_START, start, start)
        if a.restore is not None:
            end = first_start if first_start is not None else a.last_seen
            self.warn("maxtext_log_restore_end_at_loop_start")
            self.emit.span(key, schema.CHECKPOINT_RESTORE, a.restore[1], max(end, a.restore[1]),
                           {schema.ATTR_CHECKPOINT_STEP: a.restore[0]})
        last = start
        for n, (s, e) in sorted(steps.items()):
            self.emit.span(key, schema.STEP, s, e, {schema.ATTR_STEP: n})
            last = max(last, e)
        for n, t in a.saves:
            if n in steps:
                s = steps[n][1]
            else:
                s = t
                self.warn("maxtext_log_save_start_unknown")
            self.emit.span(key, schema.CHECKPOINT_SAVE, min(s, t), t,
                           {schema.ATTR_CHECKPOINT_STEP: n, schema.ATTR_BLOCKING: True})
            last = max(last, t)
        if any(r.kind == "hidden" for r in a.records):
            self.warn("maxtext_log_hidden_steps", sum(r.kind == "hidden" for r in a.records))
        # no line says a run ended: its end is its last line (a killed run's last completed
        # step has no line yet)
        self.warn("maxtext_log_end_from_last_line")
        if a.last_seen > last:
            self.emit.span(key, schema.HEARTBEAT, a.last_seen, a.last_seen)


SOURCE = Source(
    name="maxtext-log",
    imported_from="maxtext-log",
    reads=frozenset({"lines"}),
    translator=MaxTextLogTranslator,
    sniff=sniff,
    doc="sources/maxtext-log.md",
    checked="AI-Hypercomputer/maxtext e591f30 (2026-08-22): metric_logger.py "
            "_log_training_metrics/buffer_and_write_metrics, checkpointing.py messages",
)
