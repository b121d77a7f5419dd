"""``POST /v1/traces`` and ``POST /v1/logs`` of the OTLP/HTTP receiver
(:mod:`goodput_processor.serve.http`, whose docstring lists the answers).

A body is taken in under the :class:`~goodput_processor.serve.limits.ByteBudget` shared
with the gRPC receiver: before a body of ``Content-Length`` L is read, L bytes are taken
from it, then, as a gzip body inflates (:func:`_inflate`, step by step), what it inflates
to, then an estimate of its parsed form (:func:`~goodput_processor.serve.receiver.
parse_cost`). Whatever does not fit is refused without reading more; the budget is given
back when the request is done. The parsed request goes to the store
(:class:`~goodput_processor.serve.store.LiveStore`) under the shutdown gate."""

from __future__ import annotations

import json
import logging
import zlib
from urllib.parse import urlsplit

from google.protobuf.message import DecodeError

from .limits import Refused
from .receiver import SIGNALS, Held, Rejected, parse_cost
from .slots import as_client

__all__ = ["IngestEndpoints"]

_log = logging.getLogger("goodput_processor.serve.receiver")
#: Bytes inflated per step of a gzip body (each step takes its share of the budget first).
_INFLATE_STEP = 256 << 10
#: Bytes read from the socket per step of a body.
_READ_STEP = 64 << 10
#: ``Content-Type`` -> the body's encoding.
_KINDS = {"application/x-protobuf": "protobuf", "application/json": "json"}


class IngestEndpoints:
    """The ``POST`` side of the receiver's request handler (a base class of it: it uses
    the handler's ``server.app``, ``headers``, ``rfile``, ``client_address``,
    ``_expect_continue``, ``_reject`` and ``_check_token``, and its ``_reply``)."""

    # --- POST /v1/traces, /v1/logs ----------------------------------------------

    def do_POST(self):  # noqa: N802
        app = self.server.app
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        kind = _KINDS.get(ctype)
        held = Held(app.budget)
        unread = _declared_length(self.headers)  # what is still coming, at most
        try:
            path = urlsplit(self.path).path
            if path not in ("/v1/traces", "/v1/logs"):
                raise Rejected(None, 404, 5, f"no such path {self.path!r} (POST /v1/traces, "
                               "/v1/logs)", close=True)
            self._check_token()
            if kind is None:
                raise Rejected("unsupported", 415, 3, f"unsupported Content-Type {ctype!r}: "
                               "expected application/x-protobuf or application/json", close=True)
            if unread is None:
                raise Rejected("unsupported", 411, 3, "a Content-Length header (a number >= 0) "
                               "is required", close=True)
            length = unread
            enc = (self.headers.get("Content-Encoding") or "identity").strip().lower()
            if enc not in ("gzip", "identity"):
                raise Rejected("unsupported", 415, 3, f"unsupported Content-Encoding {enc!r} "
                               "(gzip or none)", close=True)
            limit = app.limits.max_message_bytes
            if length > limit:
                raise Rejected("too_large", 413, 8, f"request of {length} bytes is over the "
                               f"limit of {limit} bytes (--max-message-bytes)", close=True)
            held.take(length, "the request body")
            if self._expect_continue:
                self.send_response_only(100)
                self.end_headers()
            body = self._read_body(length)
            unread = 0
            if enc == "gzip":
                body = _inflate(body, limit, held)
                held.give_back(length)  # the compressed body is gone
            held.take(parse_cost(kind, body), "the parsed request")
            out = self._take_in(kind, body, path[len("/v1/"):])
        except Rejected as r:
            return self._reject(r, kind or "text", unread or 0)
        finally:
            held.release()
        self._reply(200, *out)

    def _read_body(self, length: int) -> bytearray:
        """Read ``length`` bytes in steps, against the request's deadline.

        Raises:
            TimeoutError: the request's time ran out (the connection is dropped).
            Rejected: the client closed before the end (400, ``incomplete``).
        """
        body = bytearray()
        while len(body) < length:
            chunk = self.rfile.read1(min(length - len(body), _READ_STEP))
            if not chunk:
                raise Rejected("incomplete", 400, 3, f"body ended after {len(body)} of "
                               f"{length} bytes (Content-Length)", close=True)
            body += chunk
        return body

    def _take_in(self, kind: str, body: bytearray, signal: str = "traces") -> tuple[bytes, str]:
        """Parse ``body`` (``signal``: ``"traces"`` or ``"logs"``) and hand it to the store;
        returns the 200 answer's body and type.

        Raises:
            Rejected: shutting down (503), not an ``ExportTraceServiceRequest`` /
                ``ExportLogsServiceRequest`` (400), the store refused it (503 / 400), or any
                other error (500, logged).
        """
        app = self.server.app
        request, response, _, method = SIGNALS[signal]
        if not app.gate.enter():
            raise Rejected("unavailable", 503, 14, "shutting down", close=True, retry_after=1)
        try:
            if kind == "protobuf":
                req = request()
                try:
                    req.ParseFromString(body)
                except DecodeError as e:
                    raise Rejected("malformed", 400, 3, f"body of {len(body)} bytes is not a "
                                   f"protobuf {request.__name__} ({e})") from None
                with as_client(self.client_address[0]):  # (job slots per client: .slots)
                    getattr(app.store, method)(req, "otlp-http")
                return response().SerializeToString(), "application/x-protobuf"
            try:
                doc = json.loads(body)
            except (ValueError, RecursionError) as e:
                raise Rejected("malformed", 400, 3, f"body of {len(body)} bytes is not "
                               f"JSON ({e})") from None
            take = app.store.ingest_logs_json if signal == "logs" else app.store.ingest_json
            try:
                with as_client(self.client_address[0]):
                    take(doc, ("otlp-http", self.client_address[0]))
            except ValueError as e:
                raise Rejected("malformed", 400, 3, f"body of {len(body)} bytes is not an "
                               f"OTLP JSON {request.__name__} ({e})") from None
            return b"{}", "application/json"
        except Refused as e:
            raise Rejected.from_refused(e) from None
        except Rejected:
            raise
        except Exception:
            _log.exception("goodput serve http: taking in a request from %s failed",
                           self.client_address[0])
            raise Rejected("internal", 500, 13, "internal error (logged)") from None
        finally:
            app.gate.leave()


