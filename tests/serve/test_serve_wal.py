"""The write-ahead log of goodput serve: replay gives exactly the state before, torn tails
are cut, a full or failing disk refuses (retryable) and never acknowledges then drops,
idle jobs retire with their final result written.

Real files, a real serve process for the disk-full case (its file size limit set with
``RLIMIT_FSIZE``, as a full volume behaves for one file), ``/dev/full`` for ENOSPC.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from instr_util import child_env
from otlp_fixtures import T0_NS, Timeline

pytest.importorskip("grpc")

from goodput_processor import report_run_dir, to_json_dict  # noqa: E402
from goodput_processor.serve import GoodputServer, LiveStore  # noqa: E402
from goodput_processor.serve.limits import Refused  # noqa: E402
from goodput_processor.serve.wal import WriteAheadLog, job_slug  # noqa: E402

NOW = T0_NS + 10**15


def _lines(tmp_path, job, attempts=2):
    out = []
    for a in range(attempts):
        t = Timeline(job=job, attempt=a).job_start(30 * a)
        if a:
            t = t.restore(30 * a, 30 * a + 1, step=10 * a)
        t = t.steps(10 * a, 10 * a + 12, start=30 * a + 1, step_time=1).custom(
            "eval", 30 * a + 14, 30 * a + 15)
        path = t.write(tmp_path / "spool" / job, spans_per_line=4)
        out += path.read_bytes().splitlines()
    return out


def _pb(line: bytes):
    """The protobuf request of an OTLP JSON line (what the gRPC exporter sends)."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    req = json.loads(line)
    for rs in req["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for k in ("traceId", "spanId"):
                    sp[k] = __import__("base64").b64encode(bytes.fromhex(sp[k])).decode()
    return json_format.ParseDict(req, trace_service_pb2.ExportTraceServiceRequest())


def _doc(results):
    doc = to_json_dict(results)
    for j in doc["jobs"]:
        j.pop("skipped_examples")
    return doc


def _store(wal_dir, **kw):
    store = LiveStore(min_interval_s=0, wal=WriteAheadLog(wal_dir, **kw), **{})
    store.replay()
    return store


def test_replay_gives_exactly_the_state_before(tmp_path):
    wal_dir = tmp_path / "wal"
    store = _store(wal_dir)
    n = 0
    for i, job in enumerate(("a", "b", "c")):
        for line in _lines(tmp_path, job):
            n += 1
            if i % 2:
                store.ingest_request(_pb(line), "otlp-grpc")  # protobuf path
            else:
                store.ingest_json(json.loads(line), ("http", 1))  # JSON path
    store.ingest_json(json.loads(_lines(tmp_path, "a")[0]), ("http", 2))  # a retry
    before = _doc(store.results(now_ns=NOW))
    store.wal.close()
    again = _store(wal_dir)
    assert _doc(again.results(now_ns=NOW)) == before
    assert again.replayed.lines == n + 1 and again.replayed.torn == 0
    # a job's log directory is a run directory: goodput report reads it as a spool
    (r,) = report_run_dir(wal_dir / "jobs" / job_slug("b"), now_ns=NOW)
    assert to_json_dict([r])["jobs"][0]["badput_s"] == before["jobs"][1]["badput_s"]


def test_torn_tail_is_cut_and_appending_goes_on(tmp_path):
    wal_dir = tmp_path / "wal"
    store = _store(wal_dir)
    lines = _lines(tmp_path, "t", attempts=1)
    store.ingest_json(json.loads(lines[0]), ("http", 1))
    (seg,) = (wal_dir / "jobs").rglob("seg-*.jsonl")
    whole = seg.stat().st_size
    store.wal.close()
    with open(seg, "ab") as f:  # serve killed in the middle of a write
        f.write(b'{"resourceSpans": [{"resour')
    store = _store(wal_dir)
    assert store.replayed.torn == 1 and seg.stat().st_size == whole
    store.ingest_json(json.loads(lines[1]), ("http", 2))
    store.wal.close()
    assert [json.loads(x) for x in seg.read_bytes().splitlines()]  # every line whole
    assert _store(wal_dir).replayed.lines == 2


def test_a_segment_that_is_a_directory_stops_no_startup(tmp_path):
    """A directory named like a segment (never one serve wrote) is left out of the replay
    with a count; the other jobs and that job's own segments replay, and the job appends
    to a new segment after it (issue 38: it stopped the startup of every job)."""
    wal_dir = tmp_path / "wal"
    store = _store(wal_dir)
    for job in ("good", "odd"):
        for line in _lines(tmp_path, job, attempts=1)[:3]:
            store.ingest_json(json.loads(line), ("http", 1))
    before = _doc(store.results(now_ns=NOW))
    store.wal.close()
    odd = wal_dir / "jobs" / job_slug("odd")
    (odd / "seg-00000099.jsonl").mkdir()
    again = _store(wal_dir)
    assert again.replayed.skipped == 1 and _doc(again.results(now_ns=NOW)) == before
    line = _lines(tmp_path, "odd", attempts=1)[3]
    again.ingest_json(json.loads(line), ("http", 2))
    again.wal.close()
    assert (odd / "seg-00000100.jsonl").is_file()
    assert _store(wal_dir).replayed.lines == again.replayed.lines + 1


def test_segments_rotate_and_fsync_every_append(tmp_path):
    store = _store(tmp_path / "wal", segment_bytes=3000, fsync_interval_s=0)
    lines = _lines(tmp_path, "r")
    for line in lines:
        store.ingest_json(json.loads(line), ("http", 1))
    segs = sorted((tmp_path / "wal" / "jobs").rglob("seg-*.jsonl"))
    assert 2 <= len(segs) < len(lines) and store.wal.fsyncs >= len(lines)
    assert all(p.stat().st_size <= 3000 for p in segs[:-1])
    assert store.wal.size_bytes() == sum(p.stat().st_size for p in segs)
    before = _doc(store.results(now_ns=NOW))
    store.wal.close()
    assert _doc(_store(tmp_path / "wal").results(now_ns=NOW)) == before


def test_enospc_refuses_retryable_and_recovers(tmp_path):
    """A write that fails (ENOSPC, from /dev/full) is refused, nothing of it is taken in,
    serve is not ready; when the disk takes writes again, so does serve."""
    wal_dir = tmp_path / "wal"
    store = _store(wal_dir)
    srv = GoodputServer(store, grpc_port=None, http_port=0, maintain_s=0.1)
    url = srv.addresses()["http"]
    job_dir = wal_dir / "jobs" / job_slug("full")
    job_dir.mkdir(parents=True)
    (job_dir / "seg-00000001.jsonl").symlink_to("/dev/full")
    lines = _lines(tmp_path, "full", attempts=1)

    def post(line):
        req = urllib.request.Request(url + "/v1/traces", data=line, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers)

    try:
        status, headers = post(lines[0])
        assert status == 503 and int(headers["Retry-After"]) >= 1
        assert "full" not in store.jobs() and store.stats["refused_wal"] == 1
        ok, why = store.ready()
        assert not ok and "No space left on device" in why
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "/readyz", timeout=10)
        assert e.value.code == 503
        (job_dir / "seg-00000001.jsonl").unlink()  # space again
        srv.maintain()  # the probe (the maintenance thread's job, every maintain_s)
        assert store.ready() == (True, "ready")
        assert all(post(line)[0] == 200 for line in lines)
        assert store.results(now_ns=NOW)[0].step_time.count == 13
    finally:
        srv.stop(5, final=False)
    assert _store(wal_dir).results(now_ns=NOW)[0].step_time.count == 13


