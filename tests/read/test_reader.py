"""Reading OTLP JSON lines spool files: robustness and skip accounting."""

from __future__ import annotations

import json
import os
import random

import pytest
from otlp_fixtures import Timeline, otlp_span, request_line, resource, write_spool

from goodput import schema
from goodput_processor import RunDirError, SpoolFormatError, read_run_dir, report_run_dir
from goodput_processor.read.rows import C_IVAL, C_KIND, C_START, K_STEP

NS = 1_000_000_000
NOW = 2 * 10**18


def simple(job="job", attempt=0, n=10):
    tl = Timeline(job=job, attempt=attempt).job_start(0)
    return tl.steps(1, n, start=0, step_time=1).job_end(n)


def steps_of(spans, job="job", key=(0, 0)):
    d = spans.jobs[job].processes[(*key, "")].data
    rows = d[d[:, C_KIND] == K_STEP]
    return sorted(zip(rows[:, C_START].tolist(), rows[:, C_IVAL].tolist(), strict=True))


def test_reads_spans_and_resource(tmp_path):
    simple(n=10).write(tmp_path, spans_per_line=3)
    s = read_run_dir(tmp_path)
    proc = s.jobs["job"].processes[(0, 0, "")]
    assert len(proc.data) == 12 and proc.host == "host0" and proc.process_count == 1
    assert [n for _, n in steps_of(s)] == list(range(1, 11))
    assert s.jobs["job"].schema_versions == {"1"} and not s.jobs["job"].skipped


