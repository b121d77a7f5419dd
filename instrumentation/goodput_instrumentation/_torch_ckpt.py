"""Checkpoints of plain PyTorch loops: ``torch.save``/``torch.load``, safetensors, accelerate.

The :class:`CheckpointHooks` mixin of :class:`~goodput_instrumentation.torch.TorchInstrumentor`
wraps

- ``torch.save`` / ``torch.load`` (also ``torch.serialization.save/load``): a
  ``goodput.checkpoint_save`` / ``goodput.checkpoint_restore`` span when the object
  saved or loaded is *training state*
  (:func:`~goodput_instrumentation._torch_ckpt_state.inspect_state`);
- ``safetensors.torch.save_file`` / ``save_model`` / ``load_file`` / ``load_model``;
- ``accelerate.Accelerator.save_state`` / ``load_state`` (one span for the whole call;
  the ``torch.save`` and safetensors calls inside it are not recorded again).

Which step a checkpoint holds (read by :mod:`goodput_instrumentation._torch_ckpt_state`:
:func:`~goodput_instrumentation._torch_ckpt_state.inspect_state`,
:func:`~goodput_instrumentation._torch_ckpt_state.name_step`): a top-level
``step`` / ``global_step`` / ``iteration`` entry, else the optimizer state's step
(``optimizer.state_dict()["state"][i]["step"]``, the number of updates Adam-family
optimizers count), else a top-level ``epoch`` entry, else a step-like number in the
file name (``ckpt-00000150.pt``, ``step_150.pt``, ``checkpoint-150/optimizer.pt``);
for a save, else the instrumentor's own update count.

Everything here is cheap (a few dict look-ups on the object, no tensor is copied or
moved; ``.item()`` of a 0-d step tensor at most) and runs under ``guard``.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time

from goodput import schema
from goodput_instrumentation._base import claimed_by_other, guard, recorder
from goodput_instrumentation._torch_ckpt_state import (
    file_name,
    inspect_state,
    is_module_state,
    metadata_step,
    name_step,
    optimizer_step,
    safetensors_metadata,
)

_time_ns = time.time_ns
_get_ident = threading.get_ident

# --- checkpoints another instrumentor records ----------------------------------------------

# (instrumentor module, framework module, class, methods): while one of these methods runs
# (on this thread's stack) and that instrumentor is enabled, its instrumentor records the
# checkpoint itself (or, for a whole fit/train, owns the run), so ours stays quiet.
_FOREIGN = (
    ("goodput_instrumentation.lightning", "{pkg}.trainer.trainer", "Trainer",
     ("fit", "save_checkpoint")),
    ("goodput_instrumentation.lightning", "{pkg}.trainer.connectors.checkpoint_connector",
     "_CheckpointConnector", ("_restore_modules_and_callbacks", "restore_training_state")),
    # its background write runs a closure defined in save_checkpoint (nested code objects)
    ("goodput_instrumentation.lightning", "{pkg}.plugins.io.async_plugin", "AsyncCheckpointIO",
     ("save_checkpoint",)),
    ("goodput_instrumentation.transformers", "transformers.trainer", "Trainer",
     ("train", "_save_checkpoint", "_load_from_checkpoint", "_load_optimizer_and_scheduler",
      "_load_scaler", "_load_rng_state", "_load_best_model")),
)
_LIGHTNING_PKGS = ("lightning.pytorch", "pytorch_lightning")


def _codes_of(func) -> list:
    code = getattr(inspect.unwrap(func), "__code__", None)
    if code is None:
        return []
    return [code, *(c for c in code.co_consts if inspect.iscode(c))]


class _Foreign:
    """Code objects of the checkpoint methods of Lightning / HF ``Trainer`` whose
    instrumentors are enabled now; recomputed when that set changes."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self.codes: frozenset = frozenset()

    def current(self) -> frozenset:
        mods = sys.modules
        key = tuple(
            bool(getattr(mods.get(inst), "_enabled", False)) and fw.format(pkg=pkg) in mods
            for inst, fw, _, _ in _FOREIGN for pkg in _LIGHTNING_PKGS
        )
        if key != self._key:
            codes = []
            for inst, fw, cls_name, methods in _FOREIGN:
                for pkg in _LIGHTNING_PKGS if "{pkg}" in fw else (None,):
                    module = mods.get(fw.format(pkg=pkg))
                    if module is None or not getattr(mods.get(inst), "_enabled", False):
                        continue
                    cls = getattr(module, cls_name, None)
                    for name in methods:
                        func = getattr(cls, name, None)
                        if callable(func):
                            codes.extend(_codes_of(func))
            self._key, self.codes = key, frozenset(codes)
        return self.codes

    def on_stack(self) -> bool:
        """Whether a recorded-elsewhere checkpoint method is running on this thread."""
        codes = self.current()
        if not codes:
            return False
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code in codes:
                return True
            frame = frame.f_back
        return False


# --- the hooks -----------------------------------------------------------------------------

_SAVE, _RESTORE = schema.CHECKPOINT_SAVE, schema.CHECKPOINT_RESTORE
_MARKED = (_SAVE, _RESTORE)