def _fsize_limit(limit):
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


def test_serve_with_a_full_volume_never_acknowledges_then_drops(tmp_path):
    """A real serve process whose files cannot grow past 3 kB: every acknowledged line is
    in its log; the rest got 503 + Retry-After; after a restart with room, the same report."""
    wal_dir = tmp_path / "wal"
    cmd = [sys.executable, "-m", "goodput_processor.cli", "serve", "--grpc-port", "off",
           "--http-port", "0", "--wal-dir", str(wal_dir), "--format", "json",
           "--report-file", str(tmp_path / "r.jsonl")]
    proc = subprocess.Popen(cmd, env=child_env(), stderr=subprocess.PIPE, text=True,
                            preexec_fn=_fsize_limit(3_000), cwd=tmp_path)
    acked, refused = [], 0
    try:
        url = re.search(r"http=(\S+)", proc.stderr.readline()).group(1)
        for job in ("j1", "j2", "j3", "j4", "j5"):
            for line in _lines(tmp_path, job):
                req = urllib.request.Request(url + "/v1/traces", data=line, method="POST",
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=10):
                        acked.append(json.loads(line))
                except urllib.error.HTTPError as e:
                    assert e.code == 503 and e.headers["Retry-After"], e.read()
                    refused += 1
        assert acked and refused  # the limit was reached, and some were taken before it
        live = json.loads(urllib.request.urlopen(url + "/v1/report", timeout=30).read())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    logged = [json.loads(x) for p in sorted(wal_dir.rglob("seg-*.jsonl"))
              for x in p.read_bytes().splitlines()]
    ids = {sp["spanId"] for req in logged for rs in req["resourceSpans"]
           for ss in rs["scopeSpans"] for sp in ss["spans"]}
    assert ids == {sp["spanId"] for req in acked for rs in req["resourceSpans"]
                   for ss in rs["scopeSpans"] for sp in ss["spans"]}
    proc = subprocess.Popen(cmd, env=child_env(), stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    try:
        url = re.search(r"http=(\S+)", proc.stderr.readline()).group(1)
        again = json.loads(urllib.request.urlopen(url + "/v1/report", timeout=30).read())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    strip = lambda d: [{k: v for k, v in j.items() if k not in ("skipped_examples",  # noqa: E731
                                                                 "end_unix_ns",
                                                                 "total_time_s")}
                       for j in d["jobs"]]
    assert [j["job"] for j in again["jobs"]] == [j["job"] for j in live["jobs"]]
    assert [j["step_time"] for j in again["jobs"]] == [j["step_time"] for j in live["jobs"]]
    assert len(strip(again)) == len(strip(live))


def test_idle_jobs_retire_with_their_final_result(tmp_path):
    wal_dir = tmp_path / "wal"
    store = LiveStore(min_interval_s=0, wal=WriteAheadLog(wal_dir), retention_s=60)
    store.replay()
    for job in ("old", "new"):
        for line in _lines(tmp_path, job):
            store.ingest_json(json.loads(line), ("http", 1))
    store._last_seen["old"] -= 120  # its last span two minutes ago
    (gone,) = store.retire_idle()
    assert gone.job == "old" and store.jobs() == ["new"]
    saved = json.loads((wal_dir / "results" / f"{job_slug('old')}.json").read_text())
    assert saved["job"] == "old" and saved["step_time"]["count"] == gone.step_time.count
    assert not (wal_dir / "jobs" / job_slug("old")).exists()
    store.wal.close()
    assert _store(wal_dir).jobs() == ["new"]  # and it stays gone after a restart


def test_replay_keeps_other_scopes_counted(tmp_path):
    store = _store(tmp_path / "wal")
    line = json.loads(_lines(tmp_path, "s", attempts=1)[0])
    line["resourceSpans"][0]["scopeSpans"].append(
        {"scope": {"name": "my.app"}, "spans": [{"name": "x", "traceId": "1" * 32,
                                                 "spanId": "2" * 16}] * 3})
    store.ingest_json(line, ("http", 1))
    store.ingest_request(_pb(json.dumps(line).encode()), "grpc")
    before = _doc(store.results(now_ns=NOW))
    assert before["jobs"][0]["skipped"]["unknown"] == 6
    store.wal.close()
    assert _doc(_store(tmp_path / "wal").results(now_ns=NOW)) == before
    assert os.path.getsize(next((tmp_path / "wal").rglob("seg-*.jsonl"))) < 2 * len(
        json.dumps(line))  # the other scope's spans are kept as {}, not whole


def test_refused_request_is_not_taken_in(tmp_path):
    store = _store(tmp_path / "wal")
    store.limits = store.limits.__class__(max_jobs=1)
    store.ingest_json(json.loads(_lines(tmp_path, "one", 1)[0]), ("http", 1))
    with pytest.raises(Refused) as e:
        store.ingest_json(json.loads(_lines(tmp_path, "two", 1)[0]), ("http", 2))
    assert e.value.reason == "over_jobs" and e.value.retryable
    assert store.jobs() == ["one"]
    assert not (tmp_path / "wal" / "jobs" / job_slug("two")).exists()
