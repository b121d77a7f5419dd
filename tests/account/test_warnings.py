"""One test per warning code, each from spools the real recorder wrote in real processes
(then truncated, emptied or deleted where the case is a damaged file), checked in the
JSON report, the table, the HTML, the ``goodput.warnings`` metric and ``--strict``.

The codes are documented in ``docs/accounting.md`` ("Warnings"); the attempt-structure
ones (``orphaned_processes``, ``process_rank_unknown``) are produced by real launchers in
``test_launchers.py`` and by spools in ``test_attempts.py``.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

from instr_util import child_env

from goodput_processor.account.checks import CODES
from goodput_processor.cli import main

#: A training process: ``python child.py RUN_DIR FIRST LAST [KEY=VALUE ...]`` records steps
#: FIRST..LAST (10 ms each). Options: ``restore=K`` (a restore of step K first),
#: ``save=K`` (a checkpoint save of step K after step K),
#: ``back=SECONDS`` (the steps after the middle are stamped that much earlier, as after a
#: wall clock stepped back), ``again=N`` (then steps 1..N once more, a counter reset).
CHILD = textwrap.dedent("""
    import sys, time, goodput
    run, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    opts = dict(a.split("=") for a in sys.argv[4:])
    goodput.configure("warn-job", run_dir=run, flush_interval_s=0.05)
    if "restore" in opts:
        with goodput.checkpoint_restore(step=int(opts["restore"])):
            time.sleep(0.01)
    back = float(opts.get("back", 0))
    mid = (first + last) // 2
    for n in range(first, last + 1):
        if back and n > mid:
            t = time.time() - back
            goodput.step(n, start=t, end=t + 0.01)
            time.sleep(0.01)
            continue
        with goodput.step(n):
            time.sleep(0.01)
        if n == int(opts.get("save", -1)):
            with goodput.checkpoint_save(step=n):
                time.sleep(0.01)
    for n in range(1, int(opts.get("again", 0)) + 1):
        with goodput.step(n):
            time.sleep(0.01)
""")


#: One plain journal per attempt, no compacted .gz beside it: the cases that damage a spool
#: file damage the one the report reads.
_PLAIN = "0"


def _run(tmp_path, first, last, *opts, **env):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env.setdefault("GOODPUT_SPOOL_SEGMENT_MB", _PLAIN)
    subprocess.run([sys.executable, str(script), str(tmp_path / "run"), str(first),
                    str(last), *opts], env=child_env(**env), check=True, timeout=60)


def _run_ranks(tmp_path, world, first, last):
    """``world`` ranks of one launch, running at the same time (RANK, WORLD_SIZE set)."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "run"), str(first),
                               str(last)], env=child_env(RANK=str(r), WORLD_SIZE=str(world),
                                                         GOODPUT_SPOOL_SEGMENT_MB=_PLAIN))
             for r in range(world)]
    assert [p.wait(60) for p in procs] == [0] * world


def _report(tmp_path, *extra):
    """``goodput report --format json``: (exit status, the one job's dict)."""
    return _report_path(tmp_path / "run", *extra)


def _report_path(run_dir, *extra):
    """``goodput report RUN_DIR --format json``: (exit status, the one job's dict)."""
    out = subprocess.run([sys.executable, "-m", "goodput_processor.cli", "report",
                          str(run_dir), "--format", "json", *extra],
                         env=child_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 3), out.stderr
    (job,) = json.loads(out.stdout)["jobs"]
    return out.returncode, job


def _codes(job) -> list[str]:
    return [w["code"] for w in job["warnings"]]


def test_missing_attempt(tmp_path):
    for attempt in (0, 1, 2):
        restore = [f"restore={5 * attempt}"] if attempt else []
        _run(tmp_path, 5 * attempt + 1, 5 * attempt + 5, *restore, GOODPUT_ATTEMPT=str(attempt))
    (lost,) = (tmp_path / "run").glob("spans-p00000-a0001-*.jsonl")
    lost.unlink()  # attempt 1's spool file deleted
    _, job = _report(tmp_path)
    assert [a["attempt"] for a in job["attempts"]] == [0, 2]
    (w,) = job["warnings"]
    assert (w["code"], w["attempt"]) == ("missing_attempt", 2) and "attempt 1" in w["message"]


