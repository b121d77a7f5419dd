"""Attempts of a ``resiliency`` event log, found from per-node evidence.

A resiliency log has no attempt number. Most restarts of a large job are pod kills, after
which nobody logs ``job_terminated``: the only sign of a restart is that nodes log
``job_started`` again. :class:`AttemptFinder` reads one job's events in time order and
assigns each to an attempt (``docs/migration.md``, "Resiliency logs without terminate
events", states the same rules for users):

- **Duplicate or restart.** A node's ``job_started`` repeated within ``window_ns`` of its
  start in its current attempt, with no checkpoint or termination event of that attempt
  in between and no newer attempt begun meanwhile, is a duplicate line (launchers log the
  same start twice, 0.1-3 s apart): counted in :attr:`AttemptFinder.duplicates` and
  dropped. Any other repeat is a restart of the node. A repeat inside the window that the
  other evidence calls a restart is reported as :data:`AMBIGUOUS` (and taken as a restart).
- **Attempts.** A node's restart begins a new attempt when the node has already started in
  the open attempt; otherwise it joins the open attempt (the rest of a restart wave). The
  first ``job_started`` of all, and the first one after a ``job_terminated`` of the open
  attempt, also begin one. An attempt that died before loading a checkpoint is an attempt.
- **The wave's first lines.** A node that was absent from the open attempt can log the
  first start of the next wave before any node repeats. When a restart begins attempt
  ``a + 1``, the starts in attempt ``a`` that are later than both the restarting node's
  own start in ``a`` and ``a``'s last checkpoint or termination event, and that chain to
  the restart with gaps of at most ``window_ns``, move to ``a + 1``.
- **Other events** belong to their node's current attempt, so late events of a slow node
  stay in the attempt they belong to while the others restart. Exceptions, each evidence
  of a restart whose ``job_started`` line is missing: after the node's own
  ``job_terminated``, its events go to the open attempt when that is newer; a second
  ``checkpoint_loaded`` of a node in one attempt goes to the open attempt when that is
  newer, else begins a new attempt (:data:`NO_START`).

Times are integers (nanoseconds since the epoch in the importer); nodes are ``node_rank``.
"""

from __future__ import annotations

__all__ = ["AMBIGUOUS", "DEFAULT_DUPLICATE_WINDOW_S", "NO_START", "AttemptFinder"]

#: Default of ``goodput import --duplicate-window`` (seconds).
DEFAULT_DUPLICATE_WINDOW_S = 10.0
#: Problem reason: a repeated ``job_started`` inside the window, taken as a restart.
AMBIGUOUS = "ambiguous restart"
#: Problem reason: a second ``checkpoint_loaded`` of a node began an attempt without a start.
NO_START = "restart without job_started"
_NEVER = -(2**63)


