"""Goodput of a Hugging Face ``transformers.Trainer`` run, with no change to the training loop.

Enable it with ``goodput.instrument()`` (or ``opentelemetry-instrument python
train.py``). Nothing is imported or patched until the script imports
``transformers.trainer`` (``from transformers import Trainer`` does; a plain
``import transformers`` does not, as transformers loads its submodules
lazily). Then ``Trainer`` is patched and every ``Trainer`` gets a
:class:`GoodputCallback` (once; one the user added is kept).

What is recorded, and from where (times in ns since the epoch):

========================  ============================================================
span                      hook
========================  ============================================================
``accelerator_init``      ``Trainer.create_accelerator_and_postprocess`` (the Accelerate
                          ``Accelerator``: device and distributed set-up)
``training_prep``         the whole ``Trainer.__init__``; and from the ``train()`` call to
                          the ``on_train_begin`` callback (data loader, optimizer,
                          scheduler, ``accelerator.prepare``)
``checkpoint_restore``    ``Trainer._load_from_checkpoint``,
                          ``_load_optimizer_and_scheduler``, ``_load_scaler``,
                          ``_load_rng_state`` (private), with the restored step read from
                          the checkpoint's ``trainer_state.json`` (``global_step``)
``data_loading``          ``Trainer.get_batch_samples`` (fetching the batches of one
                          optimizer update); without it, the gap from ``on_step_end`` to
                          the next ``on_step_begin``
``step`` n                ``on_step_begin`` -> ``on_step_end``; n = ``state.global_step``
                          after the optimizer update (one step = one update, whatever
                          the gradient accumulation)
``checkpoint_save``       ``Trainer._save_checkpoint`` (private), step =
                          ``state.global_step`` (the ``checkpoint-<n>`` directory)
``custom_badput`` eval    ``Trainer.evaluate`` (the outermost call)
========================  ============================================================

While ``Trainer.train`` runs, the callback claims ``step`` and ``data_loading``
so that the PyTorch instrumentor's optimizer and DataLoader hooks stay quiet;
the claim is released when ``train`` returns or raises. Compilation is the
PyTorch instrumentor's job. Private methods are feature-detected: a missing one
is skipped with a warning. Every hook body is guarded: a failure is counted on
the recorder, never raised into training.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import threading
import time

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
_now = time.time_ns

_CLAIMS = ("step", "data_loading")
_EVAL_ATTRS = {schema.ATTR_BADPUT_TYPE: "eval"}  # shared, never mutated
_CKPT_DIR_RE = re.compile(r"checkpoint-(\d+)$")

#: Whether the instrumentor's patches are in place now (auto-added callbacks go
#: quiet when it is uninstrumented).
_enabled = False
#: Whether ``Trainer.get_batch_samples`` is patched (else the callback measures
#: data loading as the gap between steps).
_batch_hook = False
_local = threading.local()  # evaluate() nesting depth, per thread
_ckpt_steps: dict[str, int | None] = {}


# --- the callback -------------------------------------------------------------------


class _GoodputCallbackMixin:
    """The logic of :class:`GoodputCallback`; kept free of transformers imports."""

    def __init__(self) -> None:
        self._auto = False  # added by the instrumentor (quiet once it is uninstrumented)
        self._init_end_t: int | None = None
        self._train_call_t: int | None = None
        self._step_t0: int | None = None
        self._step_end_t: int | None = None

    def _quiet(self) -> bool:
        return self._auto and not _enabled

    @guard(where="GoodputCallback.on_init_end")
    def on_init_end(self, args, state, control, **kwargs):
        self._init_end_t = _now()

    @guard(where="GoodputCallback.on_train_begin")
    def on_train_begin(self, args, state, control, **kwargs):
        t = _now()
        t0 = self._train_call_t or self._init_end_t
        self._train_call_t = self._init_end_t = None
        self._step_t0 = self._step_end_t = None
        if self._quiet():
            return
        for kind in _CLAIMS:
            claim(kind, self)
        if t0 is not None and t0 <= t:
            recorder().record(schema.TRAINING_PREP, t0, t)

    @guard(where="GoodputCallback.on_step_begin")
    def on_step_begin(self, args, state, control, **kwargs):
        t = _now()
        if self._quiet():
            return
        if not _batch_hook and self._step_end_t is not None:
            recorder().record(schema.DATA_LOADING, self._step_end_t, t)
        self._step_t0 = t

    @guard(where="GoodputCallback.on_step_end")
    def on_step_end(self, args, state, control, **kwargs):
        t = _now()
        t0, self._step_t0 = self._step_t0, None
        if t0 is not None and not self._quiet():
            recorder().record(schema.STEP, t0, t, {schema.ATTR_STEP: int(state.global_step)})
        self._step_end_t = t

    @guard(where="GoodputCallback.on_train_end")
    def on_train_end(self, args, state, control, **kwargs):
        self._train_ended()

    def _train_ended(self) -> None:
        self._step_t0 = self._step_end_t = None
        for kind in _CLAIMS:
            release(kind, self)


_callback_cls = None


def _callback_class():
    """``GoodputCallback``, a ``transformers.TrainerCallback`` built on first use."""
    global _callback_cls
    if _callback_cls is None:
        from transformers.trainer_callback import TrainerCallback

        _callback_cls = type(
            "GoodputCallback",
            (_GoodputCallbackMixin, TrainerCallback),
            {
                "__module__": __name__,
                "__doc__": (
                    "Records goodput steps (and the set-up before them) from Trainer events.\n\n"
                    "Added to every Trainer by the instrumentor. Adding it yourself "
                    "(``callbacks=[GoodputCallback()]``) without ``goodput.instrument()`` "
                    "records training prep, steps and data loading (the gap between "
                    "steps), but no checkpoint or eval spans."
                ),
            },
        )
    return _callback_cls


def __getattr__(name: str):
    # ``from goodput_instrumentation.transformers import GoodputCallback`` imports
    # transformers only then, not when this module is imported.
    if name == "GoodputCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _ensure_callback(trainer):
    """The trainer's GoodputCallback, added (marked as ours) if it has none."""
    cls = _callback_class()
    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, cls):
            return cb
    cb = cls()
    cb._auto = True
    trainer.add_callback(cb)
    return cb


