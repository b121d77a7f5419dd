"""torchtitan's structured logs (JSON lines, one file per process) as goodput spans.

torchtitan (checked against **torchtitan 0.3.0** with torch 2.13.0, gloo, on CPU) writes,
with ``debug.enable_structured_logging`` (on by default), one file per process:
``{dump_folder}/structured_logs/{source}.global_rank_{rank}.{time}-{random}.jsonl``. Each
line is one record: ``log_type_name`` (``<name>_start`` / ``<name>_end`` of a span, or an
instant such as ``training_start``), ``time_us`` (wall clock, µs since the epoch),
``rank``, ``pid``, ``host_name``, ``step`` and ``relative_step`` (the step counted from
this process's start: ``step - relative_step`` is the step it restored), ``step_tags``
(``checkpoint_save`` when a save really wrote, ``eval``, ``gc``), ``task_name`` (pairs a
start with its end, LIFO per task) and ``value`` (an end's duration in ms). Records reach
the file as they are made: a SIGKILL loses none, only the ends of the spans in flight.

What it maps (a ``<name>_start``/``<name>_end`` pair is one span):

=================================  ===================================================
torchtitan span                    goodput span
=================================  ===================================================
``step``                           ``goodput.step`` (``goodput.step`` = its step)
``fetching_batch``                 ``goodput.data_loading``
``checkpoint_save`` (its end       ``goodput.checkpoint_save`` (``goodput.checkpoint.step``
tagged ``checkpoint_save``)        = the step); an untagged one (no save due) is dropped
``checkpoint_load``                ``goodput.checkpoint_restore`` with the restored step
                                   (``step - relative_step`` of the process's first step)
                                   when that is > 0; else ``goodput.training_prep``
``torch_distributed_init``         ``goodput.accelerator_init``
``*.Config.build`` (outermost),    ``goodput.training_prep``
``model_parallelism_init``,
``training_start`` .. first step
``eval``                           ``goodput.custom_badput`` (``goodput.badput.type`` = eval)
``torch_distributed_teardown``     ``goodput.job_end`` (``exit``) at its end
=================================  ===================================================

``fwd_bwd``, ``optim``, ``post_dataloading_process``, ``collect_dist_metrics`` and
``gc_collect`` stay step time; scalars (``metric_value``) and unknown names are ignored.

Processes and attempts: each OS process (``host_name``, ``pid``; a new file is a new
process) is one resource with its ``rank``; a ``goodput.job_start`` marks its first record.
The records carry no attempt: a relaunch by torchrun ``--max-restarts`` or by hand is a
new process (a new file) of each rank, and a second ``training_start`` in one process
starts a new attempt there too; its first step lies at or before the last step of the
attempt before (a step rewind) when it resumed from a checkpoint.
Precisely: in the order the processes began, a new attempt starts where a rank of the
current attempt begins again, or where a process begins after every process of the current
attempt had written its last record. Each attempt after the first counts the warnings
``torchtitan_attempt_inferred`` and ``torchtitan_restart_startup_unseen`` (below);
``torchtitan_step_gap``: a restarted rank's first step lies more than one step after the
last step it had before (it resumed from a checkpoint of a later run).

What it can show: steps and step time, data loading, checkpoint save and restore (with
their steps), accelerator init, training preparation, evaluation, attempts, wasted progress
(from the steps and the restored step) and infrastructure recovery between attempts.

What it cannot show: the process's start-up before torchtitan's structured logger begins
(Python and torch imports, ``ConfigManager``: 8 s in the CPU run of the test data): a
restarted attempt's is counted in the infrastructure recovery before it (the
``torchtitan_restart_startup_unseen`` warning), the first attempt's lies before the job's
first record, outside the job (the job starts at its first record); program
start-up/compilation (``torch.compile`` has no span of its own: it is step time of the
first steps); asynchronous checkpoint uploads (only the
blocking staging is in the ``checkpoint_save`` span); the launcher's own events. A process
killed inside a span loses that span's end: the span is written as an open record
(``goodput.open``) ending at the process's last record (``torchtitan_span_open_at_end``),
and a process without ``torch_distributed_teardown`` has no ``goodput.job_end``.
"""