def test_steps_restart_without_restore(tmp_path):
    _run(tmp_path, 1, 8, "save=4")  # a checkpoint saved at step 4, then relaunched: its
    _run(tmp_path, 1, 8)  # steps count from 1 again and no restore is recorded
    _, job = _report(tmp_path)
    assert _codes(job) == ["steps_restart_without_restore"]
    assert job["warnings"][0]["attempt"] == 1
    _run(tmp_path, 9, 12, "restore=8")  # a recorded restore: nothing to warn about
    _, job = _report(tmp_path)
    assert _codes(job) == ["steps_restart_without_restore"]  # still only attempt 1's


def test_a_restart_from_scratch_before_any_checkpoint_is_not_warned(tmp_path):
    """Killed before its first checkpoint, the job can only start again from step 1: no
    ``steps_restart_without_restore``, and ``--strict`` exits 0. A checkpoint saved only
    after the restart does not make the restart suspect either."""
    _run(tmp_path, 1, 8)
    _run(tmp_path, 1, 8, "save=6")
    status, job = _report(tmp_path, "--strict")
    assert (status, _codes(job)) == (0, [])
    _run(tmp_path, 1, 4)  # the third attempt starts over after attempt 1's save: warned
    status, job = _report(tmp_path, "--strict")
    assert (status, _codes(job)) == (3, ["steps_restart_without_restore"])
    assert job["warnings"][0]["attempt"] == 2


def test_a_restore_in_an_earlier_attempt_makes_a_restart_from_scratch_suspect(tmp_path):
    _run(tmp_path, 5, 8, "restore=4")  # resumed from a checkpoint of an earlier run
    _run(tmp_path, 1, 8)
    _, job = _report(tmp_path)
    assert _codes(job) == ["steps_restart_without_restore"]


def test_run_dirs_merged(tmp_path):
    """``goodput report PARENT`` over two runs' directories with the same job name: one
    job, and a warning naming both directories; each directory alone has none."""
    for name in ("monday", "tuesday"):
        (tmp_path / name).mkdir()
        _run(tmp_path / name, 1, 4)
    status, job = _report_path(tmp_path, "--strict")
    assert status == 3 and _codes(job) == ["run_dirs_merged"]
    (w,) = job["warnings"]
    assert str(tmp_path / "monday" / "run") in w["message"]
    assert str(tmp_path / "tuesday" / "run") in w["message"]
    assert len(job["attempts"]) == 2
    for name in ("monday", "tuesday"):
        assert _report_path(tmp_path / name / "run", "--strict") == (0, _report_path(
            tmp_path / name / "run")[1])
    assert main(["report", str(tmp_path), "--no-cache"]) == 0
    assert main(["report", str(tmp_path)]) == 0  # (writes the columnar cache)
    assert _codes(_report_path(tmp_path)[1]) == ["run_dirs_merged"]  # read from it


def test_steps_backwards(tmp_path):
    _run(tmp_path, 1, 10, "again=3")
    _, job = _report(tmp_path)
    assert _codes(job) == ["steps_backwards"] and job["warnings"][0]["process"] == 0


def test_clock_stepped_back(tmp_path):
    _run(tmp_path, 1, 40, "back=3600")  # explicit timestamps an hour behind, mid-run
    _, job = _report(tmp_path)
    (w,) = [w for w in job["warnings"] if w["code"] == "clock_jump"]
    assert "stepped back" in w["message"] and w["attempt"] == 0
    # in time order, the steps stamped an hour early come first: numbers go down too
    assert set(_codes(job)) == {"clock_jump", "steps_backwards"}