def _declared_length(headers) -> int | None:
    """The ``Content-Length`` header as an int >= 0, or None (missing or not a number)."""
    try:
        n = int(headers.get("Content-Length", ""))
    except ValueError:
        return None
    return n if n >= 0 else None


def _inflate(body: bytearray, limit: int, held: Held) -> bytearray:
    """Inflate a gzip body (one or more members) to at most ``limit`` bytes, step by step:
    at most ``_INFLATE_STEP`` bytes out of at most ``_READ_STEP`` bytes in, each step's
    output taken from the budget first.

    Raises:
        Rejected: not gzip or truncated (400), inflates past ``limit`` (413), the budget
            ran out (503).
    """
    out, mv, pos = bytearray(), memoryview(body), 0
    d, pending = zlib.decompressobj(16 + zlib.MAX_WBITS), b""
    while True:
        if d.eof:  # a member ended: another may follow
            if not d.unused_data and pos >= len(mv):
                return out
            d, pending = zlib.decompressobj(16 + zlib.MAX_WBITS), d.unused_data
        if not pending and pos < len(mv):
            pending, pos = mv[pos:pos + _READ_STEP], pos + _READ_STEP
        step = min(_INFLATE_STEP, limit + 1 - len(out))
        held.take(step, "the inflated body")
        try:
            part = d.decompress(pending, step)
        except zlib.error as e:
            raise Rejected("malformed", 400, 3, f"gzip body is not valid gzip ({e})") from None
        held.give_back(step - len(part))
        out += part
        if len(out) > limit:
            raise Rejected("too_large", 413, 8, f"gzip body inflates to more than the limit "
                           f"of {limit} bytes (--max-message-bytes)")
        pending = d.unconsumed_tail
        if not part and not pending and pos >= len(mv) and not d.eof:
            raise Rejected("malformed", 400, 3, "gzip body is truncated (the gzip stream "
                           "does not end)")

