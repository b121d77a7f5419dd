"""The OTLP/gRPC receiver of ``goodput serve``: ``TraceService/Export`` and
``LogsService/Export``, checked and admitted before their message is read.

It runs gRPC's asyncio server on an event loop thread of its own, with each ``Export``
handled as a stream-unary method (the same wire format as unary: exporters see no
difference). So the handler runs as soon as a call's headers arrive, before gRPC reads its
message, and a call waiting for its message costs no thread. In order:

1. **Token**: a missing or wrong bearer token is answered ``UNAUTHENTICATED`` before the
   message is read; gRPC core has buffered at most the HTTP/2 stream window of it
   (``refused_unauthenticated``).
2. **Read slot** (:mod:`goodput_processor.serve.grpc_admission`): the call holds
   ``2 x max_message_bytes`` of the byte budget shared with HTTP while its message is read
   (gRPC core's buffer of it and its copy as Python bytes)
   (``grpc.max_receive_message_length`` caps each message at that, ``RESOURCE_EXHAUSTED``
   past it), and one of ``max_connections // 2`` reading places; a stalled reader is ended
   to make room; else the call waits up to :data:`WAIT_S` for a place, unread, in a line
   served quietest connection first (readers and waiting calls together at most three
   quarters of ``max_connections``); else the call gets ``UNAVAILABLE``
   (``refused_inflight`` / ``refused_connections``).
3. **Deadline**: a message that has not arrived ``request_timeout_s`` after the call began
   ends the call with ``DEADLINE_EXCEEDED``; one ended early for another call gets
   ``UNAVAILABLE``; both are counted as ``refused_timeout``. A call that ends before its
   message was read (its client cancelled it, or gRPC core refused a message over
   ``max_message_bytes`` with ``RESOURCE_EXHAUSTED``) is counted as ``refused_incomplete``.
4. **Size**: once it arrived, the call holds its size plus its parsed estimate
   (:func:`~goodput_processor.serve.receiver.parse_cost`) instead of the reservation
   (``UNAVAILABLE`` when that does not fit now), and a worker thread parses it and hands it
   to the store (the statuses of :mod:`goodput_processor.serve.receiver`); messages up to
   :data:`SMALL_BYTES` have two threads of their own, so an exporter's batch never waits
   behind the scan of a 16 MiB message.

gRPC's asyncio server takes no new call from its core while ``max_connections`` are in
flight (``maximum_concurrent_rpcs``: they queue there, first come first served, whoever
sent them); since readers and waiting calls hold at most three quarters of them, stalled
calls never fill that cap. Each call held waiting is one that does not come back at once
to queue in gRPC core ahead of other clients' calls (under 300 stalled calls, a healthy
export waited there up to 2 s while serve took in some 100 calls a second); readers'
reservations take at most half of the byte budget. gRPC core hands new calls to the event
loop one at a time, first come first served, so a healthy call waits there behind every
call the attackers have open (issue 38: 0.1-3.4 s under all attacks at once): each
connection may have :data:`STREAMS_PER_CONNECTION` calls open, the rest wait in the client.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf.message import DecodeError

from .grpc_admission import NoSlot, ReadSlots
from .limits import ByteBudget, Limits, Refused
from .receiver import (
    DEFAULT_MAX_MESSAGE_BYTES,
    SIGNALS,
    Gate,
    Rejected,
    _hostport,
    _refused,
    _retry_info,
    _token_ok,
    parse_cost,
)
from .slots import as_client, peer_host
from .store import LiveStore

__all__ = ["GrpcReceiver"]

_log = logging.getLogger(__name__)
#: Seconds a call may wait for a read slot before ``UNAVAILABLE`` (held waiting, a stalled
#: call does not come back to queue in gRPC core ahead of others' calls: 1 s let it).
WAIT_S = 3.0
#: Messages up to this many bytes (an exporter's batch of some 300 spans) are scanned and
#: stored by :attr:`GrpcReceiver.small_pool`, so that large ones (a scan of 16 MiB takes
#: 0.3 s) never hold them up; up to :data:`INLINE_BYTES` (0.1 ms to scan) on the event loop.
SMALL_BYTES = 64 << 10
INLINE_BYTES = 8 << 10
#: Calls one connection may have open at once (HTTP/2 ``SETTINGS_MAX_CONCURRENT_STREAMS``,
#: ``grpc.max_concurrent_streams``): a client's further calls wait in the client, costing
#: serve nothing, instead of queueing in gRPC core ahead of other connections' calls (its
#: new calls are taken one at a time, first come first served, by the event loop). An
#: exporter sends one batch at a time (the OTel SDKs), or a few (the Collector's
#: ``sending_queue.num_consumers``, 10); a gRPC client that opens more than this many on a
#: connection before it has read serve's settings gets them refused (``REFUSED_STREAM``,
#: retried once by gRPC, then ``UNAVAILABLE``, which exporters retry).
STREAMS_PER_CONNECTION = 8
#: Seconds between its tries (besides each time a reader leaves).
POLL_S = 0.1


def _eof(read: asyncio.Future) -> bool:
    """Whether ``read`` (of ``context.read()``) ended with no message."""
    return read.done() and not read.cancelled() and read.exception() is None and (
        read.result() is grpc.aio.EOF)


class _Export:
    """``Export`` of one signal (``"traces"`` or ``"logs"``) on raw bytes, so that a body
    that does not parse gets ``INVALID_ARGUMENT`` with the reason."""

    def __init__(self, rx: GrpcReceiver, signal: str):
        self.rx = rx
        self.request, self.response, self.service, self.method = SIGNALS[signal]

    async def export(self, request_iterator, context):
        rx, loop = self.rx, asyncio.get_running_loop()
        peer = context.peer()
        header = None
        for k, v in context.invocation_metadata() or ():
            if k == "authorization":
                header = v
        if not _token_ok(header, rx.token):
            _refused(rx.store, "unauthenticated", peer)  # (its own lock: never waits long)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "goodput serve: missing or wrong bearer token "
                                "(Authorization header)")
        r = await self._take_in(context, peer, loop)
        if r is not None:  # abort() raises, so it is called outside of any try
            if r.reason is not None:
                _refused(rx.store, r.reason, peer)
            trailing = _retry_info(r.retry_after) if r.retry_after is not None else ()
            await context.abort(r.grpc_status, f"goodput serve: {r.message}", trailing)
        return self.response()

    async def _take_in(self, context, peer: str, loop) -> Rejected | None:
        """Admit, read, then parse and store (in a worker); None, or the answer."""
        rx = self.rx
        ended = asyncio.Event()
        slot = await self._admit(peer, ended.set, loop)
        if isinstance(slot, Rejected):
            return slot
        try:
            read = asyncio.ensure_future(context.read())
            stop = asyncio.ensure_future(ended.wait())
            try:
                done, _ = await asyncio.wait((read, stop), timeout=rx.limits.request_timeout_s,
                                             return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # the call ended before its message was read:
                if _eof(read):  # the client cancelled it, or gRPC core refused a message over
                    # --max-message-bytes (RESOURCE_EXHAUSTED): the two look the same here
                    _refused(rx.store, "incomplete", peer)
                read.cancel()
                raise
            finally:
                stop.cancel()
            if read not in done:
                read.cancel()
                if slot.ended_early:
                    return Rejected("timeout", 503, 14, "the request message had not arrived "
                                    f"after {rx.slots.stale_s:g} s while other calls waited "
                                    "(--request-timeout)", retry_after=1)
                return Rejected("timeout", 408, 4, "the request message did not arrive "
                                f"within {rx.limits.request_timeout_s:g} s (--request-timeout)")
            body = read.result()
            if body is grpc.aio.EOF or body is None:
                try:  # the call ended (as above): this task is cancelled
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    _refused(rx.store, "incomplete", peer)
                    raise
                return Rejected("malformed", 400, 3, "the call carried no request message")
            slot.arrived()  # no longer a reader (it cannot be ended early now)
            # (a scan of the body: 0.3 s for 16 MiB, so not on the event loop, but 0.1 ms for
            # an exporter's usual batch); a small message is stored by threads of its own,
            # never queued behind large ones
            pool = rx.small_pool if len(body) <= SMALL_BYTES else rx.pool
            need = len(body) + (parse_cost("protobuf", body) if len(body) <= INLINE_BYTES
                                else await loop.run_in_executor(pool, parse_cost, "protobuf",
                                                                body))
            if need > rx.budget.capacity:
                slot.release()
                return Rejected("too_large", 413, 8, f"the request needs {need} bytes of "
                                f"memory, more than the limit of {rx.budget.capacity} bytes "
                                "in flight (--max-inflight-bytes)")
            if not slot.settle(need):
                return Rejected("inflight", 503, 14, f"too many bytes in flight: the request "
                                f"needs {need} bytes, of {rx.budget.capacity} "
                                "(--max-inflight-bytes); retry later", retry_after=1)
            if not rx.gate.enter():
                return Rejected("unavailable", 503, 14, "goodput serve is shutting down",
                                retry_after=1)
            try:
                return await loop.run_in_executor(pool, self._store, body, peer)
            finally:
                rx.gate.leave()
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception:
            _log.exception("goodput serve grpc: taking in a request from %s failed", peer)
            return Rejected("internal", 500, 13, "internal error (logged)")
        finally:
            slot.release()

    async def _admit(self, peer: str, on_end, loop):
        """A read slot, or the :class:`Rejected` to answer. When none is free (nor can be
        made free), or calls of connections holding no more readers than this one's wait
        already, the call waits for one (readers and waiting calls at most three quarters
        of ``max_connections``, waiting calls at least a quarter; no message is read
        meanwhile), each for at most :data:`WAIT_S` seconds: the next in line
        (:meth:`ReadSlots.first`: least rank, its connection's readers plus that
        connection's calls ahead of it in line, then earliest) tries
        again, ending a reader by the same rules, each time a reader leaves or a call leaves
        the line, and every :data:`POLL_S` seconds (bytes the HTTP receiver gives back)."""
        rx, slots = self.rx, self.rx.slots
        reason, message = "connections", ("calls of connections holding fewer readers are "
                                          "waiting for a place (--max-connections); retry later")
        if not slots.behind(peer):
            try:
                return slots.admit(peer, on_end)
            except NoSlot as e:
                reason, message = e.reason, e.message
        # readers and waiting calls together at most 3/4 of max_connections (waiting calls at
        # least 1/4): gRPC goes on taking new calls, and each waiting call is one that
        # does not come back at once to queue up in gRPC core ahead of other clients' calls
        most = max(1, rx.limits.max_connections // 4,
                   rx.limits.max_connections * 3 // 4 - slots.readers)
        if len(slots.waiters) >= most and not slots.bump(peer):
            return Rejected(reason, 503, 14, message, retry_after=1)
        rx.waiting += 1
        turn = asyncio.Event()
        ticket = slots.queue(peer, turn.set)
        try:
            end = loop.time() + min(WAIT_S, rx.limits.request_timeout_s)
            while True:
                left = end - loop.time()
                if left > 0:  # (only the next in line polls; the others wait for their turn)
                    try:
                        await asyncio.wait_for(turn.wait(), min(POLL_S, left)
                                               if slots.first() == ticket else left)
                    except asyncio.TimeoutError:
                        pass
                    turn.clear()
                if not slots.waiting(ticket):  # a call of a quieter connection took its turn
                    return Rejected("connections", 503, 14, "calls of connections holding "
                                    "fewer calls took this call's turn (--max-connections); "
                                    "retry later", retry_after=1)
                if slots.first() == ticket:
                    try:
                        return slots.admit(peer, on_end)
                    except NoSlot as e:
                        reason, message = e.reason, e.message
                if loop.time() >= end:
                    return Rejected(reason, 503, 14, message, retry_after=1)
        finally:
            rx.waiting -= 1
            slots.unqueue(ticket)
            slots.wake_first()  # the next in line may try now

    def _store(self, body: bytes, peer: str) -> Rejected | None:
        """Parse ``body`` and hand it to the store (in a worker thread)."""
        try:
            req = self.request()
            try:
                req.ParseFromString(body)
            except DecodeError as e:
                return Rejected("malformed", 400, 3, f"request of {len(body)} bytes is not "
                                f"a protobuf {self.request.__name__} ({e})")
            with as_client(peer_host(peer)):  # (job slots are per client: .slots)
                getattr(self.rx.store, self.method)(req, "otlp-grpc")
            return None
        except Refused as e:
            return Rejected.from_refused(e)
        except Exception:
            _log.exception("goodput serve grpc: taking in a request from %s failed", peer)
            return Rejected("internal", 500, 13, "internal error (logged)")

    def handler(self) -> grpc.GenericRpcHandler:
        export = grpc.stream_unary_rpc_method_handler(
            self.export, request_deserializer=None,
            response_serializer=self.response.SerializeToString)
        return grpc.method_handlers_generic_handler(self.service, {"Export": export})


class GrpcReceiver:
    """OTLP/gRPC ``TraceService`` and ``LogsService`` on ``host:port`` (port 0 = any free
    port; see :attr:`port`), on an event loop thread of its own.

    Args:
        store: where spans go.
        token: bearer token required (None: none).
        tls: ``(cert_file, key_file)`` PEM paths (None: plaintext).
        max_message_bytes: largest request (used when ``limits`` is None; else
            ``limits.max_message_bytes``).
        workers: threads parsing requests and handing them to the store.
        gate: shared with the HTTP receiver, for draining at shutdown.
        limits: the ceilings (default :class:`Limits` with ``max_message_bytes``):
            ``max_connections`` calls in flight, half of them waiting for their message,
            each for at most ``request_timeout_s`` seconds.
        budget: bytes in flight, shared with the HTTP receiver (default: its own, of
            ``limits.max_inflight_bytes``).
        streams_per_connection: calls open at once on one connection (None:
            :data:`STREAMS_PER_CONNECTION`; 0: gRPC's default, no limit).

    Raises:
        RuntimeError: the address cannot be bound.
        OSError: a TLS file cannot be read.
    """

    def __init__(self, store: LiveStore, host: str = "127.0.0.1", port: int = 4317, *,
                 token: str | None = None, tls: tuple[str, str] | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, workers: int = 8,
                 gate: Gate | None = None, limits: Limits | None = None,
                 budget: ByteBudget | None = None,
                 streams_per_connection: int | None = None):
        self.store, self.token, self.host = store, token, host
        self.streams_per_connection = (STREAMS_PER_CONNECTION if streams_per_connection is None
                                       else streams_per_connection) or None
        self.gate = gate or Gate()
        self.limits = limits or Limits(max_message_bytes=max_message_bytes)
        self.budget = budget or ByteBudget(self.limits.max_inflight_bytes)
        self.waiting = 0  # calls waiting for the byte budget (on the event loop)
        # a message being read: gRPC core's buffer of it, then its copy as Python bytes
        self.slots = ReadSlots(self.budget, min(2 * self.limits.max_message_bytes,
                                                self.budget.capacity),
                               max(1, self.limits.max_connections // 2))
        creds = None
        if tls:
            with open(tls[0], "rb") as c, open(tls[1], "rb") as k:
                creds = grpc.ssl_server_credentials([(k.read(), c.read())])
        self.pool = ThreadPoolExecutor(workers, "goodput-serve-grpc")
        self.small_pool = ThreadPoolExecutor(2, "goodput-serve-grpc-small")
        self.slots.on_free = self._place_freed
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="goodput-serve-grpc-loop")
        self._thread.start()
        addr = _hostport(host, port)
        try:
            self.port = self._run(self._bind(addr, creds), 30)
        except BaseException:
            self._close()
            raise
        if not self.port:
            self._close()
            raise RuntimeError(f"cannot listen for OTLP/gRPC on {addr}")

    def _place_freed(self) -> None:
        """A reader left: wake the call next in line for a place (on the event loop)."""
        self.slots.wake_first()

    def _run(self, coro, timeout_s: float | None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    async def _bind(self, addr: str, creds) -> int:
        # no BDP probing: a stream's window stays at HTTP/2's 64 KiB until its message is
        # read (then gRPC opens it to the message's size), so a call refused before it is
        # read costs at most that (with probing, several MiB a call on loopback)
        opts = [("grpc.max_receive_message_length", self.limits.max_message_bytes),
                ("grpc.max_send_message_length", 1 << 20), ("grpc.so_reuseport", 0),
                ("grpc.http2.bdp_probe", 0)]
        if self.streams_per_connection is not None:
            # (counted by HTTP/2's rules, not until gRPC core frees each stream: with its
            # default, a client's next call right after one ended got REFUSED_STREAM)
            opts += [("grpc.max_concurrent_streams", int(self.streams_per_connection)),
                     ("grpc.http.overload_protection", 0)]
        self.server = grpc.aio.server(options=opts,
                                      maximum_concurrent_rpcs=self.limits.max_connections)
        self.server.add_generic_rpc_handlers(tuple(
            _Export(self, signal).handler() for signal in SIGNALS))
        try:
            if creds is not None:
                return self.server.add_secure_port(addr, creds)
            return self.server.add_insecure_port(addr)
        except RuntimeError as e:
            raise RuntimeError(f"cannot listen for OTLP/gRPC on {addr} ({e})") from None

    def start(self) -> GrpcReceiver:
        """Start serving; returns ``self``."""
        self._run(self.server.start(), 30)
        return self

    def stop(self, timeout_s: float) -> None:
        """Refuse new RPCs, let those in flight finish for up to ``timeout_s`` seconds."""
        self.gate.close(timeout_s)
        try:
            self._run(self.server.stop(grace=timeout_s), timeout_s + 5)
        except Exception:  # stopped anyway below
            _log.debug("goodput serve grpc: stop", exc_info=True)
        self._close()

    def _close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()
        self.pool.shutdown(wait=False)
        self.small_pool.shutdown(wait=False)
