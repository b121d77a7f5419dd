"""Source ``megatron``: Megatron-LM's OpenTelemetry spans (nemo-lens), read as goodput spans.

Megatron-LM main (since Aug 2026, PR #6438; not megatron-core 0.19.2 on PyPI) exports
OTLP traces through nemo-lens when ``MEGATRON_OTEL_ENABLED=1``. This source reads them
(``goodput serve`` over OTLP gRPC/HTTP, ``goodput import --from megatron`` of the
Collector's OTLP JSON files) and maps them:

================================================  ==========================================
Megatron span                                     goodput span
================================================  ==========================================
``megatron.startup`` (root, backdated start)      ``goodput.job_start`` at the incarnation's
                                                  first span; the root's time after the
                                                  process-startup children (launch script,
                                                  container load, imports, arg parse,
                                                  in-process and in-job setup: left to the
                                                  processor's ``process_startup``) is
                                                  ``goodput.training_prep``
``megatron.startup.initialize_megatron``          ``goodput.accelerator_init``
``megatron.startup.jit_fusion_options``,          ``goodput.program_startup``
``megatron.train.cuda_graph_capture``
``megatron.startup.model_init``, ``.dataloader``  ``goodput.training_prep``
``megatron.train.iteration`` (``megatron.it...``) ``goodput.step``, step = iteration + 1
``megatron.checkpoint.exposed_save``              ``goodput.checkpoint_save`` (blocking; the
                                                  step from ``megatron.iteration``)
``megatron.checkpoint.save.finalize`` (>= 1 ms),  ``goodput.checkpoint_save`` (blocking: the
``megatron.checkpoint.exit_finalize``             async save's exposed finalisation)
``megatron.checkpoint.load``                      ``goodput.checkpoint_restore`` (its step is
                                                  the first iteration's: the processor's
                                                  resume step)
``megatron.evaluate``                             ``goodput.custom_badput`` ``eval``
``megatron.startup.sniff_test``,                  ``goodput.custom_badput`` ``sniff_test``,
``megatron.train.sniff_test``,                    ``weight_hash_check``
``megatron.startup.weight_hash_check``
================================================  ==========================================

The ``megatron.train`` roots (one per save interval) and
``megatron.train.first_iteration`` are read for structure only; other spans
(``megatron.checkpoint.save`` inside the exposed save, per-step children, per-layer and
communication spans, ``pre_startup``) are left out, and a resource with none of the spans
read (the asynchronous checkpoint worker's process, which shares the trainer's resource
attributes and rank) is no process of the job.

Identity: the job is ``nemo.lens.job_uuid`` (stable across restarts; when it is the value
Megatron gives a job outside SLURM, the same for every such job, ``service.name`` is the
job instead, with the warning ``megatron_job_uuid_default``); one process incarnation is
``nemo.lens.run_uuid`` (one per restart) + ``dl.rank`` + ``host.name`` + ``process.pid``;
the attempt hint is ``nvrx.cycle``, else ``slurm.restart_count``, else
``slurm.torchelastic.restart_count``. By default nemo-lens exports from one rank only (the
last): the report then sees one process per attempt, whose timeline stands for the job's.

Buckets it can show: process startup, accelerator init, training prep, program startup
(JIT fusion warm-up, CUDA graph capture), productive steps and slowdown (with the
``per_step`` span groups: ``MEGATRON_OTEL_SPAN_GROUPS=per_step``; with Megatron's
``default`` groups there are no iteration spans, and the steps between two checkpoint saves
are told from ``megatron.train.first_iteration`` and the saves' ``megatron.iteration`` as
one ``goodput.step`` span covering them, ``goodput.step.count``: warning
``megatron_steps_from_saves``; without saves, no steps: ``megatron_no_iteration_spans``),
checkpoint save and restore (the restore with ``per_step`` only), evaluation, wasted
progress and infrastructure recovery between incarnations. It cannot show data loading
inside a step (no span in the default or ``per_step`` groups' iteration), queueing before
the job (``pre_startup`` is SLURM's, not the process's), or the asynchronous checkpoint
writer's work (the worker's spans are nvidia-resiliency-ext's; not checked).

Losses: the BatchSpanProcessor holds ended spans up to ``OTEL_BSP_SCHEDULE_DELAY`` (5 s by
default) and a SIGKILL loses them with every span still open (the ``megatron.train``
interval, the iteration in flight). Such an incarnation has spans whose parent never
arrived; it gets no ``goodput.job_end`` and the warning ``megatron_open_spans_lost``, and
the processor accounts it from its last span received (``source_records_lost``). An
incarnation ends cleanly (``goodput.job_end`` ``exit``) when the ``megatron.train`` root of
its iteration ``megatron.train_iters`` has arrived and, if it saved checkpoints, the save of
that iteration (at the last span received), or, in an import, when no span lacks its
parent. Spans ending after that marker (``pretrain()``'s post-training validation and test
evaluation) are left out by the processor: warning ``megatron_span_after_end``.

Checked against Megatron-LM main at d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22)
with nemo-lens 0.1.0 and opentelemetry-sdk 1.45.2, on CPU (``tests/data/sources/megatron``).
"""

