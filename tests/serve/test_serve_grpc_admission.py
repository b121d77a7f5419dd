"""gRPC admission of ``goodput serve`` (issue 38, items 1b and 1c), with real gRPC clients.

- A wrong token is refused before the message is read: a real ``goodput serve`` process
  under concurrent 8 MiB calls with a wrong token grows by a fraction of what was sent
  (its ``VmHWM``), and none of them ever held the byte budget.
- A call that never sends its message is ended by ``--request-timeout`` and counted.
- The OpenTelemetry SDK's gRPC exporter is acknowledged while hundreds of stalled calls
  are held open (on one connection, or one each on many).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time

import grpc
import pytest
from instr_util import load_benchmark

from goodput_processor.serve import GoodputServer, LiveStore
from goodput_processor.serve.limits import Limits

bench = load_benchmark("grpc_admission")
MiB = 1 << 20


class Stalled:
    """``n`` ``TraceService/Export`` calls that never send their message, spread over
    ``channels`` connections, held from a thread of their own until :meth:`close`."""

    def __init__(self, addr: str, n: int, channels: int = 1, token: str | None = None):
        self.addr, self.n, self.channels, self.token = addr, n, channels, token
        self.codes: dict[str, int] = {}
        self.opened, self._loop = threading.Event(), asyncio.new_event_loop()
        self._stop = None
        self._thread = threading.Thread(target=self._loop.run_until_complete,
                                        args=(self._run(),), daemon=True)
        self._thread.start()
        assert self.opened.wait(30)

    async def _run(self):
        self._stop = asyncio.Event()
        chans = [grpc.aio.insecure_channel(self.addr) for _ in range(self.channels)]
        md = (("authorization", f"Bearer {self.token}"),) if self.token else None
        self.calls = calls = [
            chans[i % self.channels].stream_unary(bench.METHOD)(metadata=md, timeout=60)
            for i in range(self.n)]
        await asyncio.gather(*(c.wait_for_connection() for c in calls))
        self.opened.set()
        await self._stop.wait()
        for c in calls:
            code = (await c.code()).name if c.done() else "open"
            self.codes[code] = self.codes.get(code, 0) + 1
            c.cancel()
        for ch in chans:
            await ch.close()

    def ended(self) -> int:
        """How many of the calls the server has ended so far."""
        return asyncio.run_coroutine_threadsafe(self._ended(), self._loop).result(10)

    async def _ended(self) -> int:
        return sum(c.done() for c in self.calls)

    def close(self) -> dict[str, int]:
        """Stop holding: the final status of each call (``open``: still open)."""
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        return self.codes


def _until(check, timeout_s=20.0):
    end = time.monotonic() + timeout_s
    while not check() and time.monotonic() < end:
        time.sleep(0.05)
    return check()


def _server(**limits) -> GoodputServer:
    lim = Limits(**limits)
    return GoodputServer(LiveStore(min_interval_s=0, limits=lim), grpc_port=0, http_port=None,
                         limits=lim)


def test_wrong_token_refused_before_the_message_is_read():
    """32 concurrent 8 MiB calls with a wrong token at a real ``goodput serve``: all
    ``UNAUTHENTICATED``, counted, and serve's peak RSS grows by less than 32 MiB of the
    256 MiB sent (gRPC core holds at most a stream window of each; before the token was
    checked first, 96 such 15 MiB calls took 1,306 MiB)."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    with tempfile.TemporaryDirectory() as tmp:
        proc, addr, http = bench.start_serve(tmp, "s3cret", [])
        try:
            exp, spans = bench.exporter(addr, "s3cret")
            assert exp.export(spans) == SpanExportResult.SUCCESS
            base = bench.proc_mem(proc.pid)["VmHWM"]
            body = bench.big_request(8 * MiB)
            assert asyncio.run(bench.flood(addr, 32, body, "wrong")) == {"UNAUTHENTICATED": 32}
            grown = bench.proc_mem(proc.pid)["VmHWM"] - base
            assert grown < 32 * MiB, f"serve grew by {grown / MiB:.0f} MiB"
            assert bench.counter(http, "s3cret", "unauthenticated") == 32
            assert exp.export(spans) == SpanExportResult.SUCCESS
        finally:
            proc.terminate()
            proc.wait(30)


