"""`goodput import`: ml-goodput-measurement and resiliency logs -> goodput spans.

Real files in, spool files out, read back with the processor's own reader and accounted
with its report; the command line in process (``cli.main``) and once as the installed
``goodput`` console script.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from goodput import schema
from goodput_processor import read_run_dir, report_run_dir
from goodput_processor.cli import main
from goodput_processor.importers import (
    InputError,
    OutputExistsError,
    detect_source,
    import_logs,
)
from goodput_processor.importers import writer as writer_mod
from goodput_processor.read.rows import (
    C_AUX,
    C_END,
    C_IVAL,
    C_KIND,
    C_SIDX,
    C_START,
    KIND_NAMES,
    NONE,
)

NS = 1_000_000_000
#: A fixed, historical origin: 2025-09-27 04:00:00 UTC (nothing looks "running").
T0 = datetime(2025, 9, 27, 4, 0, tzinfo=timezone.utc)
T0_S = T0.timestamp()
T0_NS = int(T0_S) * NS
NOW = T0_NS + 30 * 86400 * NS


# --- helpers -----------------------------------------------------------------------------

def spans_of(run_dir, job, attempt=0, process=0, unit=1.0, t0_ns=T0_NS):
    """Spans of one process as sorted (short name, start, end, ival, aux, string) tuples;
    times in ``unit`` seconds after ``t0_ns``."""
    s = read_run_dir(run_dir)
    j = s.jobs[job]
    d = j.processes[(attempt, process, "")].data
    out = []
    for row in d.tolist():
        name = KIND_NAMES[row[C_KIND]].removeprefix("goodput.")
        start = (row[C_START] - t0_ns) / NS / unit
        end = (row[C_END] - t0_ns) / NS / unit
        ival = None if row[C_IVAL] == NONE else row[C_IVAL]
        aux = None if row[C_AUX] == NONE else row[C_AUX]
        string = j.strings[row[C_SIDX]] if row[C_SIDX] >= 0 else None
        out.append((name, start, end, ival, aux, string))
    return sorted(out, key=lambda r: (r[1], r[2], r[0]))


def dir_bytes(d) -> dict[str, bytes]:
    """Relative path -> content of every file under ``d``."""
    d = Path(d)
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def log_entry(payload: dict, i: int) -> dict:
    """``payload`` as a Cloud Logging LogEntry (as ``gcloud logging read`` prints one)."""
    times = [v for k, v in payload.items() if k.endswith("_time")]
    written = (times[0] if times else T0_S) + 0.001 + i * 1e-6
    return {
        "insertId": f"{i:08x}",
        "jsonPayload": payload,
        "logName": "projects/p/logs/goodput_seed-job",
        "receiveTimestamp": rfc3339(written + 0.5),
        "resource": {"labels": {"project_id": "p"}, "type": "global"},
        "severity": "INFO",
        "timestamp": rfc3339(written),
    }


def write_lines(path, values) -> Path:
    path = Path(path)
    with open(path, "w", encoding="utf-8") as f:
        for v in values:
            f.write((v if isinstance(v, str) else json.dumps(v)) + "\n")
    return path


# --- ml-goodput-measurement --------------------------------------------------------------

JOB = "seed-job"


def seed_payloads() -> list[dict]:
    """The scenario of the mgm README (seconds after T0), with a crash and a restart.

    Attempt 0: job start 0, TPU init 0-1, training prep 1-3, data loading 3-5, steps 0-4
    starting at 5, 13, 16, 20, 23 (3 s each, 5 s extra in the first), an Orbax save of
    step 2 at 19-20, killed after step 4 started. Attempt 1: job start 30, TPU init 30-31,
    prep 31-33, Orbax restore of step 2 at 33-35, steps 3, 4 at 35, 38, custom badput
    ``eval_step`` 41-43, job end 43.
    """

    def at(key, t, **kw):
        return {"job_name": JOB, key: T0_S + t, **kw}

    return [
        at("job_start_time", 0),
        at("tpu_init_start_time", 0), at("tpu_init_end_time", 1),
        at("training_prep_start_time", 1), at("training_prep_end_time", 3),
        at("data_loading_start_time", 3), at("data_loading_end_time", 5),
        at("step_start_time", 5, step_count=0), at("step_start_time", 13, step_count=1),
        at("step_start_time", 16, step_count=2),
        {"event_type": "save", "step": 2, "directory": "gs://b/ckpt", "synchronous": True,
         "wait_for_prev_start_time": T0_S + 19, "wait_for_prev_duration_secs": 0.0,
         "checkpointer_blocking_start_time": T0_S + 19.1,
         "checkpointer_blocking_duration_secs": 0.8,
         "checkpoint_manager_blocking_start_time": T0_S + 19,
         "checkpoint_manager_blocking_duration_secs": 1.0},
        at("step_start_time", 20, step_count=3), at("step_start_time", 23, step_count=4),
        at("job_start_time", 30),
        at("tpu_init_start_time", 30), at("tpu_init_end_time", 31),
        at("training_prep_start_time", 31), at("training_prep_end_time", 33),
        {"event_type": "restore", "step": 2, "directory": "gs://b/ckpt",
         "checkpointer_start_time": T0_S + 33.2, "checkpointer_duration_secs": 1.5,
         "checkpoint_manager_start_time": T0_S + 33, "checkpoint_manager_duration_secs": 2.0},
        at("step_start_time", 35, step_count=3), at("step_start_time", 38, step_count=4),
        at("custom_badput_event_start_time", 41, custom_badput_event_type="eval_step"),
        at("custom_badput_event_end_time", 43, custom_badput_event_type="eval_step"),
        at("job_end_time", 43),
    ]


SEED_SPANS_A0 = [
    ("job_start", 0, 0, None, None, None),
    ("accelerator_init", 0, 1, None, None, None),
    ("training_prep", 1, 3, None, None, None),
    ("data_loading", 3, 5, None, None, None),
    ("step", 5, 13, 0, None, None),
    ("step", 13, 16, 1, None, None),
    ("step", 16, 20, 2, None, None),
    ("checkpoint_save", 19, 20, 2, None, None),
    ("step", 20, 23, 3, None, None),
    ("step", 23, 23, 4, None, None),  # crashed: ends at its start
]
SEED_SPANS_A1 = [
    ("job_start", 30, 30, None, None, None),
    ("accelerator_init", 30, 31, None, None, None),
    ("training_prep", 31, 33, None, None, None),
    ("checkpoint_restore", 33, 35, 2, None, None),
    ("step", 35, 38, 3, None, None),
    ("step", 38, 43, 4, None, None),  # the last step ends at the job end
    ("custom_badput", 41, 43, None, None, "eval_step"),
    ("job_end", 43, 43, None, None, "explicit"),
]


@pytest.fixture
def seed_files(tmp_path):
    """The seed scenario three ways: a gcloud JSON array (newest first, pretty-printed),
    a log sink's JSON lines, and mgm's local cache of bare payloads."""
    payloads = seed_payloads()
    entries = [log_entry(p, i) for i, p in enumerate(payloads)]
    array = tmp_path / "gcloud-export.json"
    array.write_text(json.dumps(entries[::-1], indent=2), encoding="utf-8")
    lines = write_lines(tmp_path / "sink.jsonl", entries)
    bare = write_lines(tmp_path / f"{JOB}_timeline.jsonl", payloads)
    return {"array": array, "lines": lines, "bare": bare}


def test_mgm_exports_give_identical_spans(seed_files, tmp_path):
    outs = {}
    for kind, path in seed_files.items():
        out = tmp_path / f"out-{kind}"
        summary = import_logs([path], out)
        assert summary.source == "ml-goodput-measurement"
        assert summary.entries == len(seed_payloads())
        assert not summary.problems and not summary.examples
        job = summary.jobs[JOB]
        assert (job.attempts, job.processes, job.spans, job.files) == (2, 1, 18, 2)
        assert job.run_dir == str(out / JOB)
        outs[kind] = dir_bytes(out)
    assert outs["array"] == outs["lines"] == outs["bare"]
    assert sorted(outs["lines"]) == [f"{JOB}/spans-p00000-a0000.jsonl",
                                     f"{JOB}/spans-p00000-a0001.jsonl"]


def test_mgm_spans_read_back(seed_files, tmp_path):
    import_logs([seed_files["array"]], tmp_path / "out")
    run = tmp_path / "out" / JOB
    assert spans_of(run, JOB, 0) == SEED_SPANS_A0
    assert spans_of(run, JOB, 1) == SEED_SPANS_A1
    s = read_run_dir(run)
    job = s.jobs[JOB]
    assert sorted(job.processes) == [(0, 0, ""), (1, 0, "")]
    assert not job.skipped and job.schema_versions == {schema.SCHEMA_VERSION}
    proc = job.processes[(0, 0, "")]
    assert proc.process_count == 1 and proc.host is None
    line = json.loads((run / "spans-p00000-a0000.jsonl").read_text().splitlines()[0])
    res = {a["key"]: a["value"] for a in line["resourceSpans"][0]["resource"]["attributes"]}
    assert res == {
        schema.RES_SERVICE_NAME: {"stringValue": JOB},
        schema.RES_JOB_NAME: {"stringValue": JOB},
        schema.RES_ATTEMPT: {"intValue": "0"},
        schema.RES_PROCESS_INDEX: {"intValue": "0"},
        schema.RES_PROCESS_COUNT: {"intValue": "1"},
        schema.RES_SCHEMA_VERSION: {"stringValue": schema.SCHEMA_VERSION},
        schema.RES_IMPORTED_FROM: {"stringValue": "ml-goodput-measurement"},
    }
    scope = line["resourceSpans"][0]["scopeSpans"][0]
    assert scope["scope"]["name"] == schema.SCOPE_NAME
    spans = scope["spans"]
    assert [sp["spanId"] for sp in spans] == [f"{i:016x}" for i in range(1, len(spans) + 1)]
    assert len({sp["traceId"] for sp in spans}) == 1 and len(spans[0]["traceId"]) == 32
    save = next(sp for sp in spans if sp["name"] == schema.CHECKPOINT_SAVE)
    assert {a["key"]: a["value"] for a in save["attributes"]} == {
        schema.ATTR_CHECKPOINT_STEP: {"intValue": "2"}, schema.ATTR_BLOCKING: {"boolValue": True}}


def test_mgm_report_buckets(seed_files, tmp_path):
    import_logs([seed_files["lines"]], tmp_path / "out")
    (r,) = report_run_dir(tmp_path / "out" / JOB, now_ns=NOW)
    assert r.ideal_step_time_s == 3 and r.ideal_step_time_source == "estimated"
    assert r.total_time_s == 43 and r.disruptions == 1 and r.max_productive_step == 4
    assert r.buckets_ns == {k: v * NS for k, v in {
        "productive": 15, "process_startup": 0, "accelerator_init": 2, "training_prep": 4,
        "program_startup": 0,
        "data_loading": 2, "checkpoint_save": 1, "checkpoint_restore": 2,
        "wasted_progress": 3, "infrastructure_recovery": 7, "training_slowdown": 5,
        "custom:eval_step": 2, "other": 0}.items()}
    assert [(a.end_reason, a.resume_step, a.steps_kept, a.steps_wasted) for a in r.attempts] \
        == [("killed", -1, 3, 1), ("explicit", 2, 2, 0)]  # (zero-length step 4 not counted)


def test_mgm_ties_follow_logentry_timestamps(tmp_path):
    """Data loading that ends at the very instant the next one starts, in a newest-first
    export: the LogEntry timestamps, not the file order, say which came first."""
    payloads = [
        {"job_name": JOB, "job_start_time": T0_S},
        {"job_name": JOB, "data_loading_start_time": T0_S + 1},
        {"job_name": JOB, "data_loading_end_time": T0_S + 2},
        {"job_name": JOB, "data_loading_start_time": T0_S + 2},
        {"job_name": JOB, "data_loading_end_time": T0_S + 3},
        {"job_name": JOB, "step_start_time": T0_S + 3, "step_count": 7},
        {"job_name": JOB, "job_end_time": T0_S + 4},
    ]
    path = tmp_path / "desc.json"
    path.write_text(json.dumps([log_entry(p, i) for i, p in enumerate(payloads)][::-1]))
    summary = import_logs([path], tmp_path / "out")
    assert not summary.problems
    assert spans_of(tmp_path / "out" / JOB, JOB) == [
        ("job_start", 0, 0, None, None, None),
        ("data_loading", 1, 2, None, None, None),
        ("data_loading", 2, 3, None, None, None),
        ("step", 3, 4, 7, None, None),
        ("job_end", 4, 4, None, None, "explicit"),
    ]


def test_mgm_problems_reported_with_location(tmp_path):
    good = seed_payloads()
    bad = [
        "{this is not json",  # line 2
        {"job_name": JOB, "step_start_time": "soon", "step_count": 9},  # line 3: wrong type
        {"job_name": JOB, "data_loading_end_time": T0_S + 24},  # line 4: end without start
        {"event_type": "save", "step": 5, "checkpoint_manager_blocking_duration_secs": 1.0},
        [1, 2, 3],  # line 6: not an object
        {"job_name": JOB, "loss": 0.5},  # line 7: unknown payload
        {"job_name": JOB, "tpu_init_start_time": T0_S + 25},  # line 8: never ended
        {"job_name": JOB, "step_start_time": float("inf"), "step_count": 1},  # line 9
    ]
    path = tmp_path / "mixed.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps(good[0]) + "\n")
        for b in bad:
            f.write((b if isinstance(b, str) else json.dumps(b)) + "\n")
        for p in good[1:]:
            f.write(json.dumps(p) + "\n")
    summary = import_logs([path], tmp_path / "out")
    assert summary.problems == Counter({"not JSON": 1, "wrong type": 2, "end without start": 1,
                                        "no start time": 1, "not an object": 1,
                                        "unknown payload": 1, "start never ended": 1})
    text = "\n".join(summary.examples)
    for line, reason in ((2, "not JSON"), (3, "wrong type"), (4, "end without start"),
                         (5, "no start time"), (6, "not an object"), (7, "unknown payload"),
                         (8, "start never ended"), (9, "wrong type")):
        assert f"{path}:{line}: {reason}" in text, (line, reason, text)
    assert "step_start_time must be POSIX seconds" in text
    # Everything else is imported: the spans are those of the clean run.
    run = tmp_path / "out" / JOB
    assert spans_of(run, JOB, 0) == SEED_SPANS_A0
    assert spans_of(run, JOB, 1) == SEED_SPANS_A1


def test_mgm_array_problem_names_element(tmp_path):
    entries = [log_entry(p, i) for i, p in enumerate(seed_payloads())]
    entries.insert(3, {"jsonPayload": {"job_name": JOB, "job_end_time": "late"}})
    path = tmp_path / "export.json"
    path.write_text(json.dumps(entries, indent=2))
    summary = import_logs([path], tmp_path / "out")
    assert summary.problems == {"wrong type": 1}
    starts = [i for i, text in enumerate(path.read_text().splitlines(), 1) if text == "  {"]
    line = starts[3]  # where element 3 begins
    assert summary.examples[0].startswith(f"{path}:{line} (element 3): wrong type: ")


@pytest.mark.parametrize("chunk", [1, 7, 300, 1 << 20])
def test_mgm_array_read_in_chunks(tmp_path, monkeypatch, chunk):
    """A JSON array is parsed from chunks of the file: any chunk size gives the same
    entries, spans and problem locations."""
    from goodput_processor.importers import common

    entries = [log_entry(p, i) for i, p in enumerate(seed_payloads())]
    entries.insert(5, {"jsonPayload": {"job_name": JOB, "job_end_time": "late"}})
    text = "\ufeff \n" + json.dumps(entries, indent=1) + "\n\n"
    path = tmp_path / "export.json"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setattr(common, "_CHUNK_CHARS", chunk)
    summary = import_logs([path], tmp_path / "out")
    assert summary.entries == len(entries) and summary.problems == {"wrong type": 1}
    starts = [i for i, x in enumerate(path.read_text().splitlines(), 1) if x == " {"]
    assert summary.examples[0].startswith(f"{path}:{starts[5]} (element 5): wrong type")
    run = tmp_path / "out" / JOB
    assert spans_of(run, JOB, 0) == SEED_SPANS_A0 and spans_of(run, JOB, 1) == SEED_SPANS_A1


@pytest.mark.parametrize("tail, problem, line", [
    ("", "the array is not closed", 25),  # the line of the last element
    ("] trailing", "text after the end of the array", 26),
    ('] {"x": 1}', "text after the end of the array", 26),
    (' {"job_name": "x"}]', "expected ',' or ']'", 26),
])
def test_mgm_array_ends(tmp_path, tail, problem, line):
    body = ",\n".join(json.dumps(log_entry(p, i)) for i, p in enumerate(seed_payloads()))
    path = tmp_path / "export.json"
    path.write_text("[\n" + body + "\n" + tail + "\n")
    summary = import_logs([path], tmp_path / "out")
    assert summary.problems == {"not JSON": 1} and problem in summary.examples[0]
    assert summary.examples[0].startswith(f"{path}:{line}")
    assert summary.jobs[JOB].spans == 18


def test_mgm_truncated_array_keeps_what_parses(tmp_path):
    entries = [log_entry(p, i) for i, p in enumerate(seed_payloads())]
    text = json.dumps(entries, indent=2)
    path = tmp_path / "cut.json"
    path.write_text(text[: text.index('"job_end_time"')])  # the export was cut off
    summary = import_logs([path], tmp_path / "out")
    assert summary.problems == {"not JSON": 1}
    assert f"(element {len(entries) - 1}): not JSON" in summary.examples[0]
    assert summary.entries == len(entries) - 1
    assert JOB in summary.jobs


def test_mgm_numbers_out_of_range(tmp_path):
    rows = [{"job_name": JOB, "job_start_time": T0_S},
            {"job_name": JOB, "step_start_time": T0_S + 1, "step_count": "1" + "0" * 20},
            {"job_name": JOB, "step_start_time": T0_S + 2, "step_count": 2.5},
            {"job_name": JOB, "step_start_time": T0_S + 3, "step_count": "3"},
            {"job_name": JOB, "job_end_time": 1e300},
            {"event_type": "save", "step": 3, "checkpoint_manager_blocking_start_time": T0_S + 4,
             "checkpoint_manager_blocking_duration_secs": 9e9},
            {"job_name": JOB, "job_end_time": True}]
    path = write_lines(tmp_path / "big.jsonl", rows)
    summary = import_logs([path], tmp_path / "out")
    assert summary.problems == {"wrong type": 5}
    assert spans_of(tmp_path / "out" / JOB, JOB) == [
        ("job_start", 0, 0, None, None, None), ("step", 3, 3, 3, None, None)]


def test_mgm_orbax_fallback_keys_and_missing_duration(tmp_path):
    payloads = [
        {"job_name": JOB, "job_start_time": T0_S},
        {"event_type": "save", "step": 10, "checkpointer_blocking_start_time": T0_S + 5,
         "checkpointer_blocking_duration_secs": 0.5},
        {"event_type": "save", "step": 20, "wait_for_prev_start_time": T0_S + 8,
         "checkpoint_manager_blocking_duration_secs": 1.5},
        {"event_type": "emergency_restore", "step": 20, "checkpointer_start_time": T0_S + 9,
         "checkpointer_duration_secs": 0.25},
        {"event_type": "restore", "step": 20, "checkpoint_manager_start_time": T0_S + 10},
        {"job_name": JOB, "job_end_time": T0_S + 12},
    ]
    path = write_lines(tmp_path / "orbax.jsonl", payloads)
    summary = import_logs([path], tmp_path / "out")
    assert summary.problems == {"no duration": 1}
    assert f"{path}:5: no duration" in summary.examples[0]
    assert spans_of(tmp_path / "out" / JOB, JOB) == [
        ("job_start", 0, 0, None, None, None),
        ("checkpoint_save", 5, 5.5, 10, None, None),
        ("checkpoint_save", 8, 9.5, 20, None, None),
        ("checkpoint_restore", 9, 9.25, 20, None, None),
        ("checkpoint_restore", 10, 10, 20, None, None),
        ("job_end", 12, 12, None, None, "explicit"),
    ]


def test_mgm_several_jobs_and_job_filter(tmp_path):
    a = [{"job_name": "job-a", "job_start_time": T0_S},
         {"job_name": "job-a", "step_start_time": T0_S + 1, "step_count": 1},
         {"job_name": "job-a", "job_end_time": T0_S + 2}]
    b = [{"job_name": "job b/2", "job_start_time": T0_S + 10},
         {"job_name": "job b/2", "job_end_time": T0_S + 20}]
    orbax = {"event_type": "save", "step": 1, "checkpoint_manager_blocking_start_time": T0_S,
             "checkpoint_manager_blocking_duration_secs": 0.1}
    path = write_lines(tmp_path / "two.jsonl", [*a, *b, orbax])
    summary = import_logs([path], tmp_path / "all")
    assert sorted(summary.jobs) == ["job b/2", "job-a"]
    assert summary.jobs["job b/2"].run_dir == str(tmp_path / "all" / "job_b_2")
    assert summary.problems == {"no job name": 1}  # which job's save is it?
    assert "import it with --job NAME" in summary.examples[0]
    only = import_logs([path], tmp_path / "one", job="job-a")
    assert list(only.jobs) == ["job-a"] and not only.problems
    assert ("checkpoint_save", 0, 0.1, 1, None, None) in spans_of(
        tmp_path / "one" / "job-a", "job-a")
    with pytest.raises(InputError, match="job 'nope' is not in the input.*job-a"):
        import_logs([path], tmp_path / "x", job="nope")


def test_mgm_entries_without_job_name_need_job(tmp_path):
    path = write_lines(tmp_path / "orbax-only.jsonl", [
        {"event_type": "save", "step": 1, "checkpoint_manager_blocking_start_time": T0_S,
         "checkpoint_manager_blocking_duration_secs": 2.0}])
    with pytest.raises(InputError, match="no job_name.*--job NAME"):
        import_logs([path], tmp_path / "out")
    summary = import_logs([path], tmp_path / "out", job="named")
    assert summary.jobs["named"].spans == 1


# --- resiliency --------------------------------------------------------------------------

FSDP_JOB = "yejingxin-dev2-goodput-n1--a3h-unittest-09261818"
#: The example log of the resiliency README: (time after 2025-09-27T04:5, event, field).
FSDP_EVENTS = [
    ("1:00.492242", "job_started", 0), ("1:29.376985", "checkpoint_loaded", 0),
    ("1:35.775347", "checkpoint_saved", 500), ("1:37.153714", "checkpoint_saved", 1000),
    ("1:38.505679", "checkpoint_saved", 1500), ("1:39.863866", "checkpoint_saved", 2000),
    ("1:41.196246", "checkpoint_saved", 2500), ("1:42.528565", "checkpoint_saved", 3000),
    ("1:43.860838", "checkpoint_saved", 3500), ("1:45.199876", "checkpoint_saved", 4000),
    ("1:47.533941", "job_terminated", 0), ("2:07.013451", "job_started", 0),
    ("2:40.627857", "checkpoint_loaded", 4000), ("2:42.189783", "checkpoint_saved", 4500),
    ("2:43.491595", "checkpoint_saved", 5000), ("2:44.810060", "checkpoint_saved", 5500),
    ("2:46.185741", "checkpoint_saved", 6000), ("2:47.544125", "checkpoint_saved", 6500),
    ("2:48.881336", "checkpoint_saved", 7000), ("2:50.207887", "checkpoint_saved", 7500),
    ("2:51.524989", "checkpoint_saved", 8000), ("2:52.847352", "checkpoint_saved", 8500),
    ("2:54.193366", "checkpoint_saved", 9000), ("2:55.475204", "checkpoint_saved", 9500),
    ("2:56.741096", "checkpoint_saved", 10000), ("2:58.746024", "job_terminated", 0),
]


def fsdp_log(path) -> Path:
    lines = []
    for when, event, value in FSDP_EVENTS:
        rec = {"timestamp": f"2025-09-27T04:5{when}", "job_name": FSDP_JOB, "event_type": event}
        rec["node_rank" if event.startswith("job_") else "step"] = value
        lines.append(rec)
    return write_lines(path, lines)


def fsdp_s(when: str) -> float:
    """Seconds of a README time after 04:51:00 (the first job start is at 00.492242)."""
    minute, sec = when.split(":")
    return (int(minute) - 1) * 60 + float(sec)


def test_resiliency_readme_log(tmp_path):
    path = fsdp_log(tmp_path / "fsdp-goodput.log")
    assert detect_source([path]) == "resiliency"
    summary = import_logs([path], tmp_path / "out")
    assert summary.source == "resiliency" and summary.entries == 26
    assert not summary.problems and summary.duplicates == 0
    job = summary.jobs[FSDP_JOB]
    assert (job.attempts, job.processes, job.files) == (2, 1, 2)
    t0 = datetime(2025, 9, 27, 4, 51, tzinfo=timezone.utc)
    run = tmp_path / "out" / FSDP_JOB
    got0 = spans_of(run, FSDP_JOB, 0, t0_ns=int(t0.timestamp()) * NS)
    t = [round(fsdp_s(w), 6) for w, _, _ in FSDP_EVENTS]
    got0 = [(n, round(s, 6), round(e, 6), i, a, x) for n, s, e, i, a, x in got0]
    saves = [(t[k], FSDP_EVENTS[k][2]) for k in range(2, 10)]
    expected0 = [("job_start", t[0], t[0], None, None, None),
                 ("training_prep", t[0], t[1], None, None, None),
                 ("checkpoint_restore", t[1], t[1], 0, None, None)]
    prev = t[1]
    for ts, step in saves:
        expected0 += [("step", prev, ts, step, 500, None),
                      ("checkpoint_save", ts, ts, step, None, None)]
        prev = ts
    expected0.append(("job_end", t[10], t[10], None, None, "exit"))
    assert got0 == sorted(expected0, key=lambda r: (r[1], r[2], r[0]))
    got1 = spans_of(run, FSDP_JOB, 1, t0_ns=int(t0.timestamp()) * NS)
    assert got1[0][:4] == ("job_start", round(t[11], 6), round(t[11], 6), None)
    # start -> checkpoint_loaded (step > 0) is start-up and restore together; the restore
    # itself is a zero-length span at the load, carrying the step
    assert [r[0] for r in got1[1:4]] == ["custom_badput", "checkpoint_restore", "step"]
    assert round(got1[1][1], 6) == t[11] and round(got1[1][2], 6) == t[12]
    assert got1[1][5] == "startup_and_restore"
    assert round(got1[2][1], 6) == round(got1[2][2], 6) == t[12] and got1[2][3] == 4000
    assert got1[3][3:5] == (4500, 500)
    (r,) = report_run_dir(run, now_ns=NOW)
    assert r.total_ns == 118_253_782_000
    assert r.buckets_ns["checkpoint_restore"] == 0
    assert r.buckets_ns["custom:startup_and_restore"] == 33_614_406_000
    assert r.buckets_ns["training_prep"] == 28_884_743_000
    assert r.buckets_ns["infrastructure_recovery"] == 19_479_510_000
    assert r.buckets_ns["wasted_progress"] == 2_334_065_000
    assert r.max_productive_step == 10000 and r.disruptions == 1


def primer_log(path, t0=datetime(2025, 9, 27, 0, 0), job="primer", extra=()) -> Path:
    """The worked example of the resiliency guide; times in minutes after ``t0``."""
    events = [(0, "job_started", {"node_rank": 0}), (5, "checkpoint_loaded", {"step": 25}),
              (60, "checkpoint_saved", {"step": 50}), (100, "job_terminated", {"node_rank": 0}),
              (115, "job_started", {"node_rank": 0}), (120, "checkpoint_loaded", {"step": 50}),
              (200, "checkpoint_saved", {"step": 75}), (200, "job_terminated", {"node_rank": 0}),
              *extra]
    rows = [{"timestamp": (t0 + timedelta(minutes=m)).isoformat(), "job_name": job,
             "event_type": e, **kw} for m, e, kw in events]
    random.Random(3).shuffle(rows)  # the order of the lines does not matter
    return write_lines(path, rows)


def test_resiliency_primer(tmp_path):
    path = primer_log(tmp_path / "primer.log")
    summary = import_logs([path], tmp_path / "out", source="resiliency")
    assert summary.jobs["primer"].attempts == 2 and not summary.problems
    run = tmp_path / "out" / "primer"
    t0 = int(datetime(2025, 9, 27, tzinfo=timezone.utc).timestamp()) * NS
    assert spans_of(run, "primer", 0, unit=60, t0_ns=t0) == [
        ("job_start", 0, 0, None, None, None),
        ("custom_badput", 0, 5, None, None, "startup_and_restore"),
        ("checkpoint_restore", 5, 5, 25, None, None),
        ("step", 5, 60, 50, 25, None),
        ("checkpoint_save", 60, 60, 50, None, None),
        ("job_end", 100, 100, None, None, "exit"),
    ]
    assert spans_of(run, "primer", 1, unit=60, t0_ns=t0) == [
        ("job_start", 115, 115, None, None, None),
        ("custom_badput", 115, 120, None, None, "startup_and_restore"),
        ("checkpoint_restore", 120, 120, 50, None, None),
        ("step", 120, 200, 75, 25, None),
        ("checkpoint_save", 200, 200, 75, None, None),
        ("job_end", 200, 200, None, None, "exit"),
    ]
    (r,) = report_run_dir(run, ideal_step_time_s=120, now_ns=NOW)
    minutes = {k: v / 60 / NS for k, v in r.buckets_ns.items()}
    assert r.total_ns == 200 * 60 * NS
    # the log has no restore duration: start -> checkpoint_loaded is start-up and restore
    assert minutes["checkpoint_restore"] == 0 and minutes["custom:startup_and_restore"] == 10
    assert minutes["infrastructure_recovery"] == 15
    assert minutes["wasted_progress"] == 40
    assert minutes["productive"] == 100 and r.goodput == 0.5


def test_resiliency_timezone(tmp_path):
    path = primer_log(tmp_path / "primer.log")
    import_logs([path], tmp_path / "utc")
    import_logs([path], tmp_path / "paris", timezone="Europe/Paris")
    utc = read_run_dir(tmp_path / "utc").jobs["primer"].processes[(0, 0, "")].data
    paris = read_run_dir(tmp_path / "paris").jobs["primer"].processes[(0, 0, "")].data
    assert (utc[:, C_START] - paris[:, C_START] == 2 * 3600 * NS).all()  # CEST = UTC+2
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        import_logs([path], tmp_path / "x", timezone="Mars/Olympus")


def test_resiliency_explicit_offsets_ignore_timezone(tmp_path):
    rows = [{"timestamp": "2025-09-27T06:00:00+02:00", "job_name": "z",
             "event_type": "job_started", "node_rank": 0},
            {"timestamp": "2025-09-27T04:10:00Z", "job_name": "z",
             "event_type": "job_terminated", "node_rank": 0}]
    path = write_lines(tmp_path / "z.log", rows)
    import_logs([path], tmp_path / "out", timezone="America/New_York")
    assert spans_of(tmp_path / "out" / "z", "z") == [
        ("job_start", 0, 0, None, None, None), ("job_end", 600, 600, None, None, "exit")]


def test_resiliency_scheduled_and_user_terminated(tmp_path):
    path = primer_log(tmp_path / "p.log", extra=[
        (-10, "user_scheduled", {}), (200, "user_terminated", {})])
    summary = import_logs([path], tmp_path / "out")
    assert not summary.problems
    run = tmp_path / "out" / "primer"
    t0 = int(datetime(2025, 9, 27, tzinfo=timezone.utc).timestamp()) * NS
    a0 = spans_of(run, "primer", 0, unit=60, t0_ns=t0)
    assert a0[:2] == [("job_start", -10, -10, None, None, None),
                      ("custom_badput", -10, 0, None, None, "scheduling")]
    a1 = spans_of(run, "primer", 1, unit=60, t0_ns=t0)
    assert ("job_end", 200, 200, None, None, "explicit") in a1
    (r,) = report_run_dir(run, ideal_step_time_s=120, now_ns=NOW)
    assert r.total_ns == 210 * 60 * NS  # from user_scheduled, as the resiliency calculator
    assert r.buckets_ns["custom:scheduling"] == 10 * 60 * NS


def test_resiliency_multi_node(tmp_path):
    """256 nodes, 3 attempts; nodes start and stop at jittered times; some job_started and
    job_terminated lines are written twice; checkpoint events come from node 0."""
    rng = random.Random(11)
    nodes, rows, dups = 256, [], 0
    t = datetime(2025, 9, 27, 1, 0)
    first_start, last_end, step = {}, {}, 0

    def ev(when, event, **kw):
        rows.append({"timestamp": when.isoformat(), "job_name": "big", "event_type": event,
                     **kw})

    for attempt in range(3):
        for node in range(nodes):
            when = t + timedelta(seconds=rng.uniform(0, 20))
            first_start[attempt, node] = when
            ev(when, "job_started", node_rank=node)
            if rng.random() < 0.1:
                ev(when + timedelta(seconds=rng.uniform(1, 5)), "job_started", node_rank=node)
                dups += 1
        t += timedelta(seconds=60)
        ev(t, "checkpoint_loaded", step=step)
        for _ in range(5):
            t += timedelta(seconds=30)
            step += 100
            ev(t, "checkpoint_saved", step=step)
        t += timedelta(seconds=45)
        for node in range(nodes):
            when = t + timedelta(seconds=rng.uniform(0, 10))
            ev(when, "job_terminated", node_rank=node)
            last_end[attempt, node] = when
            if rng.random() < 0.05:
                when += timedelta(seconds=rng.uniform(0.5, 2))
                ev(when, "job_terminated", node_rank=node)
                last_end[attempt, node] = when
                dups += 1
        t += timedelta(minutes=5)
        step -= 100  # the last 100 steps are redone
    rng.shuffle(rows)
    path = write_lines(tmp_path / "big.log", rows)
    summary = import_logs([path], tmp_path / "out")
    assert not summary.problems and summary.duplicates == dups > 0
    job = summary.jobs["big"]
    assert (job.attempts, job.processes, job.files) == (3, 256, 3 * 256)
    s = read_run_dir(tmp_path / "out" / "big")
    procs = s.jobs["big"].processes
    assert sorted(k[:2] for k in procs) == [(a, n) for a in range(3) for n in range(nodes)]

    def ns(dt):
        return int(dt.replace(tzinfo=timezone.utc).timestamp()) * NS + dt.microsecond * 1000

    for key, proc in procs.items():
        a, n = key[:2]
        d = proc.data
        assert proc.process_count == nodes
        starts = d[d[:, C_KIND] == 0][:, C_START].tolist()
        ends = d[d[:, C_KIND] == 1][:, C_START].tolist()
        assert starts == [ns(first_start[a, n])] and ends == [ns(last_end[a, n])]
        # node 0 also: training prep (step 0, attempt 0) or startup_and_restore (step > 0)
        # up to the load, a zero-length restore at it, steps, saves
        assert len(d) == (2 if n else 2 + 2 + 5 * 2)
    (r,) = report_run_dir(tmp_path / "out" / "big", now_ns=NOW)
    assert [(a.processes, a.declared_processes, a.resume_step) for a in r.attempts] == [
        (256, 256, 0), (256, 256, 400), (256, 256, 800)]
    assert r.max_productive_step == 1300


def events_log(path, events, job="r", t0=datetime(2025, 9, 27, 4, 0)) -> Path:
    """A resiliency log from ``(seconds after t0, event type, extra fields)``, shuffled."""
    rows = [{"timestamp": (t0 + timedelta(seconds=s)).isoformat(), "job_name": job,
             "event_type": e, **kw} for s, e, kw in events]
    random.Random(5).shuffle(rows)
    return write_lines(path, rows)


def marker_times(run_dir, job, kind):
    """{(attempt, process): [times in s after T0]} of the markers of ``kind`` (0 start, 1 end)."""
    out = {}
    for key, proc in read_run_dir(run_dir).jobs[job].processes.items():
        d = proc.data
        ts = ((d[d[:, C_KIND] == kind][:, C_START] - T0_NS) / NS).tolist()
        if ts:
            out[tuple(key[:2])] = ts
    return out


#: The minimal pod-kill case: node 0 restarts at 200 s without any job_terminated.
KILLED = [(0, "job_started", {"node_rank": 0}), (10, "checkpoint_loaded", {"step": 0}),
          (110, "checkpoint_saved", {"step": 100}), (200, "job_started", {"node_rank": 0}),
          (210, "checkpoint_loaded", {"step": 100}), (310, "checkpoint_saved", {"step": 200}),
          (320, "job_terminated", {"node_rank": 0})]


def test_resiliency_restart_without_terminate(tmp_path, capsys):
    """A node's second job_started is a restart even when nothing logged job_terminated;
    the killed attempt ends at its last event, the downtime is infrastructure recovery."""
    summary = import_logs([events_log(tmp_path / "k.log", KILLED)], tmp_path / "out")
    assert summary.jobs["r"].attempts == 2 and not summary.problems
    assert summary.duplicates == 0
    run = tmp_path / "out" / "r"
    assert spans_of(run, "r", 0) == [
        ("job_start", 0, 0, None, None, None),
        ("training_prep", 0, 10, None, None, None),
        ("checkpoint_restore", 10, 10, 0, None, None),
        ("step", 10, 110, 100, 100, None),
        ("checkpoint_save", 110, 110, 100, None, None)]  # no job_end: killed
    assert spans_of(run, "r", 1) == [
        ("job_start", 200, 200, None, None, None),
        ("custom_badput", 200, 210, None, None, "startup_and_restore"),
        ("checkpoint_restore", 210, 210, 100, None, None),
        ("step", 210, 310, 200, 100, None),
        ("checkpoint_save", 310, 310, 200, None, None),
        ("job_end", 320, 320, None, None, "exit")]
    (r,) = report_run_dir(run, ideal_step_time_s=1, now_ns=NOW)
    assert r.goodput == 0.625 and r.total_ns == 320 * NS
    assert r.buckets_ns == {**dict.fromkeys(r.buckets_ns, 0), "productive": 200 * NS,
                            "training_prep": 10 * NS, "custom:startup_and_restore": 10 * NS,
                            "infrastructure_recovery": 90 * NS, "other": 10 * NS}
    assert [a.resume_step for a in r.attempts] == [0, 100]
    assert main(["report", str(run), "--definitions", "resiliency",
                 "--ideal-step-time", "1"]) == 0
    assert "62.50 %" in capsys.readouterr().out


def test_resiliency_duplicate_or_restart(tmp_path):
    """A repeated job_started within the window with nothing in between is a duplicate; after
    the window it is a restart (an attempt that died before loading is an attempt); inside
    the window but after a checkpoint event it is a restart, reported as ambiguous."""
    events = [(0, "job_started", {"node_rank": 0}), (0.5, "job_started", {"node_rank": 1}),
              (2.5, "job_started", {"node_rank": 0}),  # duplicate line (2.5 s)
              (3, "job_started", {"node_rank": 1}),  # duplicate line (2.5 s)
              (40, "job_started", {"node_rank": 1}),  # restart: died before loading
              (41, "job_started", {"node_rank": 0}),  # ... joins the wave
              (60, "checkpoint_loaded", {"step": 0}),
              (62, "job_started", {"node_rank": 0}),  # 21 s after its start: a restart
              (63, "job_started", {"node_rank": 1}),
              (70, "checkpoint_loaded", {"step": 0}),
              (72, "job_started", {"node_rank": 0}),  # 10 s, but after a load: ambiguous
              (73, "job_started", {"node_rank": 1})]
    path = events_log(tmp_path / "d.log", events)
    summary = import_logs([path], tmp_path / "out")
    assert summary.duplicates == 2
    assert summary.jobs["r"].attempts == 4
    # both nodes' starts at 72-73 s come 10 s after their previous one, but after a load
    assert summary.problems == {"ambiguous restart": 2}
    assert any("ambiguous restart" in e and "node 0" in e for e in summary.examples)
    assert marker_times(tmp_path / "out" / "r", "r", 0) == {
        (0, 0): [0], (0, 1): [0.5], (1, 0): [41], (1, 1): [40], (2, 0): [62], (2, 1): [63],
        (3, 0): [72], (3, 1): [73]}
    # a window of 0: every repeat is a restart
    summary = import_logs([path], tmp_path / "w0", duplicate_window_s=0)
    assert summary.duplicates == 0 and summary.jobs["r"].attempts == 5
    assert not summary.problems
    with pytest.raises(ValueError, match="duplicate window"):
        import_logs([path], tmp_path / "bad", duplicate_window_s=-1)
    assert main(["import", str(path), "--to", str(tmp_path / "cli"),
                 "--duplicate-window", "0"]) == 0
    assert len(list((tmp_path / "cli" / "r").glob("*-a0004.jsonl"))) == 2


def test_resiliency_restart_wave(tmp_path):
    """Events belong to their node's attempt: a slow node's late job_terminated stays in the
    attempt it ends; a node absent from the killed attempt that logs the wave's first start
    joins the new attempt; identical lines are kept once."""
    events = [(0, "job_started", {"node_rank": 0}), (1, "job_started", {"node_rank": 1}),
              (2, "job_started", {"node_rank": 2}),
              (30, "checkpoint_loaded", {"step": 0}),
              (130, "checkpoint_saved", {"step": 100, "node_rank": 0}),
              (130, "checkpoint_saved", {"step": 100, "node_rank": 0}),  # identical line
              (300, "job_started", {"node_rank": 3}),  # absent before: the wave's first line
              (301, "job_started", {"node_rank": 1}), (302, "job_started", {"node_rank": 0}),
              (303, "job_terminated", {"node_rank": 2}),  # late end of node 2's attempt 0
              (305, "job_started", {"node_rank": 2}),
              (340, "checkpoint_loaded", {"step": 100}),
              (440, "checkpoint_saved", {"step": 200})]
    summary = import_logs([events_log(tmp_path / "w.log", events)], tmp_path / "out")
    assert not summary.problems and summary.duplicates == 1
    assert summary.jobs["r"].attempts == 2 and summary.jobs["r"].processes == 4
    run = tmp_path / "out" / "r"
    assert marker_times(run, "r", 0) == {(0, 0): [0], (0, 1): [1], (0, 2): [2], (1, 0): [302],
                                         (1, 1): [301], (1, 2): [305], (1, 3): [300]}
    assert marker_times(run, "r", 1) == {(0, 2): [303]}
    (r,) = report_run_dir(run, ideal_step_time_s=1, now_ns=NOW)
    assert [(a.start_ns - T0_NS) / NS for a in r.attempts] == [0, 300]
    assert [a.resume_step for a in r.attempts] == [0, 100]
    assert r.productive_time_s == 200 and r.badput_s["custom:startup_and_restore"] == 38


def test_resiliency_second_load_without_start(tmp_path):
    """A node that loads a checkpoint a second time in one attempt restarted without
    logging job_started: a new attempt begins at the load, reported as a problem."""
    events = [(0, "job_started", {"node_rank": 0}), (10, "checkpoint_loaded", {"step": 0}),
              (110, "checkpoint_saved", {"step": 100}),
              (300, "checkpoint_loaded", {"step": 100}),
              (400, "checkpoint_saved", {"step": 200})]
    summary = import_logs([events_log(tmp_path / "s.log", events)], tmp_path / "out")
    assert summary.jobs["r"].attempts == 2
    assert summary.problems == {"restart without job_started": 1}
    run = tmp_path / "out" / "r"
    assert spans_of(run, "r", 1)[:2] == [("checkpoint_restore", 300, 300, 100, None, None),
                                         ("custom_badput", 300, 300, None, None,
                                          "startup_and_restore")]
    (r,) = report_run_dir(run, ideal_step_time_s=1, now_ns=NOW)
    assert r.badput_s["checkpoint_restore"] == 0 and r.productive_time_s == 200
    assert r.badput_s["infrastructure_recovery"] == 190


def test_resiliency_problems(tmp_path):
    good = json.loads(primer_log(tmp_path / "p.log").read_text().splitlines()[0])
    rows = [
        good,
        {"timestamp": "yesterday", "job_name": "primer", "event_type": "job_started"},
        {"timestamp": "2025-09-27T00:00:00", "job_name": "primer", "event_type": "exploded"},
        {"timestamp": "2025-09-27T00:01:00", "job_name": "primer",
         "event_type": "checkpoint_saved"},
        {"timestamp": "2025-09-27T00:01:00", "job_name": "primer",
         "event_type": "checkpoint_saved", "step": "many"},
        "not json at all",
        {"timestamp": "9999-12-31T23:59:59", "job_name": "primer",  # beyond int64 ns
         "event_type": "job_terminated", "node_rank": 0},
        {"timestamp": "2025-09-27T00:02:00", "job_name": "primer", "event_type": "job_started",
         "node_rank": 2**64},
    ]
    path = write_lines(tmp_path / "bad.log", rows)
    summary = import_logs([path], tmp_path / "out", source="resiliency")
    assert summary.problems == {"wrong type": 4, "unknown event type": 1, "missing field": 1,
                                "not JSON": 1}
    text = "\n".join(summary.examples)
    for line, reason in ((2, "wrong type"), (3, "unknown event type"), (4, "missing field"),
                         (5, "wrong type"), (6, "not JSON"), (7, "wrong type"),
                         (8, "wrong type")):
        assert f"{path}:{line}: {reason}" in text


# --- inputs, outputs, errors -------------------------------------------------------------

def test_missing_and_empty_files(tmp_path):
    with pytest.raises(InputError, match=f"cannot read {tmp_path / 'nope.json'}: "):
        import_logs([tmp_path / "nope.json"], tmp_path / "out")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(InputError, match=f"{empty} is empty"):
        import_logs([empty], tmp_path / "out", source="mgm")
    with pytest.raises(InputError, match="cannot tell the format"):
        import_logs([empty], tmp_path / "out")
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(InputError, match="empty.json is empty"):
        import_logs([tmp_path / "empty.json"], tmp_path / "out", source="resiliency")
    junk = write_lines(tmp_path / "junk.jsonl", ["nope", {"a": 1}])
    with pytest.raises(InputError, match=r"nothing to import from .*junk.jsonl: 1 entry read, "
                       r"no span made \(not JSON 1, unknown payload 1\)"):
        import_logs([junk], tmp_path / "out", source="mgm")
    assert not (tmp_path / "out").exists()


def test_detect_mixed_formats(tmp_path, seed_files):
    res = fsdp_log(tmp_path / "r.log")
    assert detect_source([seed_files["array"]]) == "mgm"
    with pytest.raises(InputError, match="different formats"):
        import_logs([seed_files["bare"], res], tmp_path / "out")


def test_existing_output_refused_then_overwritten(seed_files, tmp_path):
    out = tmp_path / "out"
    import_logs([seed_files["bare"]], out)
    first = dir_bytes(out)
    (out / JOB / "spans-p00007-a0009.jsonl").write_text("{}\n")  # e.g. an older import
    with pytest.raises(OutputExistsError, match=f"{out / JOB} already holds spans.*--overwrite"):
        import_logs([seed_files["lines"]], out)
    summary = import_logs([seed_files["lines"]], out, overwrite=True)
    assert summary.jobs[JOB].files == 2
    assert dir_bytes(out) == first  # the old file is gone; a re-import is identical


def test_interrupted_write_leaves_no_complete_looking_file(seed_files, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real = writer_mod.SpanWriter._write_file
    calls = []

    def failing(self, path, *args):
        calls.append(path)
        real(self, path, *args)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer_mod.SpanWriter, "_write_file", failing)
    with pytest.raises(OSError, match="No space"):
        import_logs([seed_files["bare"]], out)
    assert all(p.name.endswith(".jsonl.tmp") for p in calls)
    assert list((out / JOB).iterdir()) == []
    # A stale temporary file (a kill -9 mid-write) is never read and is cleaned up.
    (out / JOB / "spans-p00000-a0000.jsonl.tmp").write_text('{"resourceSpans":[')
    monkeypatch.undo()
    import_logs([seed_files["bare"]], out)
    assert sorted(p.name for p in (out / JOB).iterdir()) == [
        "spans-p00000-a0000.jsonl", "spans-p00000-a0001.jsonl"]


def test_progress_callback(seed_files, tmp_path):
    calls = []
    import_logs([seed_files["lines"]], tmp_path / "out",
                progress=lambda *a: calls.append(a))
    size = seed_files["lines"].stat().st_size
    read = [c for c in calls if c[0] == "read"]
    write = [c for c in calls if c[0] == "write"]
    assert sum(c[1] for c in read) == size and {c[2] for c in read} == {size}
    assert sum(c[1] for c in write) == 18 and {c[2] for c in write} == {18}


def test_resiliency_several_jobs(tmp_path):
    rows = [json.loads(x) for x in primer_log(tmp_path / "a.log").read_text().splitlines()]
    rows += [{**r, "job_name": "other"} for r in rows[:3]]
    rows.append({"timestamp": "2025-09-27T00:30:00", "event_type": "checkpoint_saved",
                 "step": 30})  # no job_name: which job?
    path = write_lines(tmp_path / "two.log", rows)
    summary = import_logs([path], tmp_path / "out")
    assert sorted(summary.jobs) == ["other", "primer"]
    assert summary.problems == {"no job name": 1}
    only = import_logs([path], tmp_path / "one", job="primer")
    assert list(only.jobs) == ["primer"] and not only.problems
    assert ("checkpoint_save", 30, 30, 30, None, None) in spans_of(
        tmp_path / "one" / "primer", "primer", unit=60,
        t0_ns=int(datetime(2025, 9, 27, tzinfo=timezone.utc).timestamp()) * NS)


def test_progress_bar_draws_on_stderr(capsys):
    from goodput_processor.terminal import ProgressBar

    with ProgressBar() as bar:
        bar("read", 10, 100)
        bar("read", 90, 100)
        bar("write", 5, 5)
    assert capsys.readouterr().out == ""


def test_spans_per_line(tmp_path):
    table = writer_mod.SpanTable()
    for i in range(2500):
        table.add(0, 0, writer_mod.K_STEP, T0_NS + i * NS, T0_NS + (i + 1) * NS, ival=i)
    written = writer_mod.SpanWriter(tmp_path, "resiliency", spans_per_line=1000).write_job(
        "j", table)
    lines = (tmp_path / "j" / "spans-p00000-a0000.jsonl").read_text().splitlines()
    assert written.spans == 2500 and [len(json.loads(x)["resourceSpans"][0]["scopeSpans"][0][
        "spans"]) for x in lines] == [1000, 1000, 500]
    with pytest.raises(ValueError, match="source must be one of"):
        writer_mod.SpanWriter(tmp_path, "other")


# --- command line ------------------------------------------------------------------------

def test_cli_table_and_json(seed_files, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(["import", str(seed_files["array"]), "--to", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Imported 1 job(s) from ml-goodput-measurement: 24 entries read" in text
    assert JOB in text and "problems: none" in text
    assert f"next: goodput report {out / JOB}" in text
    assert main(["import", str(seed_files["lines"]), "--to", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("goodput: error: ") and "--overwrite" in err and err.count("\n") == 1
    assert main(["import", str(seed_files["lines"]), "--to", str(out), "--overwrite",
                 "--format", "json", "--from", "mgm", "--job", JOB]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"] == "ml-goodput-measurement" and doc["entries"] == 24
    assert doc["jobs"][JOB] == {"run_dir": str(out / JOB), "attempts": 2, "processes": 1,
                                "spans": 18, "files": 2}
    assert doc["problems"] == {} and doc["next"] == [f"goodput report {out / JOB}"]


def test_cli_problems_listed_exit_zero(tmp_path, capsys):
    path = write_lines(tmp_path / "p.jsonl", [*seed_payloads(), "oops"])
    assert main(["import", str(path), "--to", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "problems: 1 (not JSON 1)" in out and f"{path}:25: not JSON" in out


def test_cli_errors(tmp_path, capsys):
    assert main(["import", str(tmp_path / "missing.json"), "--to", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"goodput: error: cannot read {tmp_path / 'missing.json'}: No such file or " \
                  "directory\n"
    path = primer_log(tmp_path / "p.log")
    assert main(["import", str(path), "--timezone", "Nowhere/Land", "--to", str(tmp_path)]) == 2
    assert "unknown time zone" in capsys.readouterr().err
    assert main(["import", str(path), "--from", "csv"]) == 2
    err = capsys.readouterr().err
    assert "unknown source 'csv'" in err and "mgm, resiliency" in err


def test_console_script_import_then_report(tmp_path):
    script = shutil.which("goodput", path=str(Path(sys.executable).parent)) or shutil.which(
        "goodput")
    if script is None:  # pragma: no cover - the package is installed in the test environment
        pytest.skip("the goodput console script is not installed")
    path = primer_log(tmp_path / "primer.log")
    env = {**os.environ, "COLUMNS": "120"}
    p = subprocess.run([script, "import", str(path), "--to", str(tmp_path / "runs")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "next: goodput report" in p.stdout and p.stderr == ""
    p = subprocess.run([script, "report", str(tmp_path / "runs" / "primer"), "--format",
                        "json", "--ideal-step-time", "120"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    (job,) = json.loads(p.stdout)["jobs"]
    assert job["goodput"] == 0.5 and job["total_time_s"] == 12000
