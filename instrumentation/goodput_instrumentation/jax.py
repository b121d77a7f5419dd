"""Goodput instrumentation for JAX: compilation, steps and accelerator start-up.

Enabled by ``goodput_instrumentation.instrument()`` (or ``opentelemetry-instrument``);
nothing is patched until the training script imports ``jax``. Then:

- **program startup**: a ``jax.monitoring`` time-span listener receives JAX's
  compile events (``/jax/core/compile/jaxpr_trace_duration``,
  ``.../jaxpr_to_mlir_module_duration``, ``.../backend_compile_duration``, each
  with its start and end). Events that overlap or lie at most
  :data:`MERGE_GAP_S` apart are merged into one ``goodput.program_startup``
  span; merged spans shorter than :data:`MIN_SPAN_S` are dropped and counted
  (:meth:`JaxInstrumentor.compile_stats`). A merged span is written when the
  next event does not touch it, at the next step start, at uninstrument or at
  interpreter exit.
- **steps**: ``jax.profiler.StepTraceAnnotation`` is replaced by a subclass
  whose ``__enter__`` marks the start of step ``step_num`` (plus the
  ``step_offset`` option, default 0). JAX dispatches asynchronously, so a
  step's time is the interval between two step starts; the last step stays open
  until the attempt ends. Annotations without ``step_num`` are not steps.
- **accelerator init**: ``jax.distributed.initialize`` is timed, and so is the
  first backend initialisation (the private ``jax._src.xla_bridge.backends``,
  whichever call comes first: ``jax.devices()``, the first array or jitted
  call). Nothing here calls into JAX's runtime itself: querying devices before
  ``jax.distributed.initialize`` would break multi-host start-up.

Every hook body is guarded: an error is counted on the recorder, never raised
into the training code (a ``jax.monitoring`` listener that raised would fail
the user's jitted call). ``docs/instrumentation/jax.md`` has the details.
"""

from __future__ import annotations

import atexit
import functools
import logging
import operator
import threading
import time

from goodput import schema
from goodput_instrumentation._base import GoodputInstrumentor, Patches, guard, recorder, timed

_log = logging.getLogger("goodput.instrumentation.jax")

#: JAX compile events (``jax._src.dispatch``) that become program startup.
COMPILE_EVENTS = frozenset({
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
})
#: Compile events at most this many seconds apart are merged into one span.
MERGE_GAP_S = 0.002
#: Merged program-startup spans shorter than this (seconds) are dropped and counted.
MIN_SPAN_S = 0.001

_time_ns = time.time_ns


class _CompileMerger:
    """Merges compile events (ns intervals, any order, any thread) into program-startup spans.

    ``holes`` are intervals (ns) that belong to another phase (accelerator init
    timed inside a compile event): they are cut out of the merged spans.
    """

    def __init__(self, gap_ns: int, min_ns: int):
        self.gap_ns = gap_ns
        self.min_ns = min_ns
        self.holes: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self._cur: tuple[int, int] | None = None
        self.events = 0
        self.spans = 0
        self.dropped = 0
        self.dropped_ns = 0

    def add(self, start_ns: int, end_ns: int) -> None:
        """Add one compile event; may write the previous merged span."""
        done = None
        with self._lock:
            self.events += 1
            cur = self._cur
            if cur is not None and start_ns <= cur[1] + self.gap_ns \
                    and end_ns >= cur[0] - self.gap_ns:
                self._cur = (min(cur[0], start_ns), max(cur[1], end_ns))
                return
            done, self._cur = cur, (start_ns, end_ns)
        if done is not None:
            self._emit(*done)

    def flush(self) -> None:
        """Write the merged span in progress, if any."""
        if self._cur is None:  # unlocked fast path (called at every step start)
            return
        with self._lock:
            done, self._cur = self._cur, None
        if done is not None:
            self._emit(*done)

    def _emit(self, start: int, end: int) -> None:
        rec = recorder()
        for s, e in _subtract(start, end, self.holes):
            if e - s < self.min_ns:
                self.dropped += 1
                self.dropped_ns += e - s
            else:
                self.spans += 1
                rec.record(schema.PROGRAM_STARTUP, s, e)

    def stats(self) -> dict:
        return {
            "events": self.events,
            "spans": self.spans,
            "dropped_spans": self.dropped,
            "dropped_s": self.dropped_ns / 1e9,
        }