from __future__ import annotations

import json
import os

from goodput import schema

from .base import Source, Translator, first_json

__all__ = ["SOURCE", "TorchtitanTranslator"]

#: torchtitan span name -> goodput span name (the rest are ignored or handled below).
_PHASE = {
    "step": schema.STEP,
    "fetching_batch": schema.DATA_LOADING,
    "torch_distributed_init": schema.ACCELERATOR_INIT,
    "model_parallelism_init": schema.TRAINING_PREP,
    "eval": schema.CUSTOM_BADPUT,
}
_BUILD_SUFFIX = ".Config.build"


def _is_build(name: str) -> bool:
    return name.endswith(_BUILD_SUFFIX)


class _Proc:
    """One OS process's (or one attempt's, within a process) records, in file order."""

    __slots__ = ("file", "host", "pid", "rank", "first_ns", "last_ns", "spans", "stack",
                 "build_depth", "first_step", "first_rel", "max_step", "clean_end_ns",
                 "train_start_ns", "first_step_ns", "load", "open_at_end")

    def __init__(self, file: str, host: str, pid: int, rank: int, t_ns: int):
        self.file, self.host, self.pid, self.rank = file, host, pid, rank
        self.first_ns = self.last_ns = t_ns
        self.spans: list[tuple[str, int, int, dict, bool]] = []  # (name, start, end, attrs, open)
        self.stack: dict[tuple, list[tuple[int, dict]]] = {}
        self.build_depth = 0
        self.first_step: int | None = None
        self.first_rel: int | None = None
        self.max_step: int | None = None
        self.clean_end_ns: int | None = None
        self.train_start_ns: int | None = None
        self.first_step_ns: int | None = None
        self.load: tuple[int, int, bool] | None = None  # (start, end, open)
        self.open_at_end = 0


