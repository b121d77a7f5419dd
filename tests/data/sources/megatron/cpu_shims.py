"""What Megatron-LM main needs to be imported on a CPU-only Python 3.11 machine.

Written down for ``megatron_loop.py`` (issue 37); nothing here touches telemetry:

1. ``typing.override`` (Python 3.12): some Megatron modules decorate methods with it at
   import. On 3.11 it becomes the identity function.
2. ``triton``: ``megatron.core.transformer.moe.ops.paged_stash`` and
   ``megatron.core.ssm.ops.*`` import it at module level (kernels never run here). A
   permissive stub module answers ``import triton`` / ``triton.*`` (decorators return the
   function; attributes are stubs; ``__version__`` "3.0.0"). torch's own triton probes
   (``torch.utils._triton.has_triton_package``, cached, and the inductor modules that
   read ``triton.__version__`` at import) run first, while ``triton`` is absent, so torch
   keeps its no-triton CPU path.

The third difference from a GPU run, nemo-lens 0.1.0's one line of 3.12 syntax
(``type ExportStrategy = ...`` in ``nemo/lens/strategies.py``), is patched in the
virtual environment by ``venv.sh``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
import typing

TRITON_STUB_VERSION = "3.0.0"


class _Any:
    """Stands for any triton object: callable (a decorator returns what it decorates),
    any attribute, subscriptable, usable as a base class."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]
        return _Any()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any()

    def __getitem__(self, key):
        return _Any()

    def __mro_entries__(self, bases):
        return (object,)


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any()


class _TritonFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Stub(spec.name)
        m.__path__ = []
        m.__version__ = TRITON_STUB_VERSION
        return m

    def exec_module(self, module):
        pass


def install() -> None:
    """Install both shims (idempotent). Call before importing ``megatron``."""
    if not hasattr(typing, "override"):
        typing.override = lambda f: f
    if any(isinstance(f, _TritonFinder) for f in sys.meta_path):
        return
    import torch  # noqa: F401
    import torch._inductor.compile_fx  # noqa: F401  (reads triton.__version__ at import)
    import torch._inductor.kernel.mm  # noqa: F401
    import torch.utils._triton
    import torch.utils.flop_counter  # noqa: F401

    torch.utils._triton.has_triton_package()  # cached False: torch keeps its CPU path
    sys.meta_path.insert(0, _TritonFinder())
