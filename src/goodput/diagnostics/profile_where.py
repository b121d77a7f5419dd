"""Where a profile goes and whose it is: the profile root directory, this process's index,
the session prefix every host of an attempt shares, and which framework's profiler to use
(for :mod:`goodput.diagnostics.profile` and :mod:`goodput.diagnostics.ondemand`).

Each answer comes from the active :func:`goodput.diagnostics.run` if there is one, else
from the goodput recorder, else a default; none raises.
"""

from __future__ import annotations

import logging
import os
import re
import sys

__all__ = ["detect_framework", "process_index", "resolve_dir", "session_prefix"]

_log = logging.getLogger("goodput.diagnostics.profile")



def _current_run():
    """``goodput.diagnostics.current_run()`` if that module exists, else None."""
    try:
        from goodput import diagnostics
    except ImportError:  # pragma: no cover - this file lives in it
        return None
    fn = getattr(diagnostics, "current_run", None)
    if fn is None:
        return None
    try:
        return fn()
    except Exception as exc:  # pragma: no cover - defensive
        _log.debug("current_run() failed: %s", exc)
        return None


def _recorder():
    from goodput import api

    return api.get_recorder()


def resolve_dir(dir=None, run=None) -> str:
    """Profile root: ``dir``, else the run's ``profile_dir``, else ``<goodput run_dir>/profiles``,
    else ``./profiles`` (absolute path)."""
    if dir is not None:
        return os.path.abspath(os.fspath(dir))
    run = run if run is not None else _current_run()
    pdir = getattr(run, "profile_dir", None) if run is not None else None
    if pdir:
        return os.path.abspath(os.fspath(pdir))
    try:
        run_dir = _recorder().run_dir
    except Exception:  # pragma: no cover - defensive
        run_dir = None
    if run_dir:
        return os.path.abspath(os.path.join(os.fspath(run_dir), "profiles"))
    return os.path.abspath("profiles")


def process_index(run=None) -> int:
    """This process's index: the run's, else the goodput recorder's."""
    run = run if run is not None else _current_run()
    idx = getattr(run, "process_index", None) if run is not None else None
    if idx is not None:
        return int(idx)
    try:
        return int(_recorder().process_index)
    except Exception:  # pragma: no cover - defensive
        return 0


def session_prefix(run=None) -> str:
    """The part of generated session ids that every host of an attempt shares: the run's
    ``session_prefix``, else ``<job>-a<attempt>`` from the goodput recorder."""
    run = run if run is not None else _current_run()
    prefix = getattr(run, "session_prefix", None) if run is not None else None
    if not prefix:
        try:
            rec = _recorder()
            attempt = rec.attempt if rec.attempt is not None else 0
            prefix = f"{rec.job_name}-a{attempt}"
        except Exception:  # pragma: no cover - defensive
            prefix = "goodput"
    return _safe(prefix)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text)).strip("._") or "session"


def detect_framework(framework: str = "auto") -> str | None:
    """``"jax"`` or ``"torch"``: as given, or for ``"auto"`` JAX if ``jax`` is imported,
    else PyTorch if ``torch`` is; None if neither. Never imports a framework."""
    if framework in ("jax", "torch"):
        return framework
    if "jax" in sys.modules:
        return "jax"
    if "torch" in sys.modules:
        return "torch"
    return None
