"""Step times of the mgm event stream: mgm 0.2.3's ideal step time
(:func:`compute_ideal_step_time`) and step deviation (``get_step_deviation``)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .mgm_events import E_STEP, Events
from .mgm_result import _NS

__all__ = ["Deviation", "compute_ideal_step_time", "dict_order"]


class Deviation(Mapping):
    """mgm's step deviation, step number -> ``|step time - ideal|`` (seconds), a read-only
    mapping over arrays: ``keys`` (step numbers, in mgm's dict order), ``times`` (seconds)
    and ``ideal`` (seconds; None: empty). Equal to (and ordered as) the dict
    ``dict(zip(keys, abs(times - ideal)))``, which is made on the first lookup or full
    iteration; its length and its last values (:meth:`last_values`) are read without it."""

    __slots__ = ("_keys", "_times", "_ideal", "_dict")

    def __init__(self, keys: np.ndarray, times: np.ndarray, ideal: float | None) -> None:
        if ideal is None:
            keys, times = keys[:0], times[:0]
        self._keys, self._times, self._ideal, self._dict = keys, times, ideal, None

    def _d(self) -> dict[int, float]:
        if self._dict is None:
            self._dict = dict(zip(self._keys.tolist(),
                                  np.abs(self._times - self._ideal).tolist(), strict=True))
        return self._dict

    def __getitem__(self, step: int) -> float:
        return self._d()[step]

    def __iter__(self):
        return iter(self._d())

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return repr(self._d())

    def str_keyed(self, start: int = 0, stop: int | None = None) -> dict[str, float]:
        """The mapping with its step numbers as strings (for JSON), in the same order; its
        entries ``start`` to ``stop`` (positions, as a slice) when given."""
        if self._dict is not None and start == 0 and stop is None:
            return dict(zip(map(str, self._dict), self._dict.values(), strict=True))
        keys, times = self._keys[start:stop], self._times[start:stop]
        return dict(zip(map(str, keys.tolist()), np.abs(times - self._ideal).tolist(),
                        strict=True))

    def last_values(self, n: int) -> list[float]:
        """The last ``n`` values (or all when fewer), in order."""
        n = min(n, len(self._keys))
        if n <= 0:
            return []
        return np.abs(self._times[len(self._times) - n:] - self._ideal).tolist()

    def __reduce__(self):
        return Deviation, (self._keys, self._times, self._ideal)

    def cache_arrays(self) -> tuple[list[np.ndarray], float | None]:
        """``([keys, times], ideal)``: what :mod:`~goodput_processor.read.result_cache` keeps."""
        return [self._keys, self._times], self._ideal

    @classmethod
    def from_cache_arrays(cls, arrays: list[np.ndarray], ideal: float | None) -> Deviation:
        """The :class:`Deviation` of :meth:`cache_arrays`' output (ValueError if they do
        not fit)."""
        keys, times = arrays
        if len(keys) != len(times) or keys.dtype.kind != "i" or times.dtype.kind != "f":
            raise ValueError("step deviation: keys and times do not fit")
        return cls(keys, times, ideal)



def compute_ideal_step_time(step_times_s) -> float | None:
    """mgm 0.2.3 ``goodput_utils.compute_ideal_step_time`` (seconds in, seconds out).

    Step times under 1 s are dropped (None when none is left: sub-second steps never get
    an ideal step time); of the rest, the mean of those at most median + 3 x MAD (median
    absolute deviation from the median).
    """
    x = (step_times_s.astype(np.float64, copy=False) if isinstance(step_times_s, np.ndarray)
         else np.asarray(list(step_times_s), np.float64))
    x = x[x >= 1.0]
    if not len(x):
        return None
    med = float(np.median(x))
    mad = float(np.median(np.abs(x - med)))
    return float(np.mean(x[x <= med + 3 * mad]))


def _step_times(ev: Events) -> dict[int, float]:
    """mgm 0.2.3 ``_get_step_times``: over all step events in stream order, the time from
    a step start to the next one when the next number is one higher, keyed by the first
    step's number (a later occurrence overwrites an earlier one). Raw seconds: custom
    badput and restarts are not taken out."""
    keys, times = _step_time_arrays(ev)
    return dict(zip(keys.tolist(), times.tolist(), strict=True))


def _step_time_arrays(ev: Events) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_step_times` as arrays: the step numbers in the dict's order (of first
    occurrence) and their times (seconds, of the last occurrence)."""
    # (a step per event of a whole job's stream: temporaries go as soon as they are used)
    sel = ev.kind == E_STEP
    num = ev.val[sel]
    ok = num[1:] == num[:-1] + 1
    keys = num[:-1][ok]
    del num
    times = np.diff(ev.t[sel])[ok].astype(np.float64)
    del sel, ok
    times /= _NS
    if len(keys) < 2 or (keys[1:] > keys[:-1]).all():
        return keys, times
    return dict_order(keys, times)


def dict_order(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, values)`` as ``dict(zip(keys, values))`` holds them: each key once, at
    the place of its first occurrence, with the value of its last."""
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    head = np.ones(len(sk), bool)
    head[1:] = sk[1:] != sk[:-1]
    del sk
    tail = np.ones(len(head), bool)
    tail[:-1] = head[1:]
    first = order[head]
    del head
    last = order[tail]
    del order, tail
    o = np.argsort(first)
    first = first[o]
    last = last[o]
    del o
    return keys[first], values[last]


def _deviation(ev: Events, ideal_step_time_s) -> tuple[float | None, Deviation]:
    """``(ideal step time, step deviation)`` of :class:`MgmResult` (seconds) for the step
    events of ``ev``: ``ideal_step_time_s``, else :func:`compute_ideal_step_time` of the
    step times (:func:`_step_times`)."""
    return deviation_of(*_step_time_arrays(ev), ideal_step_time_s)


def deviation_of(keys: np.ndarray, times: np.ndarray, ideal_step_time_s
                 ) -> tuple[float | None, Deviation]:
    """:func:`_deviation` of the step times ``keys``/``times`` (:func:`_step_time_arrays`)."""
    ideal = ideal_step_time_s
    if ideal is None:
        ideal = compute_ideal_step_time(times)
    return ideal, Deviation(keys, times, ideal)
