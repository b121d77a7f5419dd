"""goodput serve's health endpoints answer whatever ingest connections do, and ``/readyz``
says when the write-ahead log refuses a job.

Real :class:`GoodputServer` (and a real ``goodput serve`` under a file-size limit) on
loopback, raw sockets to hold connections. Nothing asserts on durations.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

from instr_util import child_env
from otlp_fixtures import Timeline, otlp_span, request_line

from goodput_processor.serve import GoodputServer, LiveStore
from goodput_processor.serve.health import HealthListener
from goodput_processor.serve.limits import Limits


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _held(address: str, n: int) -> list[socket.socket]:
    """``n`` connections to ``address`` (``http://host:port``) that send nothing."""
    host, port = address.rsplit("/", 1)[-1].rsplit(":", 1)
    return [socket.create_connection((host, int(port)), timeout=10) for _ in range(n)]


def _starved(url: str) -> bool:
    try:
        return _get(url)[0] == 503
    except OSError:  # the cap's 503 closes at once: urllib may see a reset
        return True


def test_healthz_answers_while_every_ingest_connection_is_held():
    srv = GoodputServer(LiveStore(min_interval_s=0), grpc_port=0, http_port=0, health_port=0,
                        limits=Limits(max_connections=8))
    held = []
    try:
        where = srv.addresses()
        health = where["health"]
        held = _held(where["http"], 8)  # each holds an ingest slot, waiting for a request
        assert _starved(where["http"] + "/healthz")  # the ingest port's own: starved
        answers = [_get(health + "/healthz") for _ in range(30)]
        assert answers == [(200, b"ok\n")] * 30
        assert _get(health + "/readyz") == (200, b"ready\n")
        # idle connections to the health port itself: the oldest give way to the prober
        held += _held(health, 3 * srv.health.max_connections)
        answers = [_get(health + "/healthz") for _ in range(10)]
        assert answers == [(200, b"ok\n")] * 10
        assert _get(health + "/v1/report")[0] == 404  # no data of any job on this port
        assert _get(health + "/metrics")[0] == 404
        assert srv.store.stats["refused_connections"] >= 1
    finally:
        for s in held:
            s.close()
        srv.stop(5, final=False)


def test_health_listener_answers_what_its_checks_say():
    state = {"ready": (False, "replaying the write-ahead log")}
    h = HealthListener("127.0.0.1", 0, alive=lambda: (True, "ok"),
                       ready=lambda: state["ready"], max_connections=4).start()
    url = f"http://127.0.0.1:{h.port}"
    try:
        assert _get(url + "/readyz") == (503, b"replaying the write-ahead log\n")
        state["ready"] = (True, "ready")
        assert _get(url + "/readyz?verbose=1") == (200, b"ready\n")
        req = urllib.request.Request(url + "/healthz", data=b"x", method="POST")
        try:
            code = urllib.request.urlopen(req, timeout=10).status
        except urllib.error.HTTPError as e:
            code = e.code
        assert code == 405
        with socket.create_connection(("127.0.0.1", h.port), timeout=10) as s:
            s.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n")
        with socket.create_connection(("127.0.0.1", h.port), timeout=10) as s:
            s.sendall(b"not http at all\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 400 ")
    finally:
        h.stop()


def _fsize_limit(limit: int):
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


def _line(job: str, steps: int) -> bytes:
    tl = Timeline(job=job).job_start(0).steps(0, steps, start=0, step_time=1)
    spans = [otlp_span(*s[:4], trace_id="d" * 32) for s in tl.spans]
    return request_line(tl.resource, spans).encode()


def test_readyz_is_not_ready_while_a_job_is_refused_for_a_file_size_limit(tmp_path):
    """A real ``goodput serve --health-port 0`` whose files cannot grow past 20 kB: job
    "big" sends a request larger than that (refused, 503), then job "small" writes (its
    append succeeds). /readyz says which job is refused, and why (until "big" is taken in,
    or for wal.REFUSAL_MEMORY_S)."""
    cmd = [sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port", "off",
           "--http-port", "0", "--health-port", "0", "--wal-dir", str(tmp_path / "wal"),
           "--format", "json", "--report-file", str(tmp_path / "r.jsonl")]
    proc = subprocess.Popen(cmd, env=child_env(), stderr=subprocess.PIPE, text=True,
                            preexec_fn=_fsize_limit(20_000), cwd=tmp_path)
    try:
        seen = [proc.stderr.readline() for _ in range(1)]
        while "listening" not in seen[-1] and seen[-1] and len(seen) < 50:
            seen.append(proc.stderr.readline())  # (a warning before it, if any)
        listening = seen[-1]
        assert "listening" in listening, "".join(seen)
        url = re.search(r"http=(\S+)", listening).group(1)
        health = re.search(r"health=(\S+)", listening).group(1)

        def post(body: bytes) -> int:
            req = urllib.request.Request(url + "/v1/traces", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code

        assert post(_line("small", 2)) == 200
        assert _get(url + "/readyz") == (200, b"ready\n")
        assert post(_line("big", 200)) == 503  # about 50 kB of log line
        assert post(_line("small", 3)) == 200  # another job still writes
        for where in (url, health):  # the same answer on both ports
            status, why = _get(where + "/readyz")
            assert status == 503 and b"'big'" in why and b"File too large" in why, why
            assert _get(where + "/healthz") == (200, b"ok\n")  # alive all along
        report = json.loads(_get(url + "/v1/report")[1])
        assert [j["job"] for j in report["jobs"]] == ["small"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
