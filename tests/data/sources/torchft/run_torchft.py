"""Drive a real torchft 0.2.0 job on CPU: its lighthouse, two replica groups
(``replica.py``), one replica SIGKILLed mid-run and started again (it heals from its
peer), with the driver's own fsync'd truth; torchft's OTLP log requests go to a
loopback capture server that keeps each request body and, with ``forward``, passes it on
to a ``goodput serve``.

Used by ``regenerate.py`` (the test data) and by the live test in
``tests/importers/test_source_torchft.py``. Needs the tool venv of ``venv.sh`` (``TORCHFT_VENV``,
default ``.venvs/torchft``); the driver itself runs in any python with
``opentelemetry-proto``.

Files written under ``out_dir``: ``truth-r<replica>.jsonl`` (``replica.py``'s truth),
``driver.jsonl`` (``{"ev": "kill"|"restart", "t": ns, "replica", "pid"}``),
``requests/NNNN.pb`` (each OTLP/HTTP request body as received, protobuf
``ExportLogsServiceRequest``), ``replica-r<N>-<i>.log``
and ``lighthouse.log`` (stdout and stderr).
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("TORCHFT_VENV", HERE.parents[3] / ".venvs" / "torchft"))


def venv_ok() -> str | None:
    """None when the tool venv can run torchft, else the reason it cannot."""
    py = VENV / "bin" / "python"
    if not (VENV / "bin" / "torchft_lighthouse").exists():
        return f"no torchft venv at {VENV} (build it with {HERE / 'venv.sh'})"
    r = subprocess.run([str(py), "-c", "import torchft, torch"], capture_output=True,
                       text=True, timeout=300)
    return None if r.returncode == 0 else f"torchft not importable in {VENV}: {r.stderr[-300:]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Capture:
    """A loopback OTLP/HTTP receiver that keeps each ``POST /v1/logs`` body in
    ``dir/NNNN.pb`` and answers 200 with an empty ``ExportLogsServiceResponse``; with
    ``forward`` (a ``goodput serve``'s ``http://host:port``) it passes each request on and
    answers with that server's status."""

    def __init__(self, out: Path, forward: str | None = None):
        out.mkdir(parents=True, exist_ok=True)
        lock, count = threading.Lock(), [0]

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/logs":
                    with lock:
                        count[0] += 1
                        (out / f"{count[0]:04d}.pb").write_bytes(body)
                status = 200
                if forward is not None:  # (a tee in front of a goodput serve)
                    req = urllib.request.Request(
                        forward + self.path, data=body, method="POST",
                        headers={"Content-Type": self.headers.get("Content-Type", "")})
                    try:
                        with urllib.request.urlopen(req, timeout=30) as r:
                            status = r.status
                    except urllib.error.HTTPError as e:
                        status = e.code
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _steps(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # (a torn last line)
        if rec.get("ev") == "step":
            out.append(rec)
    return out


def run(out_dir, *, forward: str | None = None, job_id: str = "torchft-demo",
        steps_after_rejoin: int = 8, step_sleep_s: float = 0.25, kill_replica: int = 1,
        kill_after_step: int = 12, restart_delay_s: float = 1.0,
        timeout_s: float = 300.0) -> dict:
    """Run the job; returns ``{"out_dir", "endpoint", "kill_ns", "restart_ns"}``.

    ``kill_replica`` is SIGKILLed ``0.4 * step_sleep_s`` after its commit of step
    ``kill_after_step`` (inside the next step's work, before its all-reduce), and started
    again ``restart_delay_s`` later; once it has committed a step (healed from its peer),
    every replica is told to stop ``steps_after_rejoin`` steps later (``stop``).

    Raises:
        RuntimeError: a replica failed or the run took longer than ``timeout_s``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cap = Capture(out / "requests", forward)
    endpoint = cap.endpoint
    lport = _free_port()
    lh_log = open(out / "lighthouse.log", "w")
    lighthouse = subprocess.Popen(
        [str(VENV / "bin" / "torchft_lighthouse"), "--min_replicas", "1",
         "--bind", f"[::]:{lport}", "--join_timeout_ms", "1000",
         "--heartbeat_timeout_ms", "2000", "--quorum_tick_ms", "100"],
        stdout=lh_log, stderr=subprocess.STDOUT)
    driver = open(out / "driver.jsonl", "a", encoding="utf-8")

    def note(rec: dict) -> None:
        driver.write(json.dumps(rec) + "\n")
        driver.flush()
        os.fsync(driver.fileno())

    env = dict(os.environ, TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{lport}", JOB_ID=job_id,
               TORCHFT_USE_OTEL="true", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
               OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    procs: dict[int, subprocess.Popen] = {}
    starts: dict[int, int] = {}

    def start(rid: int) -> None:
        starts[rid] = starts.get(rid, -1) + 1
        log = open(out / f"replica-r{rid}-{starts[rid]}.log", "w")
        procs[rid] = subprocess.Popen(
            [str(VENV / "bin" / "python"), str(HERE / "replica.py"),
             str(out / f"truth-r{rid}.jsonl"), str(out / "stop"), str(step_sleep_s)],
            env=dict(env, REPLICA_GROUP_ID=str(rid)), stdout=log, stderr=subprocess.STDOUT)

    deadline = time.monotonic() + timeout_s
    result = {"out_dir": str(out), "endpoint": endpoint}
    try:
        for rid in (0, 1):
            start(rid)
        truth = out / f"truth-r{kill_replica}.jsonl"
        while not any(s["step"] >= kill_after_step and s["commit"] for s in _steps(truth)):
            if time.monotonic() > deadline or procs[kill_replica].poll() is not None:
                raise RuntimeError(f"replica {kill_replica} never reached step "
                                   f"{kill_after_step} (see {out})")
            time.sleep(0.02)
        time.sleep(step_sleep_s * 0.4)  # inside the next step
        victim = procs[kill_replica]
        victim.send_signal(signal.SIGKILL)
        result["kill_ns"] = time.time_ns()
        victim.wait()
        note({"ev": "kill", "t": result["kill_ns"], "replica": kill_replica,
              "pid": victim.pid})
        time.sleep(restart_delay_s)
        result["restart_ns"] = time.time_ns()
        start(kill_replica)
        note({"ev": "restart", "t": result["restart_ns"], "replica": kill_replica,
              "pid": procs[kill_replica].pid})
        before = len(_steps(truth))
        while not any(s["commit"] for s in _steps(truth)[before:]):
            if time.monotonic() > deadline or procs[kill_replica].poll() is not None:
                raise RuntimeError(f"restarted replica {kill_replica} never committed a "
                                   f"step (see {out})")
            time.sleep(0.02)
        top = max(s["step"] for p in out.glob("truth-r*.jsonl") for s in _steps(p))
        (out / "stop.tmp").write_text(str(top + steps_after_rejoin))
        os.replace(out / "stop.tmp", out / "stop")
        for rid, p in procs.items():
            left = max(1.0, deadline - time.monotonic())
            try:
                rc = p.wait(timeout=left)
            except subprocess.TimeoutExpired as e:
                raise RuntimeError(f"replica {rid} still running after {timeout_s} s") from e
            if rc != 0:
                raise RuntimeError(f"replica {rid} exited with {rc} (see {out})")
        time.sleep(0.5)  # (the exporters' last requests)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        lighthouse.terminate()
        try:
            lighthouse.wait(timeout=10)
        except subprocess.TimeoutExpired:
            lighthouse.kill()
        cap.close()
        driver.close()
    return result


def requests_to_jsonl(req_dir, out_path) -> int:
    """Write each ``*.pb`` request of ``req_dir`` (in name order) as one OTLP JSON line
    (``json_format.MessageToJson``, the Collector file exporter's encoding) to
    ``out_path``; returns the number of log records."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsServiceRequest,
    )

    n = 0
    with open(out_path, "w", encoding="utf-8") as f:
        for p in sorted(Path(req_dir).glob("*.pb")):
            req = ExportLogsServiceRequest.FromString(p.read_bytes())
            n += sum(len(sl.log_records) for rl in req.resource_logs for sl in rl.scope_logs)
            doc = json.loads(json_format.MessageToJson(req))
            f.write(json.dumps(doc, separators=(",", ":")) + "\n")
    return n


if __name__ == "__main__":
    print(run(sys.argv[1] if len(sys.argv) > 1 else "/tmp/torchft-run"))


def truth(out_dir) -> dict:
    """The figures a report of this run must show, from the driver's own fsync'd files
    (``truth-r*.jsonl``), never from torchft's records. Each quorum is an attempt
    (docs/sources/torchft.md); times in seconds.

    - ``attempts``: the quorums the replicas' steps ran in.
    - ``steps_kept``: the distinct steps some replica committed; ``max_step``: the highest.
    - ``wasted_progress_s``: for each quorum followed by another, from the end of its last
      committed step at or below the next quorum's resume step (the step before the first
      one done in it) to its last step's end (a failed commit's included).
    - ``infrastructure_recovery_s``: for each quorum followed by another, from its last
      step's end to the earliest moment a member of the next quorum had it (``tq``, after
      the quorum, its process group and any heal were done).
    """
    steps = []
    for p in sorted(Path(out_dir).glob("truth-r*.jsonl")):
        steps += _steps(p)
    quorums = sorted({s["quorum_id"] for s in steps})
    by_q = {q: [s for s in steps if s["quorum_id"] == q] for q in quorums}
    committed = {s["step"] for s in steps if s["commit"]}
    wasted = recovery = 0
    for q, nq in zip(quorums, quorums[1:], strict=False):
        resume = min(s["step"] for s in by_q[nq]) - 1
        end = max(s["t1"] for s in by_q[q])
        kept = [s["t1"] for s in by_q[q] if s["commit"] and s["step"] <= resume]
        wasted += end - max(kept) if kept else 0
        recovery += min(s["tq"] for s in by_q[nq]) - end
    return {"attempts": len(quorums), "steps_kept": len(committed),
            "max_step": max(committed), "wasted_progress_s": wasted / 1e9,
            "infrastructure_recovery_s": recovery / 1e9}