def _subtract(start: int, end: int, holes) -> list[tuple[int, int]]:
    """``[start, end)`` minus the intervals in ``holes``, as a list of pieces (ns)."""
    pieces = [(start, end)]
    for hs, he in holes:
        out = []
        for s, e in pieces:
            if he <= s or hs >= e:
                out.append((s, e))
                continue
            if s < hs:
                out.append((s, hs))
            if he < e:
                out.append((he, e))
        pieces = out
    return pieces


def _step_number(step) -> int:
    """``step_num`` as an int, without forcing a device sync (jax arrays are refused)."""
    if type(step) is int:
        return step
    if type(step).__module__ == "numpy":
        return operator.index(step)
    raise TypeError(f"step_num of type {type(step).__name__} ignored: pass a Python int")


def _make_step_annotation(base, on_step):
    """A subclass of JAX's ``StepTraceAnnotation`` that calls ``on_step(step_num)`` on enter."""

    class StepTraceAnnotation(base):
        __doc__ = base.__doc__

        def __init__(self, name: str, **kwargs):
            super().__init__(name, **kwargs)
            self._goodput_step = kwargs.get("step_num")

        def __enter__(self):
            if self._goodput_step is not None:
                on_step(self._goodput_step)
            return super().__enter__()

    StepTraceAnnotation.__module__ = base.__module__
    StepTraceAnnotation.__qualname__ = base.__qualname__
    StepTraceAnnotation._goodput_original = base
    return StepTraceAnnotation


