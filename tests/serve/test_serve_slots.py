"""Fair job slots and final retirement in goodput serve (issue 38, items 5 and 6).

A job-name flood from one client cannot take another client's slots; idle jobs without a
kept step leave first when slots are short; a refusal names the limit and its flag; a
retired job's report is final and spans that arrive after it are refused for good, also
after a restart that replays the write-ahead log.

Real receivers on loopback (a second client is another loopback address, 127.0.0.2, as
the HTTP client's source address), real write-ahead logs on disk, the store in-process.
"""

from __future__ import annotations

import http.client
import json
import os
import time

import pytest
from otlp_fixtures import T0_NS, otlp_span, request_line, resource

pytest.importorskip("grpc")

from goodput import schema  # noqa: E402
from goodput_processor.serve import GoodputServer, LiveStore  # noqa: E402
from goodput_processor.serve.limits import Limits, Refused  # noqa: E402
from goodput_processor.serve.slots import as_client, peer_host  # noqa: E402
from goodput_processor.serve.wal import WriteAheadLog, job_slug  # noqa: E402

S = 10**9


def _req(job: str, steps=range(0), start: bool = True) -> dict:
    """An OTLP JSON request of ``job``: a job start marker (``start``) and ``steps``."""
    spans = ([otlp_span(schema.JOB_START, T0_NS, T0_NS)] if start else []) + [
        otlp_span(schema.STEP, T0_NS + i * S, T0_NS + (i + 1) * S, {schema.ATTR_STEP: i})
        for i in steps]
    return json.loads(request_line(resource(job=job), spans))


def _post(port: int, doc: dict, source: str = "127.0.0.1"):
    """POST ``doc`` to ``/v1/traces`` from ``source`` (a loopback address)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20, source_address=(source, 0))
    try:
        c.request("POST", "/v1/traces", json.dumps(doc).encode(),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def _get(port: int, path: str):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def _wal_store(wal_dir, **kw) -> LiveStore:
    store = LiveStore(min_interval_s=0, wal=WriteAheadLog(wal_dir, fsync_interval_s=0), **kw)
    store.replay()
    return store


def test_peer_identity_drops_the_port():
    assert peer_host("ipv4:10.0.0.5:43210") == "10.0.0.5"
    assert peer_host("ipv6:[::1]:5000") == "::1"
    assert peer_host("unix:/tmp/s") == "unix:/tmp/s"


def test_a_job_name_flood_cannot_take_another_clients_slots():
    """127.0.0.2 sends 40 new job names: 5 get slots (--max-jobs-per-client), the rest get
    a retryable 503 naming the flag; 127.0.0.1's new jobs still get theirs."""
    store = LiveStore(min_interval_s=0, limits=Limits(max_jobs=12, max_jobs_per_client=5))
    srv = GoodputServer(store, grpc_port=None, http_port=0)
    port = srv.http.port
    try:
        answers = [_post(port, _req(f"flood-{i}"), "127.0.0.2") for i in range(40)]
        assert [s for s, _ in answers].count(200) == 5
        refused = [body for s, body in answers if s != 200]
        assert {s for s, _ in answers if s != 200} == {503}
        assert "--max-jobs-per-client 5" in refused[0] and "127.0.0.2" in refused[0]
        for i in range(5):  # the other client: its own slots
            assert _post(port, _req(f"train-{i}", range(3)))[0] == 200
        status, body = _post(port, _req("train-5", range(3)))
        assert status == 503 and "--max-jobs-per-client" in body
        assert _post(port, _req("train-0", range(3, 6)))[0] == 200  # its jobs go on
        assert store.stats["refused_over_client_jobs"] == 36
        assert len(store.jobs()) == 10
    finally:
        srv.stop(5, final=False)


def test_idle_jobs_without_progress_leave_before_a_refusal(tmp_path):
    """Slots short: the idle job without a step leaves (final), never the idle job with
    steps nor the one that sent spans just now; then the refusal names the flags."""
    store = _wal_store(tmp_path / "wal", limits=Limits(max_jobs=3, max_jobs_per_client=4))
    with as_client("10.0.0.1"):
        store.ingest_json(_req("stepper", range(4)), ("t", 1))
        store.ingest_json(_req("stuck"), ("t", 2))
        store.ingest_json(_req("starting"), ("t", 3))
        for name in ("stepper", "stuck"):
            store._last_seen[name] -= 600  # idle for 10 minutes (> 300 s)
        store.ingest_json(_req("new", range(2)), ("t", 4))
        assert store.jobs() == ["new", "starting", "stepper"]
        final = json.loads((tmp_path / "wal" / "results" / f"{job_slug('stuck')}.json")
                           .read_text())
        assert final["final"] is True and "--idle-without-progress" in final["retired"]
        with pytest.raises(Refused) as e:
            store.ingest_json(_req("newer"), ("t", 5))
    assert e.value.reason == "over_jobs" and e.value.retryable
    assert "--max-jobs" in e.value.message and "--idle-without-progress" in e.value.message
    assert store.jobs() == ["new", "starting", "stepper"]
    # one client's own idle jobs without progress make room for it first
    store2 = LiveStore(min_interval_s=0, limits=Limits(max_jobs=10, max_jobs_per_client=2))
    with as_client("a"):
        store2.ingest_json(_req("a1"), ("t", 1))
        store2.ingest_json(_req("a2", range(2)), ("t", 2))
    with as_client("b"):
        store2.ingest_json(_req("b1"), ("t", 3))
    for name in ("a1", "a2", "b1"):
        store2._last_seen[name] -= 600
    with as_client("a"):
        store2.ingest_json(_req("a3"), ("t", 4))
    assert store2.jobs() == ["a2", "a3", "b1"]


