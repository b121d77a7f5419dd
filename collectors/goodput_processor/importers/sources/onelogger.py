"""NVIDIA one-logger's OpenTelemetry spans, read as goodput spans.

Checked against ``nv-one-logger-core``, ``-otel``, ``-training-telemetry`` and
``-pytorch-lightning-integration`` 2.3.1 with Lightning 2.5.6 (``hook_trainer_cls``) and
opentelemetry-sdk 1.45.2, by running a real Lightning training on CPU
(``tests/data/sources/onelogger/``); ``docs/sources/onelogger.md`` has the worked example.

What one-logger's ``OTelExporter`` sends (scope ``one_logger``; one ``TracerProvider`` per
process, so ``service.instance.id`` names the process incarnation):

- real spans, exported when they end: ``application``, ``distributed_code_initialization``,
  ``model_initialization``, ``data_loader_initialization``, ``optimizer_initialization``,
  ``checkpoint_load``, ``training_loop``, ``validation_loop``, ``testing_loop``,
  ``checkpoint_save_sync``/``_async``/``_finalization`` (attribute ``current_iteration``:
  the global step saved);
- each event twice: as an OTel event of its span (sent only when that span ends) and as a
  zero-length span ``<event>_event_for_<span>`` sent at once. Those event spans carry what
  matters: ``span_start_event_for_application`` (the attempt's start),
  ``one_logger_initialization_event_for_application`` (``session_tag``, ``rank``,
  ``world_size``, ``node_name``: the only place the rank appears),
  ``training_metrics_update_event_for_training_loop`` every ``log_every_n_train_iterations``
  steps (``train_iterations_start``, ``num_iterations`` since the loop began,
  ``last_logged_train_iterations_finish_timestamp_sec``), ``span_stop_event_for_application``.

The mapping (``goodput.*`` spans of ``docs/span-schema.md``):

================================  ==========================================================
one-logger                         goodput
================================  ==========================================================
application start event            ``job_start`` (attempt start)
application stop event             ``job_end`` (``explicit``; ``exception`` if it errored)
distributed_code_initialization    ``accelerator_init``
model/data_loader/optimizer init   ``training_prep``
checkpoint_load                    ``checkpoint_restore`` (no step: the resume step is told
                                   by the first step stretch, ``train_iterations_start``)
checkpoint_save_sync               ``checkpoint_save`` blocking, ``checkpoint.step``
checkpoint_save_async              ``checkpoint_save`` blocking (one-logger: the time the
                                   training loop was blocked to start the async save)
checkpoint_save_finalization       ``checkpoint_save`` non-blocking (the background write)
validation_loop / testing_loop     ``custom_badput`` ``eval`` / ``test``
training_metrics_update            ``step`` with ``goodput.step.count``: from the previous
                                   update's last step end (the first: from the training
                                   loop's start) to this one's, ending at step
                                   ``train_iterations_start + num_iterations``
================================  ==========================================================

Buckets it can show: productive (per stretch of ``log_every_n_train_iterations`` steps),
accelerator init, training prep, checkpoint save (sync; async trigger and background
write), checkpoint restore, ``custom:eval``/``custom:test``, wasted progress and
infrastructure recovery (attempts are process incarnations: a new ``service.instance.id``
with the same ``service.name`` and ``session_tag``). Recovery phases: the restart gap and
the restore; nothing of a launcher (one-logger sees no scheduler or rendezvous).

It cannot show: data loading and per-step times (per-iteration spans are off by default),
program startup (compilation) apart from steps, the process's start before
``on_app_start`` (imports: they fall in infrastructure recovery), slowdown of single steps
(a stretch is judged by its time per step).

What a SIGKILL loses: the open ``application``/``training_loop`` spans and whatever the
``BatchSpanProcessor`` still queued: up to ``OTEL_BSP_SCHEDULE_DELAY`` (5 s by default) of
records, plus the steps since the last ``training_metrics_update``. The attempt then ends at
its last exported record (the processor's rule for a killed process), so the lost tail
moves from wasted progress to infrastructure recovery and its steps are not counted; the
translator names it ``onelogger_tail_lost`` (a process incarnation without an application
end: at the next incarnation of the same job and rank, or at the end of the input).
one-logger's span ids are not used: Lightning re-seeds Python's ``random`` (which the OTel
SDK draws ids from), so they repeat within a process under DDP and across restarts.
Other warnings: ``onelogger_no_session`` (no initialization event: the job is the
``service.name`` alone and the rank 0).
"""

from __future__ import annotations

from goodput import schema

from .base import Emitter, ForeignSpan, Source, Translator

__all__ = ["OneLoggerTranslator", "SOURCE"]

