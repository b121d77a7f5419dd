"""What one accounting of a job can hand to the next: per-process and per-attempt results
kept between polls of a live job (``goodput serve``, the monitor, the drop-in calculator).

A live job grows at its end: new spans land in the running attempt's processes, while the
finished attempts' rows stay as they are. The accounting's per-process steps (open records
resolved, the evidence of :mod:`.attempts`) and per-attempt steps (painting, resume step,
warnings, the failed attempt's last progress) are pure functions of those rows and of a
few numbers (the attempt's bounds, the kept-step bound, the bucket levels). An
:class:`AccountingMemo` keeps their results keyed by exactly those inputs, so a poll
recomputes only what new rows can change; the job-wide statistics (ideal step time, noise
band, slowdown, percentiles) are recomputed from the kept steps every time. The result is
the same, to the nanosecond, as accounting the job afresh (``tests/test_incremental.py``).

A process's rows are identified by :func:`rows_key`: their number and the bytes of the last
and the first row. That is exact for the rows of ``goodput serve`` and of a spool tailer,
which only ever grow at the end (a duplicate is dropped where it arrives, so the rows kept
never change); a caller that edits rows in place must not pass a memo.

A summary of a running process's rows (its evidence, its step numbers, its restart phases)
is kept by :func:`folded` for the rows that only grow, and a poll summarises only the rows
added since. The rows an accounting with a memo gives its attempts live in a buffer of the
memo (the open records resolved at their end): they are valid until the next accounting
with the same memo, which may write over those records; results keep no view of them.
"""

from __future__ import annotations

import numpy as np

__all__ = ["AccountingMemo", "HashedKey", "cached", "data_key", "folded", "proc_key",
           "process_state", "rows_key"]

_MISS = object()


def rows_key(data: np.ndarray) -> tuple:
    """Identity of one process's rows (an ``(n, NCOLS)`` int64 array): ``(n, last row
    bytes, first row bytes)``."""
    if not len(data):
        return (0, b"", b"")
    return (len(data), data[-1].tobytes(), data[0].tobytes())


def data_key(p) -> tuple:
    """:func:`rows_key` of a process's rows ``p.data`` (a ``ProcessSpans``), without
    reading them where it knows it (``p.rows_id``: rows ``goodput serve`` keeps packed,
    :class:`~goodput_processor.model.packed.PackedProcessSpans`)."""
    rid = getattr(p, "rows_id", None)
    return rid if rid is not None else rows_key(p.data)


def proc_key(p) -> tuple:
    """Memo identity of a process's rows ``p.data`` (a ``ProcessSpans``): its ``origin``
    when its rows were derived (the attempts' processes: open records resolved, which moves
    them to the end and drops superseded ones, so those rows do not only grow at the end),
    else :func:`data_key` of its rows."""
    origin = getattr(p, "origin", None)
    return origin if origin is not None else data_key(p)


def process_state(memo: AccountingMemo, origin: tuple) -> dict:
    """What is kept of one process across polls (its open records' resolver, the summaries
    of :func:`folded`), by the process's key and resource identity in ``origin`` (a
    ``ProcessSpans.origin``), in ``memo.processes``. Kept while each accounting asks for it
    (:func:`goodput_processor.model.attempts.build_attempts` does, for every process)."""
    key = (origin[0], origin[2])
    memo._touched.add(key)
    return memo.processes.setdefault(key, {})


def folded(memo: AccountingMemo | None, tag: str, p, summarize, combine, *params):
    """``summarize(p.data)`` for a process ``p`` (a ``ProcessSpans``), through ``memo``:
    the summary of the rows that only grow is kept, and a later call summarises only the
    rows added since, then the rest (the open records resolved). The rows that only grow
    are ``p.data[:p.settled]`` for an attempt's process (rows derived with ``origin``; none
    when ``settled`` is None), and all of a process's own rows as read (no ``origin``: the
    rows a memo is given only grow at the end).

    Args:
        memo: an :class:`AccountingMemo`, or None (then just ``summarize(p.data)``).
        tag: names the summary; ``params``: hashable inputs it depends on besides the rows
            (a summary kept with other params is not used).
        summarize: ``rows (k, NCOLS) -> summary``, for any ``k >= 1`` (and for ``p.data``,
            which may be empty).
        combine: ``(summary of rows A, summary of rows B) -> summary of A then B`` (A's rows
            come first: ties must go as ``summarize`` of both would take them).
    """
    origin = getattr(p, "origin", None)
    if origin is None:  # (keyed like the attempts' processes: key, rows, resource)
        origin, whole = ((p.attempt, p.index, p.instance), None, None), data_key(p)
        m = whole[0]
        if memo is not None and m:  # all of its rows summarised before: not read again
            kept = process_state(memo, origin).get(tag)
            if kept is not None and kept[0] == params and kept[1:3] == (m, whole):
                return kept[3]
    else:
        m = getattr(p, "settled", None)
        if memo is not None and m:  # derived from the same rows as before, and the same
            # count, first and last row (rows goodput serve packed are not read for it)
            kept = process_state(memo, origin).get(tag)
            if kept is not None and kept[0] == params and kept[4:7] == (origin, m,
                                                                        data_key(p)):
                return kept[7]
    d = p.data
    if memo is None or not m:
        return _in_pieces(summarize, combine, d)
    state = process_state(memo, origin)
    kept = state.get(tag)
    if kept is not None and kept[0] == params and kept[1] <= m and rows_key(
            d[: kept[1]]) == kept[2]:
        n0, s = kept[1], kept[3]
        if m > n0:
            s = combine(s, _in_pieces(summarize, combine, d[n0:m]))
    else:
        s = _in_pieces(summarize, combine, d[:m])
    whole = combine(s, _in_pieces(summarize, combine, d[m:])) if len(d) > m else s
    state[tag] = (params, m, rows_key(d[:m]), s, origin, m, rows_key(d), whole)
    return whole