from __future__ import annotations

import uuid

from goodput import schema

from .base import Emitter, ForeignSpan, Source, Translator, spans_of
from .megatron_json import CollectorJson

__all__ = ["SOURCE", "MegatronTranslator"]

#: The job uuid Megatron-LM's ``build_telemetry_resource_attrs`` gives every job run
#: outside SLURM (cluster "nocluster", job "nojob").
DEFAULT_JOB_UUID = str(uuid.uuid5(uuid.NAMESPACE_URL, "nemo.lens.job/nocluster/nojob"))
#: nemo-lens's BatchSpanProcessor delay (the OTel SDK default, ``OTEL_BSP_SCHEDULE_DELAY``).
EXPORT_DELAY_MS = 5000
#: A ``megatron.checkpoint.save.finalize`` shorter than this is the per-iteration no-op.
FINALIZE_MIN_NS = 1_000_000

#: Startup children the processor's ``process_startup`` covers (not emitted).
_PROCESS_STARTUP = frozenset((
    "megatron.startup.launch_script", "megatron.startup.container_load",
    "megatron.startup.imports", "megatron.startup.arg_parse",
    "megatron.startup.inprocess_setup", "megatron.startup.in_job_setup"))
#: One-to-one spans: Megatron name -> (goodput name, attributes).
_DIRECT = {
    "megatron.startup.initialize_megatron": (schema.ACCELERATOR_INIT, {}),
    "megatron.startup.jit_fusion_options": (schema.PROGRAM_STARTUP, {}),
    "megatron.train.cuda_graph_capture": (schema.PROGRAM_STARTUP, {}),
    "megatron.startup.model_init": (schema.TRAINING_PREP, {}),
    "megatron.startup.dataloader": (schema.TRAINING_PREP, {}),
    "megatron.checkpoint.load": (schema.CHECKPOINT_RESTORE, {}),
    "megatron.checkpoint.exit_finalize": (schema.CHECKPOINT_SAVE,
                                          {schema.ATTR_BLOCKING: True}),
    "megatron.evaluate": (schema.CUSTOM_BADPUT, {schema.ATTR_BADPUT_TYPE: "eval"}),
    "megatron.startup.sniff_test": (schema.CUSTOM_BADPUT,
                                    {schema.ATTR_BADPUT_TYPE: "sniff_test"}),
    "megatron.train.sniff_test": (schema.CUSTOM_BADPUT, {schema.ATTR_BADPUT_TYPE: "sniff_test"}),
    "megatron.startup.weight_hash_check": (schema.CUSTOM_BADPUT,
                                           {schema.ATTR_BADPUT_TYPE: "weight_hash_check"}),
}
#: Resource attributes copied onto the emitted resource.
_KEEP = ("nemo.lens.job_uuid", "nemo.lens.run_uuid", "nemo.run.id", "slurm.job.id",
         "slurm.restart_count", "nvrx.cycle", "megatron.train_iters")


def _int(v) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


_ITERATION = frozenset(("megatron.train.iteration", "megatron.iteration"))
#: The spans read: a resource with none of them (the asynchronous checkpoint worker's
#: process, sharing the trainer's resource attributes and rank) is no incarnation.
_READ = _ITERATION | _PROCESS_STARTUP | frozenset(_DIRECT) | frozenset((
    "megatron.startup", "megatron.train", "megatron.train.first_iteration",
    "megatron.checkpoint.exposed_save", "megatron.checkpoint.save.finalize",
    "megatron.checkpoint.ft_heartbeat"))


