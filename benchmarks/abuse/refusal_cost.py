"""CPU that ``goodput serve`` spends per refused request, by kind of refusal (issue 38: under
the abuse mix serve was CPU-bound by some 20,000 refusals a minute).

Starts ``goodput serve`` (the limits of ``benchmarks/serve_abuse.py``, WAL and token on),
then sends each kind of refused request ``n`` times in a row from this process (one client:
no contention, so what is measured is the cost of a refusal, not the wait) and reads serve's
CPU seconds (user + system, all its threads, ``/proc/<pid>/stat``) before and after:

- ``grpc-wrongtoken``: ``TraceService/Export`` with a wrong token and a 1 MiB message
  (``UNAUTHENTICATED``);
- ``http-wrongtoken``: ``POST /v1/traces`` with a wrong token (``401``, the connection
  closed: a new one each time);
- ``http-malformed``: ``{"resourceSpans": 5}`` (``400``, keep-alive);
- ``http-too-large``: a 20 MiB body over ``--max-message-bytes`` sent whole (``413``; serve
  drops the body it did not want for up to 2 s);
- ``http-bomb``: a gzip body inflating to 256 MiB (``413``);
- ``http-amplify``: 1 MiB of empty ``ResourceSpans`` (``413``: its parse estimate is over
  the byte budget);
- ``grpc-flood``: 25 new job names from a client holding its share of job slots
  (``UNAVAILABLE``, ``over_client_jobs``).

Usage::

    python benchmarks/abuse/refusal_cost.py [--n 200] [--json]

Prints, per kind: the statuses, serve's CPU ms per request, and requests per serve
CPU-second. CPU seconds have the clock tick's resolution (10 ms): ``n`` makes it small.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import time
from collections import Counter

import grpc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from abuse import bodies  # noqa: E402
from abuse import serve as sv  # noqa: E402

MiB = 1 << 20
LIMITS = {"max_connections": 256, "max_inflight_bytes": 256 * MiB,
          "max_message_bytes": 16 * MiB, "request_timeout_s": 10, "max_jobs": 1000}
TOKEN = "abuse-token"


def _post(port: int, conn, body: bytes, headers: dict) -> tuple[str, object]:
    """POST ``body``; ``(status, conn)`` (a new connection when the last was closed)."""
    for _ in range(2):
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("POST", "/v1/traces", body=body, headers={
                "Content-Type": "application/x-protobuf", **headers})
            r = conn.getresponse()
            r.read()
            if r.getheader("Connection", "").lower() == "close":
                conn.close()
                conn = None
            return str(r.status), conn
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            conn = None
            last = type(e).__name__
    return last, conn


def run(n: int = 200) -> dict:
    """Per kind: ``{"n", "statuses", "cpu_ms_per_request"}`` (see the module docstring)."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    out = {}
    with tempfile.TemporaryDirectory(prefix="refusal-cost-") as tmp:
        proc, addr, _tail = sv.start_serve(LIMITS, tmp, TOKEN, [])
        port = int(addr["http"].rsplit(":", 1)[1])
        ch = grpc.insecure_channel(addr["grpc"], options=[
            ("grpc.max_send_message_length", -1)])
        call = ch.unary_unary(bodies.EXPORT_PATH, request_serializer=None,
                              response_deserializer=None)

        def grpc_one(body: bytes, token: str) -> str:
            try:
                call(body, metadata=(("authorization", f"Bearer {token}"),), timeout=30)
                return "OK"
            except grpc.RpcError as e:
                return e.code().name

        def http_kind(body: bytes, headers: dict):
            conn = [None]

            def one() -> str:
                status, conn[0] = _post(port, conn[0], body, headers)
                return status
            return one

        wrong = bodies.huge_attribute_request("wrongtoken", 0, MiB - 4096)
        flood_i = [0]

        def flood_body() -> bytes:
            flood_i[0] += 1
            return bodies.pb_request([f"f{flood_i[0]}-{k}" for k in range(25)]
                                     ).SerializeToString()

        # the flood's client first takes its share of job slots (500 of 1000)
        while grpc_one(flood_body(), TOKEN) == "OK":
            pass
        kinds = {
            "grpc-wrongtoken": (n, lambda: grpc_one(wrong, "not-the-token")),
            "http-wrongtoken": (n, http_kind(b"\x0a\x00", {"Authorization": "Bearer x"})),
            "http-malformed": (n, http_kind(b'{"resourceSpans": 5}', {
                **auth, "Content-Type": "application/json"})),
            "http-too-large": (max(5, n // 10), http_kind(bytes(20 * MiB), auth)),
            "http-bomb": (max(5, n // 4), http_kind(bodies.gzip_bomb(256 * MiB), {
                **auth, "Content-Encoding": "gzip"})),
            "http-amplify": (max(5, n // 4), http_kind(
                bodies.empty_resource_spans(MiB, "pb"), auth)),
            "grpc-flood": (n, lambda: grpc_one(flood_body(), TOKEN)),
        }
        try:
            for kind, (k, one) in kinds.items():
                one()  # (a first one: connections made, code paths warm)
                statuses = Counter()
                c0, t0 = sv.cpu_s(proc.pid), time.monotonic()
                for _ in range(k):
                    statuses[one()] += 1
                cpu = sv.cpu_s(proc.pid) - c0
                out[kind] = {"n": k, "statuses": dict(statuses),
                             "cpu_ms_per_request": round(1000 * cpu / k, 3),
                             "wall_s": round(time.monotonic() - t0, 2)}
        finally:
            ch.close()
            proc.terminate()
            proc.wait(60)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200, help="requests of each kind")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    res = run(a.n)
    if a.json:
        print(json.dumps(res))
    print(f"{'refusal':18} {'n':>5} {'serve CPU ms/req':>17} {'req/CPU-s':>10}  statuses")
    for kind, r in res.items():
        ms = r["cpu_ms_per_request"]
        print(f"{kind:18} {r['n']:5d} {ms:17.3f} {1000 / ms if ms else float('inf'):10.0f}  "
              f"{r['statuses']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