def test_stalled_calls_ended_by_the_request_timeout_and_counted():
    srv = _server(request_timeout_s=1.0)
    try:
        stalled = Stalled(srv.addresses()["grpc"], 3)
        assert _until(lambda: stalled.ended() == 3)
        assert srv.store.stats["refused_timeout"] == 3
        assert stalled.close() == {"DEADLINE_EXCEEDED": 3}
        assert srv.grpc.slots.readers == 0 and srv.budget.used == 0
        assert srv.store.stats["requests"] == 0
    finally:
        srv.stop(5, final=False)


@pytest.mark.parametrize("channels", [1, 40])
def test_legit_export_acknowledged_while_stalled_calls_are_open(channels, monkeypatch):
    """300 stalled calls (on one connection, or over 40) against 32 reading places
    (``max_connections`` 64; 16 more wait 1 s for one, then are refused): the SDK
    exporter's exports all succeed while the stalled calls stay for ``--request-timeout``
    (30 s); the one ended to make room is counted as ``refused_timeout``. (With no limit
    of calls per connection: with serve's, 8, only 8 of one connection's reach serve.)"""
    from opentelemetry.sdk.trace.export import SpanExportResult

    from goodput_processor.serve import grpc_receiver

    monkeypatch.setattr(grpc_receiver, "STREAMS_PER_CONNECTION", 0)

    # 32 reading places (half of max_connections), each reserving 2 MiB of the 64 MiB
    # readers may hold (half of max_inflight_bytes)
    srv = _server(max_connections=64, max_message_bytes=MiB, max_inflight_bytes=128 * MiB)
    addr = srv.addresses()["grpc"]
    stalled = Stalled(addr, 300, channels=channels)
    try:
        stats = srv.store.stats
        # 32 read, 16 wait 1 s for a place; the others are refused at once (UNAVAILABLE,
        # or RESOURCE_EXHAUSTED from gRPC's cap while 64 are in flight)
        assert _until(lambda: stalled.ended() == 300 - 32)
        assert (srv.grpc.slots.readers, srv.grpc.waiting) == (32, 0), dict(stats)
        ended = stats["refused_timeout"]
        exp, spans = bench.exporter(addr, "unused")
        if channels > 1:  # one each: a reader may be ended once it waited STALE_S
            time.sleep(srv.grpc.slots.stale_s)
        for _ in range(3):
            assert exp.export(spans) == SpanExportResult.SUCCESS
        assert stats["requests"] == 3 and srv.store.jobs() == ["legit"]
        # the first export ended one stalled reader; its place then served the others
        assert (stalled.ended(), stats["refused_timeout"] - ended, srv.grpc.slots.readers) == (
            300 - 31, 1, 31), dict(stats)
    finally:
        codes = stalled.close()
        srv.stop(5, final=False)
    assert codes.get("open") == 31 and sum(codes.values()) == 300, codes
    assert set(codes) <= {"open", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}, codes
    assert srv.budget.used == 0