class _Incarnation:
    """What the translator keeps of one process incarnation."""

    __slots__ = ("key", "prep_from", "last_end", "ids", "parents", "last_iter",
                 "max_step", "ended", "train_iters", "roots", "fresh", "first_iter", "saved",
                 "mode", "pending", "stretch", "root_end")

    def __init__(self, key: str, train_iters: int | None):
        self.key = key
        self.prep_from: int | None = None  # end of the last process-startup child
        self.last_end = 0
        self.ids: set[str] = set()  # ids of the spans received (not per-iteration ones)
        self.parents: set[str] = set()  # parent ids they name
        #: the highest iteration's span (or its OTLP JSON dict: see spans_json)
        self.last_iter: ForeignSpan | dict | None = None
        self.max_step: int | None = None
        self.ended = False
        self.train_iters = train_iters
        self.roots: set[str] = set()  # megatron.train roots received
        self.fresh = True  # no span received yet
        self.first_iter: dict[str, str] = {}  # megatron.train.first_iteration -> its parent
        self.saved: int | None = None  # the highest checkpoint saved (exposed_save)
        #: "per_step" (iteration spans), "default" (none: steps told from the saves), None
        self.mode: str | None = None
        self.pending: list[tuple] = []  # (start, end, iteration) of saves not yet used
        #: default mode: (end ns, step, start ns) of the last step span
        self.stretch: tuple | None = None
        self.root_end = 0  # latest end of a megatron.train root