def test_world_size_changed(tmp_path):
    _run_ranks(tmp_path, 2, 1, 5)  # two ranks together, then a relaunch with one
    _run(tmp_path, 6, 10, "restore=5", RANK="0", WORLD_SIZE="1")
    _, job = _report(tmp_path)
    assert [a["processes"] for a in job["attempts"]] == [2, 1]
    assert _codes(job) == ["world_size_changed"] and job["warnings"][0]["attempt"] == 1


def test_empty_and_unreadable_spool_files_are_skipped_and_named(tmp_path):
    _run(tmp_path, 1, 5, GOODPUT_ATTEMPT="0")
    _run(tmp_path, 6, 10, "restore=5", GOODPUT_ATTEMPT="1")
    _run(tmp_path, 11, 15, "restore=10", GOODPUT_ATTEMPT="2")
    files = sorted((tmp_path / "run").glob("spans-*.jsonl"))
    files[1].write_bytes(b"")  # truncated to nothing
    files[2].write_bytes(b"\x00\x00 a block of a disk that lost its contents\n")
    _, job = _report(tmp_path)
    by_code = {w["code"]: w for w in job["warnings"]}
    assert by_code["empty_spool_file"]["file"] == str(files[1])
    assert by_code["spool_file_skipped"]["file"] == str(files[2])
    assert set(by_code) == {"empty_spool_file", "spool_file_skipped"}
    assert job["step_time"]["count"] == 5  # what was readable is all there


def test_spans_rejected(tmp_path):
    _run(tmp_path, 1, 5)
    (spool,) = (tmp_path / "run").glob("spans-*.jsonl")
    lines = spool.read_text().splitlines()
    req = json.loads(lines[-1])
    span = req["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["endTimeUnixNano"] = str(int(span["startTimeUnixNano"]) - 1)  # ends before it starts
    span["spanId"] = "f" * 16
    spool.write_text("\n".join(lines + [json.dumps(req)]) + "\n")
    _, job = _report(tmp_path)
    assert _codes(job) == ["spans_rejected"] and job["skipped"]["invalid_span"] == 1


def test_ideal_step_time_contradicted_and_strict(tmp_path, capsys):
    _run(tmp_path, 1, 10)
    status, job = _report(tmp_path, "--ideal-step-time", "0.001")  # steps take ~10 ms
    assert status == 0 and _codes(job) == ["ideal_step_time_contradicted"]
    status, _ = _report(tmp_path, "--ideal-step-time", "0.001", "--strict")
    assert status == 3
    assert main(["report", str(tmp_path / "run"), "--strict"]) == 0  # estimated: no warning
    assert main(["report", str(tmp_path / "run"), "--ideal-step-time", "0.001"]) == 0
    assert "warning [ideal_step_time_contradicted]" in capsys.readouterr().out


def test_warnings_in_html_and_metrics(tmp_path):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from goodput_processor.exporters.metrics import GoodputMetrics, run_dir_source

    _run(tmp_path, 1, 8, "save=4")
    _run(tmp_path, 1, 8)
    html = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "run"), "--html", str(html)]) == 0
    page = html.read_text()
    assert '<div class="warnings">' in page and "steps_restart_without_restore" in page
    reader = InMemoryMetricReader()
    GoodputMetrics(run_dir_source(tmp_path / "run"), MeterProvider(metric_readers=[reader]))
    points = [(p.attributes, p.value)
              for rm in reader.get_metrics_data().resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics if m.name == "goodput.warnings"
              for p in m.data.data_points]
    assert [(a["goodput.warning.code"], v) for a, v in points] == [
        ("steps_restart_without_restore", 1)]


def test_recording_disabled_by_otel_sdk_disabled_says_so(tmp_path, monkeypatch, caplog):
    import goodput

    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    with caplog.at_level(logging.WARNING, logger="goodput.recorder"):
        goodput.configure("off", run_dir=tmp_path / "run")
        goodput.shutdown()
    assert any("OTEL_SDK_DISABLED=true" in r.getMessage() and "nothing is recorded"
               in r.getMessage() for r in caplog.records)


def test_every_code_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "accounting.md").read_text()
    for code in CODES:
        assert f"| `{code}` |" in doc, code