# --- hook bodies (guarded: they never raise into the Trainer) ----------------------------


@guard(where="Trainer.__init__ hook")
def _after_init(trainer, t0: int) -> None:
    recorder().record(schema.TRAINING_PREP, t0, _now())
    _ensure_callback(trainer)


def _after_accelerator(t0: int, t1: int, error, out, args, kwargs) -> None:
    if error is None:
        recorder().record(schema.ACCELERATOR_INIT, t0, t1)


@guard(where="Trainer.train hook")
def _train_enter(trainer, t0: int):
    cb = _ensure_callback(trainer)
    cb._train_call_t = t0
    for kind in _CLAIMS:
        claim(kind, cb)
    return cb


@guard(where="Trainer.train hook")
def _train_exit(cb) -> None:
    if cb is not None:
        cb._train_ended()


def _batches_loaded(t0: int, t1: int, error, out, args, kwargs) -> None:
    if error is None:
        recorder().record(schema.DATA_LOADING, t0, t1)


def _saved(t0: int, t1: int, error, out, args, kwargs) -> None:
    trainer = args[0]
    attrs = {
        schema.ATTR_CHECKPOINT_STEP: int(trainer.state.global_step),
        schema.ATTR_BLOCKING: True,
    }
    rec = recorder()
    rec.record(schema.CHECKPOINT_SAVE, t0, t1, attrs, error)
    rec.request_sync()


