"""What a checkpoint holds: whether an object saved or loaded is training state, and its step.

The reading half of :mod:`goodput_instrumentation._torch_ckpt` (which patches
``torch.save``/``torch.load``, safetensors and accelerate and records the spans). Pure
functions over the object, its file name or a safetensors header; nothing is patched or
recorded here.

- :func:`inspect_state` -> :class:`State` (``step``: int or None; ``weights_only``) or None
  when ``obj`` is not training state: a dict with a top-level ``step``/``global_step``/
  ``iteration``/``epoch`` entry, or an optimizer or module state dict, or one holding such a
  state dict as a top-level value.
- :func:`name_step`: a step-like number in a file name (``ckpt-00000150.pt`` -> 150), else
  in its directory's name (``checkpoint-150/optimizer.pt``); None for ``resnet50.pth``.
- :func:`safetensors_metadata` / :func:`metadata_step`: the step in a safetensors file's
  ``__metadata__`` (read from the 8-byte length + JSON header; no tensor is read).
  ``safetensors_metadata`` raises ``OSError`` when the file cannot be read and
  ``json.JSONDecodeError`` (a ``ValueError``) on a malformed header.
- :func:`optimizer_step`: updates done, from a live optimizer's parameter states.

Everything is cheap: a few dict look-ups, at most 32 top-level values and 16 optimizer
parameter states are scanned, no tensor is copied or moved (``.item()`` of a 0-d step
tensor at most).
"""

from __future__ import annotations

import json
import numbers
import os
import re
from itertools import islice

#: Top-level keys read as the checkpoint's step, in this order (before the optimizer's step).
STEP_KEYS = ("step", "global_step", "iteration")
#: Read after the optimizer's step: an epoch count is a step only when nothing better is there.
EPOCH_KEY = "epoch"
#: How many top-level values of a dict are looked at for a state dict inside it.
_SCAN_VALUES = 32
#: How many optimizer parameter states are read for their step (the maximum is taken).
_SCAN_PARAM_STATES = 16

# A step-like number in a file name: at the start or after a separator (not ".", which
# would read versions such as "v1.5") or a step word, and not followed by a letter or digit
# (so hashes like "0676ba61" and names like "resnet50" or "llama-7b" give none).
_NAME_STEP = re.compile(
    r"(?:^|[-_=+ ]|step|iter|iteration|ckpt|checkpoint|epoch)(\d+)(?![A-Za-z0-9])", re.I)
# In a parent directory only a number after a step word counts ("checkpoint-500/model.pt").
_DIR_STEP = re.compile(r"(?:step|iter|iteration|ckpt|checkpoint|epoch)[-_=]?(\d+)(?![A-Za-z0-9])",
                       re.I)
_SHARD = re.compile(r"\d+-of-\d+", re.I)  # model-00001-of-00002.safetensors: no step
# A parameter or buffer name of a module state dict (the last dotted component).
_PARAM_NAME = re.compile(r"(weight|bias)$|^running_|^num_batches_tracked$")


def as_int(value, strings: bool = False) -> int | None:
    """An int from an int, an integral float >= 0, a 0-d tensor/array or (``strings``, as
    in safetensors metadata) a decimal string."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() and value >= 0 else None
    if isinstance(value, str):
        value = value.strip()
        return int(value) if strings and value.isdigit() else None
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        return as_int(value.item())  # a 0-d tensor (a CPU read; no copy of anything large)
    return None


def key_step(d, keys=STEP_KEYS, strings: bool = False) -> int | None:
    """The first of ``keys`` in mapping ``d`` whose value is an integer (see :func:`as_int`)."""
    for key in keys:
        step = as_int(d.get(key), strings)
        if step is not None:
            return step
    return None


def is_optimizer_state(obj) -> bool:
    """Whether ``obj`` is an ``Optimizer.state_dict()`` (``state`` and ``param_groups``)."""
    return (isinstance(obj, dict) and "param_groups" in obj and "state" in obj
            and isinstance(obj["param_groups"], list | tuple))


def _param_states_step(states) -> int | None:
    """The highest ``step`` among the first parameter states of an optimizer's ``state``."""
    best = None
    values = states.values() if isinstance(states, dict) else ()
    for ps in islice(values, _SCAN_PARAM_STATES):
        step = as_int(ps.get("step")) if isinstance(ps, dict) else None
        if step is not None and (best is None or step > best):
            best = step
    return best


def optimizer_state_step(sd) -> int | None:
    """Updates done, from an optimizer state dict (Adam, AdamW, ... count them per
    parameter as ``state[i]["step"]``); None for optimizers without (plain SGD)."""
    return _param_states_step(sd.get("state"))


