"""The phase API: context managers and decorators that mark a training loop.

Every phase function returns a :class:`Phase`, which is a context manager, a
decorator, and has explicit :meth:`Phase.begin`/:meth:`Phase.finish` for code
whose start and end are in different places::

    with goodput.step(n):
        loss = train_step(batch)

    @goodput.data_loading()
    def next_batch(): ...

    goodput.checkpoint_save(step=100, start=t0, end=t1)   # back-filled: recorded at once

Times (``start``, ``end``, ``at``) are ``datetime`` objects (naive ones are
local time, as ``datetime.timestamp`` reads them) or seconds since the Unix
epoch (int or float). A bad time or argument is logged and counted (see
``goodput.get_recorder().stats()``) and that phase is not recorded; nothing
here raises into the training loop: a step number that is not an integer >= 0 (after
:func:`goodput.api.step_number`'s conversions: numpy and 0-d torch integers, integral
floats) is logged and counted, and that step not recorded.
"""

from __future__ import annotations

import functools
import time

from goodput import api, schema
from goodput.clock import to_ns

_time_ns = time.time_ns


_recorder = api.get_recorder
_error = api._recorder_or_none_error  # count and log an error, never raise
# api.MAX_STEP (1 << 63) is written as a literal below (a constant: cheaper);
# tests/recorder/test_never_raises.py checks the two agree.


class _Flight:
    """A decorated call in flight, for the recorder's set of phases in flight (hashed by
    identity: a tuple holding the attributes dict could not be)."""

    __slots__ = ("name", "_t0", "attrs")

    def __init__(self, name: str, t0: int, attrs):
        self.name, self._t0, self.attrs = name, t0, attrs


class Phase:
    """One phase of the training loop: becomes one span named ``name``.

    Args:
        name: span name from :mod:`goodput.schema` (e.g. ``schema.STEP``).
        attrs: span attributes (dict) or None.
        start, end: optional explicit times; with both, the phase is recorded
            at once (back-fill) and using it as a context manager is a no-op.
        sync: ask for a spool write and fsync when the phase ends (checkpoint saves).
    """

    __slots__ = ("name", "attrs", "_t0", "_start", "_sync", "_done", "_entry")

    def __init__(self, name: str, attrs=None, start=None, end=None, sync: bool = False):
        self.name = name
        self.attrs = attrs
        self._sync = sync
        self._t0 = None
        self._done = False
        self._start = None
        self._entry = False  # in the recorder's set of phases in flight
        try:
            if start is not None:
                self._start = to_ns(start, "start")
            if end is not None:
                if self._start is None:
                    raise ValueError("end= given without start=")
                self._record(self._start, to_ns(end, "end"), None)
        except Exception as exc:
            self._done = True
            _error("%s not recorded: %s", name, exc)

    def _record(self, t0: int, t1: int, err) -> None:
        self._done = True
        rec = api._RECORDER or _recorder()
        if self._entry:
            rec._open.discard(self)
            self._entry = False
        if t1 < t0:
            rec.error("%s not recorded: end is before start", self.name)
            return
        rec.record(self.name, t0, t1, self.attrs, err)
        if self._sync:
            rec.request_sync()

    def begin(self, at=None) -> Phase:
        """Mark the start (``at``: explicit time, default now). Returns self."""
        if at is None:
            self._t0 = _time_ns()
        else:
            try:
                self._t0 = to_ns(at, "at")
            except Exception as exc:
                _error("%s start not recorded: %s", self.name, exc)
                return self
        self._in_flight()
        return self

    def _in_flight(self) -> None:
        """Tell the recorder the phase is running (:meth:`Recorder.phase_begin`, inlined:
        this is the training thread's hot path)."""
        if not self._entry:
            self._entry = True
            (api._RECORDER or _recorder())._open.add(self)

    def finish(self, at=None, error: str | None = None) -> None:
        """Mark the end (``at``: explicit time, default now) and record the phase."""
        if self._done:
            return
        t0 = self._t0 if self._t0 is not None else self._start
        if t0 is None:
            _error("%s finished but never begun: not recorded", self.name)
            self._done = True
            return
        try:
            t1 = _time_ns() if at is None else to_ns(at, "at")
            self._record(t0, t1, None if error is None else str(error))
        except Exception as exc:
            _error("%s end not recorded: %s", self.name, exc)
            self._done = True

    def __enter__(self) -> Phase:
        if not self._done and self._start is None:
            self._t0 = _time_ns()
            self._in_flight()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._done:
            return
        t0 = self._t0 if self._t0 is not None else self._start
        try:
            self._record(t0, _time_ns(), None if exc_type is None else exc_type.__name__)
        except Exception as err:  # never in place of the block's own exception
            _error("%s not recorded: %r", self.name, err)

    def __call__(self, func):
        """Use as a decorator: each call of ``func`` is one such phase."""
        name, attrs, sync = self.name, self.attrs, self._sync
        if not callable(func):
            _error("%s used as a decorator of %r, which is not callable: not recorded",
                   name, func)
            return _Dropped(name)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            rec = api._RECORDER or _recorder()
            entry = _Flight(name, _time_ns(), attrs)
            rec._open.add(entry)
            err = None
            try:
                return func(*args, **kwargs)
            except BaseException as exc:
                err = type(exc).__name__
                raise
            finally:
                try:
                    rec._open.discard(entry)
                    rec.record(name, entry._t0, _time_ns(), attrs, err)
                    if sync:
                        rec.request_sync()
                except Exception as exc:  # never in place of func's result or exception
                    _error("%s not recorded: %r", name, exc)

        return wrapper


