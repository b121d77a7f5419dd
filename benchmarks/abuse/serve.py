"""The ``goodput serve`` process of an abuse run: start it (same WAL directory and token
across a restart), read its memory, ask it over HTTP (sizes in bytes, times in seconds)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections import deque

#: Limits fields -> the ``goodput serve`` flags that set them.
FLAGS = {"max_connections": "--max-connections", "max_inflight_bytes": "--max-inflight-bytes",
         "max_message_bytes": "--max-message-bytes", "request_timeout_s": "--request-timeout",
         "max_jobs": "--max-jobs", "max_custom_types": "--max-custom-types",
         "max_attribute_bytes": "--max-attribute-bytes",
         "max_job_spans_per_s": "--max-job-spans-per-second"}


_HELP: list = []


def serve_help() -> str:
    """``goodput serve --help`` of this checkout (to see which flags it has; asked once)."""
    if not _HELP:
        _HELP.append(subprocess.run(
            [sys.executable, "-m", "goodput_processor.cli", "serve", "--help"],
            capture_output=True, text=True, timeout=120).stdout)
    return _HELP[0]


def start_serve(limits: dict, tmp: str, token: str | None, extra: list[str],
                health_port: bool = True):
    """Start ``goodput serve`` on loopback with ``--wal-dir TMP/wal``, the limit flags and,
    where this checkout has it and ``health_port``, ``--health-port 0`` (``/healthz`` on a
    listener of its own); returns ``(process, {"grpc": ..., "http": ..., ...}, stderr
    tail)``.

    Raises:
        RuntimeError: serve printed no ``listening`` line (its stderr is in the message), or
            the checkout lacks one of the limit flags (set that limit to None).
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port", "0",
           "--http-port", "0", "--format", "json", "--report-file",
           os.path.join(tmp, "report.jsonl"), "--shutdown-timeout", "30",
           "--wal-dir", os.path.join(tmp, "wal")]
    if token:
        path = os.path.join(tmp, "token")
        with open(path, "w") as f:
            f.write(token + "\n")
        cmd += ["--token-file", path]
    for k, v in limits.items():
        if v is not None:
            cmd += [FLAGS[k], str(v)]
    if health_port and "--health-port" in serve_help():
        cmd += ["--health-port", "0"]
    cmd += list(extra)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    head = []
    for line in proc.stderr:
        head.append(line)
        if "listening" in line or len(head) > 50:
            break
    line = head[-1] if head else ""
    if "listening" not in line:
        proc.kill()
        raise RuntimeError("goodput serve did not start: " + " ".join(cmd) + "\n"
                           + "".join(head) + proc.stderr.read()[-4000:])
    tail: deque = deque(head, maxlen=40)
    threading.Thread(target=lambda: tail.extend(proc.stderr), daemon=True).start()
    addr = dict(re.findall(r"(\w+)=(\S+)", line))
    return proc, addr, tail


def health_base(addr: dict) -> str:
    """Where ``/healthz`` is asked: a listener of its own when serve names one (``health=``
    or ``healthz=`` in its listening line), else the HTTP port."""
    for k in ("health", "healthz", "probe", "probes"):
        if k in addr:
            v = addr[k].rstrip("/")
            v = v[:-len("/healthz")] if v.endswith("/healthz") else v
            return v if v.startswith("http") else "http://" + v
    return addr["http"]


def rss(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of ``pid`` in bytes ((0, 0) once it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line[:5]] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out.get("VmRSS", 0), out.get("VmHWM", 0)


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) ``pid`` has used so far (0.0 once it is
    gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runqueue_s(pid: int) -> float:
    """Seconds ``pid``'s threads have waited, runnable, for a CPU so far (the kernel's
    ``schedstat``, summed over the threads alive now; 0.0 once it is gone): how much the
    machine's other work starved it."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def dir_bytes(path: str) -> int:
    """Bytes of the files under ``path`` (0 when it is gone)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def get(base: str, path: str, token: str | None = None, timeout: float = 60):
    """``(status, body)`` of ``GET base+path`` (status 0 and the error's text on a socket
    error)."""
    req = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"}
                                 if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return 0, str(e).encode()


def job_report(base: str, job: str, token: str | None):
    """The report of one job (``/v1/report?job=``), or None."""
    status, body = get(base, "/v1/report?job=" + urllib.request.quote(job), token)
    if status != 200:
        return None
    jobs = json.loads(body).get("jobs") or []
    return jobs[0] if jobs else None


def all_jobs(base: str, token: str | None) -> dict:
    """Every job's report, page by page: ``{name: report}``."""
    out, page = {}, ""
    while True:
        q = "/v1/report?limit=1000" + (f"&page_token={urllib.request.quote(page)}"
                                        if page else "")
        status, body = get(base, q, token, timeout=300)
        if status != 200:
            raise RuntimeError(f"/v1/report answered {status}: {body[:300]!r}")
        doc = json.loads(body)
        for j in doc.get("jobs") or []:
            out[j.get("job")] = j
        page = doc.get("next_page_token")
        if not page:
            return out
