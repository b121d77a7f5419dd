"""``/healthz`` and ``/readyz`` of ``goodput serve`` on their own port, apart from ingest.

Why a listener of its own (``--health-port``), not a slot reserved on the OTLP/HTTP port:
a connection's slot is taken when it is accepted, before its request says what it wants,
so a reserved slot is one more slot an idle client can hold. Here nothing a client does to
the ingest ports (``--max-connections`` idle connections, slow bodies, a full byte budget,
stalled gRPC calls) reaches the probes, and nothing done to this port reaches ingest.

The port answers only ``GET`` (and ``HEAD``) ``/healthz`` and ``/readyz``: no token, no
data of any job, ``Connection: close`` after each answer. One thread serves every
connection through a selector (no thread per connection, a few hundred bytes of buffer
each); a connection gets :data:`REQUEST_TIMEOUT_S` seconds to send its request head (at
most :data:`MAX_HEAD_BYTES`). At most ``max_connections`` are open at once: a new one
closes the *oldest* open connection, so idle connections cannot starve a prober: each
turn of the loop first answers the requests that arrived, then accepts at most a quarter
of ``max_connections`` new connections, so a connection lives at least four turns however
fast others connect (a kubelet sends its request as soon as it has connected).

- ``/healthz``: ``200 ok`` while the process serves: the HTTP receiver's and the
  maintenance threads are alive (``alive()``); else ``503`` and which one stopped.
- ``/readyz``: ``200 ready``, or ``503`` and the reason (``LiveStore.ready()``): the
  write-ahead log is replaying or cannot be written, or a job's spans were refused
  because the log could not take them (a file-size limit, a full disk) in the last
  :data:`~goodput_processor.serve.wal.REFUSAL_MEMORY_S` seconds. Neither takes a lock
  that ingest holds.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["HealthListener", "MAX_HEAD_BYTES", "REQUEST_TIMEOUT_S"]

_log = logging.getLogger("goodput_processor.serve.health")

#: Seconds a connection has to send its request head.
REQUEST_TIMEOUT_S = 5.0
#: Largest request head (request line and headers) read, in bytes.
MAX_HEAD_BYTES = 8192
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 503: "Service Unavailable"}

Check = Callable[[], "tuple[bool, str]"]


def _answer(status: int, text: str, head_only: bool = False) -> bytes:
    body = (text + "\n").encode("utf-8", "replace")
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: text/plain; "
            f"charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
            + ("Retry-After: 1\r\n" if status == 503 else "") + "\r\n").encode()
    return head if head_only else head + body


class HealthListener:
    """``GET /healthz`` and ``GET /readyz`` on ``host:port`` (0: any free port, see
    :attr:`port`), served by one thread (see the module docstring).

    Args:
        host, port: where to listen (an IPv6 address is bound as IPv6).
        alive: ``() -> (ok, why)`` for ``/healthz``; ready: the same for ``/readyz``.
            Both must answer at once (no lock ingest may hold).
        max_connections: connections open at once; a new one closes the oldest.
        request_timeout_s: seconds a connection has to send its request head.

    Raises:
        OSError: the address cannot be bound.
        ValueError: ``max_connections`` < 1 or ``request_timeout_s`` not > 0.
    """

    def __init__(self, host: str, port: int, *, alive: Check, ready: Check,
                 max_connections: int = 64, request_timeout_s: float = REQUEST_TIMEOUT_S):
        if max_connections < 1 or not request_timeout_s > 0:
            raise ValueError("max_connections must be >= 1 and request_timeout_s > 0, got "
                             f"{max_connections!r}, {request_timeout_s!r}")
        self.alive, self.ready = alive, ready
        self.max_connections, self.request_timeout_s = max_connections, request_timeout_s
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            self._sock.listen(256)
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            raise
        self.host, self.port = host, self._sock.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ, None)
        #: open connections, oldest first: socket -> [deadline (monotonic s), head bytes]
        self._conns: OrderedDict[socket.socket, list] = OrderedDict()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: answers given, by status (for tests and the log)
        self.answered: dict[int, int] = {}

    def start(self) -> HealthListener:
        """Serve on a daemon thread; returns ``self``."""
        self._thread = threading.Thread(target=self._run, name="goodput-serve-health",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop serving (within ``timeout_s`` seconds) and close every socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        for conn in list(self._conns):
            self._close(conn)
        try:
            self._sel.unregister(self._sock)
        except (KeyError, ValueError):
            pass
        self._sock.close()
        self._sel.close()

    # --- the loop ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._sel.select(0.2)
            except (OSError, ValueError):  # closed by stop()
                return
            accept = False
            for key, _ in events:  # requests that arrived first, then new connections
                if key.fileobj is self._sock:
                    accept = True
                else:
                    self._read(key.fileobj)
            if accept:
                self._accept()
            now = time.monotonic()
            while self._conns:  # oldest first: the first not due ends the scan
                conn, (deadline, _) = next(iter(self._conns.items()))
                if deadline > now:
                    break
                self._close(conn)

    def _accept(self) -> None:
        # A quarter of the cap per turn: a connection lives at least four turns however
        # fast others connect, and its request is read at the start of each.
        for _ in range(max(1, self.max_connections // 4)):
            try:
                conn, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of file descriptors: the oldest make room
                _log.warning("goodput serve: health port cannot accept (%s)", e)
                if self._conns:
                    self._close(next(iter(self._conns)))
                return
            while len(self._conns) >= self.max_connections:
                self._close(next(iter(self._conns)))  # the oldest goes: never the prober
            conn.setblocking(False)
            self._conns[conn] = [time.monotonic() + self.request_timeout_s, b""]
            self._sel.register(conn, selectors.EVENT_READ, None)

    def _read(self, conn: socket.socket) -> None:
        state = self._conns.get(conn)
        if state is None:
            return
        try:
            data = conn.recv(MAX_HEAD_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self._close(conn)
        if not data:
            return self._close(conn)
        state[1] += data
        head = state[1]
        end = head.find(b"\r\n\r\n")
        if end < 0:
            end = head.find(b"\n\n")
        if end < 0:
            if len(head) >= MAX_HEAD_BYTES:
                self._send(conn, 431, "request head too large")
            return
        self._respond(conn, head[:end])

    def _respond(self, conn: socket.socket, head: bytes) -> None:
        parts = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return self._send(conn, 400, "not an HTTP/1.x request")
        method, path = parts[0], parts[1].split(b"?", 1)[0]
        if path not in (b"/healthz", b"/readyz"):
            return self._send(conn, 404, "this port answers GET /healthz and GET /readyz")
        if method not in (b"GET", b"HEAD"):
            return self._send(conn, 405, "GET or HEAD")
        try:
            ok, why = (self.alive if path == b"/healthz" else self.ready)()
        except Exception as e:  # noqa: BLE001 - a check that fails is an answer: not ok
            _log.exception("goodput serve: health check %s failed", path.decode())
            ok, why = False, f"the check failed ({type(e).__name__})"
        text = ("ok" if path == b"/healthz" else "ready") if ok else why
        self._send(conn, 200 if ok else 503, text, method == b"HEAD")

    def _send(self, conn: socket.socket, status: int, text: str, head_only=False) -> None:
        try:
            conn.send(_answer(status, text, head_only))  # < 1 KiB: the send buffer takes it
        except OSError:
            pass
        self.answered[status] = self.answered.get(status, 0) + 1
        self._close(conn)

    def _close(self, conn: socket.socket) -> None:
        if self._conns.pop(conn, None) is not None:
            try:
                self._sel.unregister(conn)
            except (KeyError, ValueError):
                pass
        try:
            conn.close()
        except OSError:
            pass
