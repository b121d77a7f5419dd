"""Admission of gRPC calls to ``goodput serve`` before their message is read.

gRPC core buffers a call's message only while someone reads it: until then it holds at most
the HTTP/2 stream window of it. So a call of the receiver
(:mod:`goodput_processor.serve.grpc_receiver`) is checked (token) and admitted *before* its
message is read: it takes a **read slot** here, which holds a reservation of the shared
:class:`~goodput_processor.serve.limits.ByteBudget` (the receiver's: twice
``max_message_bytes``, the most gRPC core can buffer for it, as larger messages are refused
by core, ``grpc.max_receive_message_length``, and its copy as Python bytes) and one of
at most ``max_readers`` reading places, until its message has arrived and its actual size
(bytes + parsed estimate) replaces the reservation, or until it ends. Readers together
reserve at most half the budget, so calls that never send cannot hold what HTTP requests
need. When that much is not
free, one call at a time is read on :data:`LEAN_BYTES`, or on nothing when not even that is
free (HTTP requests may hold the whole budget: slow bodies hold their ``Content-Length``),
so that small exports get through while others hold the budget: the budget may then be
exceeded by at most one reservation, and the message, once read, still needs its size of
the budget (:meth:`ReadSlot.settle`).

A call that never sends its message must not keep the others out (a slow-loris). Readers
wait at most ``deadline_s`` (``--request-timeout``) for their message, and when a call finds
no slot free, one reader is **ended early** (:meth:`ReadSlots.admit`):

1. the oldest reader of the connection (peer address and port) holding the most readers,
   if it holds at least two more than the caller's connection: one client's stalled calls
   never keep out another connection's export, whatever their age;
2. else, of the readers that have waited ``stale_s`` (0.25 s) for their message, the oldest
   of the connection holding the most of them, if that connection holds more readers than
   the caller's (a real exporter's message follows its headers at once; one that is late
   makes room, and its call gets ``UNAVAILABLE`` and is retried; calls of connections
   holding as many never end each other's).

Else the call waits for a place (the receiver's), and freed places go to the waiting calls
in turn (:meth:`ReadSlots.queue`): first the call of least rank (its connection's readers,
plus its calls admitted lately, each counting 1, or :data:`STALLED_RANK` once it was ended
early for not sending its message, halving every :data:`SERVED_HALF_S` seconds, plus that
connection's calls ahead of it in line), then the earliest, so that connections take turns
and one connection's many calls never starve a quiet connection's export (a connection
whose calls all wait holds no reader, yet its second waiting call ranks 1; the stalled calls
of a connection, ended and sent again at once, rank behind an exporter's, whose calls send
their message). A new call takes a place at once only if no waiting call ranks as low as it
would.
Not thread-safe: used from the receiver's event loop only (the budget it holds is
thread-safe and shared with the HTTP receiver).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .limits import SMALL_REQUEST_BYTES, ByteBudget

__all__ = ["NoSlot", "ReadSlot", "ReadSlots"]

#: Seconds a reader may wait for its message before a call that finds no free slot ends it
#: (an exporter sends its message right after the headers: this is a late one).
STALE_S = 0.25
#: Seconds in which a connection's count of calls admitted lately halves (the line's rank).
SERVED_HALF_S = 1.0
#: What a call ended early for not sending its message counts in its connection's rank,
#: against 1 for a call let in: connections whose calls send their message go first.
STALLED_RANK = 4.0
#: Bytes the one *lean* reader holds while its message is read (see :meth:`ReadSlots.admit`).
LEAN_BYTES = 256 << 10


class NoSlot(Exception):
    """No read slot for a call now (retryable).

    Args:
        reason: ``"inflight"`` (the byte budget) or ``"connections"`` (readers).
        message: one line for the client, naming the flag.
    """

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


class ReadSlot:
    """One admitted call's place: the bytes it holds of the budget and its connection.

    Attributes:
        peer: the connection (``context.peer()``).
        started: ``time.monotonic()`` at admission.
        held: bytes of the budget held.
        ended_early: set once :class:`ReadSlots` ended it to make room (its bytes are
            already given back).
    """

    def __init__(self, owner: ReadSlots, peer: str, on_end: Callable[[], None]):
        self.owner, self.peer, self.on_end = owner, peer, on_end
        self.started, self.held, self.ended_early, self.reading = time.monotonic(), 0, False, True
        self.lean = False

    def arrived(self) -> None:
        """The message arrived: leave the readers (it can no longer be ended early),
        keeping the bytes held until :meth:`settle` or :meth:`release`."""
        self.owner._leave(self)

    def settle(self, need: int) -> bool:
        """The message arrived: hold ``need`` bytes instead of the reservation and leave the
        readers. False (the reservation given back) when ``need`` does not fit now."""
        self.owner._leave(self)
        budget = self.owner.budget
        if need > self.held and not budget.acquire(
                need - self.held, small=need <= SMALL_REQUEST_BYTES, own=self.held):
            self.release()
            return False
        if need < self.held:
            budget.release(self.held - need)
        self.held = need
        return True

    def release(self) -> None:
        """Give everything back (idempotent)."""
        self.owner._leave(self)
        if self.held:
            self.owner.budget.release(self.held)
            self.held = 0
            if self.owner.on_free is not None:
                self.owner.on_free()


class ReadSlots:
    """Read slots of one gRPC receiver.

    Args:
        budget: the byte budget shared with the HTTP receiver.
        reserve: bytes a reader holds until its message arrived (``max_message_bytes``).
        max_readers: calls waiting for their message at once (> 0).
        stale_s: seconds after which a waiting reader may be ended for a new call.
    """

    def __init__(self, budget: ByteBudget, reserve: int, max_readers: int,
                 stale_s: float = STALE_S, lean_bytes: int = LEAN_BYTES):
        if not max_readers > 0:
            raise ValueError(f"max_readers must be > 0, got {max_readers!r}")
        self.budget, self.reserve, self.max_readers = budget, int(reserve), int(max_readers)
        self.stale_s, self.lean_bytes = float(stale_s), min(int(lean_bytes), int(reserve))
        self.lean: ReadSlot | None = None
        #: full reservations of the readers together: at most half the budget (at least
        #: one), so that calls that never send cannot hold what HTTP requests need
        self.max_reserved = max(self.reserve, budget.capacity // 2)
        self.reserved = 0
        #: called (on the event loop) each time a reader leaves: a place may be free
        self.on_free: Callable[[], None] | None = None
        self.by_peer: dict[str, list[ReadSlot]] = {}
        self.readers = 0
        self.ended_early = 0
        #: calls waiting for a place: ticket -> (peer, wake) (a smaller ticket waited longer)
        self.waiters: dict[int, tuple[str, Callable[[], None]]] = {}
        self.waiting_of: dict[str, int] = {}  # peer -> its calls in :attr:`waiters`
        #: peer -> (calls admitted lately, when last counted): see :meth:`_served`
        self.served: dict[str, tuple[float, float]] = {}
        self._ticket = 0

    def _rank(self, peer: str) -> int:
        return len(self.by_peer.get(peer, ()))

    def _served(self, peer: str, now: float | None = None) -> float:
        """Calls of ``peer`` admitted lately: each counts 1 (:data:`STALLED_RANK` once ended
        early), halving every :data:`SERVED_HALF_S` seconds."""
        n, t = self.served.get(peer, (0.0, 0.0))
        return n * 0.5 ** (((time.monotonic() if now is None else now) - t) / SERVED_HALF_S)

    def _count_served(self, peer: str, n: float) -> None:
        now = time.monotonic()
        self.served[peer] = (self._served(peer, now) + n, now)
        if len(self.served) > 4 * self.max_readers:  # forget connections served long ago
            self.served = {p: v for p, v in self.served.items()
                           if self._served(p, now) >= 0.01}

    def _line_rank(self, peer: str) -> float:
        return self._rank(peer) + self._served(peer)

    def queue(self, peer: str, wake: Callable[[], None]) -> int:
        """Put a call of ``peer`` in the line for a place; its ticket. ``wake`` is called
        when it is next in line (:meth:`wake_first`) or was taken out (:meth:`bump`)."""
        self._ticket += 1
        self.waiters[self._ticket] = (peer, wake)
        self.waiting_of[peer] = self.waiting_of.get(peer, 0) + 1
        return self._ticket

    def unqueue(self, ticket: int) -> None:
        """The call left the line (admitted, refused or ended; idempotent)."""
        w = self.waiters.pop(ticket, None)
        if w is not None:
            n = self.waiting_of.pop(w[0]) - 1
            if n:
                self.waiting_of[w[0]] = n

    def _first(self) -> tuple[float, int] | None:
        """``(rank, ticket)`` of the call next in line (None: no call waits). A waiting
        call's rank is its connection's readers, plus its connection's calls admitted
        lately (:meth:`_served`), plus its connection's calls ahead of it in line, so that
        a connection's many waiting calls are served one at a time in turn with the other
        connections' (quietest first), never all before a quiet connection's one, and
        connections whose calls are ended and come back at once do not keep the first
        places among themselves."""
        ahead: dict[str, int] = {}
        base: dict[str, float] = {}
        best = None
        for t, (peer, _wake) in self.waiters.items():  # (in ticket order)
            k = ahead.get(peer, 0)
            ahead[peer] = k + 1
            if peer not in base:
                base[peer] = self._line_rank(peer)
            key = (base[peer] + k, t)
            if best is None or key < best:
                best = key
        return best

    def first(self) -> int | None:
        """The ticket next in line: of the waiting calls, the one of least rank (its
        connection's readers plus its connection's calls ahead of it in line), then the one
        that waited longest (None: no call waits)."""
        f = self._first()
        return None if f is None else f[1]

    def wake_first(self) -> None:
        """Wake the call next in line (a place may be free, or it became next)."""
        t = self.first()
        if t is not None:
            self.waiters[t][1]()

    def behind(self, peer: str) -> bool:
        """Whether a new call of ``peer`` must wait in line: a waiting call's rank is no more
        than the new call's would be (its connection's readers and waiting calls)."""
        f = self._first()
        return f is not None and f[0] <= self._line_rank(peer) + self.waiting_of.get(peer, 0)

    def bump(self, peer: str) -> bool:
        """The line is full: take out the last in line of the connection holding the most
        calls (readers and waiting), if that is more than ``peer``'s connection holds, so that
        a new call of ``peer`` can wait instead: one connection's many calls never keep a
        quiet connection out of the line. True if one was taken out (it is woken and finds
        its ticket gone: :meth:`waiting`)."""
        def held(p: str) -> int:
            return self._rank(p) + self.waiting_of.get(p, 0)
        if not self.waiters:
            return False
        most = max(self.waiting_of, key=held)
        if held(most) <= held(peer):
            return False
        last = max(t for t, w in self.waiters.items() if w[0] == most)
        wake = self.waiters[last][1]
        self.unqueue(last)
        wake()
        return True

    def waiting(self, ticket: int) -> bool:
        """Whether the call ``ticket`` is still in line (False: :meth:`bump` took it out)."""
        return ticket in self.waiters

    def admit(self, peer: str, on_end: Callable[[], None], end_one: bool = True,
              by_age: bool = True) -> ReadSlot:
        """A reading place for a call of ``peer``, ending a stalled reader if needed.

        The call holds ``reserve`` bytes of the budget while its message is read (all
        readers together at most half of the budget); when those are not free, one call at
        a time (the *lean* reader) holds ``lean_bytes`` instead, or nothing when not even
        those are free, so that small exports are still read while others hold the budget:
        gRPC may then buffer up to ``reserve`` bytes beyond the budget for it.

        Args:
            peer: the call's connection.
            on_end: called (on the event loop) when this reader is ended early.
            end_one: False: end no reader.
            by_age: False: end a reader only by rule 1.

        Raises:
            NoSlot: none free and none may be ended (retryable).
        """
        while True:
            if self.readers < self.max_readers:
                if (self.reserved + self.reserve <= self.max_reserved
                        and self.budget.acquire(self.reserve)):
                    held, lean = self.reserve, False
                    self.reserved += self.reserve
                    break
                if self.lean is None:  # (on what is left when less: HTTP may hold it all)
                    held = self.lean_bytes if self.budget.acquire(self.lean_bytes,
                                                                  small=True) else 0
                    lean = True
                    break
            if not (end_one and self._end_one(peer, by_age)):
                if self.readers >= self.max_readers:
                    raise NoSlot("connections", f"{self.readers} calls are waiting for their "
                                 "message (half of --max-connections); retry later")
                raise NoSlot("inflight", f"too many bytes in flight: a call reserves "
                             f"{self.reserve} bytes (2 x --max-message-bytes) while its "
                             f"message is read, and calls being read hold at most "
                             f"{self.max_reserved} of {self.budget.capacity} "
                             "(--max-inflight-bytes); retry later")
        self._count_served(peer, 1.0)
        slot = ReadSlot(self, peer, on_end)
        slot.held, slot.lean = held, lean
        if lean:
            self.lean = slot
        self.by_peer.setdefault(peer, []).append(slot)
        self.readers += 1
        return slot

    def _end_one(self, peer: str, by_age: bool = True) -> bool:
        mine = len(self.by_peer.get(peer, ()))
        victim = None
        if self.by_peer:
            most = max(self.by_peer.values(), key=lambda s: (len(s), -s[0].started))
            if len(most) >= mine + 2:
                victim = most[0]
        if victim is None and by_age:
            late = time.monotonic() - self.stale_s
            stale = [s for s in self.by_peer.values() if len(s) > mine and s[0].started <= late]
            if stale:  # (a connection's readers are in the order they came)
                victim = max(stale, key=lambda s: (sum(r.started <= late for r in s),
                                                   -s[0].started))[0]
        if victim is None:
            return False
        victim.ended_early = True
        victim.release()
        self.ended_early += 1
        self._count_served(victim.peer, STALLED_RANK - 1.0)  # (its admission counted 1)
        victim.on_end()
        return True

    def _leave(self, slot: ReadSlot) -> None:
        if not slot.reading:
            return
        slot.reading = False
        self.readers -= 1
        if slot.lean:
            self.lean = None
        else:
            self.reserved -= self.reserve
        if self.on_free is not None:
            self.on_free()
        same = self.by_peer.get(slot.peer)
        if same is not None:
            same.remove(slot)
            if not same:
                del self.by_peer[slot.peer]