SCOPE = "one_logger"
_EV = "_event_for_"
#: Records held for a process before its initialization event, at most.
_MAX_PENDING = 4096

_SPAN_MAP = {
    "distributed_code_initialization": (schema.ACCELERATOR_INIT, {}),
    "model_initialization": (schema.TRAINING_PREP, {}),
    "data_loader_initialization": (schema.TRAINING_PREP, {}),
    "optimizer_initialization": (schema.TRAINING_PREP, {}),
    "checkpoint_load": (schema.CHECKPOINT_RESTORE, {}),
    "checkpoint_save_sync": (schema.CHECKPOINT_SAVE, {schema.ATTR_BLOCKING: True}),
    "checkpoint_save_async": (schema.CHECKPOINT_SAVE, {schema.ATTR_BLOCKING: True}),
    "checkpoint_save_finalization": (schema.CHECKPOINT_SAVE,
                                     {schema.ATTR_BLOCKING: False}),
    "validation_loop": (schema.CUSTOM_BADPUT, {schema.ATTR_BADPUT_TYPE: "eval",
                                                    schema.ATTR_BLOCKING: True}),
    "testing_loop": (schema.CUSTOM_BADPUT, {schema.ATTR_BADPUT_TYPE: "test",
                                                 schema.ATTR_BLOCKING: True}),
}
_SAVES = ("checkpoint_save_sync", "checkpoint_save_async", "checkpoint_save_finalization")


def _sec_ns(v) -> int | None:
    try:
        return int(round(float(v) * 1e9))
    except (TypeError, ValueError):
        return None


class _Proc:
    """One one-logger process incarnation (one ``service.instance.id``)."""

    __slots__ = ("service", "key", "job", "pending", "ended", "errored", "fake_events",
                 "loop_start", "prev", "where")

    def __init__(self, service: str):
        self.service = service
        self.key: str | None = None  # the emitter's key, once the job is known
        self.job: str | None = None
        self.pending: list = []  # (kind, args) held until the initialization event
        self.ended = False
        self.errored = False  # an error event of the application span was seen
        self.fake_events = False  # event spans seen: the spans' own events are copies
        self.loop_start: int | None = None
        self.prev: tuple | None = None  # (num_iterations, end ns) of the last update
        self.where = ""


