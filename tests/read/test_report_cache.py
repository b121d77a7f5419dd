"""The columnar cache beside the spool (``goodput_processor.read.cache``): a finished run's second
report reads arrays, equal to reading the spool; any change to the files, a damaged or
foreign cache, or a live run means the spool is read."""

from __future__ import annotations

import json
import os
import time

from otlp_fixtures import Timeline

from goodput_processor.account.accounting import account
from goodput_processor.cli import main
from goodput_processor.read import cache
from goodput_processor.read.reader import read_run_dir, span_files
from goodput_processor.results.report_json import to_json_dict

NOW = 2**62


def _run(tmp_path, age_s=3600):
    run = tmp_path / "run"
    Timeline(job="c").job_start(0).steps(0, 20, start=1, step_time=1).custom(
        "eval", 22, 23).write(run)
    (Timeline(job="c", attempt=1).job_start(30).restore(30, 31, step=15)
     .steps(15, 30, start=31, step_time=1).job_end(50).write(run))
    old = time.time() - age_s
    for p in run.iterdir():
        os.utime(p, (old, old))
    return run


def _doc(spans):
    return to_json_dict([account(j, now_ns=NOW) for _, j in sorted(spans.jobs.items())])


def test_second_read_comes_from_the_cache_and_equals_the_spool(tmp_path, monkeypatch):
    run = _run(tmp_path)
    first = read_run_dir(run)
    assert (run / cache.CACHE_DIR / "index.json").exists()
    loaded = cache.load(run, span_files(run))
    assert loaded is not None and _doc(loaded) == _doc(first)
    calls = []
    monkeypatch.setattr(cache, "load", lambda *a: calls.append(1) or loaded)
    assert _doc(read_run_dir(run)) == _doc(first) and calls == [1]


def test_a_changed_file_is_read_again(tmp_path):
    run = _run(tmp_path)
    read_run_dir(run)
    Timeline(job="c", attempt=2).job_start(60).restore(60, 61, step=29).steps(
        29, 40, start=61, step_time=1).write(run)  # a new attempt: a new file
    assert cache.load(run, span_files(run)) is None
    (r,) = [account(j, now_ns=NOW) for j in read_run_dir(run).jobs.values()]
    assert [a.attempt for a in r.attempts] == [0, 1, 2]
    (path,) = [p for p in span_files(run) if "a0000" in p.name]
    with open(path, "a") as f:  # a line appended: size and mtime change
        f.write("\n")
    assert cache.load(run, span_files(run)) is None


def test_a_live_run_is_not_cached(tmp_path):
    run = _run(tmp_path, age_s=0)
    read_run_dir(run)
    assert not (run / cache.CACHE_DIR).exists()


def test_damaged_or_foreign_cache_is_a_miss(tmp_path):
    run = _run(tmp_path)
    want = _doc(read_run_dir(run))
    d = run / cache.CACHE_DIR
    index = json.loads((d / "index.json").read_text())
    (d / index["rows"]).write_bytes(b"not an npy file")
    assert cache.load(run, span_files(run)) is None and _doc(read_run_dir(run)) == want
    index = json.loads((d / "index.json").read_text())
    index["key"] = "another reader"
    (d / "index.json").write_text(json.dumps(index))
    assert cache.load(run, span_files(run)) is None and _doc(read_run_dir(run)) == want


def test_unwritable_cache_place_and_no_cache_flag(tmp_path, capsys, monkeypatch):
    run = _run(tmp_path)
    (run / cache.CACHE_DIR).write_text("a file where the cache directory would go")
    assert _doc(read_run_dir(run))["jobs"][0]["step_time"]["count"] == 32
    other = tmp_path / "other"
    run.rename(other)
    (other / cache.CACHE_DIR).unlink()
    monkeypatch.setenv("GOODPUT_REPORT_CACHE", "1")  # --no-cache sets it to 0 in-process
    assert main(["report", str(other), "--no-cache", "--format", "json"]) == 0
    assert not (other / cache.CACHE_DIR).exists()
    assert json.loads(capsys.readouterr().out)["jobs"][0]["step_time"]["count"] == 32