#: Rows :func:`folded` summarises at once: longer runs of rows (a one-shot report of a long
#: attempt, a memo's first poll) are summarised this many at a time and combined, so that
#: a summary's temporaries (2 MiB per int64 column at this size) do not grow with the job.
CHUNK_ROWS = 1 << 18


def _in_pieces(summarize, combine, d):
    """``summarize(d)``, as ``combine`` of the summaries of :data:`CHUNK_ROWS` rows at a
    time (the same summary: ``combine`` is exact for any split)."""
    n = CHUNK_ROWS
    if len(d) <= n:
        return summarize(d)
    s = summarize(d[:n])
    for i in range(n, len(d), n):
        s = combine(s, summarize(d[i : i + n]))
    return s


class HashedKey(tuple):
    """A memo key (a tuple) that computes its hash once: a key kept from poll to poll and
    hashed inside longer keys (the parts' keys of a job's kept steps) costs one call, not
    a walk of its items, each time. Equal to, and hashed as, the plain tuple."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_h")
        if h is None:
            h = self.__dict__["_h"] = tuple.__hash__(self)
        return h


def cached(memo: AccountingMemo | None, key, compute):
    """``compute()``, kept in ``memo`` under ``key`` (:meth:`AccountingMemo.get`); without
    a memo, just ``compute()``."""
    return compute() if memo is None else memo.get(key, compute)


class AccountingMemo:
    """Results of accounting steps kept from one accounting of a job to the next.

    :meth:`get` returns the value kept under ``key`` or computes and keeps it;
    :meth:`end_round`, called after each accounting, drops what that accounting did not
    use, so the memo holds one accounting's worth of results (memory bounded by the job's
    rows, not by the number of polls). Not thread-safe: one accounting at a time.
    ``hits``/``misses`` count lookups (for tests and benchmarks).

    ``processes`` holds what is kept per process (:func:`process_state`); memos of one job
    may share it (``goodput serve``'s report and rolling windows: one copy of a process's
    resolved rows), if their accountings run one at a time. After each accounting, the
    processes it did not ask for are dropped from it.
    """

    def __init__(self, processes: dict | None = None) -> None:
        self._old: dict = {}
        self._new: dict = {}
        self.processes: dict = {} if processes is None else processes
        self._touched: set = set()
        #: the processes' memo identities of the last accounting, by key
        #: (:func:`goodput_processor.model.attempts.build_attempts`)
        self.origins: dict = {}
        #: the finished attempts' contribution, folded once (the account stage's
        #: :class:`goodput_processor.account.live.Prefix`; None: none yet)
        self.prefix = None
        #: the runs grouped into attempts by the last accounting
        #: (:func:`goodput_processor.model.attempts.build_attempts`; None: none kept)
        self.grouping = None
        self.hits = 0
        self.misses = 0

    def get(self, key, compute):
        """The value under ``key`` (a hashable tuple naming the step and all its inputs),
        or ``compute()`` kept under it."""
        value = self._new.get(key, _MISS)
        if value is not _MISS:
            return value
        value = self._old.pop(key, _MISS)
        if value is _MISS:
            value = compute()
            self.misses += 1
        else:
            self.hits += 1
        self._new[key] = value
        return value

    def put(self, key, value) -> None:
        """Keep ``value`` under ``key``, in place of what is kept there (between two
        accountings too: then it is kept as the last accounting's)."""
        if key in self._new or key not in self._old:
            self._new[key] = value
        else:
            self._old[key] = value

    def kept(self, key):
        """The value kept under ``key``, or None; unlike :meth:`peek`, it does not count as
        used (for maintenance between accountings)."""
        value = self._new.get(key, _MISS)
        if value is _MISS:
            value = self._old.get(key)
        return value

    def entries(self, tag) -> list[tuple]:
        """``(key, value)`` of every result kept under a key whose first item is ``tag``."""
        return [(k, v) for d in (self._old, self._new) for k, v in d.items()
                if isinstance(k, tuple) and k and k[0] == tag]

    def peek(self, key):
        """The value under ``key`` if one is kept (then it counts as used), else None."""
        value = self._new.get(key, _MISS)
        if value is _MISS:
            value = self._old.pop(key, _MISS)
            if value is _MISS:
                return None
            self._new[key] = value
        return value

    def end_round(self) -> None:
        """End of one accounting: results and processes it did not use are dropped."""
        self._old, self._new = self._new, {}
        for key in [k for k in self.processes if k not in self._touched]:
            del self.processes[key]
        self._touched = set()

    def __len__(self) -> int:
        return len(self._old) + len(self._new)
