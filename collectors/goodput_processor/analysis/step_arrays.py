"""The per-step arrays of a job's result (:class:`StepArrays`), built on demand from the
accounting's per-attempt parts of kept steps (``(step numbers, attempt numbers, starts
(ns), times (ns), counts)``, int64 arrays in time order; :mod:`.steptimes` computes the
statistics from the same parts).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from .order_stats import quantiles_of

__all__ = ["StepArrays"]

_NS = 1_000_000_000


class StepArrays:
    """Per kept step span, in time order (all arrays of the same length).

    ``step``: step number (int64, ``NONE`` if the span had none); ``attempt``: attempt
    number (int64); ``start_ns``: span start (int64, ns since the epoch); ``time_ns``: the
    span's time after the overlap rules (int64 ns); ``count``: steps the span covers (int64,
    1 for a recorded step; more only for imported logs, ``goodput.step.count``);
    ``time_s``/``deviation_s``: time per step (``time_ns / count``) and that minus the ideal
    step time (float64 seconds; deviation NaN without an ideal); ``anomalous``: bool.

    Built from the accounting's per-attempt parts; each array is made when first read
    (a live poll that reads none of them costs nothing here). :meth:`of_attempt` gives one
    attempt's steps without making the whole arrays.
    """

    def __init__(self, parts: list, ideal_ns: float | None = None, tol_ns: float = 0.0,
                 keys: list | None = None, kth=None):
        self._parts = parts
        self._kth = kth
        self._keys = keys if keys is not None else [None] * len(parts)
        self._ideal = ideal_ns
        self._tol = tol_ns
        self._offsets = np.concatenate(([0], np.cumsum([len(p[0]) for p in parts],
                                                       dtype=np.int64)))

    def __len__(self) -> int:
        return int(self._offsets[-1])

    @property
    def ideal_ns(self) -> float | None:
        """The ideal step time the flags are taken against (float ns; None: none)."""
        return self._ideal

    @property
    def tol_ns(self) -> float:
        """The noise band above the ideal (float ns)."""
        return self._tol

    def cache_arrays(self) -> tuple[list[np.ndarray], dict]:
        """Its parts' five int64 columns, part by part, and ``{"parts", "ideal", "tol"}``:
        what :mod:`~goodput_processor.read.result_cache` keeps (the memo keys are not kept: a
        report has no memo to give them to)."""
        return ([c for p in self._parts for c in p],
                {"parts": len(self._parts), "ideal": self._ideal, "tol": self._tol})

    @classmethod
    def from_cache_arrays(cls, arrays: list[np.ndarray], meta: dict) -> StepArrays:
        """The :class:`StepArrays` of :meth:`cache_arrays`' output (ValueError if they do
        not fit)."""
        n = len(arrays) // 5
        if len(arrays) != 5 * n or n != meta["parts"]:
            raise ValueError(f"{len(arrays)} step columns for {meta['parts']} parts")
        return cls([tuple(arrays[5 * i:5 * i + 5]) for i in range(n)], meta["ideal"],
                   meta["tol"])

    def _column(self, i: int) -> np.ndarray:
        if not self._parts:
            return np.zeros(0, np.int64)
        if len(self._parts) == 1:
            return self._parts[0][i]
        return np.concatenate([p[i] for p in self._parts])

    @cached_property
    def step(self) -> np.ndarray:
        return self._column(0)

    @cached_property
    def attempt(self) -> np.ndarray:
        return self._column(1)

    @cached_property
    def start_ns(self) -> np.ndarray:
        return self._column(2)

    @cached_property
    def time_ns(self) -> np.ndarray:
        return self._column(3)

    @cached_property
    def count(self) -> np.ndarray:
        return self._column(4)

    @cached_property
    def time_s(self) -> np.ndarray:
        return self._per() / _NS

    @cached_property
    def deviation_s(self) -> np.ndarray:
        if self._ideal is None:
            return np.full(len(self), np.nan)
        return (self._per() - self._ideal) / _NS

    @cached_property
    def anomalous(self) -> np.ndarray:
        if self._ideal is None:
            return np.zeros(len(self), bool)
        return self._per() > self._ideal + self._tol

    def _per(self) -> np.ndarray:
        return self.time_ns / self.count if len(self) else np.zeros(0)

    def take(self, column: str, idx: np.ndarray) -> np.ndarray:
        """``getattr(self, column)[idx]`` for ``column`` in step, attempt, start_ns,
        time_ns, count, without making the whole array (``idx``: int indexes)."""
        i = ("step", "attempt", "start_ns", "time_ns", "count").index(column)
        if column in self.__dict__ or len(self._parts) == 1:
            return getattr(self, column)[idx]
        idx = np.asarray(idx, np.int64)
        part = np.searchsorted(self._offsets, idx, "right") - 1
        out = np.zeros(len(idx), np.int64)
        for j in np.unique(part):
            m = part == j
            out[m] = self._parts[j][i][idx[m] - self._offsets[j]]
        return out

    def time_quantiles_s(self, percents) -> list[float]:
        """Percentiles (``percents``: numbers in [0, 100]) of the time per step, in seconds,
        by linear interpolation between closest ranks; [] without steps. From the
        accounting's sorted runs when it kept them (no pass over every step)."""
        n = len(self)
        if not n:
            return []
        kth = self._kth
        if kth is None:
            per = self._per()
            kth = lambda ks: [float(v) for v in np.partition(per, ks)[ks]]  # noqa: E731
        return quantiles_of(kth, n, _NS, tuple(p / 100 for p in percents))

    def of_attempt(self, attempt: int) -> tuple[int, list, list]:
        """``(offset, parts, keys)``: where attempt ``attempt``'s steps begin in the arrays,
        its parts (one, or one per piece of a running attempt; each ``(step, attempt,
        start_ns, time_ns, count)``, in time order; [] if it kept no step) and the memo keys
        the accounting gave them (None without a memo). The parts are the accounting's
        own: do not modify them."""
        by = self.__dict__.get("_by_attempt")
        if by is None:  # the last attempts' (a live poll's), found from the end: parts come
            got = self._from_end(attempt)  # in attempt order
            if got is not None:
                return got
            by = self.__dict__.setdefault("_by_attempt", {})  # (indexed once, not per call)
        for off, p, key in [] if by else zip(self._offsets[:-1].tolist(), self._parts,
                                             self._keys, strict=True):
            if len(p[1]):
                got = by.setdefault(int(p[1][0]), (off, [], []))
                got[1].append(p), got[2].append(key)
        first, parts, keys = by.get(attempt, (0, (), ()))
        return first, list(parts), list(keys)

    def _from_end(self, attempt: int, most: int = 8):
        """:meth:`of_attempt` from the last parts back, or None after ``most`` parts with
        steps (then index them all)."""
        parts, keys, first, seen = [], [], 0, 0
        for i in range(len(self._parts) - 1, -1, -1):
            p = self._parts[i]
            if not len(p[1]):
                continue
            a = int(p[1][0])
            if a < attempt:
                break
            seen += 1
            if seen > most:
                return None
            if a == attempt:
                parts.append(p), keys.append(self._keys[i])
                first = int(self._offsets[i])
        parts.reverse(), keys.reverse()
        return first, parts, keys