class _Dropped(Phase):
    """A phase that records nothing (its arguments were bad: already logged): a context
    manager, decorator and ``begin``/``finish`` that do nothing."""

    __slots__ = ()

    def __init__(self, name: str):
        super().__init__(name)
        self._done = True

    def begin(self, at=None) -> Phase:
        return self

    def __call__(self, func):
        return func


def _failed(name: str, exc: BaseException, func=None):
    """A phase function failed on its arguments (``exc``): log it, and give what it would
    have given (``func`` itself for a decorator) recording nothing."""
    _error("%s not recorded: %r", name, exc)
    return func if callable(func) else _Dropped(name)


def _flag(value, what: str, default: bool = True) -> bool:
    """``value`` as a bool; one without a truth value (a numpy array) logged, ``default``."""
    try:
        return bool(value)
    except Exception as exc:
        _error("%s=%r has no truth value (%s): taken as %s", what, value, exc, default)
        return default


class _Step(Phase):
    """A step whose number, if not given, is the recorder's next step number: taken when
    it begins (a context manager, :meth:`begin`), or at each call (a decorator)."""

    __slots__ = ()

    def _number(self) -> None:
        if self.attrs is None and not self._done:
            try:
                rec = _recorder()
                n = rec.next_step
                rec.next_step = n + 1
                self.attrs = {schema.ATTR_STEP: n}
            except Exception as exc:
                self._done = True
                _error("%s not recorded: %r", self.name, exc)

    def __enter__(self) -> Phase:
        self._number()
        return super().__enter__()

    def begin(self, at=None) -> Phase:
        self._number()
        return super().begin(at)

    def __call__(self, func):
        if self.attrs is not None:
            return super().__call__(func)
        if not callable(func):
            return _failed(schema.STEP, TypeError(f"{func!r} is not callable"), func)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            try:
                rec = _recorder()
                n = rec.next_step
                rec.next_step = n + 1
                phase = Phase(schema.STEP, {schema.ATTR_STEP: n})
            except Exception as exc:
                phase = _failed(schema.STEP, exc)
            with phase:
                return func(*args, **kwargs)

        return wrapper


def _phase_or_decorate(name, attrs, start, end, func=None, sync=False):
    try:
        phase = Phase(name, attrs, start, end, sync)
        return phase(func) if func is not None else phase
    except Exception as exc:
        return _failed(name, exc, func)


def accelerator_init(func=None, *, start=None, end=None) -> Phase:
    """Accelerator (TPU/GPU) discovery and initialisation: bucket ``accelerator_init``."""
    return _phase_or_decorate(schema.ACCELERATOR_INIT, None, start, end, func)


def training_prep(func=None, *, start=None, end=None) -> Phase:
    """Building the model, optimizer, data pipeline, checkpoint manager: ``training_prep``."""
    return _phase_or_decorate(schema.TRAINING_PREP, None, start, end, func)


def program_startup(func=None, *, start=None, end=None) -> Phase:
    """Compilation, tracing, runtime start: bucket ``program_startup``."""
    return _phase_or_decorate(schema.PROGRAM_STARTUP, None, start, end, func)


