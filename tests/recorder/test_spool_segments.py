"""The recorder's spool format: spans encoded straight from its records, journal segments
compacted into ``*.jsonl.gz`` as they close, and readers that see the same job either way."""

from __future__ import annotations

import enum
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

import goodput
from goodput import config, forward, schema
from goodput.encode import Encoder
from goodput.segments import SpoolWriter
from goodput.spool import encode_request
from goodput.traces import AttemptIds, TraceWindows
from goodput_processor.read.reader import read_run_dir, span_files

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import recorded_job  # noqa: E402

RES = {"service.name": "enc", "goodput.attempt": 3, "host.name": "h", "x.float": 0.5,
       "x.list": ["a", "b"]}


class _Color(enum.IntEnum):
    RED = 1


class _Collect:
    def __init__(self):
        self.spans, self.windows = [], 0

    def add(self, text, name, t0, t1, is_open):
        self.spans.append(text)

    def window_done(self):
        self.windows += 1


def _sdk_span(d: dict, resource: Resource) -> ReadableSpan:
    """The SDK span the old recorder built for the decoded span ``d`` (ids and times kept,
    attributes as the SDK cleans the original values)."""
    def ctx(span_hex):
        return SpanContext(int(d["traceId"], 16), int(span_hex, 16), False,
                           TraceFlags(TraceFlags.SAMPLED))
    return ReadableSpan(
        name=d["name"], context=ctx(d["spanId"]),
        parent=ctx(d["parentSpanId"]) if "parentSpanId" in d else None, resource=resource,
        attributes=BoundedAttributes(attributes=d["_attrs"]), kind=SpanKind.INTERNAL,
        links=[Link(SpanContext(int(ln["traceId"], 16), int(ln["spanId"], 16), False))
               for ln in d.get("links", [])],
        status=Status(StatusCode.ERROR, d["status"]["message"]) if "status" in d else Status(),
        start_time=int(d["startTimeUnixNano"]), end_time=int(d["endTimeUnixNano"]),
        instrumentation_scope=InstrumentationScope("goodput", "0.1.0"))