class OneLoggerTranslator(Translator):
    """one-logger's spans (OTLP, scope ``one_logger``) -> goodput spans; see the module."""

    def __init__(self, emitter: Emitter, problems=None):
        super().__init__(emitter, problems)
        self._procs: dict[str, _Proc] = {}
        self._incarnations: dict[tuple, list[_Proc]] = {}

    # --- input ------------------------------------------------------------------------------

    def spans(self, resource: dict, scope: str, spans: list[ForeignSpan], where: str) -> None:
        service = str(resource.get(schema.RES_SERVICE_NAME) or "unknown_service")
        for s in spans:
            inst = resource.get(schema.RES_SERVICE_INSTANCE_ID) or ("trace:" + s.trace_id)
            p = self._procs.get(inst)
            if p is None:
                p = self._procs[inst] = _Proc(service)
            p.where = where
            try:
                self._span(p, str(inst), s, where)
            except (TypeError, ValueError, KeyError) as e:
                self.problems.add(where, "malformed", f"one-logger span {s.name!r}: {e!r}")

    def forget(self, job: str) -> None:
        """Drop what is kept for ``job`` (``goodput serve`` retired it)."""
        every = getattr(self.emit, "job", None) == job  # --job NAME: every process is it
        for inst in [i for i, p in self._procs.items()
                     if p.job == job or (every and p.key is not None)]:
            del self._procs[inst]
        for k in [k for k in self._incarnations if k[0] == job or every]:
            del self._incarnations[k]
        super().forget(job)

    def finish(self) -> None:
        for inst, p in self._procs.items():
            if p.key is None and p.pending:
                self._name(p, inst, {})
                self.warn("onelogger_no_session")
            if p.key is not None and not p.ended:
                p.ended = True
                self.warn("onelogger_tail_lost")

    # --- one span ---------------------------------------------------------------------------

    def _span(self, p: _Proc, inst: str, s: ForeignSpan, where: str) -> None:
        if _EV in s.name:
            p.fake_events = True
            event, _, parent = s.name.partition(_EV)
            self._event(p, inst, event, parent, s.start_ns, s.attrs, s.error)
            return
        if s.error and s.name.endswith("_for_application"):
            p.errored = True  # OTelExporter.export_error: "<error>_for_application"
        if not p.fake_events:  # a producer without the event spans: the span's own events
            for event, t, attrs in s.events:
                self._event(p, inst, event, s.name, t, attrs, s.error)
        mapped = _SPAN_MAP.get(s.name)
        if mapped is None:
            return  # application, training_loop: evidence only; others: not goodput
        name, attrs = mapped
        attrs = dict(attrs)
        if s.name in _SAVES and s.attrs.get("current_iteration") is not None:
            attrs[schema.ATTR_CHECKPOINT_STEP] = int(s.attrs["current_iteration"])
        self._out(p, inst, (name, s.start_ns, s.end_ns, attrs, s.error))

    def _event(self, p: _Proc, inst: str, event: str, parent: str, t: int, attrs: dict,
               error: bool) -> None:
        if parent == "application":
            if event == "span_start":
                self._out(p, inst, (schema.JOB_START, t, t, {}, False))
            elif event == "one_logger_initialization":
                self._name(p, inst, attrs)
            elif event == "span_stop":
                p.ended = True
                reason = "exception" if error or p.errored else "explicit"
                self._out(p, inst, (schema.JOB_END, t, t,
                                    {schema.ATTR_END_REASON: reason}, False))
            return
        if parent != "training_loop":
            return
        if event == "span_start":
            p.loop_start, p.prev = t, None
        elif event == "training_metrics_update":
            self._update(p, inst, t, attrs)

    def _update(self, p: _Proc, inst: str, t: int, attrs: dict) -> None:
        """A ``training_metrics_update``: one ``goodput.step`` over the steps since the last."""
        done = int(attrs["num_iterations"])
        step = int(attrs.get("train_iterations_start") or 0) + done
        end = _sec_ns(attrs.get("last_logged_train_iterations_finish_timestamp_sec")) or t
        if p.prev is not None:
            count, start = done - p.prev[0], p.prev[1]
        else:
            count, start = done, p.loop_start
            if start is None:  # the loop's start event lost: back from the mean step time
                mean = _sec_ns(attrs.get("avg_iteration_time_sec")) or 0
                start = end - mean * done
        if count <= 0:
            return  # the same update again (or out of order): nothing new
        p.prev = (done, end)
        attrs_out = {schema.ATTR_STEP: step}
        if count != 1:
            attrs_out[schema.ATTR_STEP_COUNT] = count
        self._out(p, inst, (schema.STEP, start, end, attrs_out, False))

    # --- processes and output ---------------------------------------------------------------

    def _name(self, p: _Proc, inst: str, attrs: dict) -> None:
        """Name the emitter's process from the initialization event's ``attrs``."""
        if p.key is not None:
            return
        session = attrs.get("session_tag")
        job = p.service if session in (None, "") else (
            str(session) if p.service.startswith("unknown_service")
            else f"{p.service}/{session}")
        try:
            rank = int(attrs.get("rank") or 0)
            count = int(attrs.get("world_size") or 1)
        except (TypeError, ValueError):
            self.problems.add(p.where, "malformed", "one-logger rank/world_size not ints")
            rank, count = 0, 1
        seen = self._incarnations.setdefault((job, rank), [])
        for old in seen:
            if not old.ended:  # an older incarnation never ended: killed, its tail lost
                old.ended = True
                self.warn("onelogger_tail_lost")
        node = attrs.get("node_name")
        p.key = self.emit.process(
            "onelogger\0" + inst, job=job, rank=rank, count=count, attempt=len(seen),
            host=str(node) if node else None, extra={"onelogger.session_tag": session}
            if session else None)
        seen.append(p)
        p.job = job
        pending, p.pending = p.pending, []
        for item in pending:
            self._out(p, inst, item)

    def _out(self, p: _Proc, inst: str, item: tuple) -> None:
        if p.key is None:
            p.pending.append(item)
            if len(p.pending) > _MAX_PENDING:
                self._name(p, inst, {})
                self.warn("onelogger_no_session")
            return
        name, start, end, attrs, error = item
        # The emitter's own id (a hash of process, name, times, step), not one-logger's:
        # its span ids repeat within a process once Lightning re-seeds Python's ``random``
        # (``seed_everything``; DDP re-seeds at setup), which the OTel SDK's id generator
        # draws from; a resent record still gets the same id.
        self.emit.span(p.key, name, start, end, attrs, error=error)


def _matches(resource: dict, scope: str, names) -> bool:
    return scope == SCOPE


SOURCE = Source(
    name="onelogger", imported_from="onelogger", reads=frozenset({"traces"}),
    translator=OneLoggerTranslator, matches=_matches, doc="sources/onelogger.md",
    checked="nv-one-logger-* 2.3.1 (core, otel, training-telemetry, "
            "pytorch-lightning-integration), lightning 2.5.6, opentelemetry-sdk 1.45.2",
    export_delay_ms=5000)  # the OTel BatchSpanProcessor's default OTEL_BSP_SCHEDULE_DELAY