class _BusyStore(LiveStore):
    """A real store whose ingests hold its lock until :attr:`go` is set (a long ingest)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.go, self.holding = threading.Event(), threading.Event()

    def ingest_request(self, req, *a, **kw):
        with self._lock:
            self.holding.set()
            self.go.wait(30)
        return super().ingest_request(req, *a, **kw)


def test_refusals_are_answered_while_the_store_is_busy():
    """Refusals are counted without waiting on the store's lock: while one export holds it,
    40 calls with a wrong token are answered ``UNAUTHENTICATED`` (each within its 5 s
    deadline, not after the ingest), and counted once the lock is free."""
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    store = _BusyStore(min_interval_s=0)
    srv = GoodputServer(store, grpc_port=0, http_port=None, token="s3cret")
    addr = srv.addresses()["grpc"]
    try:
        ch = grpc.insecure_channel(addr)
        export = ch.unary_unary(bench.METHOD)
        held = export.future(trace_service_pb2.ExportTraceServiceRequest().SerializeToString(),
                             metadata=(("authorization", "Bearer s3cret"),), timeout=30)
        assert store.holding.wait(10)
        assert asyncio.run(bench.flood(addr, 40, b"", "wrong", timeout_s=5)) == {
            "UNAUTHENTICATED": 40}
        store.go.set()
        held.result(timeout=30)
        assert _until(lambda: store.stats["refused_unauthenticated"] == 40)
    finally:
        store.go.set()
        srv.stop(5, final=False)


def test_line_serves_the_quietest_connection_first():
    """The read-slot line (:class:`ReadSlots`): a freed place goes to the waiting call whose
    connection holds the fewest readers; a new call of a quiet connection takes the place of
    the last waiting call of the connection holding the most calls in a full line; a late
    reader is ended only for a call of a connection holding fewer readers."""
    from goodput_processor.serve.grpc_admission import NoSlot, ReadSlots
    from goodput_processor.serve.limits import ByteBudget

    slots = ReadSlots(ByteBudget(4 * MiB), MiB, 3, stale_s=0.0)  # 2 full readers + 1 lean
    ended, woken = [], []
    for _ in range(3):
        slots.admit("attacker", lambda: ended.append("attacker"), end_one=False)
    with pytest.raises(NoSlot):
        slots.admit("attacker", lambda: None, end_one=False)
    a = slots.queue("attacker", lambda: woken.append("attacker"))
    b = slots.queue("quiet", lambda: woken.append("quiet"))
    assert slots.first() == b and slots.behind("fresh")  # (behind "quiet": 0 readers each)
    slots.wake_first()
    assert woken == ["quiet"]
    assert slots.bump("fresh") and not slots.waiting(a) and woken[-1] == "attacker"
    assert not slots.bump("attacker")  # no connection holds more calls than its own
    slots.unqueue(b)
    slots.admit("attacker-2", lambda: None)  # by rule 1 (3 readers vs 0): one ended
    assert ended == ["attacker"] and slots.readers == 3
    slots.admit("attacker-2", lambda: None)  # by rule 2: "attacker" holds 2, more than 1
    assert ended == ["attacker"] * 2
    with pytest.raises(NoSlot):  # 1 and 2 readers: none holds more than "attacker-2"
        slots.admit("attacker-2", lambda: None)


def test_line_takes_connections_in_turn():
    """A connection whose many calls all wait (it holds no reader) is served one call at a
    time in turn with a quiet connection's call, not all of them first (issue 38: the
    stalled calls of a connection holding no reader kept a healthy export waiting 3 s)."""
    from goodput_processor.serve.grpc_admission import ReadSlots
    from goodput_processor.serve.limits import ByteBudget

    slots = ReadSlots(ByteBudget(4 * MiB), MiB, 3)
    busy = [slots.queue("busy", lambda: None) for _ in range(3)]
    quiet = slots.queue("quiet", lambda: None)
    assert slots.first() == busy[0]  # (rank 0 each; the earlier first)
    assert slots.behind("fresh") and slots.behind("busy")
    slots.unqueue(busy[0])
    slots.admit("busy", lambda: None)  # busy's first call is read: busy holds a reader
    assert slots.first() == quiet  # rank 0, before busy's next (rank 1 + 0)
    slots.unqueue(quiet)
    assert slots.first() == busy[1] and not slots.behind("fresh")  # (ranks 1 and 0)


def test_lean_reader_while_http_holds_the_whole_budget():
    """When HTTP requests hold the whole byte budget (slow bodies hold their
    ``Content-Length``), one gRPC call is still read, on nothing of the budget (issue 38: a
    healthy export waited 3 s and was refused ``UNAVAILABLE``)."""
    from goodput_processor.serve.grpc_admission import NoSlot, ReadSlots
    from goodput_processor.serve.limits import ByteBudget

    budget = ByteBudget(4 * MiB)
    slots = ReadSlots(budget, MiB, 3)
    assert budget.acquire(4 * MiB)  # (what HTTP requests hold)
    lean = slots.admit("quiet", lambda: None, end_one=False)
    assert lean.lean and lean.held == 0 and budget.used == 4 * MiB
    with pytest.raises(NoSlot):  # one lean reader at a time
        slots.admit("other", lambda: None, end_one=False)
    assert not lean.settle(10)  # its message still needs its size of the budget
    budget.release(4 * MiB)
    assert slots.readers == 0 and budget.used == 0


def test_line_puts_connections_whose_calls_stalled_behind():
    """A connection whose call was ended early for not sending its message ranks behind a
    connection whose calls send theirs, though its call waited longer."""
    from goodput_processor.serve.grpc_admission import ReadSlots
    from goodput_processor.serve.limits import ByteBudget

    slots = ReadSlots(ByteBudget(4 * MiB), MiB, 1, stale_s=0.0)
    slots.admit("stalled", lambda: None)
    slots.admit("exporter", lambda: None)  # ends the stalled reader (late, and holds more)
    assert slots.ended_early == 1 and slots.readers == 1
    stalled = slots.queue("stalled", lambda: None)
    fresh = slots.queue("fresh", lambda: None)
    assert slots.first() == fresh and stalled in slots.waiters
