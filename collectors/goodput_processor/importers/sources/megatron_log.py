"""Megatron-LM's stdout (no telemetry at all) as goodput spans: ``goodput import --from
megatron-log LOG...``.

What it reads (the lines of ``megatron/training/training.py`` and ``checkpointing.py`` of
Megatron-LM main at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553, 2026-08-22; the
formats have been stable since 2023):

- the start of a launch: ``using world size: ...`` (argument parsing), ``> initializing
  torch distributed ...``, ``time to initialize megatron (seconds): X`` (X is measured from
  the import of ``training.py``, so the process began X s before the line), ``[after
  megatron is initialized] datetime: ...``. Such a line after the current launch had got
  that far begins a new **attempt** (``goodput.job_start``).
- ``[after model, optimizer, and learning rate scheduler are built]``, ``[after dataloaders
  are built]``, ``[before the start of training step]`` (``print_datetime``): the end of
  start-up. Start of attempt to ``[after megatron is initialized]`` is
  ``goodput.accelerator_init``; from there to the start of training,
  ``goodput.training_prep``.
- `` loading [distributed ]checkpoint from DIR at iteration N`` ... ``successfully loaded
  checkpoint from DIR [ t ... ] at iteration N``: ``goodput.checkpoint_restore`` of step N
  (the attempt resumes after iteration N).
- ``[DATE] iteration N/M | ... elapsed time per iteration (ms): X | ...``
  (``training_log``): a ``goodput.step`` stretch ending at the line with
  ``goodput.step.count`` = the iterations since the previous such line and starting
  ``count * X`` ms before its end (Megatron's ``interval-time`` timer stops during
  checkpoint saves and evaluation, so those stay outside the stretch). The first line of a
  launch covers one iteration; its timer is not reset, so the second line's average covers
  the first iteration too, which is taken out.
- ``[DATE] saving checkpoint at iteration N to ...`` ... ``[DATE] successfully saved
  checkpoint from iteration N to ...``: ``goodput.checkpoint_save`` of step N (non-blocking
  when iteration lines came in between: ``--async-save``).
- ``[after training is done]`` and ``exiting program ...``: ``goodput.job_end``.

Times: a ``kubectl logs --timestamps`` prefix (RFC 3339 with ns) gives each line's wall
clock. Without it, the naive date Megatron prints in the iteration, save and
``print_datetime`` lines is read as UTC (warning ``megatron_log_naive_time_as_utc``); lines
with neither take their time from the elapsed time per iteration chained from the last
line with one (``megatron_log_time_chained``: gaps between iterations, such as evaluation,
are then unknown, and later times drift by them). Several files (``kubectl logs
--previous`` and the current log; rank 0's pod, which prints the start and checkpoint
lines, and the last rank's, which prints the iteration lines) are merged by time.

What it can show: attempts (from start lines, or an iteration number that goes back:
``megatron_log_attempt_from_rewind``), accelerator init, training preparation, checkpoint
restore and save (blocking), steps (stretches of ``--log-interval`` iterations, their
time per iteration), the wasted progress and infrastructure recovery of a restart (the
killed attempt is last seen at its last line). What it cannot show: data loading and
program startup/compilation apart from steps (they are inside the iteration time),
evaluation (outside the stretches: ``other``), the ranks' processes (one stream, rank 0),
step-by-step times inside a log interval, and a kill's exact time (the last line before
it is the evidence).

Recovery phases of a restart: rescheduling (the killed launch's last line to the new
container's first line), initialization (to the first step, less the restore), restore
and recompilation/warm-up (the first stretches' excess) show; detection and termination
are 0 (no line says when the failure was seen or the old processes ended), and process
start-up is inside initialization unless ``time to initialize megatron`` was printed
(the process began that many seconds before it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from goodput import schema

from .base import Source, Translator
from .logtime import MAX_SECONDS, MAX_STEP, naive_ns, split_prefix

__all__ = ["SOURCE", "MegatronLogTranslator", "sniff"]

_NS_MS = 1_000_000
_ALIVE_NS = 100 * _NS_MS
_ITER = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")
_ITER_HEAD = re.compile(r"\s*\[\d{4}-[^\]]*\] iteration\b")
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\): (\d+(?:\.\d+)?)")
_SAVING = re.compile(r"saving checkpoint at iteration\s+(\d+) to ")
_SAVED = re.compile(r"successfully saved checkpoint from iteration\s+(\d+) to ")
_LOADING = re.compile(r"^ loading (?:distributed )?checkpoint from \S.* at iteration (\d+)")
_LOADED = re.compile(r"successfully loaded checkpoint from \S.* at iteration (\d+)")
_TIME_INIT = re.compile(r"time to initialize megatron \(seconds\): (\d+(?:\.\d+)?)")
_DATETIME = re.compile(r"^\[([^\]]+)\] datetime: ")

# stages of a launch, in the order Megatron prints them; a start line whose stage the
# current attempt already reached begins a new attempt
_S_ARGS, _S_DIST, _S_TINIT, _S_INIT, _S_LOAD, _S_LOADED, _S_PREP, _S_TRAIN, _S_DONE = range(9)
_PRINT_DATETIME = {
    "after megatron is initialized": _S_INIT,
    "after model, optimizer, and learning rate scheduler are built": _S_PREP,
    "after dataloaders are built": _S_PREP,
    "before the start of training step": _S_PREP,
    "after training is done": _S_DONE,
}


def sniff(head: bytes) -> bool:
    """Whether a file's first bytes look like Megatron-LM's stdout."""
    return (b"elapsed time per iteration (ms)" in head or b"time to initialize megatron" in head
            or (b"using world size:" in head and b"data-parallel size" in head))


@dataclass
class _Event:
    t: int | None       # ns; None: the line had no time
    order: tuple        # (file index, line number): ties and lines without time
    kind: str
    n: int = 0          # iteration / checkpoint step
    x: float = 0.0      # elapsed ms per iteration, or seconds since the start
    stage: int = -1
    where: str = ""


@dataclass
class _Attempt:
    number: int
    start: int
    stage: int = -1
    spans: list = field(default_factory=list)
    last_seen: int = 0
    prev_iter: int | None = None     # the iteration the next line's stretch follows
    iter_lines: int = 0
    first_iter_ms: float = 0.0       # the first line's elapsed: inside the second's average
    init_end: int | None = None      # [after megatron is initialized]
    prep_end: int | None = None
    load: tuple | None = None        # (step, start ns)
    save: tuple | None = None        # (step, start ns, iteration lines since)
    last_end: int = 0
    ended: bool = False


class MegatronLogTranslator(Translator):
    """Megatron-LM stdout lines -> goodput spans (one process per attempt, rank 0).

    Lines are collected as they come (one small record per recognised line) and turned
    into spans at :meth:`finish`, after merging every file by time.
    """

    def __init__(self, emitter, problems=None):
        super().__init__(emitter, problems)
        self.job: str | None = None
        self.events: list[_Event] = []
        self._file = -1
        #: True: nothing read yet in this file; None: only unrecognised lines; False: past
        #: its first recognised line
        self._preamble: bool | None = True
        self._alive: _Event | None = None
        self._naive = False

    # --- reading ----------------------------------------------------------------------

    def start_file(self, path: str) -> None:
        self._flush_alive()
        self._file += 1
        self._preamble = True
        if self.job is None:
            base = os.path.basename(path)
            for ext in (".gz", ".log", ".txt", ".out", ".previous"):
                base = base[:-len(ext)] if base.endswith(ext) else base
            self.job = base or "megatron"

    def _flush_alive(self) -> None:
        if self._alive is not None:
            self.events.append(self._alive)
            self._alive = None

    def line(self, text: str, where: str) -> None:
        t, rest, bad = split_prefix(text)
        if bad:
            self.problems.add(where, "malformed", "a timestamp prefix that is not a time")
            return
        lineno = int(where.rsplit(":", 1)[1]) if where.rsplit(":", 1)[-1].isdigit() else 0
        order = (self._file, lineno)
        ev = self._classify(rest, t, order, where)
        if ev is None:
            # a line before this file's first recognised one tells when its container
            # started (the start of an attempt, not a sign of the one before); any other
            # says the current attempt was alive then
            if t is not None:
                if self._preamble is True:
                    self.events.append(_Event(t, order, "file_start"))
                    self._preamble = None
                elif self._preamble is False:
                    # one record per 0.1 s of lines, and the last one: enough to tell
                    # where a launch's process began in a file of several launches
                    if self._alive is not None and t - self._alive.t >= _ALIVE_NS:
                        self.events.append(self._alive)
                    self._alive = _Event(t, order, "alive")
            return
        self._flush_alive()
        self._preamble = False
        self.events.append(ev)

    def _classify(self, s: str, t: int | None, order: tuple, where: str) -> _Event | None:
        if "iteration" in s:
            m = _ITER.search(s)
            if m is not None:
                e = _ELAPSED.search(s, m.end())
                if e is None:
                    self.problems.add(where, "truncated", "iteration line without its elapsed "
                                      "time per iteration")
                    return None
                ms, n = float(e.group(1)), int(m.group(1))
                if not (ms <= MAX_SECONDS * 1000 and n <= MAX_STEP):
                    self.problems.add(where, "malformed", "iteration or elapsed time out of range")
                    return None
                return _Event(self._own_time(t, s[:m.start()]), order, "iter", n, ms, _S_TRAIN,
                              where)
            for rx, kind, stage in ((_SAVING, "save", _S_TRAIN), (_SAVED, "saved", _S_TRAIN),
                                    (_LOADING, "load", _S_LOAD),
                                    (_LOADED, "loaded", _S_LOADED)):
                m = rx.search(s)
                if m is not None and int(m.group(1)) > MAX_STEP:
                    self.problems.add(where, "malformed", "checkpoint iteration out of range")
                    return None
                if m is not None:
                    own = self._own_time(t, s[:m.start()]) if kind in ("save", "saved") else t
                    return _Event(own, order, kind, int(m.group(1)), 0.0, stage, where)
            if "saving checkpoint at iteration" in s or "successfully saved checkpoint" in s:
                self.problems.add(where, "truncated", "checkpoint line without its iteration")
                return None
            if _ITER_HEAD.match(s):
                self.problems.add(where, "truncated", "iteration line cut before its numbers")
                return None
        if s.startswith("using world size:"):
            return _Event(t, order, "start", 0, 0.0, _S_ARGS, where)
        if s.startswith("> initializing torch distributed"):
            return _Event(t, order, "start", 0, 0.0, _S_DIST, where)
        m = _TIME_INIT.search(s)
        if m is not None:
            x = float(m.group(1))
            return _Event(t, order, "start", 0, x if x <= MAX_SECONDS else 0.0, _S_TINIT, where)
        m = _DATETIME.match(s)
        if m is not None:
            stage = _PRINT_DATETIME.get(m.group(1))
            if stage is None:
                return None
            kind = {_S_INIT: "start", _S_DONE: "done"}.get(stage, "prep")
            return _Event(self._own_time(t, s[m.end():]), order, kind, 0, 0.0, stage, where)
        if s.startswith("[exiting program"):
            return _Event(t, order, "done", 0, 0.0, _S_DONE, where)
        return None

    def _own_time(self, t: int | None, text: str) -> int | None:
        """The line's time: its prefix, else the naive date Megatron printed in it."""
        if t is not None:
            return t
        own = naive_ns(text)
        if own is not None and not self._naive:
            self._naive = True
            self.warn("megatron_log_naive_time_as_utc")
        return own

    # --- making spans -----------------------------------------------------------------

    def finish(self) -> None:
        self._flush_alive()
        evs = self.events
        if not evs:
            return
        if all(e.t is not None for e in evs):
            evs.sort(key=lambda e: (e.t, e.order))
        else:
            evs.sort(key=lambda e: e.order)
        self.cur: _Attempt | None = None
        self.prev: _Attempt | None = None    # closed once the current attempt's start is final
        self.prev_held: list[int] = []
        self.held: list[int] = []            # unrecognised lines since cur's last event
        self.number = 0
        self.last_t: int | None = None
        self.pending_start: int | None = None
        for e in evs:
            self._event(e)
        if self.cur is not None and self.held:
            self.cur.last_seen = max([self.cur.last_seen] + self.held)
        self._settle()
        self._close(self.cur)
        self.events = []

    def _time(self, e: _Event) -> int:
        if e.t is not None:
            self.last_t = e.t if self.last_t is None else max(self.last_t, e.t)
            return e.t
        if self.last_t is None:
            self.warn("megatron_log_no_wall_clock")
            self.last_t = 0
        self.warn("megatron_log_time_chained")
        return self.last_t

    def _new_attempt(self, t: int, backdate_s: float = 0.0) -> _Attempt:
        self._settle()
        old = self.cur
        start = t - int(backdate_s * 1e9)
        if self.pending_start is not None and (old is None
                                               or self.pending_start >= old.last_seen):
            start = min(start, self.pending_start)
        self.pending_start = None
        self.cur = _Attempt(self.number, start, last_seen=t, last_end=start)
        self.number += 1
        self.prev, self.prev_held, self.held = old, self.held, []
        return self.cur

    def _settle(self) -> None:
        """Close the attempt before the current one once the current one's start is known
        for good: the unrecognised lines before that start were the earlier one's."""
        if self.prev is None:
            return
        start = self.cur.start if self.cur is not None else None
        for h in self.prev_held:
            if start is None or h < start:
                self.prev.last_seen = max(self.prev.last_seen, h)
        self._close(self.prev)
        self.prev, self.prev_held = None, []

    def _seen(self, a: _Attempt, t: int) -> None:
        """A recognised line of attempt ``a`` at ``t``: it and the lines before it were its."""
        a.last_seen = max([a.last_seen, t] + self.held)
        self.held = []

    def _event(self, e: _Event) -> None:
        if e.kind == "file_start":
            if e.t is not None and (self.pending_start is None or e.t < self.pending_start):
                self.pending_start = e.t
            return
        if e.kind == "alive":
            t = self._time(e)
            if self.cur is not None:
                self.held.append(t)
            return
        if e.kind == "iter":
            self._iteration(e)
            self._settle()
            return
        t = self._time(e)
        a = self.cur
        if e.kind == "start":
            if a is None or a.stage >= e.stage:
                a = self._new_attempt(t, e.x if e.stage == _S_TINIT else 0.0)
            elif e.stage == _S_TINIT and t - int(e.x * 1e9) < a.start:
                a.start = a.last_end = t - int(e.x * 1e9)
            if e.stage == _S_INIT:
                a.init_end = t
        elif a is None:
            a = self._new_attempt(t)
        if e.stage > _S_TINIT:
            self._settle()
        a.stage = max(a.stage, e.stage)
        self._seen(a, t)
        if e.kind == "prep":
            a.prep_end = t
        elif e.kind == "load":
            a.load = (e.n, t)
        elif e.kind == "loaded":
            start = a.load[1] if a.load is not None and a.load[0] == e.n else t
            if start == t:
                self.warn("megatron_log_restore_without_start")
            a.spans.append((schema.CHECKPOINT_RESTORE, start, t,
                            {schema.ATTR_CHECKPOINT_STEP: e.n}, False))
            a.load = None
            a.prev_iter = e.n
        elif e.kind == "save":
            a.save = (e.n, t, a.iter_lines)
        elif e.kind == "saved":
            if a.save is not None and a.save[0] == e.n:
                blocking = a.save[2] == a.iter_lines
                if not blocking:
                    self.warn("megatron_log_async_save")
                a.spans.append((schema.CHECKPOINT_SAVE, a.save[1], t,
                                {schema.ATTR_CHECKPOINT_STEP: e.n,
                                 schema.ATTR_BLOCKING: blocking}, False))
                a.last_end = max(a.last_end, t) if blocking else a.last_end
            else:
                self.warn("megatron_log_save_without_start")
            a.save = None
        elif e.kind == "done":
            a.spans.append((schema.JOB_END, t, t, {schema.ATTR_END_REASON: "exit"}, False))
            a.ended = True

    def _iteration(self, e: _Event) -> None:
        n, ms = e.n, e.x
        a = self.cur
        rewind = a is not None and a.prev_iter is not None and a.iter_lines and n <= a.prev_iter
        if a is None or rewind or a.ended:
            if rewind:
                self.warn("megatron_log_attempt_from_rewind")
            a = self._new_attempt(e.t if e.t is not None else (self.last_t or 0))
        else:
            self._seen(a, a.last_seen)
        if a.iter_lines == 0:
            count, dur_ms = 1, ms                      # is_first_iteration: one iteration
            a.first_iter_ms = ms
            if a.prev_iter is not None and n != a.prev_iter + 1:
                self.warn("megatron_log_first_iteration_not_after_resume")
        else:
            count = n - a.prev_iter
            dur_ms = count * ms
            if a.iter_lines == 1:   # the timer was not reset after the first line
                dur_ms = (count + 1) * ms - a.first_iter_ms
        if e.t is not None:
            end = self._time(e)
        else:
            end = self._time(e) + int(dur_ms * _NS_MS)
            self.last_t = end
        start = max(end - int(round(dur_ms * _NS_MS)), a.last_end if a.iter_lines else 0)
        a.spans.append((schema.STEP, start, end,
                        {schema.ATTR_STEP: n, schema.ATTR_STEP_COUNT: count}, False))
        a.prev_iter = n
        a.iter_lines += 1
        a.last_end = end
        a.stage = max(a.stage, _S_TRAIN)
        a.last_seen = max(a.last_seen, end)

    def _close(self, a: _Attempt | None) -> None:
        if a is None:
            return
        if a.save is not None:
            self.warn("megatron_log_save_unfinished")
            a.spans.append((schema.CHECKPOINT_SAVE, a.save[1], max(a.last_seen, a.save[1]),
                            {schema.ATTR_CHECKPOINT_STEP: a.save[0]}, True))
        if a.load is not None:
            self.warn("megatron_log_restore_unfinished")
            a.spans.append((schema.CHECKPOINT_RESTORE, a.load[1], max(a.last_seen, a.load[1]),
                            {schema.ATTR_CHECKPOINT_STEP: a.load[0]}, True))
        if not a.ended:
            # killed (or still running): its end is its last line; the iterations after
            # the last iteration line, and the time after that line, are not in the log
            self.warn("megatron_log_end_from_last_line")
        key = self.emit.process(f"megatron-log\0{self.job}\0{a.number}", job=self.job or "",
                                attempt=a.number, start_ns=a.start)
        self.emit.span(key, schema.JOB_START, a.start, a.start)
        if a.init_end is not None and a.init_end > a.start:
            self.emit.span(key, schema.ACCELERATOR_INIT, a.start, a.init_end)
        first_step = min((s[1] for s in a.spans if s[0] == schema.STEP), default=None)
        prep_from = a.init_end if a.init_end is not None else None
        prep_to = a.prep_end if a.prep_end is not None else first_step
        if prep_from is not None and prep_to is not None and prep_to > prep_from:
            self.emit.span(key, schema.TRAINING_PREP, prep_from, prep_to)
        self.emit.spans_then_alive(key, a.start, a.spans, a.last_seen, a.ended)


SOURCE = Source(
    name="megatron-log",
    imported_from="megatron-log",
    reads=frozenset({"lines"}),
    translator=MegatronLogTranslator,
    sniff=sniff,
    doc="sources/megatron-log.md",
    checked="Megatron-LM main d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22): "
            "training.py training_log/print_datetime, checkpointing.py save/load lines",
)