class AttemptFinder:
    """Assigns the events of one job, fed in time order, to attempts numbered 0, 1, ...

    After the events: :attr:`starts` maps ``(attempt, node)`` to the node's start in that
    attempt, :attr:`ends` to its last ``job_terminated``; :attr:`duplicates` counts the
    repeated ``job_started``/``job_terminated`` lines dropped.

    Args:
        window_ns: a repeated ``job_started`` of a node at most this long after its start
            (same time unit as the events), with nothing in between, is a duplicate.
    """

    def __init__(self, window_ns: int) -> None:
        self.window_ns = window_ns
        self.open = -1  # the attempt new nodes join
        self.terminated = False  # a job_terminated was assigned to the open attempt
        self.current: dict[int, int] = {}  # node -> its current attempt
        self.starts: dict[tuple[int, int], int] = {}
        self.ends: dict[tuple[int, int], int] = {}
        self.duplicates = 0
        self._loaded: set[tuple[int, int]] = set()
        self._members: list[list[tuple[int, int]]] = []  # per attempt: (start, node), by time
        self._events: list[int] = []  # per attempt: checkpoint and termination events so far
        self._last_event: list[int] = []  # per attempt: time of the latest of them
        self._events_at_start: dict[tuple[int, int], int] = {}

    def first_start(self, attempt: int) -> int | None:
        """The earliest ``job_started`` of ``attempt`` (None: none yet)."""
        m = self._members[attempt]
        return m[0][0] if m else None

    def start(self, node: int, t: int) -> str | None:
        """A ``job_started`` of ``node`` at ``t``; returns a problem reason or None."""
        cur = self.current.get(node)
        ambiguous = False
        if cur is not None and (cur, node) in self.starts:
            if t - self.starts[cur, node] <= self.window_ns:
                if cur == self.open and self._events[cur] == self._events_at_start[cur, node]:
                    self.duplicates += 1
                    return None
                ambiguous = True
        o = self.open
        if o < 0 or self.terminated or (o, node) in self.starts:
            moved = self._wave(o, node, t) if o >= 0 and not self.terminated else []
            a = self._new()
            for s, n in moved:
                self._join(a, n, s)
        else:
            a = o
        self._join(a, node, t)
        return AMBIGUOUS if ambiguous else None

    def terminate(self, node: int, t: int) -> int | None:
        """A ``job_terminated`` of ``node`` at ``t``; returns its attempt (None: before any
        start, ignored). A repeat in the same attempt is a duplicate; the last one wins."""
        cur = self.current.get(node)
        if cur is None:
            if self.open < 0:
                return None
            a = self.current[node] = self.open
        elif cur < self.open and (cur, node) in self.ends:
            a = self.current[node] = self.open
        else:
            a = cur
        if (a, node) in self.ends:
            self.duplicates += 1
        self.ends[a, node] = t
        self._event(a, t)
        if a == self.open:
            self.terminated = True
        return a

    def checkpoint(self, node: int, t: int, loaded: bool) -> tuple[int, str | None]:
        """A ``checkpoint_loaded`` (``loaded``) or ``checkpoint_saved`` of ``node`` at ``t``;
        returns ``(attempt, problem reason or None)``. Events before any start belong to
        attempt 0."""
        cur = self.current.get(node)
        problem = None
        if cur is None:
            a = self.open if self.open >= 0 else self._new()
            self.current[node] = a
        elif cur < self.open and ((cur, node) in self.ends or (loaded and (cur, node) in
                                                                self._loaded)):
            a = self.current[node] = self.open
        elif loaded and (cur, node) in self._loaded:
            a = self.current[node] = self._new()
            problem = NO_START
        else:
            a = cur
        if loaded:
            self._loaded.add((a, node))
        self._event(a, t)
        return a, problem

    # --- internals ---------------------------------------------------------------------

    def _new(self) -> int:
        self.open += 1
        self.terminated = False
        self._members.append([])
        self._events.append(0)
        self._last_event.append(_NEVER)
        return self.open

    def _join(self, a: int, node: int, t: int) -> None:
        self.starts[a, node] = t
        self.current[node] = a
        self._events_at_start[a, node] = self._events[a]
        self._members[a].append((t, node))

    def _event(self, a: int, t: int) -> None:
        self._events[a] += 1
        self._last_event[a] = max(self._last_event[a], t)

    def _wave(self, o: int, node: int, t: int) -> list[tuple[int, int]]:
        """Starts of attempt ``o`` that open the wave ``node`` restarts in at ``t``: those
        after ``node``'s own start in ``o`` and after ``o``'s last event, chained to ``t``
        by gaps of at most the window. They are removed from ``o`` and returned."""
        own = self.starts.get((o, node))
        if own is None:
            return []
        floor = max(own, self._last_event[o])
        m = self._members[o]
        i, last = len(m), t
        while i > 0 and m[i - 1][0] > floor and last - m[i - 1][0] <= self.window_ns:
            i -= 1
            last = m[i][0]
        moved = m[i:]
        del m[i:]
        for _s, n in moved:
            del self.starts[o, n]
            del self._events_at_start[o, n]
        return moved