class _Open:
    """A checkpoint phase of ours in flight (``Recorder.phase_begin`` takes an object with
    ``name``, ``_t0`` and ``attrs``; a tuple holding a dict would not be hashable)."""

    __slots__ = ("name", "_t0", "attrs")

    def __init__(self, name: str, t0: int, attrs):
        self.name, self._t0, self.attrs = name, t0, attrs


class _Call:
    """One outermost checkpoint call being recorded."""

    __slots__ = ("entry", "info")

    def __init__(self, info=None, entry=None):
        self.info, self.entry = info, entry


_LOAD = _Call()


class CheckpointHooks:
    """Mixin of ``TorchInstrumentor``: records checkpoints written and read by
    ``torch.save``/``torch.load``, safetensors and accelerate (see the module doc).

    Uses from the instrumentor: ``self._step`` (updates done), ``self._patches``,
    ``self._resumed(step)`` (continue the numbering after a restore of ``step``) and
    ``self._train_tid`` (the thread of the last optimizer update).
    """

    def _ckpt_init(self) -> None:
        self._ckpt_tls = threading.local()  # .depth > 0 inside a checkpoint call we record
        self._foreign = _Foreign()
        self._tensor_type = None

    # --- shared -------------------------------------------------------------------------

    def _quiet(self) -> bool:
        """Someone else records this checkpoint: a ``checkpoint`` claim, a checkpoint phase
        marked with the phase API that is in flight, or a Lightning / HF Trainer method on
        the stack whose instrumentor records it."""
        if claimed_by_other("checkpoint", self):
            return True
        for e in list(getattr(recorder(), "_open", ())):  # phases in flight (any thread)
            if type(e) is _Open:
                continue  # ours (on another thread)
            if (e[0] if type(e) is tuple else getattr(e, "name", None)) in _MARKED:
                return True
        return self._foreign.on_stack()

    def _wrap(self, orig, before, after, where: str):
        """Wrap a checkpoint function. ``before(args, kwargs)`` -> a :class:`_Call` to
        record this call, or None; ``after(call, t0, t1, error, result, args, kwargs)``
        records it. Both are guarded; only the outermost call on a thread is looked at, so
        ``save_model`` -> ``save_file`` or ``save_state`` -> ``torch.save`` is one span.
        The original's result and exceptions pass through unchanged."""
        tls = self._ckpt_tls
        before = guard(before, where=f"{where} (before)")
        after = guard(after, where=where)
        discard = guard(lambda entry: recorder().phase_end(entry), where=where)

        @functools.wraps(orig)
        def wrapper(*args, **kwargs):
            if getattr(tls, "depth", 0):
                return orig(*args, **kwargs)
            call = before(args, kwargs)
            if call is None:
                return orig(*args, **kwargs)
            tls.depth = 1
            t0, err, out = _time_ns(), None, None
            try:
                out = orig(*args, **kwargs)
                return out
            except BaseException as exc:
                err = type(exc).__name__
                raise
            finally:
                tls.depth = 0
                t1 = _time_ns()
                if call.entry is not None:
                    discard(call.entry)
                after(call, t0, t1, err, out, args, kwargs)

        return wrapper

    def _in_flight(self, name: str, attrs) -> _Open:
        """Register a phase in flight (a kill inside it leaves a ``goodput.open`` record)."""
        entry = _Open(name, _time_ns(), attrs)
        recorder().phase_begin(entry)
        return entry

    def _save_call(self, step: int | None, path) -> _Call | None:
        if self._quiet():
            return None
        if step is None:
            step = name_step(path)
        if step is None:
            step = self._step
        blocking = self._train_tid in (None, _get_ident())  # a save off the training thread
        attrs = {schema.ATTR_CHECKPOINT_STEP: step, schema.ATTR_BLOCKING: blocking}
        return _Call(attrs, self._in_flight(_SAVE, attrs) if blocking else None)

    def _record_save(self, call: _Call, t0: int, t1: int, err) -> None:
        rec = recorder()
        rec.record(_SAVE, call.entry._t0 if call.entry else t0, t1, call.info, err)
        rec.request_sync()

    def _record_restore(self, step: int | None, t0: int, t1: int, err=None) -> None:
        attrs = {schema.ATTR_CHECKPOINT_STEP: step} if step is not None else None
        recorder().record(_RESTORE, t0, t1, attrs, err)
        if step is not None:
            self._resumed(step)

    def _load_call(self, args, kwargs) -> _Call:
        return _LOAD  # what was loaded (and whether someone else records it) is looked at after

    # --- torch.save / torch.load -----------------------------------------------------------

    def _patch_serialization(self, torch) -> None:
        self._tensor_type = torch.Tensor
        ser = sys.modules.get("torch.serialization")
        for name, before, after in (("save", self._torch_save_before, self._after_save),
                                    ("load", self._load_call, self._torch_load_after)):
            orig = getattr(torch, name, None)
            if not callable(orig):
                continue
            wrapper = self._wrap(orig, before, after, f"torch.{name}")
            self._patches.set(torch, name, wrapper)
            if ser is not None and getattr(ser, name, None) is orig:
                self._patches.set(ser, name, wrapper)

    def _torch_save_before(self, args, kwargs) -> _Call | None:
        obj = args[0] if args else kwargs.get("obj")
        info = inspect_state(obj, self._tensor_type)
        if info is None:
            return None
        return self._save_call(info.step, file_name(args[1] if len(args) > 1 else kwargs.get("f")))

    def _after_save(self, call, t0, t1, err, out, args, kwargs) -> None:
        self._record_save(call, t0, t1, err)

    def _torch_load_after(self, call, t0, t1, err, out, args, kwargs) -> None:
        if err is not None:
            return  # nothing to tell a checkpoint from any other file
        info = inspect_state(out, self._tensor_type)
        if info is None:
            return
        step = info.step
        if step is None:
            step = name_step(file_name(args[0] if args else kwargs.get("f")))
        if step is None and info.weights_only:
            return  # weights without a step: pretrained weights, an evaluation
        if not self._quiet():
            self._record_restore(step, t0, t1)

    # --- safetensors ------------------------------------------------------------------------

    def _patch_safetensors(self, module) -> None:
        for name, before, after in (
            ("save_file", self._st_save_file_before, self._after_save),
            ("save_model", self._st_save_model_before, self._after_save),
            ("load_file", self._load_call, self._st_load_after),
            ("load_model", self._load_call, self._st_load_after),
        ):
            orig = getattr(module, name, None)
            if callable(orig):
                self._patches.set(module, name,
                                  self._wrap(orig, before, after, f"safetensors.torch.{name}"))

    @staticmethod
    def _arg(args, kwargs, i: int, name: str):
        return args[i] if len(args) > i else kwargs.get(name)

    def _st_save_file_before(self, args, kwargs) -> _Call | None:
        tensors = self._arg(args, kwargs, 0, "tensors")
        step = metadata_step(self._arg(args, kwargs, 2, "metadata"))
        if step is None and not is_module_state(tensors, self._tensor_type):
            return None  # a dict of tensors that is no model and names no step
        return self._save_call(step, file_name(self._arg(args, kwargs, 1, "filename")))

    def _st_save_model_before(self, args, kwargs) -> _Call | None:
        step = metadata_step(self._arg(args, kwargs, 2, "metadata"))
        return self._save_call(step, file_name(self._arg(args, kwargs, 1, "filename")))

    def _st_load_after(self, call, t0, t1, err, out, args, kwargs) -> None:
        if err is not None:
            return
        model_given = len(args) > 1 or "model" in kwargs  # load_model(model, filename, ...)
        path = file_name(self._arg(args, kwargs, 1 if model_given else 0, "filename"))
        step = metadata_step(safetensors_metadata(path)) if path else None
        if step is None:
            if not model_given and not is_module_state(out, self._tensor_type):
                return
            step = name_step(path)
        if step is None:
            return  # weights without a step: pretrained weights, an evaluation
        if not self._quiet():
            self._record_restore(step, t0, t1)

    # --- accelerate ---------------------------------------------------------------------------

    def _patch_accelerate(self, module) -> None:
        cls = getattr(module, "Accelerator", None)
        for name, before, after in (("save_state", self._acc_save_before, self._acc_save_after),
                                    ("load_state", self._acc_load_before, self._acc_load_after)):
            orig = getattr(cls, name, None)
            if callable(orig):
                self._patches.set(cls, name,
                                  self._wrap(orig, before, after, f"Accelerator.{name}"))

    @staticmethod
    def _acc_step(acc) -> int | None:
        for opt in getattr(acc, "_optimizers", ()):
            step = optimizer_step(opt)
            if step is not None:
                return step
        return None

    @staticmethod
    def _acc_auto_named(acc) -> bool:
        # checkpoints/checkpoint_<n>: n counts saves, not steps
        conf = getattr(acc, "project_configuration", None)
        return bool(getattr(conf, "automatic_checkpoint_naming", False))

    def _acc_save_before(self, args, kwargs) -> _Call | None:
        acc = args[0]
        step = self._acc_step(acc)
        path = None if self._acc_auto_named(acc) else self._arg(args, kwargs, 1, "output_dir")
        return self._save_call(step, path)

    def _acc_save_after(self, call, t0, t1, err, out, args, kwargs) -> None:
        self._record_save(call, t0, t1, err)

    def _acc_load_before(self, args, kwargs) -> _Call | None:
        if self._quiet():
            return None
        return _Call(None, self._in_flight(_RESTORE, None))

    def _acc_load_after(self, call, t0, t1, err, out, args, kwargs) -> None:
        acc = args[0]
        step = None
        if err is None:
            step = self._acc_step(acc)  # the optimizer state just loaded
            if step is None and not self._acc_auto_named(acc):
                step = name_step(self._arg(args, kwargs, 1, "input_dir"))
        self._record_restore(step, call.entry._t0, t1, err)


__all__ = ["CheckpointHooks"]