def optimizer_step(optimizer) -> int | None:
    """Updates done, from a live optimizer (or a wrapper with ``.optimizer``, as
    accelerate's ``AcceleratedOptimizer``): its parameter states' ``step``."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return _param_states_step(getattr(inner, "state", None))


def is_module_state(obj, tensor_type) -> bool:
    """Whether ``obj`` is a module's state dict: ``Module.state_dict()`` output (it has
    ``_metadata``, kept by ``torch.save``/``torch.load``), or a dict whose first values are
    all tensors and one of whose first keys names a parameter or buffer
    (``"fc.weight"``, ``"bn.running_mean"``): a safetensors file's or a re-built dict."""
    if not isinstance(obj, dict) or not obj:
        return False
    if getattr(obj, "_metadata", None) is not None:
        return True
    if tensor_type is None:
        return False
    named = False
    for key, value in islice(obj.items(), 8):
        if not isinstance(key, str) or not isinstance(value, tensor_type):
            return False
        named = named or bool(_PARAM_NAME.search(key.rpartition(".")[2]))
    return named


class State:
    """What :func:`inspect_state` found: the step it holds (None: none) and whether it
    holds weights only (a module state dict, no optimizer state, no step or epoch)."""

    __slots__ = ("step", "weights_only")

    def __init__(self, step: int | None, weights_only: bool):
        self.step, self.weights_only = step, weights_only

    def __repr__(self) -> str:
        return f"State(step={self.step}, weights_only={self.weights_only})"


def inspect_state(obj, tensor_type=None) -> State | None:
    """Whether ``obj`` (given to ``torch.save``, returned by ``torch.load``) is training
    state, and its step; None when it is not.

    Training state is a dict that has a top-level ``step``/``global_step``/``iteration``/
    ``epoch`` entry, or is an optimizer or module state dict, or holds one as a top-level
    value (or in a list there, as Lightning's ``optimizer_states``). A tensor, a list of
    tensors, a pickled ``nn.Module`` (``torch.save(model)``) or any other object is not.
    Only the top level and its direct values are looked at; no tensor is read except a
    0-d step.
    """
    if not isinstance(obj, dict):
        return None
    step = key_step(obj)
    opt_step, has_opt, has_module = None, False, False
    if is_optimizer_state(obj):
        has_opt, opt_step = True, optimizer_state_step(obj)
    elif is_module_state(obj, tensor_type):
        has_module = True
    else:
        for value in islice(obj.values(), _SCAN_VALUES):
            items = value[:4] if isinstance(value, list | tuple) else (value,)
            for v in items:
                if not isinstance(v, dict):
                    continue
                if is_optimizer_state(v):
                    has_opt = True
                    s = optimizer_state_step(v)
                    if s is not None and (opt_step is None or s > opt_step):
                        opt_step = s
                elif not has_module and is_module_state(v, tensor_type):
                    has_module = True
    epoch = as_int(obj.get(EPOCH_KEY))
    if step is None and epoch is None and not has_opt and not has_module:
        return None
    if step is None:
        step = opt_step if opt_step is not None else epoch
    return State(step, has_module and not has_opt and step is None)


def file_name(f) -> str | None:
    """The path of ``f``: a path (``str``/``PathLike``) or an open file's ``name``."""
    if isinstance(f, str | os.PathLike):
        return os.fspath(f)
    name = getattr(f, "name", None)  # an open file; BytesIO has none
    return name if isinstance(name, str) else None


def name_step(path) -> int | None:
    """A step-like number in a checkpoint's file name, else in its directory's name.

    ``ckpt-00000150.pt``, ``step_150.pt``, ``epoch=2-step=150.ckpt``, ``150.pt`` and
    ``checkpoint-150/optimizer.pt`` give 150; ``model.pt``, ``resnet50.pth``,
    ``resnet50-0676ba61.pth``, ``llama-7b.bin``, ``sd-v1.5.safetensors`` and
    ``model-00001-of-00002.safetensors`` give None.
    """
    if path is None:
        return None
    path = os.path.normpath(os.fspath(path))
    base = _SHARD.sub("", os.path.basename(path))
    found = _NAME_STEP.findall(base)
    if found:
        return int(found[-1])
    found = _DIR_STEP.findall(os.path.basename(os.path.dirname(path)))
    return int(found[-1]) if found else None


def safetensors_metadata(path) -> dict | None:
    """The ``__metadata__`` of a safetensors file, from its header (8-byte length + JSON);
    no tensor is read."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if not 0 < size <= 100_000_000:
            return None
        header = json.loads(f.read(size))
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else None


def metadata_step(meta) -> int | None:
    """The step in safetensors metadata (string values): step keys, then ``epoch``."""
    if not isinstance(meta, dict):
        return None
    step = key_step(meta, strings=True)
    return step if step is not None else as_int(meta.get(EPOCH_KEY), strings=True)


__all__ = [
    "EPOCH_KEY",
    "STEP_KEYS",
    "State",
    "as_int",
    "file_name",
    "inspect_state",
    "is_module_state",
    "is_optimizer_state",
    "key_step",
    "metadata_step",
    "name_step",
    "optimizer_state_step",
    "optimizer_step",
    "safetensors_metadata",
]
