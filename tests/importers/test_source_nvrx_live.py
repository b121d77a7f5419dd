"""The ``nvrx`` source, live: NVIDIA's ft_launcher itself (SIGKILL mid-run, restart), and
the kept run's records sent over OTLP to a real ``goodput serve``.

The ft_launcher test runs only where the tool's environment is
(``tests/data/sources/nvrx/venv.sh``); it takes about 65-75 s a case on a loaded 2-core
machine. The serve tests take about 7 s each.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from test_source_nvrx import CASES, DATA, LOG, _logs_requests, _workers, needs_linux_torch, rg

# --- live: ft_launcher itself ------------------------------------------------------------


_why = None if not sys.platform.startswith("linux") else rg.nvrx_missing()


@needs_linux_torch
@pytest.mark.skipif(_why is not None, reason=f"NVRx not runnable: {_why}")
@pytest.mark.parametrize("case", sorted(CASES))
def test_live_ft_launcher_kill_and_restart(tmp_path, case):
    """ft_launcher for real: rank 1 SIGKILLed after step 33, restarted (and, in
    nvrx_kill_twice, rank 0 of the restart after step 28, restarted again); the merged
    report against the driver's truth (regenerate.py's checks)."""
    lh, out, d, truth, rep = rg.run_live(tmp_path, case=case)
    print(lh.summarize([out], lh.Settings()))
    print(json.dumps(out.notes))
    assert not out.failures, out.failures
    if os.environ.get("NVRX_KEEP"):
        shutil.copytree(d.base, os.environ["NVRX_KEEP"], dirs_exist_ok=True)


# --- live over OTLP to a real `goodput serve` --------------------------------------------
#
# ft_launcher has no OTLP exporter: a Collector's filelog receiver sends each line of its
# output as a log record (body = the line; service.name set in the receiver's resource).
# The workers' own spool lines are OTLP JSON trace requests, sent as their exporter would.


class _Serve:
    """A real ``goodput serve`` process on loopback (gRPC and HTTP on free ports)."""

    def __init__(self, cwd: Path):
        import re
        import subprocess

        from instr_util import child_env

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port", "0",
             "--http-port", "0"], env=child_env(), stderr=subprocess.PIPE, text=True, cwd=cwd)
        line = self.proc.stderr.readline()
        self.grpc = re.search(r"grpc=(\S+)", line).group(1)
        self.http = re.search(r"http=(\S+)", line).group(1)

    def post(self, path: str, body: bytes, ctype: str) -> None:
        import urllib.request

        req = urllib.request.Request(self.http + path, data=body, method="POST",
                                     headers={"Content-Type": ctype})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200

    def report(self, job: str) -> dict:
        import urllib.request

        with urllib.request.urlopen(f"{self.http}/v1/report?job={job}", timeout=120) as r:
            doc = json.loads(r.read())
        (found,) = [j for j in doc["jobs"] if j["job"] == job]
        return found

    def stop(self) -> None:
        import signal
        import subprocess

        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _send_logs(serve: _Serve, protocol: str, docs: list[dict]) -> None:
    from google.protobuf import json_format
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
        ExportLogsServiceRequest,
    )

    if protocol == "grpc":
        import grpc
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2_grpc import LogsServiceStub

        with grpc.insecure_channel(serve.grpc) as ch:
            stub = LogsServiceStub(ch)
            for doc in docs:
                stub.Export(json_format.ParseDict(doc, ExportLogsServiceRequest()), timeout=60)
        return
    for doc in docs:
        if protocol == "http-protobuf":
            serve.post("/v1/logs", json_format.ParseDict(
                doc, ExportLogsServiceRequest()).SerializeToString(), "application/x-protobuf")
        else:
            serve.post("/v1/logs", json.dumps(doc).encode(), "application/json")


_SAME = ("productive_time_s", "total_time_s", "badput_s", "max_productive_step",
         "attempts", "recovery", "disruptions")


@needs_linux_torch
@pytest.mark.parametrize("protocol", ["grpc", "http-protobuf", "http-json"])
def test_live_to_serve_gives_the_same_report(tmp_path, protocol):
    """The workers' spool requests (OTLP JSON traces) and the launcher's lines (OTLP log
    records, over ``protocol``) sent to a real ``goodput serve``: its /v1/report equals the
    file import of the same records (the journals; the killed worker's .tail is a file
    only), recovery evidence from NVRx included."""
    pytest.importorskip("grpc")
    lh = rg.harness()
    drv = json.loads((DATA / "driver.json").read_text())
    job = drv["case"]
    off = tmp_path / "offline"
    _workers(off)
    for t in off.glob("*.tail"):
        t.unlink()
    journals = [x for f in sorted(off.glob("spans-*.jsonl"))
                for x in f.read_text().splitlines() if x.strip()]
    rg.import_launcher_log(LOG, off, job, drv["agent_pid"])
    offline = rg.report_json(lh, off)["jobs"][0]
    assert offline["recovery"][0]["evidence"]["launcher_rendezvous_s"] > 0
    (tmp_path / "serve").mkdir()
    serve = _Serve(tmp_path / "serve")
    try:
        for x in journals:
            serve.post("/v1/traces", x.encode(), "application/json")
        _send_logs(serve, protocol, _logs_requests(LOG.read_text().splitlines(), job))
        live = serve.report(job)
    finally:
        serve.stop()
    assert {k: live[k] for k in _SAME} == {k: offline[k] for k in _SAME}
