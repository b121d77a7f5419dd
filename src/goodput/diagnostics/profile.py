"""Programmatic profile capture (JAX / PyTorch profiler) recorded as goodput spans.

One :class:`Profile` captures one profiler session at a time, used in any of three ways::

    from goodput.diagnostics import profile

    with profile():                      # context manager
        train(steps=5)

    @profile()                           # decorator: every call is one capture
    def train_a_few_steps(): ...

    prof = profile(process_indices=[0])  # start / stop (here: only process 0 captures)
    prof.start()
    ...
    prof.stop()

Each capture writes the framework's own trace files under ``<dir>/<session_id>/`` and
becomes one ``goodput.custom_badput`` span of type ``"profile"`` (the report's
``custom:profile`` badput bucket) with the attributes ``goodput.profile.session_id``,
``goodput.profile.dir`` and ``goodput.profile.trigger``. See ``docs/profiling.md``.

Verified behaviour of the profilers this module drives (jax 0.10.2, torch 2.13 CPU):

- ``jax.profiler.start_trace(log_dir, profiler_options=opts)`` with ``opts.session_id = S``
  writes ``<log_dir>/plugins/profile/S/<host>.xplane.pb`` and ``<host>.trace.json.gz``
  (without a session id the folder is a timestamp). A second ``start_trace`` raises
  ``RuntimeError``; ``stop_trace`` without a start raises ``RuntimeError``. When the
  export in ``stop_trace`` fails (unwritable directory), JAX keeps its session marked as
  running, so every later ``start_trace`` fails: this module resets that private state.
  The JAX profiler is process-wide: start and stop may be called from any thread.
- ``torch.profiler.profile`` records the ops of the thread that called ``start()`` only;
  started in another thread it records nothing from the training thread, and ``stop()``
  from a thread other than the one that started it crashes the process (SIGSEGV). So
  a torch capture is stopped only on the thread that started it (else refused with a
  warning). A second ``profile().start()`` silently ends the first session: nested
  captures are refused here before they reach torch. The first ``start()`` of a process
  takes about a second (Kineto initialisation); that time is inside the span.

Nothing here raises into training: profiler errors are logged and counted
(:func:`stats`), a stop without a start is a warning, and a capture requested while
another one is running in this process is refused with a warning.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import socket
import threading
import time

from goodput import schema

from .profile_where import (
    _current_run,
    _safe,
    detect_framework,
    process_index,
    resolve_dir,
    session_prefix,
)

_log = logging.getLogger(__name__)

__all__ = ["Profile", "active_session", "profile", "stats", "xprof"]

#: Triggers (values of ``goodput.profile.trigger``).
PROGRAMMATIC = "programmatic"
ON_DEMAND = "on_demand"
FRAMEWORKS = ("auto", "jax", "torch")

_LOCK = threading.Lock()  # guards _ACTIVE, _COUNTERS and _STATS
_ACTIVE: _Capture | None = None  # the capture running in this process, if any
_COUNTERS = {PROGRAMMATIC: 0, ON_DEMAND: 0}
_STATS = {"captures": 0, "errors": 0, "refused": 0, "skipped": 0}
_ATEXIT = False


def stats() -> dict:
    """Counters of this process: ``captures`` finished, profiler ``errors``, captures
    ``refused`` (one already running, wrong thread) and ``skipped`` (process not in
    ``process_indices``), and ``active`` (the running session id or None)."""
    with _LOCK:
        out = dict(_STATS)
        out["active"] = _ACTIVE.session_id if _ACTIVE is not None else None
    return out


def active_session() -> str | None:
    """Session id of the capture running in this process, or None."""
    cap = _ACTIVE
    return cap.session_id if cap is not None else None


def _count(key: str) -> None:
    with _LOCK:
        _STATS[key] += 1


def _error(message: str, *args) -> None:
    _count("errors")
    _log.warning("goodput profile: " + message, *args)


# --- which session ------------------------------------------------------------------


def next_session_id(trigger: str = PROGRAMMATIC, prefix: str | None = None) -> str:
    """A session id shared by every host without communication.

    ``<prefix>-<n>`` for the ``n``-th programmatic capture of this process (hosts capture
    in lock step, so the ``n``-th capture has the same id everywhere) and
    ``<prefix>-ondemand-<n>`` for on-demand ones. Numbers start at 1.
    """
    with _LOCK:
        _COUNTERS[trigger] = n = _COUNTERS.get(trigger, 0) + 1
    prefix = prefix if prefix is not None else session_prefix()
    tag = "" if trigger == PROGRAMMATIC else f"{_safe(trigger).replace('_', '')}-"
    return f"{prefix}-{tag}{n:04d}"


# --- one capture ------------------------------------------------------------------


class _Capture:
    """One running profiler session and its span."""

    def __init__(self, framework, session_id, root, trigger, pindex, options):
        self.framework = framework
        self.session_id = session_id
        self.root = root
        self.dir = os.path.join(root, session_id)
        self.trigger = trigger
        self.process_index = pindex
        self.options = dict(options or {})
        self.thread = threading.get_ident()
        self.started_ns = 0
        self._prof = None  # the torch profiler
        self._phase = None

    # The span starts before the profiler does and ends after its files are written:
    # profiler start-up and export are profiling time too.
    def start(self) -> None:
        from goodput.phases import Phase

        self._phase = Phase(schema.CUSTOM_BADPUT, {
            schema.ATTR_BADPUT_TYPE: schema.PROFILE_BADPUT_TYPE,
            schema.ATTR_PROFILE_SESSION: self.session_id,
            schema.ATTR_PROFILE_DIR: self.dir,
            schema.ATTR_PROFILE_TRIGGER: self.trigger,
        })
        self._phase.begin()
        self.started_ns = time.time_ns()
        os.makedirs(self.dir, exist_ok=True)
        if self.framework == "jax":
            self._start_jax()
        else:
            self._start_torch()

    def _start_jax(self) -> None:
        import jax

        opts = jax.profiler.ProfileOptions()
        for key, value in self.options.items():
            if value is not None:
                setattr(opts, key, value)
        # The run folder under plugins/profile/ is the session id (not a timestamp), so
        # XProf shows the hosts of one session together.
        opts.session_id = self.session_id
        jax.profiler.start_trace(self.dir, profiler_options=opts)

    def _start_torch(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

        enabled = getattr(torch.autograd, "_profiler_enabled", None)
        if enabled is not None and enabled():
            # a second session would silently end the one already running
            raise RuntimeError("a torch profiler is already running in this process")
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        worker = f"{_safe(socket.gethostname())}_p{self.process_index}_{os.getpid()}"
        kwargs = {"activities": activities,
                  "on_trace_ready": tensorboard_trace_handler(self.dir, worker_name=worker)}
        kwargs.update({k: v for k, v in self.options.items() if k != "host_tracer_level"})
        self._prof = profile(**kwargs)
        self._prof.start()

    def stop(self) -> str | None:
        """Stop the profiler and record the span; returns an error string or None."""
        err = None
        try:
            if self.framework == "jax":
                self._stop_jax()
            else:
                self._prof.stop()  # writes the trace through on_trace_ready
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
            _error("stopping session %s failed: %s", self.session_id, err)
        finally:
            self._prof = None
            self._phase.finish(error=err)
        return err

    def _stop_jax(self) -> None:
        import jax

        try:
            jax.profiler.stop_trace()
        except Exception:
            _reset_jax_profiler()
            raise

    def abort(self) -> None:
        """Undo a failed start (no span: nothing was captured)."""
        try:
            if self.framework == "jax":
                _reset_jax_profiler()
            elif self._prof is not None:
                self._prof.stop()
        except Exception:  # pragma: no cover - best effort
            pass
        self._prof = None


def _reset_jax_profiler() -> None:
    """After a failed export JAX still thinks a session runs: forget it (private API,
    feature-detected) so that later captures work."""
    try:
        from jax._src import profiler as jp

        state = getattr(jp, "_profile_state", None)
        if state is not None and getattr(state, "profile_session", None) is not None:
            state.reset()
    except Exception as exc:  # pragma: no cover - depends on JAX internals
        _log.debug("cannot reset the JAX profiler state: %s", exc)


def start_capture(
    *,
    trigger: str,
    dir=None,
    session_id: str | None = None,
    framework: str = "auto",
    options=None,
    run=None,
) -> _Capture | None:
    """Start a capture of this process (the building block of :class:`Profile` and the
    on-demand trigger). Returns None (logged, counted) when it cannot start."""
    global _ACTIVE, _ATEXIT
    if framework not in FRAMEWORKS:
        _error("unknown framework %r (use one of %s)", framework, ", ".join(FRAMEWORKS))
        return None
    fw = detect_framework(framework)
    if fw is None:
        _error("no framework to profile: neither jax nor torch is imported")
        return None
    run = run if run is not None else _current_run()
    if session_id is None:
        session_id = next_session_id(trigger, session_prefix(run))
    session_id = _safe(session_id)
    cap = _Capture(fw, session_id, resolve_dir(dir, run), trigger, process_index(run), options)
    with _LOCK:
        if _ACTIVE is not None:
            busy = _ACTIVE.session_id
        else:
            busy = None
            _ACTIVE = cap
        if not _ATEXIT:
            atexit.register(_stop_at_exit)
            _ATEXIT = True
    if busy is not None:
        _count("refused")
        _log.warning("goodput profile: session %s not started: session %s is running "
                     "(nested or overlapping captures are refused)", session_id, busy)
        return None
    try:
        cap.start()
    except Exception as exc:
        cap.abort()
        with _LOCK:
            _ACTIVE = None
        _error("cannot start session %s (%s): %s: %s", session_id, fw, type(exc).__name__, exc)
        return None
    _log.info("goodput profile: session %s started (%s, %s) -> %s", session_id, fw, trigger,
              cap.dir)
    return cap


def stop_capture(cap: _Capture | None) -> str | None:
    """Stop ``cap`` (from :func:`start_capture`); returns an error string or None."""
    global _ACTIVE
    if cap is None:
        return None
    if cap.framework == "torch" and threading.get_ident() != cap.thread:
        _count("refused")
        msg = (f"session {cap.session_id} not stopped: the torch profiler must be stopped on "
               "the thread that started it")
        _log.warning("goodput profile: %s", msg)
        return msg
    with _LOCK:
        if _ACTIVE is not cap:
            return None  # already stopped (at exit, by the other trigger)
    try:
        err = cap.stop()
    finally:
        with _LOCK:
            if _ACTIVE is cap:
                _ACTIVE = None
            _STATS["captures"] += 1
    _log.info("goodput profile: session %s stopped -> %s", cap.session_id, cap.dir)
    return err


def _stop_at_exit() -> None:
    cap = _ACTIVE
    if cap is not None:
        _log.warning("goodput profile: session %s still running at exit: stopping it",
                     cap.session_id)
        stop_capture(cap)


# --- the public object ------------------------------------------------------------


class Profile:
    """A reusable profile capture: context manager, decorator, or :meth:`start`/:meth:`stop`.

    Made by :func:`profile`. Attributes: ``session_id`` and ``session_dir`` of the latest
    capture of this object (None before the first or on processes that do not capture),
    ``active`` (True while capturing).
    """

    def __init__(self, dir=None, *, session_id=None, process_indices=None, framework="auto",
                 host_tracer_level=None, python_tracer_level=None, options=None,
                 trigger=PROGRAMMATIC):
        if framework not in FRAMEWORKS:
            _log.warning("goodput profile: unknown framework %r (use one of %s)",
                         framework, ", ".join(FRAMEWORKS))
        self.dir = dir
        self.session_id_arg = session_id
        self.process_indices = (None if process_indices is None
                                else frozenset(int(i) for i in process_indices))
        self.framework = framework
        self.trigger = trigger
        opts = dict(options or {})
        if host_tracer_level is not None:
            opts["host_tracer_level"] = int(host_tracer_level)
        if python_tracer_level is not None:
            opts["python_tracer_level"] = int(python_tracer_level)
        self.options = opts
        self.session_id: str | None = None
        self.session_dir: str | None = None
        self._cap: _Capture | None = None
        self._skipped = False  # the latest start() was for other processes only
        self._owned: list = []  # per ``with``: the capture it started, or None

    @property
    def active(self) -> bool:
        return self._cap is not None

    def start(self, session_id: str | None = None) -> Profile:
        """Start a capture (``session_id``: this capture's id; default the one given to
        :func:`profile`, else a generated one shared by every host). Returns self."""
        if self._cap is not None:
            _count("refused")
            _log.warning("goodput profile: start() while session %s of this profile is "
                         "running: ignored", self._cap.session_id)
            return self
        self._skipped = False
        run = _current_run()
        sid = session_id if session_id is not None else self.session_id_arg
        if sid is None:
            # allocated on every process, capturing or not, so numbers stay in lock step
            sid = next_session_id(self.trigger, session_prefix(run))
        if self.process_indices is not None and process_index(run) not in self.process_indices:
            _count("skipped")
            self._skipped = True
            _log.debug("goodput profile: process %s not in %s: session %s not captured here",
                       process_index(run), sorted(self.process_indices), sid)
            return self
        self._cap = start_capture(trigger=self.trigger, dir=self.dir, session_id=sid,
                                  framework=self.framework, options=self.options, run=run)
        if self._cap is not None:
            self.session_id, self.session_dir = self._cap.session_id, self._cap.dir
        return self

    def stop(self) -> None:
        """Stop the running capture and write its files; without one, a warning."""
        cap = self._cap
        if cap is None:
            if self._skipped:  # this process does not capture: nothing to stop
                self._skipped = False
                return
            _log.warning("goodput profile: stop() without a running capture: ignored")
            return
        if cap.framework == "torch" and threading.get_ident() != cap.thread:
            stop_capture(cap)  # refused (logged): keep it so the right thread can stop it
            return
        self._cap = None
        stop_capture(cap)

    def _start_owned(self) -> _Capture | None:
        """Start; return the capture if this call started one (else None)."""
        before = self._cap
        self.start()
        cap = self._cap
        return cap if cap is not None and cap is not before else None

    def _stop_owned(self, cap: _Capture | None) -> None:
        if cap is not None and self._cap is cap:
            self.stop()

    def __enter__(self) -> Profile:
        self._owned.append(self._start_owned())
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # a nested ``with`` of the same object was refused: only the outer one stops
        self._stop_owned(self._owned.pop() if self._owned else None)

    def __call__(self, func):
        """Use as a decorator: each call of ``func`` is one capture (a call made while
        another capture runs, e.g. recursively or from another thread, is not captured)."""

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            cap = self._start_owned()
            try:
                return func(*args, **kwargs)
            finally:
                self._stop_owned(cap)

        return wrapper


def profile(dir=None, *, session_id: str | None = None, process_indices=None,
            framework: str = "auto", host_tracer_level: int | None = None,
            python_tracer_level: int | None = None, options=None) -> Profile:
    """A profile capture of this process, as context manager, decorator or start/stop.

    Args:
        dir: root directory of the profiles; each capture writes ``<dir>/<session_id>/``.
            Default: the current ML run's ``profile_dir``, else ``<goodput run_dir>/profiles``,
            else ``./profiles``.
        session_id: id of the capture (all hosts that pass the same id form one multi-host
            session). Default: ``<prefix>-<n>``, the same on every host for the ``n``-th
            capture (prefix: the run's ``session_prefix``, else ``<job>-a<attempt>``).
        process_indices: only processes with these indices capture; others do nothing.
            Default: all.
        framework: ``"auto"`` (JAX if ``jax`` is imported, else PyTorch if ``torch`` is),
            ``"jax"`` or ``"torch"``. Never imports a framework.
        host_tracer_level, python_tracer_level: JAX ``ProfileOptions`` levels (JAX only).
        options: more settings: for JAX ``ProfileOptions`` attributes, for PyTorch keyword
            arguments of ``torch.profiler.profile`` (e.g. ``{"record_shapes": True}``).

    Returns:
        A :class:`Profile`. Nothing it does raises into the caller (errors are logged and
        counted in :func:`stats`), except the exceptions of the code it wraps.
    """
    return Profile(dir, session_id=session_id, process_indices=process_indices,
                   framework=framework, host_tracer_level=host_tracer_level,
                   python_tracer_level=python_tracer_level, options=options)


#: The name Google Cloud ML Diagnostics uses (``from goodput.diagnostics import xprof``).
xprof = profile