def test_encoded_lines_are_what_the_sdk_encoding_gives():
    """Every span the recorder now encodes from its records is, as JSON, what the SDK span of
    the old recorder encoded to (but for an unset status left out)."""
    resource = Resource.create(RES)
    enc, sink = Encoder(resource.attributes, "goodput", "0.1.0"), _Collect()
    windows = TraceWindows(enc, AttemptIds(), 10**9, 3, sink)
    given = [
        (schema.STEP, 5, 9, {schema.ATTR_STEP: 7}, None),
        (schema.CHECKPOINT_SAVE, 9, 12, {schema.ATTR_BLOCKING: False,
                                         schema.ATTR_CHECKPOINT_STEP: 7}, "OSError"),
        (schema.CUSTOM_BADPUT, 12, 20, {schema.ATTR_BADPUT_TYPE: 'ev"al\u00e9'}, None),
        ("odd", 20, 19, {"f": 1.25, "t": (1, 2), "l": ["x"], "e": _Color.RED, "n": None,
                         "b": True, "d": {"k": 1}}, None),
        (schema.HEARTBEAT, 21, 30, None, None),
    ]
    for name, t0, t1, attrs, err in given:
        windows.emit(name, t0, t1, attrs, err)
    windows.close()
    assert sink.windows == 2 and len(sink.spans) == 7  # 5 spans, 2 window roots
    line = enc.line(sink.spans)
    assert line.endswith("}]}\n") and "\n" not in line[:-1]
    ours = json.loads(line)
    spans = ours["resourceSpans"][0]["scopeSpans"][0]["spans"]
    originals = {name: attrs for name, _, _, attrs, _ in given}
    for s in spans:
        s["_attrs"] = (originals.get(s["name"]) or {}) if s["name"] != schema.WINDOW else {
            schema.ATTR_WINDOW_INDEX: int(s["attributes"][0]["value"]["intValue"]),
            schema.ATTR_WINDOW_SPANS: int(s["attributes"][1]["value"]["intValue"])}
    theirs = encode_request([_sdk_span(s, resource) for s in spans])
    for s in theirs["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        if s["status"] == {}:
            del s["status"]
    for s in spans:
        del s["_attrs"]
    assert ours == theirs
    roots = [s for s in spans if s["name"] == schema.WINDOW]
    assert roots[1]["links"] == [{"traceId": roots[0]["traceId"], "spanId": roots[0]["spanId"],
                                  "attributes": []}]
    # decoded for the exporters: the same spans
    decoded = forward.decode_line(line)
    assert [d.name for d in decoded] == [s["name"] for s in spans]
    assert decoded[0].attributes[schema.ATTR_STEP] == 7 and decoded[0].resource == resource
    # a line's first bytes are its first span's ids (files never start alike)
    assert line.index(spans[0]["traceId"]) < 120


def test_writer_rotates_compacts_and_reaps(tmp_path):
    """Segments close at a window close once their journal is full; the compacted segment
    leaves out superseded open records; a retired journal goes once sent and its grace is
    over."""
    path = tmp_path / "spans-p00000-a0000-1-abcdef01.jsonl"
    enc = Encoder({"service.name": "w"}, "goodput", "0.1.0")
    segments = []
    w = SpoolWriter(path, enc, segment_bytes=2000, grace_ns=100, on_segment=segments.append)
    windows = TraceWindows(enc, AttemptIds(), 10**12, 4, w)
    for i in range(20):
        windows.emit(schema.STEP, i * 10, i * 10 + 5, {schema.ATTR_STEP: i, schema.ATTR_OPEN: True},
                     is_open=True)
        windows.emit(schema.STEP, i * 10, i * 10 + 9, {schema.ATTR_STEP: i})
        w.flush()
    windows.close()
    w.flush()
    assert segments and segments[0].endswith(".s0001.jsonl")
    gz = sorted(tmp_path.glob("*.jsonl.gz"))
    assert len(gz) == len(segments) and len(w.retired) == len(segments)
    lines = [json.loads(x) for p in gz for x in gzip.open(p).read().splitlines()]
    names = [s["name"] for ln in lines for s in ln["resourceSpans"][0]["scopeSpans"][0]["spans"]]
    assert schema.STEP in names and all(  # no open records left: each step completed
        "goodput.open" not in json.dumps(ln) for ln in lines)
    assert len(lines) == names.count(schema.WINDOW)  # one line per window
    first = w.retired[0][0]
    w.reap(1, sent=lambda p: False)
    w.reap(1000, sent=lambda p: False)  # grace over, not sent: stays
    assert os.path.exists(first)
    removed = []
    w.reap(1000, sent=lambda p: True, on_removed=removed.append)
    assert removed and not os.path.exists(first) and not w.retired
    windows.emit(schema.STEP, 500, 509, {schema.ATTR_STEP: 50})
    w.flush()
    w.close()
    assert not list(tmp_path.glob("*.tmp"))  # the last segment's compaction is dropped
    assert os.path.getsize(w.path) > 0  # and its journal stays
    assert all(os.path.exists(p) for p, _ in w.retired)


def _report(run_dir, definitions="goodput") -> str:
    out = subprocess.run(
        [sys.executable, "-m", "goodput_processor.cli", "report", str(run_dir), "--format",
         "json", "--definitions", definitions], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                          str(ROOT / "collectors")])})
    return out.stdout


