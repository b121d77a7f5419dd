"""Goodput instrumentation for Orbax: checkpoint save (blocking and background) and restore.

Enabled by ``goodput_instrumentation.instrument()`` (or ``opentelemetry-instrument``);
nothing is patched until the training script imports ``orbax.checkpoint``. Then
``orbax.checkpoint.CheckpointManager.__init__`` gets a logger of ours in front
of the user's ``logger=`` (or of Orbax's default ``StandardLogger``), which
sees the statistics dictionary Orbax logs for every save and restore:

- ``event_type='save'``: one ``goodput.checkpoint_save`` span with
  ``goodput.blocking=True`` and the step, from
  ``checkpoint_manager_blocking_start_time`` over
  ``checkpoint_manager_blocking_duration_secs`` (seconds): the time
  ``CheckpointManager.save`` kept the training loop waiting, including the wait
  for the previous save. The spool is written and fsynced right after.
- the asynchronous background write of that save: a second span with
  ``goodput.blocking=False`` and the same checkpoint step, from the end of the
  blocking part to Orbax's ``/jax/orbax/write/async/total_duration_secs``
  ``jax.monitoring`` event (the checkpoint is committed then). That event
  carries no step, so it is paired with the oldest save still in flight (Orbax
  runs one save per manager at a time).
- ``event_type='restore'`` (and ``'emergency_restore'``): a
  ``goodput.checkpoint_restore`` span with the restored step, from
  ``checkpoint_manager_start_time`` over ``checkpoint_manager_duration_secs``.

Synchronous saves (``enable_async_checkpointing=False``) give only the blocking
span. ``docs/instrumentation/orbax.md`` has the details and caveats.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections import deque

from goodput import schema
from goodput_instrumentation._base import GoodputInstrumentor, Patches, guard, recorder

_log = logging.getLogger("goodput.instrumentation.orbax")

#: ``jax.monitoring`` duration event Orbax records when an async save is committed.
ASYNC_DONE_EVENT = "/jax/orbax/write/async/total_duration_secs"
#: Saves in flight remembered for pairing (a host that never sees the event forgets old ones).
_MAX_PENDING = 16

_time_ns = time.time_ns


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class OrbaxInstrumentor(GoodputInstrumentor):
    """Records Orbax ``CheckpointManager`` saves (blocking + background) and restores."""

    modules = ("orbax.checkpoint",)
    requirements = ("orbax-checkpoint >= 0.5.0",)

    def __init__(self) -> None:
        super().__init__()
        if not hasattr(self, "_patches"):
            self._patches = Patches()
            self._enabled = False
            self._listener = None
            self._unregister = None
            self._pair_lock = threading.Lock()
            # (checkpoint step, background start ns) of async saves not yet committed
            self._in_flight: deque[tuple[int, int]] = deque(maxlen=_MAX_PENDING)
            # commit times (ns) seen before their save's log entry (a very fast write)
            self._early: deque[int] = deque(maxlen=_MAX_PENDING)

    # --- patching -----------------------------------------------------------

    def _patch(self, module) -> None:
        import jax.monitoring as monitoring
        from orbax.checkpoint import CheckpointManager
        from orbax.checkpoint.logging import AbstractLogger, StandardLogger

        logger_cls = _make_logger_class(AbstractLogger, StandardLogger)
        orig_init = CheckpointManager.__init__
        sig = inspect.signature(orig_init)
        if "logger" not in sig.parameters:
            raise RuntimeError("CheckpointManager.__init__ has no logger= parameter")
        inst = self

        @functools.wraps(orig_init)
        def __init__(self, *args, **kwargs):
            args, kwargs = inst._with_logger(sig, logger_cls, self, args, kwargs)
            orig_init(self, *args, **kwargs)

        self._patches.set(CheckpointManager, "__init__", __init__)
        monitoring.register_event_duration_secs_listener(self._on_duration)
        self._listener = self._on_duration
        self._unregister = getattr(monitoring, "unregister_event_duration_listener", None)
        self._enabled = True

    def _unpatch(self) -> None:
        self._enabled = False
        self._patches.undo()
        if self._listener is not None:
            listener, self._listener = self._listener, None
            try:
                if self._unregister is not None:
                    self._unregister(listener)
                else:  # JAX without unregister_*: the private list
                    from jax._src import monitoring

                    if listener in monitoring._event_duration_secs_listeners:
                        monitoring._event_duration_secs_listeners.remove(listener)
            except Exception as exc:  # noqa: BLE001
                _log.warning("goodput: could not remove the orbax listener: %r", exc)
        with self._pair_lock:
            self._in_flight.clear()
            self._early.clear()

    def _with_logger(self, sig, logger_cls, manager, args, kwargs):
        """``(args, kwargs)`` with our logger wrapped around the user's (unchanged on error)."""
        try:
            bound = sig.bind(manager, *args, **kwargs)
        except TypeError:
            return args, kwargs  # let the original raise its own error
        try:
            user = bound.arguments.get("logger")
            if isinstance(user, logger_cls):
                return args, kwargs
            bound.arguments["logger"] = logger_cls(self, user)
            return bound.args[1:], bound.kwargs
        except Exception as exc:  # noqa: BLE001
            from goodput_instrumentation._base import report_error

            report_error("CheckpointManager.__init__ hook", exc)
            return args, kwargs

    # --- hooks --------------------------------------------------------------

    @guard(where="orbax checkpoint logger")
    def _on_entry(self, entry) -> None:
        if not self._enabled or not isinstance(entry, dict):
            return
        kind = entry.get("event_type")
        if kind == "save":
            self._on_save(entry)
        elif kind in ("restore", "emergency_restore"):
            start = entry["checkpoint_manager_start_time"]
            duration = entry["checkpoint_manager_duration_secs"]
            t0 = _ns(start)
            recorder().record(schema.CHECKPOINT_RESTORE, t0, t0 + _ns(duration),
                              {schema.ATTR_CHECKPOINT_STEP: int(entry["step"])})

    def _on_save(self, entry: dict) -> None:
        step = int(entry["step"])
        t0 = _ns(entry["checkpoint_manager_blocking_start_time"])
        t1 = t0 + _ns(entry["checkpoint_manager_blocking_duration_secs"])
        rec = recorder()
        rec.record(schema.CHECKPOINT_SAVE, t0, t1,
                   {schema.ATTR_CHECKPOINT_STEP: step, schema.ATTR_BLOCKING: True})
        if not entry.get("synchronous", False):
            done = None
            with self._pair_lock:
                while self._early and self._early[0] < t0:
                    self._early.popleft()  # a commit of something older: not this save
                if self._early:
                    done = self._early.popleft()
                else:
                    self._in_flight.append((step, t1))
            if done is not None:
                self._record_background(step, t1, done)
        rec.request_sync()

    @guard(where="orbax jax.monitoring listener")
    def _on_duration(self, event, duration_secs, **kwargs) -> None:
        if event != ASYNC_DONE_EVENT or not self._enabled:
            return
        now = _time_ns()
        with self._pair_lock:
            if not self._in_flight:
                self._early.append(now)
                return
            step, start = self._in_flight.popleft()
        self._record_background(step, start, now)

    def _record_background(self, step: int, start: int, end: int) -> None:
        rec = recorder()
        rec.record(schema.CHECKPOINT_SAVE, start, max(start, end),
                   {schema.ATTR_CHECKPOINT_STEP: step, schema.ATTR_BLOCKING: False})
        rec.request_sync()


def _make_logger_class(abstract, standard):
    """An Orbax ``AbstractLogger`` that records goodput spans, then logs to the user's logger."""

    class GoodputOrbaxLogger(abstract):
        """Sends each Orbax statistics entry to goodput, then to ``inner``.

        ``inner`` is the ``logger=`` the user gave ``CheckpointManager`` (Orbax's
        ``StandardLogger`` when none was given, as Orbax itself does).
        """

        def __init__(self, instrumentor: OrbaxInstrumentor, inner=None):
            self.goodput_instrumentor = instrumentor
            self.inner = inner if inner is not None else standard()

        def log_entry(self, entry, *args, **kwargs):
            self.goodput_instrumentor._on_entry(entry)
            return self.inner.log_entry(entry, *args, **kwargs)

    return GoodputOrbaxLogger