def test_late_spans_never_restart_a_retired_job(tmp_path):
    """40 steps were planned: 20 arrive, the job retires (--retention), the other 20 are
    refused for good (400, naming why), the final result stays, also after a restart; a
    request holding another job's spans too has those taken in."""
    wal_dir = tmp_path / "wal"
    store = _wal_store(wal_dir, retention_s=60)
    srv = GoodputServer(store, grpc_port=None, http_port=0)
    port = srv.http.port
    result = wal_dir / "results" / f"{job_slug('run')}.json"
    try:
        assert _post(port, _req("run", range(20)))[0] == 200
        store._last_seen["run"] -= 120
        (gone,) = store.retire_idle()
        assert gone.step_time.count == 20 and store.jobs() == []
        saved = result.read_bytes()
        doc = json.loads(saved)
        assert doc["final"] is True and doc["step_time"]["count"] == 20
        assert "--retention" in doc["retired"]
        status, body = _post(port, _req("run", range(20, 40), start=False))
        assert status == 400 and "retired" in body and "--retention" in body
        assert store.stats["refused_retired"] == 1 and store.jobs() == []
        status, rep = _get(port, "/v1/report?job=run")
        assert status == 200 and rep["final"] is True
        assert rep["jobs"][0]["final"] is True and rep["jobs"][0]["step_time"]["count"] == 20
        mixed = _req("other", range(2))
        mixed["resourceSpans"] += _req("run", range(20, 40), start=False)["resourceSpans"]
        assert _post(port, mixed)[0] == 200
        assert store.jobs() == ["other"] and store.stats["retired_spans"] == 20
    finally:
        srv.stop(5, final=False)
        store.wal.close()
    assert result.read_bytes() == saved
    again = _wal_store(wal_dir, retention_s=60)  # a restart: the log is replayed
    assert again.jobs() == ["other"]
    with pytest.raises(Refused) as e:
        again.ingest_json(_req("run", range(20, 40), start=False), ("t", 1))
    assert e.value.reason == "retired" and not e.value.retryable
    assert again.final_report("run")["step_time"]["count"] == 20
    assert result.read_bytes() == saved and again.jobs() == ["other"]
    again.wal.close()


def test_a_retirement_cut_short_by_a_crash_is_finished_at_replay(tmp_path):
    """Serve died after writing the final result, before removing the segments: the
    replay removes them and the job stays retired. Segments written after a result (a job
    that came back under an older serve) are replayed."""
    wal_dir = tmp_path / "wal"
    store = _wal_store(wal_dir, retention_s=60)
    store.ingest_json(_req("done", range(5)), ("t", 1))
    store.ingest_json(_req("back", range(5)), ("t", 2))
    segs = {n: (wal_dir / "jobs" / job_slug(n) / "seg-00000001.jsonl").read_bytes()
            for n in ("done", "back")}
    for n in ("done", "back"):
        store._last_seen[n] -= 120
    assert len(store.retire_idle()) == 2
    store.wal.close()
    past = time.time() - 3600
    for n, data in segs.items():
        d = wal_dir / "jobs" / job_slug(n)
        d.mkdir()
        (d / "seg-00000001.jsonl").write_bytes(data)
        if n == "done":
            os.utime(d / "seg-00000001.jsonl", (past, past))
    again = _wal_store(wal_dir, retention_s=60)
    assert again.jobs() == ["back"]
    assert not (wal_dir / "jobs" / job_slug("done")).exists()
    again.wal.close()


def test_spool_lines_of_a_retired_job_do_not_restart_it():
    """The tailer's path (lines already on disk, no admission): a retired job stays
    retired; a new job's slot is held by the spool directory."""
    store = LiveStore(min_interval_s=0, retention_s=60)
    with as_client("spool:/runs"):
        store.ingest_line(request_line(resource(job="sp"), [
            otlp_span(schema.STEP, T0_NS, T0_NS + S, {schema.ATTR_STEP: 0})]).encode(),
            ("a.jsonl", 1))
    assert store.slots.held("spool:/runs", store._reader.jobs) == 1
    store._last_seen["sp"] = time.time() - 120  # (spool lines set no last-seen time)
    (gone,) = store.retire_idle()
    with as_client("spool:/runs"):
        store.ingest_line(request_line(resource(job="sp"), [
            otlp_span(schema.STEP, T0_NS + S, T0_NS + 2 * S, {schema.ATTR_STEP: 1})]).encode(),
            ("a.jsonl", 2))
    assert store.jobs() == [] and store.stats["retired_spans"] == 1
    with pytest.raises(KeyError, match="retired"):
        store.results(job="sp")