class MegatronTranslator(CollectorJson, Translator):
    """Per-stream state of the ``megatron`` source: one :class:`_Incarnation` per process
    incarnation (see the module docstring); the Collector's OTLP JSON is read by the
    paths of :class:`~.megatron_json.CollectorJson`."""

    _READ, _ITERATION = _READ, _ITERATION

    def __init__(self, emitter: Emitter, problems=None):
        super().__init__(emitter, problems)
        self._inc: dict[str, _Incarnation] = {}
        self._job_of: dict[str, str] = {}  # incarnation key -> the job it was written into

    def forget(self, job: str) -> None:
        """``goodput serve`` retired ``job``: its incarnations' state goes."""
        for key in [k for k, j in self._job_of.items() if j == job]:
            self._inc.pop(key, None)
            del self._job_of[key]
        super().forget(job)

    # --- identity ----------------------------------------------------------------------
    @staticmethod
    def _key(res: dict) -> str:
        """The incarnation key of resource attributes ``res``."""
        rank = _int(res.get("dl.rank")) or 0
        run = res.get("nemo.lens.run_uuid") or res.get("nemo.run.id") or ""
        return f"{run}\0{rank}\0{res.get('host.name')}\0{_int(res.get('process.pid'))}"

    def _incarnation(self, res: dict) -> _Incarnation:
        key = self._key(res)
        rank = _int(res.get("dl.rank")) or 0
        host, pid = res.get("host.name"), _int(res.get("process.pid"))
        inc = self._inc.get(key)
        if inc is not None:
            return inc
        job = res.get("nemo.lens.job_uuid")
        if not isinstance(job, str) or not job or job == DEFAULT_JOB_UUID:
            self.warn("megatron_job_uuid_default")
            job = str(res.get("service.name") or "megatron-lm")
        attempt = 0
        for k in ("nvrx.cycle", "slurm.restart_count", "slurm.torchelastic.restart_count"):
            if _int(res.get(k)) is not None:
                attempt = _int(res.get(k))
                break
        self.emit.process(key, job=job, rank=rank, count=_int(res.get("dl.world_size")) or 1,
                          attempt=max(attempt, 0), host=host if isinstance(host, str) else None,
                          pid=pid, extra={k: res[k] for k in _KEEP if k in res})
        inc = self._inc[key] = _Incarnation(key, _int(res.get("megatron.train_iters")))
        self._job_of[key] = self.emit.job or job
        return inc

    # --- spans -------------------------------------------------------------------------
    def spans(self, resource: dict, scope: str, spans: list[ForeignSpan], where: str) -> None:
        inc, one = None, self._one
        for s in spans:
            if s.name not in _READ:
                continue
            if inc is None:
                inc = self._incarnation(resource)
                if inc.fresh:  # the first spans of this incarnation: its start marker
                    inc.fresh = False
                    t0 = min(x.start_ns for x in spans if x.name in _READ)
                    self.emit.span(inc.key, schema.JOB_START, t0, t0,
                                   {schema.ATTR_HEARTBEAT_INTERVAL_MS: EXPORT_DELAY_MS})
            one(inc, s, where)
        if inc is not None:
            self._maybe_end(inc)

    def _one(self, inc: _Incarnation, s: ForeignSpan, where: str) -> None:
        """One span of :meth:`spans` (its incarnation's start marker already written)."""
        name, key, emit = s.name, inc.key, self.emit.span
        if name not in _READ:
            return
        start, end = s.start_ns, s.end_ns
        if start <= 0 or end < start:
            self.problems.add(where, "malformed", f"{name}: bad times")
            return
        if end > inc.last_end:
            if inc.ended:
                self.warn("megatron_span_after_end")
            inc.last_end = end
        if name in _ITERATION:
            it = s.attr("megatron.iteration")
            if type(it) is not int or it < 0:
                self.problems.add(where, "malformed", f"{name} without megatron.iteration")
                return
            step = it + 1
            sid = s.span_id
            if sid and type(start) is int and type(end) is int:  # (start <= end: above)
                self.emit.span_kept(key, schema.STEP, start, end, {schema.ATTR_STEP: step},
                                    sid, s.error)
            else:
                emit(key, schema.STEP, start, end, {schema.ATTR_STEP: step}, sid, s.error)
            if inc.max_step is None or step >= inc.max_step:
                inc.max_step, inc.last_iter = step, s  # its parent: read when needed
            if inc.mode is None:
                inc.mode, inc.pending = "per_step", []
        elif name == "megatron.checkpoint.ft_heartbeat":
            if inc.mode == "default" and s.parent_id:
                inc.parents.add(s.parent_id)
        elif name != "megatron.checkpoint.save.finalize":
            inc.ids.add(s.span_id)
            if s.parent_id:
                inc.parents.add(s.parent_id)
            self._span(inc, s)
        elif end - start >= FINALIZE_MIN_NS:
            emit(key, schema.CHECKPOINT_SAVE, start, end, {schema.ATTR_BLOCKING: True},
                 span_id=s.span_id, error=s.error)

    def _span(self, inc: _Incarnation, s: ForeignSpan) -> None:
        name, key = s.name, inc.key
        if name in _PROCESS_STARTUP:
            inc.prep_from = max(inc.prep_from or 0, s.end_ns)
        elif name == "megatron.startup":
            start = max(s.start_ns, inc.prep_from or s.start_ns)
            if s.end_ns > start:
                self.emit.span(key, schema.TRAINING_PREP, start, s.end_ns, span_id=s.span_id,
                               error=s.error)
        elif name == "megatron.train":
            inc.roots.add(s.span_id)
            inc.root_end = max(inc.root_end, s.end_ns)
        elif name == "megatron.train.first_iteration":  # the first iteration's parent
            inc.first_iter[s.span_id] = s.parent_id
            it = _int(s.attrs.get("megatron.iteration"))
            if inc.mode is None and it is not None and it >= 0:
                # no iteration span came before it: the default span groups
                inc.mode, inc.max_step = "default", it + 1
                inc.stretch = (s.end_ns, it + 1, s.start_ns)
                self.emit.span(key, schema.STEP, s.start_ns, s.end_ns,
                               {schema.ATTR_STEP: it + 1}, span_id=s.span_id, error=s.error)
                self._stretches(inc)
        elif name == "megatron.checkpoint.exposed_save":
            attrs = {schema.ATTR_BLOCKING: True}
            it = _int(s.attrs.get("megatron.iteration"))
            if it is not None:
                attrs[schema.ATTR_CHECKPOINT_STEP] = it
                inc.saved = it if inc.saved is None else max(inc.saved, it)
                if inc.mode != "per_step":
                    inc.pending.append((s.start_ns, s.end_ns, it))
                    self._stretches(inc)
            self.emit.span(key, schema.CHECKPOINT_SAVE, s.start_ns, s.end_ns, attrs,
                           span_id=s.span_id, error=s.error)
        elif name in _DIRECT:
            gname, attrs = _DIRECT[name]
            self.emit.span(key, gname, s.start_ns, s.end_ns, dict(attrs), span_id=s.span_id,
                           error=s.error)

    def _stretches(self, inc: _Incarnation) -> None:
        """Default span groups: the steps between two saves as one ``goodput.step`` span
        covering them (``goodput.step.count``), from the end of the last step (the first
        iteration, or the save before) to the start of the save, whose
        ``megatron.iteration`` is the last step's number."""
        if inc.mode != "default":
            return
        for start, end, it in sorted(inc.pending, key=lambda p: p[2]):
            last_end, last, _ = inc.stretch
            if it <= last:
                continue
            attrs = {schema.ATTR_STEP: it}
            if it - last > 1:
                attrs[schema.ATTR_STEP_COUNT] = it - last
            self.emit.span(inc.key, schema.STEP, last_end, max(start, last_end), attrs)
            inc.stretch, inc.max_step = (end, it, last_end), it
        inc.pending = []

    @staticmethod
    def _root_seen(inc: _Incarnation) -> bool:
        """Whether the ``megatron.train`` root of the highest iteration has arrived (the
        first iteration of an incarnation nests in ``megatron.train.first_iteration``)."""
        if inc.mode == "default":  # a root ended after the last steps began
            return inc.root_end > 0 and inc.root_end > inc.stretch[2]
        parent = _parent(inc.last_iter) if inc.last_iter is not None else ""
        return inc.first_iter.get(parent, parent) in inc.roots

    def _maybe_end(self, inc: _Incarnation) -> None:
        """``goodput.job_end`` once the root of the last iteration (``megatron.train_iters``)
        has arrived (the loop finished and its spans were ended and exported) and, when the
        incarnation saved checkpoints, the save of that iteration (``pretrain()`` saves
        after the loop when the last iteration is no multiple of the save interval)."""
        if inc.ended or inc.train_iters is None or inc.max_step is None:
            return
        if (inc.max_step >= inc.train_iters and self._root_seen(inc)
                and (inc.saved is None or inc.saved >= inc.train_iters)):
            self._end(inc)

    def _end(self, inc: _Incarnation) -> None:
        inc.ended = True
        self.emit.span(inc.key, schema.JOB_END, inc.last_end, inc.last_end,
                       {schema.ATTR_END_REASON: "exit"})

    def finish(self) -> None:
        for inc in self._inc.values():
            if inc.mode == "default":
                self.warn("megatron_steps_from_saves")
            elif inc.roots and inc.max_step is None:
                self.warn("megatron_no_iteration_spans")
            if inc.ended:
                continue
            lost = inc.parents - inc.ids
            if inc.mode == "per_step" and not self._root_seen(inc):
                lost.add(_parent(inc.last_iter))
            if lost:
                # the open spans (interval root, iteration, startup) died with the process
                self.warn("megatron_open_spans_lost")
            else:
                self._end(inc)


def _parent(span) -> str:
    """The parent id of a :class:`ForeignSpan` or of the OTLP JSON span dict
    :meth:`MegatronTranslator.spans_json` kept (as its :class:`ForeignSpan` reads it)."""
    if type(span) is dict:
        span = spans_of((span,))[0]
    return span.parent_id


def _matches(resource: dict, scope: str, names) -> bool:
    """An OTLP resource of Megatron-LM: nemo-lens's run identity, or a nemo-lens scope
    with ``megatron.*`` spans."""
    if "nemo.lens.job_uuid" in resource or "nemo.lens.run_uuid" in resource:
        return True
    return scope.startswith("nemo.lens") and any(n.startswith("megatron.") for n in names)


SOURCE = Source(
    name="megatron",
    imported_from="megatron",
    reads=frozenset({"traces"}),
    translator=MegatronTranslator,
    matches=_matches,
    doc="sources/megatron.md",
    checked="Megatron-LM main d98e8a64dd (2026-08-22), nemo-lens 0.1.0, "
            "opentelemetry-sdk 1.45.2",
    export_delay_ms=EXPORT_DELAY_MS,
)
