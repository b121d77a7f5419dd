"""Exporter outages, disk full and an unwritable run directory (issue 8).

The real OTLP (gRPC and HTTP) and Cloud Trace exporters send to loopback services that
go down, come back, answer slowly or answer errors. Nothing the recorder accepted may be
lost: every span of the spool arrives once the endpoint is back (also after a SIGKILL,
through the next attempt), and ``goodput.recorder.dropped`` stays 0. Retries are short
here (``GOODPUT_EXPORT_BACKOFF_*``, exporter timeouts of 1 s); the minutes-long outage and
the step-time figures are in ``benchmarks/bench_outage.py``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from fake_trace_services import FakeCloudTrace, otlp_json_lines, otlp_spans
from google.protobuf import empty_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExp
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExp
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

import goodput
from goodput import export, forward

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for var in ("OTEL_TRACES_EXPORTER", "GOODPUT_TRACES_EXPORTER", "OTEL_SERVICE_NAME",
                "GOODPUT_JOB_NAME", "GOODPUT_ATTEMPT", "OTEL_RESOURCE_ATTRIBUTES",
                "GOODPUT_SPOOL", "OTEL_BSP_MAX_QUEUE_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GOODPUT_EXPORT_BACKOFF_S", "0.05")
    monkeypatch.setenv("GOODPUT_EXPORT_BACKOFF_MAX_S", "0.2")
    yield
    goodput.shutdown()


class _Sink:
    """Received requests and a mode: ``ok``, ``error`` (refuse each request) or ``slow``."""

    def __init__(self):
        self.requests: list = []
        self.mode = "ok"
        self.delay_s = 0.3
        self.refused = 0
        self._cond = threading.Condition()

    def take(self, request) -> bool:
        if self.mode == "error":
            self.refused += 1
            return False
        if self.mode == "slow":
            time.sleep(self.delay_s)
        with self._cond:
            self.requests.append(request)
            self._cond.notify_all()
        return True


class FlakyGrpc(_Sink):
    """OTLP/gRPC receiver that can be stopped and started again on the same port."""

    def __init__(self):
        super().__init__()
        self.port = 0
        self.server = None
        self.up()

    def up(self) -> None:
        sink = self

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802
                if not sink.take(request):
                    context.abort(grpc.StatusCode.UNAVAILABLE, "injected outage")
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()

    def down(self) -> None:
        self.server.stop(0).wait()

    def exporter(self):
        return GrpcExp(endpoint=f"127.0.0.1:{self.port}", insecure=True, timeout=1)


class FlakyHttp(_Sink):
    """OTLP/HTTP receiver: ``error`` answers 503, ``slow`` waits before answering."""

    def __init__(self):
        super().__init__()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                req = trace_service_pb2.ExportTraceServiceRequest()
                req.ParseFromString(body)
                ok = sink.take(req)
                out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def exporter(self):
        # a timeout far above the slow mode's 0.3 s: on a loaded machine a timed-out request
        # that the server did take would be sent again (at least once), a duplicate
        return HttpExp(endpoint=f"http://127.0.0.1:{self.port}/v1/traces", timeout=10)


def spool_ids(run_dir) -> list[str]:
    """Span ids of every whole line of every spool file (duplicates kept)."""
    out = []
    for path in sorted(Path(run_dir).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                req = json.loads(line)
            except ValueError:
                continue
            out += [sp["spanId"] for rs in req["resourceSpans"] for ss in rs["scopeSpans"]
                    for sp in ss["spans"]]
    return out


def train(steps: int) -> None:
    with goodput.training_prep():
        pass
    for n in range(steps):
        with goodput.data_loading():
            pass
        with goodput.step(n):
            time.sleep(0.002)
        if n % 5 == 4:
            with goodput.checkpoint_save(step=n):
                pass


def report(run_dir) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                        str(ROOT / "collectors")])}
    p = subprocess.run([sys.executable, "-m", "goodput_processor.cli", "report", str(run_dir),
                        "--format", "json"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_grpc_down_then_up_sends_every_spooled_span(tmp_path, caplog):
    fake = FlakyGrpc()
    fake.down()
    try:
        with caplog.at_level(logging.WARNING, logger="goodput.forward"):
            rec = goodput.configure("down-up", run_dir=tmp_path / "run",
                                    exporters=[fake.exporter()], flush_interval_s=0.05,
                                    handle_signals=False, start_time=time.time())
            train(30)
            assert rec.flush(timeout_s=1.0) is False  # the exporter cannot finish: bounded
            st = rec.stats()["exporters"]["OTLPSpanExporter"]
            assert st["failures"] >= 1 and st["sent"] == 0 and st["pending_bytes"] > 0
            fake.up()
            assert rec.flush(timeout_s=20.0) is True
            goodput.shutdown()  # the heartbeats written since are sent too
        received = [s["span_id"] for s in otlp_spans(fake.requests)]
        spooled = spool_ids(tmp_path / "run")
        assert sorted(set(received)) == sorted(set(spooled)) and len(spooled) > 60
        assert rec.stats()["dropped"] == 0
        assert rec.stats()["exporters"]["OTLPSpanExporter"]["pending_bytes"] == 0
        assert "export failed" in caplog.text and "works again" in caplog.text
    finally:
        goodput.shutdown()
        fake.down()


def test_http_errors_then_slow_then_ok_loses_nothing(tmp_path):
    fake = FlakyHttp()
    fake.mode = "error"
    try:
        rec = goodput.configure("errors", run_dir=tmp_path / "run", exporters=[fake.exporter()],
                                flush_interval_s=0.05, handle_signals=False,
                                start_time=time.time())
        train(10)
        rec.flush(exporters=False)
        deadline = time.monotonic() + 20
        while fake.refused < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake.refused >= 3 and not fake.requests
        fake.mode = "slow"  # slower than the recorder's flush interval, within the timeout
        train(10)
        assert rec.flush(timeout_s=30.0) is True
        fake.mode = "ok"
        train(5)
        goodput.shutdown()
        received = [s["span_id"] for s in otlp_spans(fake.requests)]
        assert sorted(set(received)) == sorted(set(spool_ids(tmp_path / "run")))
        assert len(received) == len(set(received))  # a 503 is retried, not duplicated
        assert rec.stats()["dropped"] == 0
    finally:
        fake.stop()


def test_cloud_trace_down_then_up(tmp_path):
    fake = FakeCloudTrace()
    port = fake.port
    client = fake.client()
    fake.stop()
    try:
        exporter = export.cloud_trace_exporter(project_id="p", client=client)
        rec = goodput.configure("ct-down", run_dir=tmp_path / "run", exporters=[exporter],
                                flush_interval_s=0.05, handle_signals=False,
                                start_time=time.time())
        train(10)
        assert rec.flush(timeout_s=1.0) is False
        fake.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        fake.server.add_generic_rpc_handlers((_cloud_trace_handler(fake),))
        assert fake.server.add_insecure_port(f"127.0.0.1:{port}") == port
        fake.server.start()
        assert rec.flush(timeout_s=30.0) is True
        goodput.shutdown()
        received = {s.span_id for s in fake.spans}
        assert received == set(spool_ids(tmp_path / "run"))
        assert rec.stats()["dropped"] == 0
    finally:
        goodput.shutdown()
        fake.stop()


def _cloud_trace_handler(fake):
    from google.cloud.trace_v2.types import BatchWriteSpansRequest

    def batch_write(request, context):
        fake._add(request)
        return empty_pb2.Empty()

    return grpc.method_handlers_generic_handler(fake.SERVICE, {
        "BatchWriteSpans": grpc.unary_unary_rpc_method_handler(
            batch_write, request_deserializer=BatchWriteSpansRequest.deserialize,
            response_serializer=empty_pb2.Empty.SerializeToString)})


CHILD = textwrap.dedent("""
    import sys, time
    import goodput
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    exporter = OTLPSpanExporter(endpoint=sys.argv[2], insecure=True, timeout=1)
    rec = goodput.configure("killed", run_dir=sys.argv[1], exporters=[exporter],
                            flush_interval_s=0.05, handle_signals=False)
    for n in range(int(sys.argv[3])):
        with goodput.step(n):
            time.sleep(0.002)
    if sys.argv[4] == "hang":
        rec.flush(exporters=False)
        print("written", flush=True)
        time.sleep(60)
    ok = rec.flush(timeout_s=20)
    print("sent" if ok else "not sent", flush=True)
    goodput.shutdown()