class TorchtitanTranslator(Translator):
    """Reads torchtitan structured-log lines (``line``); emits at :meth:`finish` (the
    attempts are numbered once every file is read)."""

    def __init__(self, emitter, problems=None):
        super().__init__(emitter, problems)
        self._procs: list[_Proc] = []
        self._cur: _Proc | None = None
        self._file = ""

    def start_file(self, path: str) -> None:
        self._file = path
        self._cur = None

    # --- reading ----------------------------------------------------------------------

    def line(self, text: str, where: str) -> None:
        try:
            rec = json.loads(text)
        except ValueError as e:
            torn = text.lstrip().startswith("{") and not text.rstrip().endswith("}")
            reason = "truncated" if torn else "malformed"
            self.problems.add(where, reason, f"not JSON ({e})")
            return
        if not isinstance(rec, dict):
            self.problems.add(where, "malformed", "not a JSON object")
            return
        name, t_us = rec.get("log_type_name"), rec.get("time_us")
        if not isinstance(name, str) or isinstance(t_us, bool) or not isinstance(t_us, int):
            self.problems.add(where, "malformed", "no log_type_name / integer time_us")
            return
        t = t_us * 1000
        try:
            pid, rank = int(rec.get("pid") or 0), int(rec.get("rank", 0) or 0)
        except (TypeError, ValueError):
            self.problems.add(where, "malformed", "pid/rank not integers")
            return
        host = str(rec.get("host_name") or "")
        p = self._cur
        if p is None or (p.host, p.pid, p.rank) != (host, pid, rank):
            p = self._cur = _Proc(self._file, host, pid, rank, t)
            self._procs.append(p)
        elif name == "training_start" and p.train_start_ns is not None:
            # train() again in the same process: a new attempt there.
            self._close_open(p)
            p = self._cur = _Proc(self._file, host, pid, rank, t)
            self._procs.append(p)
        p.last_ns = max(p.last_ns, t)
        step = rec.get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        if name == "training_start":
            p.train_start_ns = t
        elif name.endswith("_start"):
            base = name[:-6]
            if _is_build(base):
                p.build_depth += 1
            p.stack.setdefault((rec.get("task_name"), base), []).append((t, rec))
            if base == "step" and step is not None and p.first_step is None:
                p.first_step, p.first_step_ns = step, t
                rel = rec.get("relative_step")
                if isinstance(rel, int) and not isinstance(rel, bool):
                    p.first_rel = rel
        elif name.endswith("_end"):
            base = name[:-4]
            opened = p.stack.get((rec.get("task_name"), base))
            if not opened:
                self.problems.add(where, "unmatched_end", f"{name} without its start")
                return
            t0, srec = opened.pop()
            if _is_build(base):
                p.build_depth -= 1
            self._span(p, base, t0, t, srec, rec, p.build_depth, False)

    def _span(self, p: _Proc, base: str, t0: int, t1: int, srec: dict, erec: dict | None,
              depth: int, is_open: bool) -> None:
        """Record the goodput span (if any) of torchtitan span ``base`` of process ``p``."""
        step = (erec or srec).get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        tags = (erec or {}).get("step_tags") or ()
        if base == "step":
            if step is None:
                return
            p.max_step = step if p.max_step is None else max(p.max_step, step)
            p.spans.append((schema.STEP, t0, t1, {schema.ATTR_STEP: step}, is_open))
        elif base == "checkpoint_save":
            # Only an end tagged checkpoint_save wrote a checkpoint (the tag is set inside
            # the save, after its start record): an untagged or open one is dropped.
            if "checkpoint_save" in tags and step is not None:
                p.spans.append((schema.CHECKPOINT_SAVE, t0, t1,
                                {schema.ATTR_CHECKPOINT_STEP: step}, False))
        elif base == "checkpoint_load":
            p.load = (t0, t1, is_open)
        elif base == "torch_distributed_teardown":
            p.clean_end_ns = t1
        elif _is_build(base):
            if depth == 0:
                p.spans.append((schema.TRAINING_PREP, t0, t1, {}, is_open))
        elif base in _PHASE:
            attrs = {schema.ATTR_BADPUT_TYPE: "eval"} if base == "eval" else {}
            p.spans.append((_PHASE[base], t0, t1, attrs, is_open))

    def _close_open(self, p: _Proc) -> None:
        """Spans still open at the end of ``p``'s records: open records to its last one
        (of the ``*.Config.build`` spans, only the outermost: the earliest begun)."""
        opened = sorted(((t0, base, srec) for (_task, base), stack in p.stack.items()
                         for t0, srec in stack), key=lambda x: x[0])
        p.stack.clear()
        outer_build = True
        for t0, base, srec in opened:
            depth = 0
            if _is_build(base):
                depth, outer_build = (0 if outer_build else 1), False
            if base in ("step", "checkpoint_load") or (base in _PHASE and base != "step") \
                    or (_is_build(base) and depth == 0):
                p.open_at_end += 1
                self.warn("torchtitan_span_open_at_end")
            self._span(p, base, t0, p.last_ns, srec, None, depth, True)
        p.build_depth = 0

    # --- emitting ---------------------------------------------------------------------

    def finish(self) -> None:
        uniq: dict[tuple, _Proc] = {}
        for p in self._procs:
            # the same file read twice (or a copy of it) is one process
            if uniq.setdefault((p.host, p.pid, p.rank, p.first_ns), p) is p:
                self._close_open(p)
        order = sorted(uniq.values(), key=lambda q: (q.first_ns, q.rank))
        attempts: list[int] = []
        a, ranks, alive_until = 0, set(), None
        last_step: dict[int, int] = {}
        for p in order:
            # A new attempt: a rank of the current attempt begins again (a new process or a
            # second training_start), or every process of the current attempt had ended.
            if ranks and (p.rank in ranks or p.first_ns > alive_until):
                a, ranks, alive_until = a + 1, set(), None
                self.warn("torchtitan_attempt_inferred")
                # its processes' start-up before the structured logger is not in the logs
                self.warn("torchtitan_restart_startup_unseen")
            if a:
                prev = last_step.get(p.rank)
                if prev is not None and p.first_step is not None and p.first_step > prev + 1:
                    self.warn("torchtitan_step_gap")
            ranks.add(p.rank)
            alive_until = p.last_ns if alive_until is None else max(alive_until, p.last_ns)
            attempts.append(a)
            if p.max_step is not None:
                last_step[p.rank] = p.max_step
        counts: dict[int, int] = {}
        for p, a in zip(order, attempts, strict=True):
            counts[a] = max(counts.get(a, 0), p.rank + 1)
        for p, a in zip(order, attempts, strict=True):
            self._emit(p, a, counts[a])
        self._procs = []

    def _emit(self, p: _Proc, attempt: int, count: int) -> None:
        key = f"{p.host}\0{p.pid}\0{p.rank}\0{p.first_ns}"
        self.emit.process(key, job=_job_name(p.file), rank=p.rank, count=count,
                          attempt=attempt, host=p.host or None, pid=p.pid or None,
                          start_ns=p.first_ns,
                          # a record reaches the file as it is made (logging.FileHandler)
                          extra={"torchtitan.file": p.file,
                                 schema.RES_SOURCE_EXPORT_DELAY: 0})
        span = self.emit.span
        span(key, schema.JOB_START, p.first_ns, p.first_ns)
        resume = None
        if p.first_step is not None and p.first_rel is not None:
            resume = p.first_step - p.first_rel
        if p.load is not None:
            t0, t1, is_open = p.load
            if resume:
                attrs = {schema.ATTR_CHECKPOINT_STEP: resume}
                if is_open:
                    attrs[schema.ATTR_OPEN] = True
                span(key, schema.CHECKPOINT_RESTORE, t0, t1, attrs)
            else:
                span(key, schema.TRAINING_PREP, t0, t1, {schema.ATTR_OPEN: True} if is_open
                     else {})
        if p.train_start_ns is not None:
            end = p.first_step_ns if p.first_step_ns is not None else p.last_ns
            span(key, schema.TRAINING_PREP, p.train_start_ns, end,
                 {} if p.first_step_ns is not None else {schema.ATTR_OPEN: True})
        for name, t0, t1, attrs, is_open in p.spans:
            if is_open:
                attrs = dict(attrs, **{schema.ATTR_OPEN: True})
            span(key, name, t0, t1, attrs)
        if p.clean_end_ns is not None:
            span(key, schema.JOB_END, p.clean_end_ns, p.clean_end_ns,
                 {schema.ATTR_END_REASON: "exit"})


def _job_name(path: str) -> str:
    """The job name of a log file: its dump folder's name (the directory above
    ``structured_logs``), else the name of the directory holding it, else
    ``torchtitan``."""
    d = os.path.dirname(os.path.abspath(path)) if path else ""
    if os.path.basename(d) == "structured_logs":
        d = os.path.dirname(d)
    return os.path.basename(d) or "torchtitan"


def sniff(head: bytes) -> bool:
    """Whether a file's first bytes are torchtitan structured-log records."""
    rec = first_json(head)
    return rec is not None and all(k in rec for k in (
        "log_type_name", "time_us", "global_rank", "seq_id"))


SOURCE = Source(
    name="torchtitan",
    imported_from="torchtitan",
    reads=frozenset({"lines"}),
    translator=TorchtitanTranslator,
    sniff=sniff,
    doc="sources/torchtitan.md",
    checked="torchtitan 0.3.0 (torch 2.13.0, gloo, CPU)",
)
