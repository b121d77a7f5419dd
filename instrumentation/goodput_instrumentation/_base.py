"""What every goodput instrumentor shares: lazy patching, guarded hooks, claims.

An instrumentor never imports or patches its framework when it is instrumented.
It registers a post-import hook (``wrapt``) that patches the framework the moment
the training script imports it (at once, if it already has), so
``opentelemetry-instrument`` with every instrumentor enabled costs a script
nothing for the frameworks it does not use, and a framework that is not
installed is skipped quietly.

Hooks run inside the framework's code. Every hook body goes through
:func:`guard`: an exception in it is counted on the recorder (``errors`` in
``goodput.get_recorder().stats()``, ``goodput.recorder.errors`` in the report)
and logged once per hook, never raised into the training loop.

*Claims* keep two instrumentors from recording the same thing: while a
Lightning or Hugging Face run is active it claims ``step`` and
``data_loading``, and the PyTorch instrumentor's optimizer and DataLoader hooks
record nothing until the claim is released.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Collection
from importlib import metadata

import wrapt
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
from packaging.requirements import InvalidRequirement, Requirement

import goodput

_log = logging.getLogger("goodput.instrumentation")

# --- claims -----------------------------------------------------------------

_claims: dict[str, object] = {}
_claims_lock = threading.Lock()


def claim(kind: str, owner: object) -> None:
    """``owner`` (an instrumentor or callback) records ``kind`` ("step", ...) from now on."""
    with _claims_lock:
        _claims[kind] = owner


def release(kind: str, owner: object) -> None:
    """Give ``kind`` back, if ``owner`` holds it."""
    with _claims_lock:
        if _claims.get(kind) is owner:
            del _claims[kind]


def claimed_by_other(kind: str, owner: object) -> bool:
    """Whether someone other than ``owner`` records ``kind`` now (a dict lookup)."""
    holder = _claims.get(kind)
    return holder is not None and holder is not owner


# --- guarded hooks ----------------------------------------------------------

_reported: set[str] = set()


def report_error(where: str, exc: BaseException) -> None:
    """Count an exception raised in hook ``where`` on the recorder; log it once per hook."""
    try:
        rec = goodput.get_recorder()
        if where in _reported:
            rec.error("goodput instrumentation: %s failed: %r", where, exc)
        else:
            _reported.add(where)
            rec.error("goodput instrumentation: %s failed (counted, not raised): %r", where, exc)
            _log.debug("first failure of %s", where, exc_info=exc)
    except Exception:  # noqa: BLE001 - the last line of defence: never raise from a hook
        pass


def guard(func: Callable | None = None, *, default=None, where: str | None = None):
    """Decorate a hook body so that it never raises: errors are counted, ``default`` returned.

    Usable as ``@guard`` or ``@guard(default=..., where="name")``. Only for code
    of ours: wrap the framework's own call *outside* the guard, so its
    exceptions still reach the training code unchanged.
    """

    def deco(f):
        name = where or f.__qualname__

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            try:
                return f(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                report_error(name, exc)
                return default

        return wrapper

    return deco(func) if func is not None else deco


def timed(orig: Callable, after: Callable, where: str | None = None) -> Callable:
    """Wrap a framework function so that each call is timed.

    ``after(t0_ns, t1_ns, error, result, args, kwargs)`` runs after every call
    (``error``: the exception's class name or None; ``result``: the return value
    or None), under :func:`guard`. The original's result and exceptions pass
    through unchanged.
    """
    hook = guard(after, where=where or f"{getattr(orig, '__qualname__', orig)} hook")

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        t0, err, out = time.time_ns(), None, None
        try:
            out = orig(*args, **kwargs)
            return out
        except BaseException as exc:
            err = type(exc).__name__
            raise
        finally:
            hook(t0, time.time_ns(), err, out, args, kwargs)

    return wrapper


def recorder():
    """The process recorder (configured with defaults on first use). Never raises."""
    return goodput.get_recorder()


# --- patching helpers ----------------------------------------------------------


class Patches:
    """Attribute replacements that can all be undone: ``set(obj, name, new)`` / ``undo()``."""

    def __init__(self) -> None:
        self._saved: list[tuple[object, str, bool, object]] = []

    def set(self, obj: object, name: str, new: object) -> object:
        """Replace ``obj.name`` with ``new``; returns the original."""
        own = getattr(obj, "__dict__", {})
        had = name in own
        old = getattr(obj, name, None)
        self._saved.append((obj, name, had, own.get(name)))
        setattr(obj, name, new)
        return old

    def undo(self) -> None:
        """Put every replaced attribute back (deleting those that did not exist), newest first."""
        while self._saved:
            obj, name, had, old = self._saved.pop()
            try:
                if had:
                    setattr(obj, name, old)
                else:
                    delattr(obj, name)
            except Exception as exc:  # noqa: BLE001
                _log.warning("goodput: could not restore %r.%s: %r", obj, name, exc)

    def __bool__(self) -> bool:
        return bool(self._saved)


# --- the base instrumentor --------------------------------------------------------


class GoodputInstrumentor(BaseInstrumentor):
    """Base of the goodput instrumentors: patch a module when (and if) it is imported.

    Subclasses set :attr:`modules` (the import names that trigger patching) and
    :attr:`requirements` (``instrumentation_dependencies``), and implement
    :meth:`_patch` (called once per name in ``modules``, with the imported
    module) and :meth:`_unpatch` (undoes every ``_patch``). A failure in either
    is logged and counted, and the training script runs on without that
    instrumentor.
    """

    #: Import names whose import triggers :meth:`_patch` (each at most once).
    modules: tuple[str, ...] = ()
    #: Requirement strings, e.g. ``("torch >= 2.4",)``; a mismatch skips patching.
    requirements: tuple[str, ...] = ()
    #: Keyword options ``instrument()`` accepts (read from ``self._options``).
    options: tuple[str, ...] = ()

    def __init__(self) -> None:
        # BaseInstrumentor is a per-class singleton: __init__ runs on every call.
        if not hasattr(self, "_lock"):
            self._lock = threading.RLock()
            self._active = False
            self._patched: set[str] = set()
            self._hooked: set[str] = set()
            self._options: dict = {}

    def instrumentation_dependencies(self) -> Collection[str]:
        return self.requirements

    def _check_dependency_conflicts(self):
        # Checked when the framework is imported (a missing framework is no error:
        # it is simply never patched); see _version_problem.
        return None

    def _instrument(self, **kwargs) -> None:
        with self._lock:
            self._active = True
            self._options = kwargs
            for name in self.modules:
                module = sys.modules.get(name)
                if module is not None:
                    self._on_import(name, module)
                elif name not in self._hooked:
                    # wrapt runs a hook once, on the module's first import.
                    self._hooked.add(name)
                    try:
                        wrapt.register_post_import_hook(self._hook_for(name), name)
                    except Exception as exc:  # noqa: BLE001
                        report_error(f"{type(self).__name__} import hook", exc)

    def _hook_for(self, name: str):
        def hook(module) -> None:
            with self._lock:
                self._hooked.discard(name)
            self._on_import(name, module)

        return hook

    def _on_import(self, name: str, module) -> None:
        with self._lock:
            if not self._active or name in self._patched:
                return
            problem = self._version_problem()
            if problem:
                _log.warning("goodput: %s not instrumented: %s", name, problem)
                return
            try:
                self._patch(module)
                self._patched.add(name)
            except Exception as exc:  # noqa: BLE001
                # Half a patch is worse than none: undo all of this instrumentor's.
                report_error(f"{type(self).__name__}._patch({name})", exc)
                self._patched.clear()
                try:
                    self._unpatch()
                except Exception as exc2:  # noqa: BLE001
                    report_error(f"{type(self).__name__}._unpatch", exc2)

    def _uninstrument(self, **kwargs) -> None:
        with self._lock:
            self._active = False  # hooks still registered with wrapt now do nothing
            self._patched.clear()
            try:
                self._unpatch()
            except Exception as exc:  # noqa: BLE001
                report_error(f"{type(self).__name__}._unpatch", exc)

    @property
    def patched(self) -> bool:
        """Whether the framework is patched now (imported while instrumented)."""
        return bool(self._patched)

    def _version_problem(self) -> str | None:
        for text in self.requirements:
            try:
                req = Requirement(text)
                have = metadata.version(req.name)
            except (InvalidRequirement, metadata.PackageNotFoundError) as exc:
                return f"cannot check {text!r}: {exc}"
            if not req.specifier.contains(have, prereleases=True):
                return f"needs {text}, found {have}"
        return None

    def _patch(self, module) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _unpatch(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