""")


def test_sigkill_during_outage_next_attempt_sends_the_backlog(tmp_path):
    """Attempt 0 is killed while the endpoint is down; attempt 1 sends attempt 0's lines."""
    fake = FlakyGrpc()
    fake.down()
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = tmp_path / "run"
    args = [sys.executable, str(script), str(run), f"127.0.0.1:{fake.port}"]
    try:
        first = subprocess.Popen(args + ["40", "hang"], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        assert first.stdout.readline().strip() == "written"
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        a0 = spool_ids(run)
        (sidecar,) = run.glob("spans-p00000-a0000-*.jsonl.OTLPSpanExporter.offset")
        assert a0 and sidecar.read_text().strip() == "0"
        fake.up()
        second = subprocess.run(args + ["5", "exit"], env=env, capture_output=True,
                                text=True, timeout=60)
        assert second.returncode == 0 and second.stdout.strip() == "sent", second.stderr
        received = {s["span_id"] for s in otlp_spans(fake.requests)}
        assert received == set(spool_ids(run)) and set(a0) <= received
        for path in run.glob("*.jsonl"):
            offset = Path(f"{path}.OTLPSpanExporter.offset").read_text().strip()
            assert int(offset) == path.stat().st_size
    finally:
        fake.down()


def test_no_spool_queue_full_counts_exactly_what_is_lost(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "10")
    fake = FlakyGrpc()
    fake.down()
    try:
        rec = goodput.configure("nospool", spool=False, exporters=[fake.exporter()],
                                flush_interval_s=0.05, handle_signals=False,
                                start_time=time.time())
        train(10)
        rec.job_end()
        total = rec.stats()["spans"] + 1  # and the window's root
        fake.up()
        assert rec.flush(timeout_s=20.0) is True
        # distinct spans: an export that outlived the exporter's 1 s deadline on a loaded
        # machine is sent again (OTLP's at-least-once), so a span may arrive twice
        received = {s["span_id"] for s in otlp_spans(fake.requests)}
        assert len(received) == 10
        assert rec.stats()["dropped"] == total - 10 > 0
    finally:
        goodput.shutdown()
        fake.down()


def test_bad_forwarder_settings_are_clear_errors():
    with pytest.raises(ValueError, match=r"backoff_s must be a number > 0, got 0"):
        forward.Forwarder(object(), "x", backoff_s=0)
    with pytest.raises(ValueError, match=r"max_queue_spans must be a number > 0, got -1"):
        forward.Forwarder(object(), "x", max_queue_spans=-1)
    with pytest.raises(ValueError, match=r"not an OTLP JSON line"):
        forward.decode_line(b'{"resourceSpans": [{"scopeSpans": [{"spans": [{}]}]}]}')


def test_unreadable_spool_lines_are_skipped_and_counted(tmp_path):
    fake = FlakyGrpc()
    try:
        rec = goodput.configure("bad-lines", run_dir=tmp_path / "run",
                                exporters=[fake.exporter()], flush_interval_s=0.05,
                                handle_signals=False, start_time=time.time())
        train(3)
        rec.flush(exporters=False)
        with open(rec.stats()["spool_path"], "a") as f:  # as after a torn write
            f.write('{"resourceSpans": [tor\n')
        train(3)
        assert rec.flush(timeout_s=20.0) is True
        goodput.shutdown()
        st = rec.stats()["exporters"]["OTLPSpanExporter"]
        assert st["bad_lines"] == 1 and st["pending_bytes"] == 0
        received = {s["span_id"] for s in otlp_spans(fake.requests)}
        assert received == set(spool_ids(tmp_path / "run"))
    finally:
        goodput.shutdown()
        fake.down()


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (needs root); skipped where it cannot be mounted."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if not shutil.which("mount") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if p.returncode:
        pytest.skip(f"cannot mount a tmpfs: {p.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_warns_keeps_training_and_report_says_what_is_missing(small_disk,
                                                                        tmp_path, caplog):
    run = small_disk / "run"
    filler = small_disk / "filler"
    fake = FlakyGrpc()
    try:
        with caplog.at_level(logging.WARNING, logger="goodput"):
            rec = goodput.configure("disk-full", run_dir=run, exporters=[fake.exporter()],
                                    flush_interval_s=0.05, handle_signals=False,
                                    start_time=time.time())
            train(5)
            rec.flush(exporters=False)
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT)  # fill the disk
            try:
                while os.write(fd, b"\0" * 1024):
                    pass
            except OSError:
                pass
            os.close(fd)
            train(40)  # training goes on while the spool cannot be written
            rec.flush(exporters=False)
            assert rec.stats()["errors"] > 0
            filler.unlink()  # space again: later lines (and the counters) land
            train(5)
            rec.job_end()
            assert rec.flush(timeout_s=20.0) is True
            goodput.shutdown()
        assert "not writable" in caplog.text and caplog.text.count("not writable") == 1
        # the exporter got everything: the spool's lines and what the spool could not take
        received = {s["span_id"] for s in otlp_spans(fake.requests)}
        assert set(spool_ids(run)) < received
        assert rec.stats()["dropped"] == 0
        # the report of the spool says spans are missing; the one of the OTLP copy too
        (job,) = report(run)["jobs"]
        assert job["recorder"]["errors"] > 0
        (tmp_path / "otlp").mkdir()
        otlp_json_lines(fake.requests, tmp_path / "otlp" / "received.jsonl")
        (job,) = report(tmp_path / "otlp")["jobs"]
        assert job["recorder"]["errors"] > 0 and job["step_time"]["count"] == 50
    finally:
        goodput.shutdown()
        fake.down()


