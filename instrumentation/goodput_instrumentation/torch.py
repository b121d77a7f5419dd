"""Goodput instrumentation for plain PyTorch training loops.

Enable it with ``goodput.instrument()`` (or ``goodput_instrumentation.instrument(["torch"])``)
before or after ``import torch``, or run the script under ``opentelemetry-instrument``.
Nothing is patched until ``torch`` is imported. What is captured, and from where:

============================  ===========================================================
span                          hook
============================  ===========================================================
``goodput.step``              global optimizer step hooks
                              (``torch.optim.optimizer.register_optimizer_step_pre_hook`` /
                              ``..._post_hook``): step *n* runs from the end of optimizer
                              update *n-1* to the end of update *n* (the first step of a
                              process, or after a restore, from its first DataLoader fetch,
                              else from the optimizer's pre-hook). Recorded as a closed span
                              at the post-hook.
``goodput.data_loading``      ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__``
                              (private): every batch fetch, with or without workers; the
                              call that ends an epoch (``StopIteration``) is not recorded.
``goodput.program_startup``   ``torch._dynamo.callback.callback_handler`` start/end
                              callbacks (private): each ``torch.compile`` compilation.
                              ``torch._dynamo.reset()`` clears them: it is wrapped to
                              register them again.
``goodput.accelerator_init``  ``torch.distributed.init_process_group``.
``goodput.checkpoint_save``   ``torch.distributed.checkpoint.save`` (blocking) and
                              ``async_save`` (blocking part = the call; a second span with
                              ``goodput.blocking = false`` until its future completes);
                              ``torch.save`` of training state; ``safetensors.torch``
                              ``save_file`` (a model's tensors, or a step in its metadata)
                              and ``save_model``; ``accelerate.Accelerator.save_state``.
``goodput.checkpoint_restore`` ``torch.distributed.checkpoint.load``; ``torch.load`` of
                              training state; ``safetensors.torch.load_file`` /
                              ``load_model`` with a step; ``Accelerator.load_state``.
``goodput.custom_badput``     (type ``eval``) from ``model.eval()`` to the next
                              ``model.train()`` once training has started, when no optimizer
                              step ran in between (``torch.nn.Module.train``);
                              ``instrument(detect_eval=False)`` turns it off.
============================  ===========================================================

*Training state* (``_torch_ckpt_state.inspect_state``) is a dict that has a top-level
``step``/``global_step``/``iteration``/``epoch`` entry, or is, or holds as a top-level
value, a module or optimizer ``state_dict``; a tensor, a list of tensors or a pickled
``nn.Module`` is not a checkpoint. A load of weights alone (no optimizer state, no step)
is a restore only when its file name holds a step. The checkpoint step is the top-level
``step``/``global_step``/``iteration``, else the optimizer state's ``step`` (updates
done), else ``epoch``, else a step-like number in the file name, else (saves) the
instrumentor's own count. Inside a checkpoint call recorded by the Lightning or Hugging
Face instrumentor, under a ``checkpoint`` claim, or inside a checkpoint phase marked with
the phase API, these hooks record nothing; ``accelerate`` / ``save_model`` calls are one
span (the saves inside them are not recorded again).

Step numbers count optimizer updates, 1-based, so that they match checkpoint
steps: the checkpoint of step *n* holds the state after *n* updates, and after a
restore (DCP, ``torch.load``, safetensors, accelerate) of step *k* the next step
is *k + 1*. With several optimizers (a GAN), only the first one
to step (the *lead*) ends steps; the others' updates fall inside its steps. An
optimizer that steps twice while the lead does not becomes the lead (the old
one was replaced), and both of its updates end a step.

While a Lightning or Hugging Face run claims ``step`` / ``data_loading``, the
optimizer and DataLoader hooks (and the eval detection) record nothing.
Every hook body is guarded: an error in it is counted on the recorder, never
raised into training. ``docs/instrumentation/pytorch.md`` has the details.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import threading
import time

from goodput import schema
from goodput_instrumentation._base import (
    GoodputInstrumentor,
    Patches,
    claimed_by_other,
    guard,
    recorder,
    timed,
)
from goodput_instrumentation._torch_ckpt import CheckpointHooks
from goodput_instrumentation._torch_ckpt_state import STEP_KEYS, inspect_state

_log = logging.getLogger("goodput.instrumentation.torch")
_time_ns = time.time_ns
_get_ident = threading.get_ident

_STEP = schema.STEP
_ATTR_STEP = schema.ATTR_STEP
_DATA_LOADING = schema.DATA_LOADING
_EVAL_ATTRS = {schema.ATTR_BADPUT_TYPE: "eval"}
_LAST_INT = re.compile(r"(\d+)(?!.*\d)")


def _checkpoint_step(state_dict) -> int | None:
    """The step stored in a state dict (the rules of ``_torch_ckpt_state.inspect_state``: a
    top-level ``step``/``global_step``/``iteration``, the optimizer state's step, ``epoch``).

    Returns None when there is none.
    """
    info = inspect_state(state_dict, getattr(sys.modules.get("torch"), "Tensor", None))
    return None if info is None else info.step


def _step_from_id(checkpoint_id) -> int | None:
    """The last integer in a checkpoint id's final path component (``step-00000100`` -> 100)."""
    if checkpoint_id is None:
        return None
    name = os.path.basename(os.path.normpath(os.fspath(checkpoint_id)))
    m = _LAST_INT.search(name)
    return int(m.group(1)) if m else None


def _state_dict_arg(args, kwargs):
    return args[0] if args else kwargs.get("state_dict")


class TorchInstrumentor(CheckpointHooks, GoodputInstrumentor):
    """Records steps, data loading, compilation, process-group start-up and checkpoints
    (DCP, ``torch.save``/``torch.load`` of training state, safetensors, accelerate).

    Options (keyword arguments of ``instrument()``):
        detect_eval: record ``model.eval()`` ... ``model.train()`` as ``custom:eval``
            badput (default True).
    """

    modules = (
        "torch",
        "torch._dynamo",
        "torch.distributed.checkpoint",
        "torch.distributed.checkpoint.state_dict",
        "safetensors.torch",
        "accelerate.accelerator",
    )
    requirements = ("torch >= 2.4",)
    options = ("detect_eval",)

    def __init__(self) -> None:
        super().__init__()
        if not hasattr(self, "_patches"):
            self._patches = Patches()
            self._handles: list = []
            self._dynamo_handler = None
            self._ckpt_init()
            self._reset_state()

    # --- state ------------------------------------------------------------

    def _reset_state(self) -> None:
        self._step = 0  # optimizer updates done: the number of the last step recorded
        self._steps_seen = 0  # steps recorded by this process (eval detection starts after one)
        self._last_end: int | None = None  # end of the previous step (ns)
        self._fetch_t0: int | None = None  # first fetch since the last step boundary
        self._pre_t0: int | None = None  # first optimizer pre-hook since then
        self._lead: int | None = None  # id() of the optimizer whose updates end steps
        self._others: dict[int, int] = {}  # other optimizers in this step: first end
        self._suppress = 0  # > 0 while DCP initialises optimizer state with a fake step
        self._eval_t0: int | None = None
        self._compile_t0: int | None = None
        self._train_tid: int | None = None  # thread of the last optimizer update

    @property
    def step(self) -> int:
        """The number of the last step recorded (optimizer updates done; 0 before any)."""
        return self._step

    # --- patching -------------------------------------------------------------

    def _patch(self, module) -> None:
        name = module.__name__
        if name == "torch":
            self._patch_torch(module)
        elif name == "torch._dynamo":
            self._patch_dynamo(module)
        elif name == "torch.distributed.checkpoint":
            self._patch_dcp(module)
        elif name == "torch.distributed.checkpoint.state_dict":
            self._patch_dcp_state_dict(module)
        elif name == "safetensors.torch":
            self._patch_safetensors(module)
        elif name == "accelerate.accelerator":
            self._patch_accelerate(module)

    def _unpatch(self) -> None:
        while self._handles:
            handle = self._handles.pop()
            try:
                handle.remove()
            except Exception as exc:  # noqa: BLE001
                _log.warning("goodput: could not remove %r: %r", handle, exc)
        self._remove_compile_callbacks()
        self._patches.undo()
        self._reset_state()

    def _patch_torch(self, torch) -> None:
        self._reset_state()
        optim = sys.modules.get("torch.optim.optimizer")
        if optim is None or not hasattr(optim, "register_optimizer_step_post_hook"):
            _log.warning("goodput: torch has no global optimizer step hooks: no step spans")
        else:
            self._handles.append(optim.register_optimizer_step_pre_hook(self._on_pre_step))
            self._handles.append(optim.register_optimizer_step_post_hook(self._on_post_step))

        import torch.utils.data.dataloader as dl

        base = getattr(dl, "_BaseDataLoaderIter", None)
        if base is None or not callable(getattr(base, "__next__", None)):
            _log.warning("goodput: torch DataLoader iterator not found: no data_loading spans")
        else:
            self._patches.set(base, "__next__", self._wrap_next(base.__next__))

        if self._options.get("detect_eval", True):
            module_cls = torch.nn.Module
            self._patches.set(module_cls, "train", self._wrap_train(module_cls.train))

        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and hasattr(dist, "init_process_group"):
            wrapper = self._wrap_init_process_group(dist.init_process_group)
            c10d = sys.modules.get("torch.distributed.distributed_c10d")
            if c10d is not None and c10d.init_process_group is dist.init_process_group:
                self._patches.set(c10d, "init_process_group", wrapper)
            self._patches.set(dist, "init_process_group", wrapper)

        self._patch_serialization(torch)  # torch.save / torch.load of training state

    def _patch_dynamo(self, dynamo) -> None:
        callback = sys.modules.get("torch._dynamo.callback")
        handler = getattr(callback, "callback_handler", None)
        if handler is None or not hasattr(handler, "register_start_callback"):
            _log.warning("goodput: torch._dynamo.callback not found: no program_startup spans")
            return
        self._dynamo_handler = handler
        self._register_compile_callbacks()
        reset = getattr(dynamo, "reset", None)
        if callable(reset):
            self._patches.set(dynamo, "reset", self._wrap_reset(reset))

    def _patch_dcp(self, dcp) -> None:
        for name, make in (
            ("save", self._wrap_save),
            ("async_save", self._wrap_async_save),
            ("load", self._wrap_load),
        ):
            func = getattr(dcp, name, None)
            if callable(func):
                self._patches.set(dcp, name, make(func))
            else:
                _log.warning("goodput: torch.distributed.checkpoint.%s not found", name)

    def _patch_dcp_state_dict(self, module) -> None:
        init = getattr(module, "_init_optim_state", None)
        if not callable(init):
            return  # nothing to suppress in this version
        inst = self

        @functools.wraps(init)
        def _init_optim_state(*args, **kwargs):
            inst._suppress += 1
            try:
                return init(*args, **kwargs)
            finally:
                inst._suppress -= 1

        self._patches.set(module, "_init_optim_state", _init_optim_state)

    # --- steps (hot path) -------------------------------------------------------

    @guard(where="torch optimizer pre-hook")
    def _on_pre_step(self, optimizer, args, kwargs) -> None:
        if self._last_end is None and self._pre_t0 is None and not self._suppress:
            self._pre_t0 = _time_ns()

    @guard(where="torch optimizer post-hook")
    def _on_post_step(self, optimizer, args, kwargs) -> None:
        t = _time_ns()
        if self._suppress:
            return
        if claimed_by_other("step", self):
            self._last_end = None  # the claimer records steps; start afresh when it stops
            return
        oid = id(optimizer)
        if oid != self._lead:
            first = self._others.get(oid)
            if first is None and self._lead is not None:
                self._others[oid] = t  # a second optimizer within the lead's step
                return
            # The first optimizer of the process, or one that stepped twice while the
            # lead did not: the lead was replaced, and its first update ended a step too.
            self._lead = oid
            if first is not None:
                self._end_step(first)
        if self._others:
            self._others.clear()
        self._end_step(t)

    def _end_step(self, t: int) -> None:
        n = self._step + 1
        self._step = n
        self._steps_seen += 1
        t0 = self._last_end
        if t0 is None:
            t0 = self._fetch_t0 or self._pre_t0 or t
            self._fetch_t0 = self._pre_t0 = None
        self._last_end = t
        self._train_tid = _get_ident()
        self._eval_t0 = None  # an optimizer update in eval mode: not an evaluation
        recorder().record(_STEP, t0, t, {_ATTR_STEP: n})

    # --- data loading (hot path) ------------------------------------------------

    def _wrap_next(self, orig):
        inst = self

        @functools.wraps(orig)
        def __next__(it):
            if claimed_by_other("data_loading", inst):
                return orig(it)
            t0 = _time_ns()
            try:
                data = orig(it)
            except StopIteration:
                raise  # the end of an epoch: no batch was waited for
            except BaseException as exc:
                inst._on_fetch(t0, type(exc).__name__)
                raise
            inst._on_fetch(t0, None)
            return data

        return __next__

    @guard(where="torch DataLoader __next__")
    def _on_fetch(self, t0: int, error) -> None:
        if self._last_end is None and self._fetch_t0 is None:
            self._fetch_t0 = t0
        recorder().record(_DATA_LOADING, t0, _time_ns(), None, error)

    # --- evaluation ------------------------------------------------------------

    def _wrap_train(self, orig):
        inst = self

        @functools.wraps(orig)
        def train(module, mode=True):
            if inst._steps_seen:
                inst._on_train_mode(module, mode)
            return orig(module, mode)

        return train

    @guard(where="torch Module.train")
    def _on_train_mode(self, module, mode) -> None:
        if claimed_by_other("step", self):
            self._eval_t0 = None
            return
        if not mode:
            if self._eval_t0 is None and module.training:
                self._eval_t0 = _time_ns()
        elif self._eval_t0 is not None:
            t0, self._eval_t0 = self._eval_t0, None
            recorder().record(schema.CUSTOM_BADPUT, t0, _time_ns(), _EVAL_ATTRS)

    # --- compilation -------------------------------------------------------------

    @guard(where="torch compile start callback")
    def _on_compile_start(self, args=None) -> None:
        self._compile_t0 = _time_ns()

    @guard(where="torch compile end callback")
    def _on_compile_end(self, args=None) -> None:
        t0, self._compile_t0 = self._compile_t0, None
        if t0 is not None:
            recorder().record(schema.PROGRAM_STARTUP, t0, _time_ns())

    def _register_compile_callbacks(self) -> None:
        handler = self._dynamo_handler
        if handler is None:
            return
        if self._on_compile_start not in handler.start_callbacks:
            handler.register_start_callback(self._on_compile_start)
        if self._on_compile_end not in handler.end_callbacks:
            handler.register_end_callback(self._on_compile_end)

    def _remove_compile_callbacks(self) -> None:
        handler, self._dynamo_handler = self._dynamo_handler, None
        if handler is None:
            return
        for lst, cb in (
            (handler.start_callbacks, self._on_compile_start),
            (handler.end_callbacks, self._on_compile_end),
        ):
            while cb in lst:
                lst.remove(cb)

    def _wrap_reset(self, orig):
        inst = self
        register = guard(inst._register_compile_callbacks, where="torch._dynamo.reset")

        @functools.wraps(orig)
        def reset(*args, **kwargs):
            try:
                return orig(*args, **kwargs)
            finally:
                register()  # reset() clears every compile callback

        return reset

    # --- process group -----------------------------------------------------------

    def _wrap_init_process_group(self, orig):
        return timed(orig, lambda t0, t1, err, out, args, kwargs: self._record(
            schema.ACCELERATOR_INIT, t0, t1, None, err), "init_process_group hook")

    @guard(where="torch span")
    def _record(self, name, t0, t1, attrs=None, error=None) -> None:
        recorder().record(name, t0, t1, attrs, error)

    # --- checkpoints -------------------------------------------------------------

    def _wrap_save(self, orig):
        return timed(orig, lambda t0, t1, err, out, args, kwargs: self._on_save(
            _state_dict_arg(args, kwargs), t0, t1, err), "torch.distributed.checkpoint.save")

    @guard(where="torch.distributed.checkpoint.save")
    def _on_save(self, state_dict, t0, t1, err) -> int:
        step = _checkpoint_step(state_dict)
        if step is None:
            step = self._step
        attrs = {schema.ATTR_CHECKPOINT_STEP: step, schema.ATTR_BLOCKING: True}
        rec = recorder()
        rec.record(schema.CHECKPOINT_SAVE, t0, t1, attrs, err)
        rec.request_sync()
        return step

    def _wrap_async_save(self, orig):
        return timed(orig, lambda t0, t1, err, out, args, kwargs: self._on_async_save(
            _state_dict_arg(args, kwargs), t0, t1, err, out),
            "torch.distributed.checkpoint.async_save")

    @guard(where="torch.distributed.checkpoint.async_save")
    def _on_async_save(self, state_dict, t0, t1, err, out) -> None:
        step = self._on_save(state_dict, t0, t1, err)
        if out is None or step is None:
            return
        # AsyncSaveResponse (staging + upload futures) or a plain Future.
        future = getattr(out, "upload_completion", out)
        if not hasattr(future, "add_done_callback"):
            return
        inst = self

        def done(fut):
            inst._on_async_done(step, t1, fut)

        future.add_done_callback(done)

    @guard(where="torch.distributed.checkpoint.async_save background")
    def _on_async_done(self, step: int, t0: int, future) -> None:
        if future.cancelled():
            err = "CancelledError"
        else:
            exc = future.exception()
            err = None if exc is None else type(exc).__name__
        attrs = {schema.ATTR_CHECKPOINT_STEP: step, schema.ATTR_BLOCKING: False}
        rec = recorder()
        rec.record(schema.CHECKPOINT_SAVE, t0, _time_ns(), attrs, err)
        rec.request_sync()

    def _wrap_load(self, orig):
        return timed(orig, lambda t0, t1, err, out, args, kwargs: self._on_load(
            _state_dict_arg(args, kwargs), kwargs.get("checkpoint_id"), t0, t1, err),
            "torch.distributed.checkpoint.load")

    @guard(where="torch.distributed.checkpoint.load")
    def _on_load(self, state_dict, checkpoint_id, t0, t1, err) -> None:
        step = None
        if err is None:
            step = _checkpoint_step(state_dict)
            if step is None:
                step = _step_from_id(checkpoint_id)
        attrs = {schema.ATTR_CHECKPOINT_STEP: step} if step is not None else None
        recorder().record(schema.CHECKPOINT_RESTORE, t0, t1, attrs, err)
        if step is not None:
            self._resumed(step)

    def _resumed(self, step: int) -> None:
        """Training resumes from the checkpoint of ``step``: the next update is step + 1,
        timed from its first fetch."""
        self._step = step
        self._last_end = self._fetch_t0 = self._pre_t0 = None
        self._eval_t0 = None


__all__ = ["STEP_KEYS", "TorchInstrumentor"]
