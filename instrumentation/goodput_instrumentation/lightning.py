"""Goodput instrumentation for PyTorch Lightning (``lightning.pytorch`` and ``pytorch_lightning``).

When the training script imports Lightning (either package), this instrumentor

- adds a :class:`GoodputCallback` in front of every ``Trainer``'s callbacks
  (patch of ``Trainer.__init__``; not when one is there already), which records
  ``accelerator_init`` (``setup`` -> ``on_fit_start``), ``training_prep``
  (``on_fit_start`` -> ``on_train_start``; the sanity check falls here), one
  ``step`` per optimizer step (``on_train_batch_start`` -> the
  ``on_train_batch_end`` at which ``trainer.global_step`` went up, numbered with
  the new ``global_step``, so step *n* is the one after which *n* optimizer
  updates are done, as in the checkpoints), and evaluation as
  ``custom_badput`` ``eval`` (``on_validation_start/end`` and
  ``on_test_start/end``, not during the sanity check);
- records blocking ``data_loading`` around each training batch fetch (the
  fit loop's fetch-profiler hooks ``_TrainingEpochLoop._on_before_fetch`` /
  ``_on_after_fetch``, private; without them: the gap from
  ``on_train_batch_end`` to the next ``on_train_batch_start``);
- records ``checkpoint_save`` (blocking) around ``Trainer.save_checkpoint``
  (state dump, write, barrier) with ``trainer.global_step``; with
  ``AsyncCheckpointIO`` also the background write (``blocking=False``, same
  step) by queueing begin/end markers around the write on its one-thread
  executor (private ``_ensure_setup``/``_executor``);
- records ``checkpoint_restore`` around the checkpoint connector's
  ``_restore_modules_and_callbacks`` and ``restore_training_state`` (private)
  during ``fit``, with the restored checkpoint's ``global_step``.

While a fit runs, the callback claims ``step`` and ``data_loading`` so that the
PyTorch instrumentor's optimizer and DataLoader hooks stay quiet. Compilation
time is left to the PyTorch instrumentor. See ``docs/instrumentation/lightning.md``.
"""

from __future__ import annotations

import importlib
import logging
import time

from packaging.version import InvalidVersion, Version

from goodput import schema
from goodput_instrumentation._base import (
    GoodputInstrumentor,
    Patches,
    claim,
    guard,
    recorder,
    release,
    timed,
)

_log = logging.getLogger("goodput.instrumentation")
_time_ns = time.time_ns

#: Oldest Lightning release the hooks were written against (2.6.6 is tested).
MIN_VERSION = Version("2.0")

# Auto-added callbacks record only while the instrumentor is enabled.
_enabled = False
# The callback of the fit that runs now (for the fetch hooks); None outside a fit.
_current = None
# One Callback subclass per Lightning package (lightning.pytorch, pytorch_lightning).
_callback_classes: dict[str, type] = {}

_EVAL = {schema.ATTR_BADPUT_TYPE: "eval"}


