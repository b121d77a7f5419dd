"""The attackers of ``benchmarks/serve_abuse.py``, each a function of ``(cfg, addr, stop,
counts)`` run in threads of a process that ``serve_abuse`` starts for each attack
(``python -m abuse.attacks``: the run's settings as JSON on stdin, what the attack got as
JSON on stdout at SIGTERM or after ``duration_s``), so that their CPU and GIL do not slow
each other or the process that measures serve.

Attacks (issue 38, and the earlier ones of issue 15):

- ``amplify``: bodies of empty ``ResourceSpans`` of each ``amplify_mib`` size, protobuf and
  OTLP/JSON over HTTP and protobuf over gRPC, ``amplify_clients`` at once, right token;
- ``wrongtoken``: ``wrongtoken_calls`` concurrent gRPC calls of ``wrongtoken_bytes`` each
  with a wrong token, again and again;
- ``stalled``: ``stalled_calls`` gRPC calls that send their headers (right token) and never
  their message; each opened again a second after serve ends it;
- ``idle``: ``idle_connections`` HTTP connections that send nothing; one closed is opened
  again at once, one refused with an answer a second later;
- ``malformed``: JSON that is not OTLP (``{"resourceSpans": 5}`` and friends, some naming the
  healthy job) and protobuf garbage, over HTTP and gRPC, as fast as they go;
- ``hugeattr``: custom badput spans with an ``attr_bytes`` string attribute, HTTP and gRPC;
- ``flood``: new job names, ``jobs_per_request`` a request, over HTTP (``http_flooders``,
  every 4th request OTLP/JSON) and gRPC, as fast as they go, up to ``jobs``;
- ``slowloris``: HTTP connections announcing ``slowloris_bytes`` that trickle, hold, or stop
  one byte short; ``bomb``: gzip bombs inflating to ``bomb_bytes``.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import selectors
import signal
import socket
import sys
import threading
import time
from collections import Counter

import grpc

from abuse import bodies

ATTACKS = ("amplify", "wrongtoken", "stalled", "idle", "malformed", "hugeattr", "flood",
           "slowloris", "bomb")
_BIG = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
        ("grpc.use_local_subchannel_pool", 1)]


class Counts:
    """Answers by attack and status (thread-safe)."""

    def __init__(self):
        self._lock, self.by_kind, self.acked_jobs = threading.Lock(), {}, []
        self.acked_present: set = set()  # jobs with an acknowledged span that is not a step

    def add(self, kind: str, status, n: int = 1) -> None:
        with self._lock:
            self.by_kind.setdefault(kind, Counter())[str(status)] += n


def _hdr(cfg) -> dict:
    return {"Authorization": f"Bearer {cfg['token']}"} if cfg.get("token") else {}


def _md(token):
    return (("authorization", f"Bearer {token}"),) if token else None


def _port(addr) -> int:
    return int(addr["http"].rsplit(":", 1)[1])


def _raw_export(ch: grpc.Channel):
    return ch.unary_unary(bodies.EXPORT_PATH, request_serializer=None,
                          response_deserializer=None)


def _post(conn, body: bytes, ctype: str, headers: dict, gz=False) -> str:
    h = {"Content-Type": ctype, **headers}
    if gz:
        h["Content-Encoding"] = "gzip"
    try:
        conn.request("POST", "/v1/traces", body, h)
        r = conn.getresponse()
        r.read()
        if r.getheader("Connection", "").lower() == "close":
            conn.close()
        return str(r.status)
    except (OSError, http.client.HTTPException) as e:
        conn.close()
        return type(e).__name__


def _grpc(call, body: bytes, token, timeout: float) -> str:
    try:
        call(body, timeout=timeout, metadata=_md(token))
        return "OK"
    except grpc.RpcError as e:
        return e.code().name


def amplify(cfg, addr, stop, counts) -> None:
    combos = [(int(m * bodies.MiB), how) for m in cfg["amplify_mib"]
              for how in ("pb-http", "json-http", "pb-grpc")]
    cache = {}

    def one(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", _port(addr), timeout=120)
        with grpc.insecure_channel(addr["grpc"], options=_BIG) as ch:
            call, i = _raw_export(ch), k * len(combos) // max(1, cfg["amplify_clients"])
            while not stop.is_set():
                size, how = combos[i % len(combos)]
                key = (size, how[:2])
                if key not in cache:
                    cache[key] = bodies.empty_resource_spans(size, "json" if how[0] == "j"
                                                             else "pb")
                if how == "pb-grpc":
                    status = _grpc(call, cache[key], cfg.get("token"), 120)
                else:
                    status = _post(conn, cache[key], "application/json" if how[0] == "j"
                                   else "application/x-protobuf", _hdr(cfg))
                counts.add(f"amplify {how} {size >> 20}MiB", status)
                i += 1
        conn.close()

    _threads([lambda k=k: one(k) for k in range(cfg["amplify_clients"])])


def wrongtoken(cfg, addr, stop, counts) -> None:
    body = bodies.huge_attribute_request("wrongtoken", 0, cfg["wrongtoken_bytes"] - 4096)
    chans = [grpc.insecure_channel(addr["grpc"], options=_BIG) for _ in range(4)]

    def one(k: int) -> None:
        call = _raw_export(chans[k % len(chans)])
        while not stop.is_set():
            counts.add("wrongtoken", _grpc(call, body, "not-the-token", 60))

    _threads([lambda k=k: one(k) for k in range(cfg["wrongtoken_calls"])])
    for ch in chans:
        ch.close()


def stalled(cfg, addr, stop, counts) -> None:
    """Calls whose request iterator blocks until the end: gRPC sends the headers at once and
    never a message."""
    chans = [grpc.insecure_channel(addr["grpc"], options=_BIG) for _ in range(3)]

    def never():
        stop.wait()
        return
        yield  # a generator that yields nothing, once stop is set

    open_calls = []

    def opened(k: int) -> None:
        if stop.is_set():
            return
        call = chans[k % len(chans)].stream_unary(
            bodies.EXPORT_PATH, request_serializer=None, response_deserializer=None)
        fut = call.future(never(), metadata=_md(cfg.get("token")))
        counts.add("stalled", "opened")

        def done(f, k=k):
            if stop.is_set():
                return
            counts.add("stalled", f.code().name if f.code() else "done")
            threading.Timer(1.0, opened, args=(k,)).start()  # open it again a second on
        fut.add_done_callback(done)
        open_calls.append(fut)

    for k in range(cfg["stalled_calls"]):
        opened(k)
    stop.wait()
    for f in list(open_calls):
        f.cancel()
    for ch in chans:
        ch.close()


def idle(cfg, addr, stop, counts) -> None:
    sel, port = selectors.DefaultSelector(), _port(addr)

    def open_one() -> None:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError as e:
            counts.add("idle", type(e).__name__)
            return
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        counts.add("idle", "opened")

    for _ in range(cfg["idle_connections"]):
        open_one()
    later: list = []  # when to open again a connection that serve refused
    while not stop.is_set():
        now = time.monotonic()
        while later and later[0] <= now:
            later.pop(0)
            open_one()
        for key, _ in sel.select(0.1):
            s = key.fileobj
            try:
                data = s.recv(4096)
                outcome = _status(data) if data else "closed"
            except BlockingIOError:
                continue
            except OSError:
                outcome = "reset"
            counts.add("idle", outcome)
            sel.unregister(s)
            s.close()
            later.append(time.monotonic() + (1.0 if data else 0.0))  # a refused one: 1 s on
            later.sort()
    for key in list(sel.get_map().values()):
        key.fileobj.close()


def _status(data: bytes) -> str:
    m = re.match(rb"HTTP/1\.\d (\d{3})", data)
    return m.group(1).decode() if m else "garbled"


def malformed(cfg, addr, stop, counts) -> None:
    cases = bodies.malformed_bodies(cfg["victim"])
    conn = http.client.HTTPConnection("127.0.0.1", _port(addr), timeout=60)
    with grpc.insecure_channel(addr["grpc"], options=_BIG) as ch:
        call, i = _raw_export(ch), 0
        while not stop.is_set():
            ctype, body = cases[i % len(cases)]
            status = _post(conn, body, ctype, _hdr(cfg))
            counts.add("malformed http", status)
            if status.startswith("2"):
                counts.add("malformed accepted", f"case {i % len(cases)}: "
                           + body[:24].decode("latin-1"))
            if ctype.endswith("protobuf"):
                counts.add("malformed grpc", _grpc(call, body, cfg.get("token"), 30))
            i += 1
            time.sleep(cfg["malformed_pause_s"])
    conn.close()


def hugeattr(cfg, addr, stop, counts) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", _port(addr), timeout=120)
    with grpc.insecure_channel(addr["grpc"], options=_BIG) as ch:
        call, i = _raw_export(ch), 0
        while not stop.is_set():
            body = bodies.huge_attribute_request(f"hugeattr-{i % 3}", i, cfg["attr_bytes"])
            if i % 2:
                status = _grpc(call, body, cfg.get("token"), 120)
            else:
                status = _post(conn, body, "application/x-protobuf", _hdr(cfg))
            counts.add("hugeattr", status)
            if status in ("OK", "200"):
                counts.acked_present.add(f"hugeattr-{i % 3}")
            i += 1
    conn.close()


def flood(cfg, addr, stop, counts) -> None:
    lock, sent = threading.Lock(), [0]

    def names(n: int) -> list[str]:  # the next n distinct job names
        with lock:
            first = sent[0]
            sent[0] = min(cfg["jobs"], first + n)
            return [f"flood-{i:06d}" for i in range(first, sent[0])]

    def over_http() -> None:
        conn, i = http.client.HTTPConnection("127.0.0.1", _port(addr), timeout=30), 0
        while not stop.is_set() and (jobs := names(cfg["jobs_per_request"])):
            if i % 4 == 3:
                status = _post(conn, bodies.json_request(jobs), "application/json", _hdr(cfg))
            else:
                status = _post(conn, bodies.pb_request(jobs).SerializeToString(),
                               "application/x-protobuf", _hdr(cfg))
            counts.add("flood http", status)
            if status == "200":
                counts.acked_jobs.extend(jobs)
            i += 1
        conn.close()

    def over_grpc() -> None:
        with grpc.insecure_channel(addr["grpc"]) as ch:
            call = _raw_export(ch)
            while not stop.is_set() and (jobs := names(cfg["jobs_per_request"])):
                status = _grpc(call, bodies.pb_request(jobs).SerializeToString(),
                               cfg.get("token"), 30)
                counts.add("flood grpc", status)
                if status == "OK":
                    counts.acked_jobs.extend(jobs)

    _threads([over_http] * cfg["http_flooders"] + [over_grpc])
    counts.add("flood", "names sent", sent[0])


def slowloris(cfg, addr, stop, counts) -> None:
    """A third trickle 1 KiB a second, a third hold their body back, a third send all of it
    but the last byte as fast as they can."""
    sel, port = selectors.DefaultSelector(), _port(addr)
    auth = "".join(f"{k}: {v}\r\n" for k, v in _hdr(cfg).items())
    head = (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"{auth}Content-Length: {cfg['slowloris_bytes']}\r\n\r\n").encode()
    left: dict = {}  # socket -> [mode, bytes of body still to send, next trickle time]
    block = b"\x0a" * (64 << 10)

    def open_one(i: int) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(head)
        except OSError as e:
            counts.add("slowloris", type(e).__name__)
            return
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
        left[s] = [("trickle", "hold", "all-but-1")[i % 3], cfg["slowloris_bytes"] - 1, 0.0]

    for i in range(cfg["slowloris"]):
        open_one(i)
    while not stop.is_set():
        for key, _ in sel.select(0.05):
            s = key.fileobj
            try:
                data = s.recv(4096)
                outcome = _status(data) if data else "dropped"
            except BlockingIOError:
                continue
            except OSError:
                outcome = "reset"
            counts.add("slowloris", outcome)
            sel.unregister(s)
            left.pop(s, None)
            s.close()
            if not stop.is_set():
                open_one(key.data)
        now = time.monotonic()
        for s, st in list(left.items()):
            mode, todo, when = st
            if mode == "hold" or todo <= 0 or when > now:
                continue
            try:
                st[1] -= s.send(block[:min(todo, 1024 if mode == "trickle" else len(block))])
            except OSError:
                pass  # the selector sees the close; a full window just waits
            if mode == "trickle":
                st[2] = now + 1.0
    for key in list(sel.get_map().values()):
        key.fileobj.close()


def bomb(cfg, addr, stop, counts) -> None:
    body = bodies.gzip_bomb(cfg["bomb_bytes"])
    conn = http.client.HTTPConnection("127.0.0.1", _port(addr), timeout=60)
    while not stop.is_set():
        counts.add("bomb", _post(conn, body, "application/x-protobuf", _hdr(cfg), gz=True))
    conn.close()


def _threads(targets) -> None:
    ts = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def main() -> int:
    """Run ``cfg["attacks"]`` against ``cfg["addr"]`` for ``cfg["duration_s"]`` seconds (or
    until SIGTERM); print ``{"answers": {kind: {status: n}}, "acked_jobs": [...]}`` (jobs
    with one acknowledged step each) and ``"acked_present"`` (jobs with an acknowledged
    span of another kind)."""
    cfg = json.load(sys.stdin)
    stop, counts = threading.Event(), Counts()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    fns = {name: globals()[name] for name in cfg["attacks"]}
    threads = [threading.Thread(target=fn, args=(cfg, cfg["addr"], stop, counts), daemon=True,
                                name=name) for name, fn in fns.items()]
    for t in threads:
        t.start()
    print("started", file=sys.stderr, flush=True)
    stop.wait(cfg["duration_s"])
    stop.set()
    end = time.monotonic() + 60
    for t in threads:
        t.join(max(0.1, end - time.monotonic()))
    json.dump({"answers": {k: dict(v) for k, v in counts.by_kind.items()},
               "acked_jobs": sorted(set(counts.acked_jobs)),
               "acked_present": sorted(counts.acked_present),
               "unfinished": [t.name for t in threads if t.is_alive()]}, sys.stdout)
    sys.stdout.flush()
    os._exit(0)  # gRPC's and the stalled calls' threads need not be waited for


if __name__ == "__main__":
    main()