def test_torn_last_line_is_counted(tmp_path):
    path = simple().write(tmp_path)
    line = request_line(resource(), [otlp_span(schema.STEP, 20 * NS, 21 * NS)])
    with open(path, "a") as f:
        f.write(line[: len(line) // 2])  # crash mid-write: no newline
    s = read_run_dir(tmp_path)
    job = s.jobs["job"]
    assert job.skipped == {"torn": 1}
    assert len(job.processes[(0, 0, "")].data) == 12
    assert f"{path}:2:" in job.examples[0]


def test_malformed_middle_line_is_counted_with_location(tmp_path):
    path = tmp_path / "spans-p00000-a0000.jsonl"
    tl = simple()
    write_spool(path, tl.resource, tl.spans[:5])
    with open(path, "a") as f:
        f.write("{not json\n")
        f.write('{"something": "else"}\n')
    write_spool(path, tl.resource, tl.spans[5:], mode="a")
    s = read_run_dir(tmp_path)
    job = s.jobs["job"]
    assert job.skipped == {"malformed": 2}
    assert job.examples[0].startswith(f"{path}:2: ") and "invalid JSON" in job.examples[0]
    assert job.examples[1].startswith(f"{path}:3: expected") and "resourceSpans" in job.examples[1]
    assert len(job.processes[(0, 0, "")].data) == 12


def test_duplicates_kept_once(tmp_path):
    tl = simple(n=10)
    spans = [otlp_span(*t, trace_id="ab" * 16) for t in tl.spans]
    write_spool(tmp_path / "a.jsonl", tl.resource, spans)
    write_spool(tmp_path / "b.jsonl", tl.resource, spans[:4])  # re-sent after a retry
    s = read_run_dir(tmp_path)
    assert s.jobs["job"].skipped == {"duplicate": 4}
    assert len(s.jobs["job"].processes[(0, 0, "")].data) == 12
    r = report_run_dir(tmp_path, ideal_step_time_s=1, now_ns=NOW)[0]
    assert r.total_time_s == 10 and r.goodput == 1 and r.skipped["duplicate"] == 4
    assert sum(r.skipped.values()) == 4


def test_same_span_id_in_other_trace_is_not_duplicate(tmp_path):
    tl = simple(n=2)
    spans = [otlp_span(*t, trace_id="ab" * 16, span_id=i) for i, t in enumerate(tl.spans)]
    other = [otlp_span(*tl.spans[1], trace_id="cd" * 16, span_id=1)]
    write_spool(tmp_path / "a.jsonl", tl.resource, spans + other)
    s = read_run_dir(tmp_path)
    assert not s.jobs["job"].skipped and len(s.jobs["job"].processes[(0, 0, "")].data) == 5


def test_out_of_order_spans_give_the_same_result(tmp_path):
    ordered, shuffled = tmp_path / "ordered", tmp_path / "shuffled"
    tl = simple(n=50)
    tl.span(schema.DATA_LOADING, 3, 3.5).save(10, 12, step=10)
    tl.write(ordered, spans_per_line=7)
    random.Random(3).shuffle(tl.spans)
    tl.write(shuffled, spans_per_line=7)
    a = report_run_dir(ordered, now_ns=NOW)[0]
    b = report_run_dir(shuffled, now_ns=NOW)[0]
    assert a.buckets_ns == b.buckets_ns and a.attempts == b.attempts
    assert a.steps.step.tolist() == b.steps.step.tolist() == list(range(1, 51))


def test_unknown_span_names_and_scopes_are_counted(tmp_path):
    tl = simple(n=3)
    tl.spans.append(("my.own.span", 0, NS, {}))
    tl.spans.append(("goodput.not_in_schema", 0, NS, {}))
    path = tl.write(tmp_path)
    other_scope = request_line(tl.resource, [otlp_span("http.get", 0, NS)], scope="requests")
    with open(path, "a") as f:
        f.write(other_scope + "\n")
    s = read_run_dir(tmp_path)
    assert s.jobs["job"].skipped == {"unknown": 3}
    assert len(s.jobs["job"].processes[(0, 0, "")].data) == 5


def test_invalid_spans_are_counted(tmp_path):
    tl = simple(n=3)
    tl.spans.append((schema.STEP, 5 * NS, 4 * NS, {schema.ATTR_STEP: 9}))  # ends before start
    bad = otlp_span(schema.STEP, 0, NS)
    bad["startTimeUnixNano"] = "soon"
    path = tl.write(tmp_path)
    write_spool(path, tl.resource, [bad], mode="a")
    s = read_run_dir(tmp_path)
    assert s.jobs["job"].skipped == {"invalid_span": 2}
    assert len(s.jobs["job"].processes[(0, 0, "")].data) == 5


@pytest.mark.parametrize(
    "content, line",
    [
        ("hello world\n", 1),
        ('{"foo": 1}\n', 1),
        ("\n\n[1, 2, 3]\n", 3),
        ('{"timestamp": "2025-09-27", "event_type": "job_started"}\n', 1),
    ],
)
def test_non_otlp_file_is_skipped_with_a_warning_and_refused_alone(tmp_path, content, line):
    """Next to a spool, a file that is not OTLP JSON lines is skipped and named in a
    warning; the report refuses only when nothing is readable, naming file and line."""
    simple().write(tmp_path / "good")
    bad = tmp_path / "good" / "zz-other.jsonl"
    bad.write_text(content)
    (r,) = report_run_dir(tmp_path / "good")
    assert r.step_time.count == 10
    (w,) = [w for w in r.warnings if w.code == "spool_file_skipped"]
    assert w.file == str(bad) and "resourceSpans" in w.message
    (tmp_path / "bad").mkdir()
    bad.rename(tmp_path / "bad" / bad.name)
    with pytest.raises(SpoolFormatError) as err:
        read_run_dir(tmp_path / "bad")
    msg = str(err.value)
    alone = tmp_path / "bad" / bad.name
    assert msg.startswith(f"{alone}:{line}: ") and "resourceSpans" in msg and "\n" not in msg


def test_int_values_as_numbers_or_strings(tmp_path):
    as_str, as_num = tmp_path / "s", tmp_path / "n"
    tl = simple(n=5)
    tl.write(as_str)
    tl.write(as_num, int_as_number=True)
    assert '"intValue":1}' in (as_num / "spans-p00000-a0000.jsonl").read_text()
    a = read_run_dir(as_str).jobs["job"].processes[(0, 0, "")].data
    b = read_run_dir(as_num).jobs["job"].processes[(0, 0, "")].data
    assert (a[:, :7] == b[:, :7]).all()  # all but trace and span ids
    assert steps_of(read_run_dir(as_num))[0] == (tl.ns(0), 1)


def test_attribute_value_types(tmp_path):
    tl = Timeline().job_start(0, interval_ms=500)
    tl.span(schema.STEP, 0, 1, {schema.ATTR_STEP: 3.0})  # a backend turned it into a double
    tl.span(schema.CHECKPOINT_SAVE, 1, 2, {schema.ATTR_BLOCKING: "false"})
    tl.span(schema.DATA_LOADING, 2, 3, {schema.ATTR_BLOCKING: False}, status_code=2)
    tl.job_end(3).write(tmp_path)
    r = report_run_dir(tmp_path, now_ns=NOW)[0]
    assert r.steps.step.tolist() == [3]
    assert r.async_work_s == {"checkpoint_save": 1.0, "data_loading": 1.0}
    assert r.attempts[0].error_spans == 1


def test_unsupported_schema_version_is_skipped(tmp_path):
    simple(job="new", attempt=0).write(tmp_path / "a")
    tl = Timeline(job="new", attempt=1, version="2.0").job_start(20)
    tl.write(tmp_path / "b")
    s = read_run_dir(tmp_path)
    job = s.jobs["new"]
    assert job.skipped == {"unsupported_schema": 1}
    assert "schema version '2.0' not supported" in job.examples[0]
    with pytest.raises(RunDirError, match="no goodput spans.*unsupported_schema: 1"):
        read_run_dir(tmp_path / "b")


def test_several_resources_and_jobs_in_one_line(tmp_path):
    a, b = simple(job="a", n=2), simple(job="b", n=3)
    req = {"resourceSpans": []}
    for tl in (a, b):
        one = json.loads(request_line(tl.resource, [otlp_span(*t) for t in tl.spans]))
        req["resourceSpans"] += one["resourceSpans"]
    (tmp_path / "mixed.jsonl").write_text(json.dumps(req) + "\n")
    s = read_run_dir(tmp_path)
    assert sorted(s.jobs) == ["a", "b"]
    assert len(s.jobs["a"].processes[(0, 0, "")].data) == 4
    assert len(s.jobs["b"].processes[(0, 0, "")].data) == 5


def test_job_name_falls_back_to_service_name(tmp_path):
    tl = simple(job="svc")
    del tl.resource[schema.RES_JOB_NAME]
    tl.write(tmp_path)
    assert list(read_run_dir(tmp_path).jobs) == ["svc"]


def test_bad_run_dirs(tmp_path):
    with pytest.raises(RunDirError, match="does not exist"):
        read_run_dir(tmp_path / "missing")
    (tmp_path / "file.jsonl").write_text("")
    with pytest.raises(RunDirError, match="not a directory"):
        read_run_dir(tmp_path / "file.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDirError, match="no \\*.jsonl"):
        read_run_dir(tmp_path / "empty")
    with pytest.raises(RunDirError, match="no goodput spans"):
        read_run_dir(tmp_path)  # only an empty file


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read anything")
def test_unreadable_dir(tmp_path):
    d = tmp_path / "locked"
    d.mkdir()
    d.chmod(0)
    try:
        with pytest.raises(RunDirError, match="not readable"):
            read_run_dir(d)
    finally:
        d.chmod(0o755)


def test_parallel_read_equals_serial(tmp_path, monkeypatch):
    from goodput_processor.read import parallel as read_parallel
    from goodput_processor.read import reader

    tl = simple(n=400)
    tl.span(schema.CUSTOM_BADPUT, 1, 2, {schema.ATTR_BADPUT_TYPE: "eval"})
    spans = [otlp_span(*t, trace_id="ab" * 16, span_id=i) for i, t in enumerate(tl.spans)]
    path = write_spool(tmp_path / "a.jsonl", tl.resource, spans[:200], spans_per_line=5)
    with open(path, "a") as f:
        f.write("{oops\n")  # malformed, in a later unit
    write_spool(path, tl.resource, spans[200:], spans_per_line=5, mode="a")
    with open(path, "a") as f:
        f.write('{"resourceSpans": [')  # torn
    write_spool(tmp_path / "b.jsonl", tl.resource, spans[100:130], spans_per_line=5)  # dups
    monkeypatch.setattr(read_parallel, "UNIT_BYTES", 4096)  # many units per file
    assert len(read_parallel.units(sorted(tmp_path.glob("*.jsonl")))) > 10

    serial = read_run_dir(tmp_path, workers=1)
    merged = read_parallel.read_parallel(sorted(tmp_path.glob("*.jsonl")), 2, reader._Reader)
    merged.finish()
    parallel = read_run_dir(tmp_path, workers=2)
    for other in (merged, parallel):
        a, b = serial.jobs["job"], other.jobs["job"]
        assert a.skipped == b.skipped == {"malformed": 1, "torn": 1, "duplicate": 30}
        assert a.examples == b.examples
        assert f"{path}:41: " in a.examples[0]
        assert (a.processes[(0, 0, "")].data == b.processes[(0, 0, "")].data).all()
        assert serial.strings == other.strings == ["exit", "eval"]


def test_a_random_first_line_is_skipped_like_any_other(tmp_path):
    """A garbage first line (a disk block lost, a stray write) is one malformed line, as it
    would be anywhere else in the file: the spans after it are read."""
    path = simple(n=10).write(tmp_path)
    path.write_bytes(b"\x00\x17 not json at all\n" + path.read_bytes())
    (r,) = report_run_dir(tmp_path)
    assert r.step_time.count == 10 and r.skipped["malformed"] == 1
    assert not r.warnings