class _GoodputHooks:
    """The recording logic of :class:`GoodputCallback`, independent of the Lightning package.

    Times are ``time.time_ns()`` values (ns since the epoch). Every hook is
    guarded: an error is counted on the recorder and never raised into Lightning.
    """

    def __init__(self, auto: bool = False) -> None:
        super().__init__()
        self._auto = auto  # added by the instrumentor: inert after uninstrument
        self._reset()

    def _reset(self) -> None:
        self._trainer = None
        self._setup_ns: int | None = None
        self._fit_start_ns: int | None = None
        self._step_t0: int | None = None  # start of the open step
        self._step_from: int = 0  # global_step when the open step began
        self._fetch_t0: int | None = None
        self._fetch_end: int | None = None  # end of the fetch of the coming batch
        self._batch_end: int | None = None  # for the gap fallback of data loading
        self._eval_t0: int | None = None
        self._claimed = False

    @property
    def _on(self) -> bool:
        return _enabled or not self._auto

    # --- fit lifecycle -------------------------------------------------------

    @guard(where="lightning setup")
    def setup(self, trainer, pl_module, stage) -> None:
        if self._on and str(getattr(stage, "value", stage)) == "fit":
            self._reset()
            self._trainer = trainer
            self._setup_ns = _time_ns()

    @guard(where="lightning on_fit_start")
    def on_fit_start(self, trainer, pl_module) -> None:
        global _current
        if not self._on:
            return
        now = _time_ns()
        if self._trainer is not trainer:  # setup() not seen (callback added late)
            self._reset()
            self._trainer = trainer
        if self._setup_ns is not None:
            recorder().record(schema.ACCELERATOR_INIT, self._setup_ns, now)
            self._setup_ns = None
        self._fit_start_ns = now
        _current = self
        claim("step", self)
        claim("data_loading", self)
        self._claimed = True

    @guard(where="lightning on_train_start")
    def on_train_start(self, trainer, pl_module) -> None:
        if self._fit_start_ns is not None:
            recorder().record(schema.TRAINING_PREP, self._fit_start_ns, _time_ns())
            self._fit_start_ns = None
        self._batch_end = None
        self._fetch_end = None

    @guard(where="lightning on_fit_end")
    def on_fit_end(self, trainer, pl_module) -> None:
        self._end_fit()

    @guard(where="lightning on_exception")
    def on_exception(self, trainer, pl_module, exception) -> None:
        self._end_fit()

    @guard(where="lightning teardown")
    def teardown(self, trainer, pl_module, stage) -> None:
        if str(getattr(stage, "value", stage)) == "fit":
            self._end_fit()

    def _end_fit(self) -> None:
        global _current
        self._step_t0 = None  # a step cut short by an exception is not recorded
        self._fit_start_ns = None
        self._setup_ns = None
        if _current is self:
            _current = None
        if self._claimed:
            self._claimed = False
            release("step", self)
            release("data_loading", self)

    # --- steps and data loading ------------------------------------------------

    @guard(where="lightning on_train_batch_start")
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if _current is not self:
            return
        now = _time_ns()
        if self._step_t0 is None:  # not inside a gradient-accumulation window
            self._step_t0 = self._fetch_end if self._fetch_end is not None else now
            self._step_from = trainer.global_step
        if self._batch_end is not None and not _fetch_hooks:
            recorder().record(schema.DATA_LOADING, self._batch_end, now)
        self._batch_end = None
        self._fetch_end = None

    @guard(where="lightning on_train_batch_end")
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if _current is not self:
            return
        now = _time_ns()
        self._batch_end = now
        step = trainer.global_step
        if self._step_t0 is not None and step > self._step_from:
            recorder().record(schema.STEP, self._step_t0, now, {schema.ATTR_STEP: step})
            self._step_t0 = None

    def _fetch_begin(self) -> None:
        self._fetch_t0 = _time_ns()

    def _fetch_done(self) -> None:
        t0 = self._fetch_t0
        if t0 is not None:
            self._fetch_t0 = None
            now = _time_ns()
            recorder().record(schema.DATA_LOADING, t0, now)
            self._fetch_end = now

    # --- evaluation -------------------------------------------------------------

    def _eval_start(self, trainer) -> None:
        if self._on and not trainer.sanity_checking:
            self._eval_t0 = _time_ns()

    def _eval_end(self) -> None:
        if self._eval_t0 is not None:
            recorder().record(schema.CUSTOM_BADPUT, self._eval_t0, _time_ns(), _EVAL)
            self._eval_t0 = None
            # the next data-loading gap must not include the evaluation
            self._batch_end = None

    @guard(where="lightning on_validation_start")
    def on_validation_start(self, trainer, pl_module) -> None:
        self._eval_start(trainer)

    @guard(where="lightning on_validation_end")
    def on_validation_end(self, trainer, pl_module) -> None:
        self._eval_end()

    @guard(where="lightning on_test_start")
    def on_test_start(self, trainer, pl_module) -> None:
        self._eval_start(trainer)

    @guard(where="lightning on_test_end")
    def on_test_end(self, trainer, pl_module) -> None:
        self._eval_end()


# Set when the fit loop's fetch hooks are patched (data loading = the fetch itself).
_fetch_hooks = False


def callback_class(package: str = "lightning.pytorch") -> type:
    """The ``GoodputCallback`` class for a Lightning package (imports it).

    Args:
        package: ``"lightning.pytorch"`` or ``"pytorch_lightning"``.

    Returns:
        A subclass of that package's ``Callback``; instances record the phases
        listed in this module's docstring. Add one to ``Trainer(callbacks=[...])``
        yourself to record steps without :func:`goodput.instrument` (checkpoint
        save/restore and the exact data-loading time need the instrumentor).

    Raises:
        ImportError: the package is not installed.
    """
    cls = _callback_classes.get(package)
    if cls is None:
        base = importlib.import_module(package).Callback
        name = next(k for k, v in _CLASS_NAMES.items() if v == package)
        cls = type(name, (_GoodputHooks, base), {
            "__module__": __name__,
            "__doc__": "Records goodput phases of a Lightning ``Trainer`` (see the module doc).",
        })
        _callback_classes[package] = cls
    return cls