def test_unwritable_run_dir_training_goes_on_and_loss_is_counted(tmp_path, caplog):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")  # a run directory under a file: unwritable, even for root
    with caplog.at_level(logging.WARNING, logger="goodput"):
        rec = goodput.configure("unwritable", run_dir=not_a_dir / "run",
                                flush_interval_s=0.05, handle_signals=False,
                                start_time=time.time())
        train(5)
        rec.job_end()
        stats = rec.stats()
    assert "cannot write spool file" in caplog.text and "not writable" in caplog.text
    # every span (the phases, the markers and the window's root) is counted as lost
    assert stats["errors"] > 0 and stats["dropped"] == stats["spans"] + 1
    assert stats["recorded"] == 1 + 5 * 2 + 1 and stats["attempt"] is None  # ended normally


def test_disk_full_without_exporter_report_counts_the_lost_spans(small_disk):
    """No other exporter: the spans the full disk refused are lost, counted, and the lines
    written once there is space again (the end marker with the counters) stay readable."""
    run = small_disk / "run"
    rec = goodput.configure("disk-full-2", run_dir=run, flush_interval_s=0.05,
                            handle_signals=False, start_time=time.time())
    train(5)
    rec.flush(exporters=False)
    fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 1024):
            pass
    except OSError:
        pass
    os.close(fd)
    train(40)
    rec.flush(exporters=False)
    os.unlink(small_disk / "filler")
    train(5)
    goodput.shutdown()
    stats = rec.stats()
    assert stats["dropped"] > 0 and stats["errors"] > 0
    (job,) = report(run)["jobs"]
    assert job["recorder"] == {"errors": stats["errors"], "dropped": stats["dropped"]}
    assert job["attempts"][0]["end_reason"] == "exit"
    # the 5 steps before and the 5 after the full disk, and the step that was in flight at
    # a flush just before the disk filled, if one was: its open record is on disk, its end
    # was lost, so it counts as started and runs until the next step on disk began
    assert job["step_time"]["count"] in (10, 11)