def test_a_compacted_job_reports_as_its_journal(tmp_path):
    """The same recorded job (3 restarts, kills), with segments of 40 KB compacted and
    their journals reaped, and with one plain file per attempt: the same report, with
    either definitions, from a smaller spool."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    plain, compact = tmp_path / "plain", tmp_path / "compact"
    recorded_job.write_job(str(plain), 3000, env={**env, "GOODPUT_SPOOL_SEGMENT_MB": "0"})
    recorded_job.write_job(str(compact), 3000, env={**env, "GOODPUT_SPOOL_SEGMENT_MB": "0.04"})
    names = [p.name for p in compact.iterdir()]
    assert not any(n.endswith(".gz") for n in os.listdir(plain))
    gz = [n for n in names if n.endswith(".jsonl.gz")]
    assert len(gz) > 10
    reaped = [n for n in gz if n[:-3] not in names]  # journals deleted after their grace
    assert reaped and len(reaped) < len(gz)  # ... and those within it still there
    size = {d: sum(p.stat().st_size for p in span_files(d)) for d in (plain, compact)}
    assert size[compact] < size[plain] / 3  # what the reader reads
    for definitions in ("goodput", "mgm"):
        assert _report(compact, definitions) == _report(plain, definitions)


def test_reader_prefers_the_compacted_segment(tmp_path):
    """A journal still next to its compacted segment is not read twice; a damaged .gz is a
    file problem, not a crash."""
    run = tmp_path / "run"
    goodput.configure("pair", run_dir=run, handle_signals=False, start_time=time.time())
    for i in range(5):
        with goodput.step(i):
            pass
    goodput.shutdown()
    (journal,) = run.glob("*.jsonl")
    with open(journal, "rb") as f, gzip.open(f"{journal}.gz", "wb") as g:
        shutil.copyfileobj(f, g)
    Path(f"{journal}.s0001.jsonl.gz.tmp").write_bytes(b"\x1f\x8b unfinished")  # a kill's
    assert span_files(run) == [Path(f"{journal}.gz")]
    spans = read_run_dir(run)
    job = spans.jobs["pair"]
    assert not job.skipped and sum(len(p.data) for p in job.processes.values()) > 5
    bad = run / "spans-p00001-a0000-9-00000000.jsonl.gz"
    bad.write_bytes(b"\x1f\x8b not gzip")
    again = read_run_dir(run)
    assert [p for p, code, _ in again.file_problems if p == str(bad)]
    assert not again.jobs["pair"].skipped


def test_exporters_get_every_span_across_segments(tmp_path, monkeypatch):
    """Journal segments rotate under the forwarder: every step reaches the exporter once,
    and no journal is deleted before it was sent."""
    monkeypatch.setenv("GOODPUT_SPOOL_SEGMENT_MB", "0.01")
    exporter = InMemorySpanExporter()
    goodput.configure("fwd", run_dir=tmp_path / "run", exporters=[exporter],
                      flush_interval_s=0.02, trace_window_spans=20, handle_signals=False,
                      start_time=time.time())
    for i in range(400):
        with goodput.step(i):
            pass
        if i % 50 == 0:
            time.sleep(0.03)
    assert goodput.flush(timeout_s=30)
    rec = goodput.get_recorder()
    assert rec._sink.path.endswith(".jsonl") and ".s0" in rec._sink.path
    goodput.shutdown()
    steps = [s.attributes[schema.ATTR_STEP] for s in exporter.get_finished_spans()
             if s.name == schema.STEP and not s.attributes.get(schema.ATTR_OPEN)]
    assert sorted(steps) == list(range(400))
    assert list((tmp_path / "run").glob("*.jsonl.gz"))


def test_segment_size_setting(monkeypatch):
    monkeypatch.setenv("GOODPUT_SPOOL_SEGMENT_MB", "0")
    assert config.spool_segment_bytes() is None
    monkeypatch.setenv("GOODPUT_SPOOL_SEGMENT_MB", "2")
    assert config.spool_segment_bytes() == 2 << 20
    monkeypatch.setenv("GOODPUT_SPOOL_SEGMENT_MB", "lots")
    assert config.spool_segment_bytes() == config.DEFAULT_SPOOL_SEGMENT_MB << 20


@pytest.mark.parametrize("segment_mb", ["0", "0.01"])
def test_a_killed_process_leaves_a_readable_spool(tmp_path, segment_mb):
    """SIGKILL mid-segment: the journal up to the last flush is read, the unfinished
    compacted segment (.gz.tmp) is not, and the step in flight is there as open."""
    code = (
        "import goodput, time\n"
        f"goodput.configure('kill', run_dir={str(tmp_path / 'run')!r}, flush_interval_s=0.02,"
        " trace_window_spans=20, handle_signals=False)\n"
        "for i in range(300):\n"
        "    with goodput.step(i):\n"
        "        time.sleep(0.001)\n"
        "goodput.flush()\n"
        "s = goodput.step(300); s.__enter__(); time.sleep(0.2)\n"
        "print('ready', flush=True); time.sleep(60)\n")
    env = {**os.environ, "GOODPUT_SPOOL_SEGMENT_MB": segment_mb,
           "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=env)
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.wait()
    (job,) = json.loads(_report(tmp_path / "run"))["jobs"]
    (attempt,) = job["attempts"]
    assert attempt["end_reason"] == "killed" and job["max_productive_step"] >= 299
    assert not any(job["skipped"].values()), job["skipped"]
    open_steps = [s for p in span_files(tmp_path / "run")
                  for line in (gzip.open(p) if p.name.endswith(".gz") else open(p, "rb"))
                  for rs in json.loads(line)["resourceSpans"]
                  for s in rs["scopeSpans"][0]["spans"] if schema.ATTR_OPEN in json.dumps(s)]
    assert any('"300"' in json.dumps(s) for s in open_steps)  # the step in flight


def test_compaction_that_fails_keeps_the_journal(tmp_path):
    """A compacted segment that cannot be written is given up: its journal is not retired,
    the next segment is compacted again, and nothing is counted as lost."""
    path = tmp_path / "spans-p00000-a0000-1-abcdef01.jsonl"
    (tmp_path / (path.name + ".gz.tmp")).mkdir()  # the first segment's cannot be opened
    enc = Encoder({"service.name": "w"}, "goodput", "0.1.0")
    w = SpoolWriter(path, enc, segment_bytes=1500, grace_ns=0)
    windows = TraceWindows(enc, AttemptIds(), 10**12, 3, w)
    for i in range(40):
        windows.emit(schema.STEP, i * 10, i * 10 + 9, {schema.ATTR_STEP: i})
        w.flush()
    assert w.compact_failures == 1 and w.failures == 0
    assert not (tmp_path / (path.name + ".gz")).exists() and path.exists()
    assert w.retired and all(p != str(path) for p, _ in w.retired)
    assert (tmp_path / "spans-p00000-a0000-1-abcdef01.s0001.jsonl.gz").exists()
    w.reap(0, sent=lambda p: True)
    assert path.exists()  # the journal of the uncompacted segment is never reaped
    w.close()
    spans = read_run_dir(tmp_path)
    steps = sorted(int(x) for p in spans.jobs["w"].processes.values()
                   for x in p.data[p.data[:, 2] == 8][:, 3])
    assert steps == list(range(40))


def test_a_tailer_started_late_reads_compacted_segments_once(tmp_path):
    """goodput serve --spool-dir (and the monitor) started on a run long under way, whose
    journals were compacted and reaped: everything read once, the live report equal to
    goodput report; a tailer that followed the journals does not read the .gz again."""
    from goodput_processor.serve import LiveStore, SpoolTailer

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = tmp_path / "run"
    recorded_job.write_job(str(run), 3000, env={**env, "GOODPUT_SPOOL_SEGMENT_MB": "0.04"})
    names = os.listdir(run)
    assert [n for n in names if n.endswith(".jsonl.gz") and n[:-3] not in names]  # reaped
    store = LiveStore()
    SpoolTailer(store, [run]).poll()
    live = json.loads(store.report_json(now_ns=2**62))["jobs"][0]
    reported = json.loads(_report(run))["jobs"][0]
    for key in ("total_time_s", "productive_time_s", "badput_s", "step_time", "attempts"):
        assert live[key] == reported[key], key
    assert live["skipped"]["duplicate"] == 0
    tailer = SpoolTailer(store := LiveStore(), [run])
    journals = sorted(p for p in run.glob("*.jsonl"))
    for p in journals:  # as if it had followed these journals from their start
        tailer._read(p)
    tailer.poll()
    assert json.loads(store.report_json(now_ns=2**62))["jobs"][0]["step_time"] == \
        reported["step_time"]