def data_loading(func=None, *, blocking: bool = True, start=None, end=None) -> Phase:
    """Waiting for a batch: ``data_loading``; ``blocking=False``: prefetch overlapping steps."""
    attrs = None if _flag(blocking, "data_loading(blocking)") else {schema.ATTR_BLOCKING: False}
    return _phase_or_decorate(schema.DATA_LOADING, attrs, start, end, func)


def step(step: int | None = None, *, start=None, end=None) -> Phase:
    """One training step number ``step`` (int >= 0): ``productive`` / ``training_slowdown``.

    With ``step=None`` the recorder's next step number is used (handy as a
    decorator: ``@goodput.step()``). A numpy or 0-d torch integer, or an integral float
    (``3.0``), is taken as that int; another value (a string, a negative number, ``2.5``)
    is logged and counted, and the phase returned records nothing. Never raises.
    """
    try:
        rec = _recorder()
        if step is None:
            if start is None:  # a decorator or context manager: numbered per use
                return _Step(schema.STEP, None, start, end)
            step = rec.next_step
        elif type(step) is not int or not 0 <= step < 0x8000000000000000:
            step = api.step_number(step)
            if step is None:
                return _Dropped(schema.STEP)
        rec.next_step = step + 1
        return Phase(schema.STEP, {schema.ATTR_STEP: step}, start, end)
    except Exception as exc:
        return _failed(schema.STEP, exc)


def _checkpoint_attrs(step, what: str, then: str, attrs: dict | None = None) -> dict | None:
    if step is not None:
        n = api.step_number(step, what, then)
        if n is not None:
            attrs = {**(attrs or {}), schema.ATTR_CHECKPOINT_STEP: n}
    return attrs


def checkpoint_save(
    step: int | None = None, *, blocking: bool = True, start=None, end=None
) -> Phase:
    """Saving the checkpoint of ``step``: ``checkpoint_save`` if ``blocking``, else async work.

    The spool is written and fsynced when a save ends. A ``step`` that is not a step
    number (see :func:`step`) is logged and the save recorded without it. Never raises.
    """
    try:
        attrs = _checkpoint_attrs(step, "checkpoint_save(step)", "the save is recorded "
                                  "without it", {schema.ATTR_BLOCKING: _flag(
                                      blocking, "checkpoint_save(blocking)")})
        return Phase(schema.CHECKPOINT_SAVE, attrs, start, end, sync=True)
    except Exception as exc:
        return _failed(schema.CHECKPOINT_SAVE, exc)


def checkpoint_restore(step: int | None = None, *, start=None, end=None) -> Phase:
    """Restoring the checkpoint of ``step`` (the step training resumes from). A ``step``
    that is not a step number is logged and the restore recorded without it."""
    try:
        attrs = _checkpoint_attrs(step, "checkpoint_restore(step)",
                                  "the restore is recorded without it")
        return Phase(schema.CHECKPOINT_RESTORE, attrs, start, end)
    except Exception as exc:
        return _failed(schema.CHECKPOINT_RESTORE, exc)


def custom_badput(badput_type: str, *, blocking: bool = True, start=None, end=None) -> Phase:
    """Other non-training work of type ``badput_type`` (e.g. ``"eval"``): ``custom:<type>``.
    A type that is not a string is recorded as its ``str()``. Never raises."""
    try:
        attrs = {schema.ATTR_BADPUT_TYPE: str(badput_type)}
        if not _flag(blocking, "custom_badput(blocking)"):
            attrs[schema.ATTR_BLOCKING] = False
        return Phase(schema.CUSTOM_BADPUT, attrs, start, end)
    except Exception as exc:
        return _failed(schema.CUSTOM_BADPUT, exc)


def collective_wait(func=None, *, start=None, end=None) -> Phase:
    """This process waiting in a collective (an all-reduce, a barrier) for its peers, inside
    a step: from reaching it to its end (schema 1.3, ``goodput.collective_wait``).

    It changes no bucket (the step covers it); it tells the processor which host made a slow
    step slow: the one that reached the collective last (``docs/accounting.md``, "Badput
    attributed to hosts"). Wrap the first collective of the step, where the ranks meet::

        with goodput.step(n):
            loss = model(batch)
            with goodput.collective_wait():
                dist.all_reduce(loss_for_logging)
            loss.backward()
    """
    return _phase_or_decorate(schema.COLLECTIVE_WAIT, None, start, end, func)