def _checkpoint_step(path) -> int | None:
    """The step of a Trainer checkpoint directory: ``global_step`` in its trainer_state.json,
    else the ``<n>`` of its ``checkpoint-<n>`` name; None if neither is there."""
    key = os.fspath(path)
    if key in _ckpt_steps:
        return _ckpt_steps[key]
    step = None
    try:
        with open(os.path.join(key, "trainer_state.json"), encoding="utf-8") as f:
            step = int(json.load(f)["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        m = _CKPT_DIR_RE.search(os.path.basename(os.path.normpath(key)))
        step = int(m.group(1)) if m else None
    _ckpt_steps[key] = step
    return step


def _restored(t0: int, t1: int, error, out, args, kwargs) -> None:
    args = args[1:]  # after self
    path = args[0] if args else kwargs.get("resume_from_checkpoint", kwargs.get("checkpoint"))
    if path is None:  # called with no checkpoint: the method did nothing
        return
    step = _checkpoint_step(path)
    attrs = {schema.ATTR_CHECKPOINT_STEP: step} if step is not None else None
    recorder().record(schema.CHECKPOINT_RESTORE, t0, t1, attrs, error)


@guard(where="Trainer.evaluate hook")
def _eval_enter() -> int | None:
    depth = getattr(_local, "eval_depth", 0)
    _local.eval_depth = depth + 1
    return _now() if depth == 0 else None


@guard(where="Trainer.evaluate hook")
def _eval_exit(t0: int | None, error: str | None) -> None:
    _local.eval_depth = max(0, getattr(_local, "eval_depth", 1) - 1)
    if t0 is not None:
        recorder().record(schema.CUSTOM_BADPUT, t0, _now(), _EVAL_ATTRS, error)


# --- wrappers (the Trainer's own call stays outside every guard) --------------------------


def _wrap_init(orig):
    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        t0 = _now()
        orig(self, *args, **kwargs)
        _after_init(self, t0)

    return __init__


def _wrap_accelerator(orig):
    return timed(orig, _after_accelerator, "Trainer.create_accelerator_and_postprocess hook")


def _wrap_train(orig):
    @functools.wraps(orig)
    def train(self, *args, **kwargs):
        cb = _train_enter(self, _now())
        try:
            return orig(self, *args, **kwargs)
        finally:
            _train_exit(cb)

    return train


def _wrap_batches(orig):
    return timed(orig, _batches_loaded, "Trainer.get_batch_samples hook")


def _wrap_save(orig):
    return timed(orig, _saved, "Trainer._save_checkpoint hook")


def _wrap_restore(orig):
    return timed(orig, _restored, "Trainer checkpoint restore hook")


def _wrap_evaluate(orig):
    @functools.wraps(orig)
    def evaluate(self, *args, **kwargs):
        t0 = _eval_enter()
        error = "exception"
        try:
            out = orig(self, *args, **kwargs)
            error = None
            return out
        finally:
            _eval_exit(t0, error)

    return evaluate


#: Trainer method -> wrapper factory; the private ones are feature-detected.
_WRAPPERS = {
    "__init__": _wrap_init,
    "create_accelerator_and_postprocess": _wrap_accelerator,
    "train": _wrap_train,
    "get_batch_samples": _wrap_batches,
    "evaluate": _wrap_evaluate,
    "_save_checkpoint": _wrap_save,
    "_load_from_checkpoint": _wrap_restore,
    "_load_optimizer_and_scheduler": _wrap_restore,
    "_load_scaler": _wrap_restore,
    "_load_rng_state": _wrap_restore,
}


class TransformersInstrumentor(GoodputInstrumentor):
    """Records goodput from ``transformers.Trainer``: see the module docstring.

    Patches the ``Trainer`` class (so subclasses such as ``Seq2SeqTrainer`` too)
    when ``transformers.trainer`` is imported; :meth:`uninstrument` puts every
    method back, and callbacks it added to existing trainers go quiet.
    """

    modules = ("transformers.trainer",)
    requirements = ("transformers >= 4.46",)

    def _patch(self, module) -> None:
        global _enabled, _batch_hook
        trainer_cls = module.Trainer
        _callback_class()  # fail here, not in a hook, if TrainerCallback is gone
        self._patches = patches = Patches()
        missing = []
        for name, wrap in _WRAPPERS.items():
            orig = getattr(trainer_cls, name, None)
            if not callable(orig):
                missing.append(name)
                continue
            patches.set(trainer_cls, name, wrap(orig))
        if missing:
            _log.warning(
                "goodput: transformers.Trainer has no %s in this version; "
                "what they time is not recorded", ", ".join(missing),
            )
        _batch_hook = "get_batch_samples" not in missing
        _enabled = True

    def _unpatch(self) -> None:
        global _enabled, _batch_hook
        _enabled = False
        _batch_hook = False
        patches = getattr(self, "_patches", None)
        if patches is not None:
            patches.undo()