# Class name -> package; the names are module attributes (below), so callbacks pickle.
_CLASS_NAMES = {"GoodputCallback": "lightning.pytorch",
                "GoodputCallbackPL": "pytorch_lightning"}


def __getattr__(name: str):
    # ``from goodput_instrumentation.lightning import GoodputCallback`` imports lightning.pytorch
    # then, not before (nothing of Lightning is imported when this module is).
    if name in _CLASS_NAMES:
        return callback_class(_CLASS_NAMES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- module-level hook bodies (guarded; the framework call stays outside) -------


@guard(where="lightning Trainer.__init__")
def _add_callback(trainer, package: str) -> None:
    if not _enabled:
        return
    callbacks = trainer.callbacks
    if any(isinstance(cb, _GoodputHooks) for cb in callbacks):
        return  # the user added one already
    callbacks.insert(0, callback_class(package)(auto=True))


@guard(where="lightning fetch begin")
def _fetch_begin(loop) -> None:
    cb = _current
    if cb is not None and cb._trainer is loop.trainer:
        cb._fetch_begin()


@guard(where="lightning fetch end")
def _fetch_done(loop) -> None:
    cb = _current
    if cb is not None and cb._trainer is loop.trainer:
        cb._fetch_done()


def _record_save(t0: int, t1: int, error, out, args, kwargs) -> None:
    trainer = args[0]
    if _enabled:
        attrs = {schema.ATTR_CHECKPOINT_STEP: int(trainer.global_step), schema.ATTR_BLOCKING: True}
        rec = recorder()
        rec.record(schema.CHECKPOINT_SAVE, t0, t1, attrs, error)
        rec.request_sync()


def _checkpoint_step(checkpoint) -> int | None:
    step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
    return int(step) if isinstance(step, int) else None


class _AsyncWrite:
    """Begin/end markers queued around one background write of ``AsyncCheckpointIO``."""

    __slots__ = ("step", "t0")

    def __init__(self, step: int) -> None:
        self.step = step
        self.t0: int | None = None

    @guard(where="lightning async write begin")
    def begin(self) -> None:
        self.t0 = _time_ns()

    @guard(where="lightning async write end")
    def end(self) -> None:
        if self.t0 is not None:
            attrs = {schema.ATTR_CHECKPOINT_STEP: self.step, schema.ATTR_BLOCKING: False}
            rec = recorder()
            rec.record(schema.CHECKPOINT_SAVE, self.t0, _time_ns(), attrs)
            rec.request_sync()


@guard(where="lightning async save (queue begin)")
def _queue_async_begin(io, args, kwargs) -> _AsyncWrite | None:
    if not _enabled:
        return None
    step = _checkpoint_step(kwargs["checkpoint"] if "checkpoint" in kwargs else
                            (args[0] if args else None))
    if step is None:
        return None
    io._ensure_setup()
    executor = io._executor
    if getattr(executor, "_max_workers", None) != 1:
        return None  # markers are ordered around the write only with one worker
    write = _AsyncWrite(step)
    executor.submit(write.begin)
    return write


@guard(where="lightning async save (queue end)")
def _queue_async_end(io, write: _AsyncWrite) -> None:
    io._executor.submit(write.end)


def _record_restore(t0: int, t1: int, error, out, args, kwargs) -> None:
    connector = args[0]
    if not _enabled:
        return
    trainer = connector.trainer
    if str(getattr(trainer.state.fn, "value", trainer.state.fn)) != "fit":
        return  # validate/test/predict loading weights is no resume
    step = _checkpoint_step(connector._loaded_checkpoint)
    if step is not None:
        recorder().record(schema.CHECKPOINT_RESTORE, t0, t1,
                          {schema.ATTR_CHECKPOINT_STEP: step}, error)


# --- patch builders ---------------------------------------------------------------


def _wrap_init(orig, package: str):
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        _add_callback(self, package)

    __init__.__wrapped__ = orig
    __init__.__name__ = orig.__name__
    __init__.__qualname__ = orig.__qualname__
    __init__.__doc__ = orig.__doc__
    return __init__


def _wrap_save(orig):
    return timed(orig, _record_save, "lightning save_checkpoint")


def _wrap_async_save(orig):
    def save_checkpoint(self, *args, **kwargs):
        write = _queue_async_begin(self, args, kwargs)
        result = orig(self, *args, **kwargs)
        if write is not None:
            _queue_async_end(self, write)
        return result

    save_checkpoint.__wrapped__ = orig
    save_checkpoint.__doc__ = orig.__doc__
    return save_checkpoint


def _wrap_restore(orig):
    return timed(orig, _record_restore, "lightning checkpoint restore")


def _wrap_fetch(orig, hook):
    def fetch_hook(self):
        hook(self)
        return orig(self)

    fetch_hook.__wrapped__ = orig
    fetch_hook.__name__ = orig.__name__
    return fetch_hook


def _wrap_fetch_after(orig, hook):
    def fetch_hook(self):
        result = orig(self)
        hook(self)
        return result

    fetch_hook.__wrapped__ = orig
    fetch_hook.__name__ = orig.__name__
    return fetch_hook


def _private(module_name: str, qualname: str, *attrs: str):
    """A private Lightning class that has all ``attrs``, or None (with a warning)."""
    try:
        cls = getattr(importlib.import_module(module_name), qualname)
    except (ImportError, AttributeError):
        cls = None
    if cls is None or not all(callable(getattr(cls, a, None)) for a in attrs):
        _log.warning("goodput: %s.%s(%s) not found in this Lightning version: that hook is "
                     "skipped", module_name, qualname, ", ".join(attrs))
        return None
    return cls


class LightningInstrumentor(GoodputInstrumentor):
    """Records goodput phases of Lightning ``Trainer`` runs; see the module docstring.

    Enable with ``goodput.instrument()`` (or ``["lightning"]``), or
    ``opentelemetry-instrument python train.py``. Patches each of
    ``lightning.pytorch`` and ``pytorch_lightning`` when it is imported
    (Lightning >= 2.0; 2.6.6 tested); ``uninstrument()`` restores every patched
    attribute, and callbacks it added to existing Trainers stop recording.
    """

    modules = ("lightning.pytorch", "pytorch_lightning")
    # Either distribution may be the one installed: the version is checked in _patch.
    requirements = ()

    def __init__(self) -> None:
        super().__init__()
        if not hasattr(self, "_patches"):
            self._patches = Patches()

    def _patch(self, module) -> None:
        global _enabled, _fetch_hooks
        pkg = module.__name__
        version = getattr(module, "__version__", "0")
        try:
            too_old = Version(version) < MIN_VERSION
        except InvalidVersion:
            too_old = True
        if too_old:
            _log.warning("goodput: %s %s not instrumented: needs >= %s", pkg, version,
                         MIN_VERSION)
            return
        _enabled = True
        p = self._patches
        trainer_cls = module.Trainer
        p.set(trainer_cls, "__init__", _wrap_init(trainer_cls.__init__, pkg))
        p.set(trainer_cls, "save_checkpoint", _wrap_save(trainer_cls.save_checkpoint))

        loop = _private(f"{pkg}.loops.training_epoch_loop", "_TrainingEpochLoop",
                        "_on_before_fetch", "_on_after_fetch")
        if loop is not None:
            p.set(loop, "_on_before_fetch", _wrap_fetch(loop._on_before_fetch, _fetch_begin))
            p.set(loop, "_on_after_fetch", _wrap_fetch_after(loop._on_after_fetch, _fetch_done))
            _fetch_hooks = True

        conn = _private(f"{pkg}.trainer.connectors.checkpoint_connector", "_CheckpointConnector",
                        "_restore_modules_and_callbacks", "restore_training_state")
        if conn is not None:
            for name in ("_restore_modules_and_callbacks", "restore_training_state"):
                p.set(conn, name, _wrap_restore(getattr(conn, name)))

        aio = _private(f"{pkg}.plugins.io.async_plugin", "AsyncCheckpointIO",
                       "save_checkpoint", "_ensure_setup")
        if aio is not None:
            p.set(aio, "save_checkpoint", _wrap_async_save(aio.save_checkpoint))

    def _unpatch(self) -> None:
        global _enabled, _fetch_hooks, _current
        _enabled = False
        _fetch_hooks = False
        if _current is not None:
            _current._end_fit()
        _current = None
        self._patches.undo()


__all__ = ["LightningInstrumentor", "callback_class"]