class JaxInstrumentor(GoodputInstrumentor):
    """Records JAX program startup (compilation), steps and accelerator init as goodput spans.

    Options (keyword arguments of ``instrument()``):
        step_offset (int, default 0): added to ``StepTraceAnnotation``'s
            ``step_num``. Goodput numbers step ``n`` as the step after which
            ``n`` updates are done (the checkpoint of step ``n`` holds its
            result); a loop that annotates with the step count *before* the
            update (``step_num=0`` for the first step) should pass 1.
    """

    modules = ("jax",)
    requirements = ("jax >= 0.4.30",)
    options = ("step_offset",)

    def __init__(self) -> None:
        super().__init__()
        if not hasattr(self, "_patches"):
            self._patches = Patches()
            self._listeners: list[tuple[object, object]] = []  # (unregister fn, listener)
            self._merger = _CompileMerger(round(MERGE_GAP_S * 1e9), round(MIN_SPAN_S * 1e9))
            self._step_offset = 0
            self._backend_init_pending = False
            self._exit_flush = False

    # --- public -------------------------------------------------------------

    def compile_stats(self) -> dict:
        """Program-startup bookkeeping since this process started.

        Returns:
            ``{"events": compile events seen, "spans": program_startup spans
            written, "dropped_spans": merged spans shorter than MIN_SPAN_S not
            written, "dropped_s": their total length in seconds}``.
        """
        return self._merger.stats()

    # --- patching -----------------------------------------------------------

    def _patch(self, module) -> None:
        self._step_offset = int(self._options.get("step_offset", 0))
        self._patch_monitoring(module)
        self._patch_steps(module)
        self._patch_accelerator_init(module)

    def _unpatch(self) -> None:
        self._flush()
        atexit.unregister(self._flush)
        self._exit_flush = False
        for unregister, listener in self._listeners:
            try:
                unregister(listener)
            except Exception as exc:  # noqa: BLE001
                _log.warning("goodput: could not remove a jax.monitoring listener: %r", exc)
        self._listeners.clear()
        self._backend_init_pending = False
        self._patches.undo()

    def _flush(self) -> None:
        try:
            self._merger.flush()
        except Exception as exc:  # noqa: BLE001
            recorder().error("goodput instrumentation: jax compile flush failed: %r", exc)

    def _patch_monitoring(self, jax) -> None:
        import jax.monitoring as monitoring

        register = getattr(monitoring, "register_event_time_span_listener", None)
        if register is not None:
            listener = self._on_time_span
            unregister = getattr(monitoring, "unregister_event_time_span_listener", None)
            private = "_event_time_span_listeners"
        else:  # older JAX: durations only, the event ends now
            register = monitoring.register_event_duration_secs_listener
            listener = self._on_duration
            unregister = getattr(monitoring, "unregister_event_duration_listener", None)
            private = "_event_duration_secs_listeners"
        if unregister is None:
            unregister = functools.partial(_remove_private_listener, private)
        register(listener)
        self._listeners.append((unregister, listener))

    @guard(where="jax.monitoring compile listener")
    def _on_time_span(self, event, start_time, end_time, **kwargs) -> None:
        if event in COMPILE_EVENTS:
            if not self._exit_flush:
                self._register_exit_flush()
            self._merger.add(int(start_time * 1e9), int(end_time * 1e9))

    @guard(where="jax.monitoring compile listener")
    def _on_duration(self, event, duration_secs, **kwargs) -> None:
        if event in COMPILE_EVENTS:
            if not self._exit_flush:
                self._register_exit_flush()
            end = _time_ns()
            self._merger.add(end - int(duration_secs * 1e9), end)

    def _register_exit_flush(self) -> None:
        # The recorder first (configured on first use, it registers its own exit
        # hook), then ours: atexit runs ours first, while the attempt is still open.
        recorder()
        atexit.register(self._flush)
        self._exit_flush = True

    def _patch_steps(self, jax) -> None:
        import jax.profiler as profiler

        base = getattr(profiler, "StepTraceAnnotation", None)
        if base is None:
            _log.warning("goodput: jax.profiler.StepTraceAnnotation missing: steps not recorded")
            return
        self._patches.set(profiler, "StepTraceAnnotation",
                          _make_step_annotation(base, self._on_step))

    @guard(where="StepTraceAnnotation.__enter__")
    def _on_step(self, step) -> None:
        at = _time_ns()
        self._merger.flush()
        recorder().step_start(_step_number(step) + self._step_offset, at)

    def _patch_accelerator_init(self, jax) -> None:
        import jax.distributed as distributed

        orig_init = getattr(distributed, "initialize", None)
        if orig_init is not None:
            self._patches.set(distributed, "initialize", self._wrap_distributed(orig_init))
        try:
            from jax._src import xla_bridge
        except ImportError:
            xla_bridge = None
        backends = getattr(xla_bridge, "backends", None)
        ready = getattr(xla_bridge, "backends_are_initialized", None)
        if backends is None or ready is None:
            _log.warning("goodput: jax._src.xla_bridge.backends not found: the first backend "
                         "initialisation is not timed (tested with jax 0.10.2)")
            return
        if ready():
            return  # already initialised before instrumenting: nothing left to time
        self._backend_init_pending = True
        self._patches.set(xla_bridge, "backends",
                          self._wrap_backends(xla_bridge, backends, ready))

    def _wrap_distributed(self, orig):
        return timed(orig, lambda t0, t1, err, out, args, kwargs: self._record_init(t0, t1, err),
                     "jax.distributed.initialize hook")

    def _wrap_backends(self, xla_bridge, orig, ready):
        @functools.wraps(orig)
        def backends():
            if not self._backend_init_pending:
                return orig()
            t0 = _time_ns()
            err = None
            try:
                return orig()
            except BaseException as exc:
                err = type(exc).__name__
                raise
            finally:
                self._backend_init_done(xla_bridge, backends, orig, ready, t0, err)

        return backends

    @guard(where="jax backend init hook")
    def _backend_init_done(self, xla_bridge, wrapper, orig, ready, t0, err) -> None:
        if not self._backend_init_pending or not ready():
            return  # failed (timed again on the next try) or another thread won
        self._backend_init_pending = False
        self._record_init(t0, _time_ns(), err)
        if getattr(xla_bridge, "backends", None) is wrapper:
            xla_bridge.backends = orig  # done: no cost on later calls

    @guard(where="jax accelerator init hook")
    def _record_init(self, t0: int, t1: int, err) -> None:
        self._merger.holes.append((t0, t1))
        recorder().record(schema.ACCELERATOR_INIT, t0, t1, None, err)


def _remove_private_listener(attr: str, listener) -> None:
    """Remove ``listener`` from ``jax._src.monitoring.<attr>`` (JAX without unregister_*)."""
    from jax._src import monitoring

    listeners = getattr(monitoring, attr)
    if listener in listeners:
        listeners.remove(listener)
