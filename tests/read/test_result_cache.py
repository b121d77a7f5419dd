"""A finished run's results kept beside the spool (``goodput_processor.read.result_cache``): the
second report reads them, equal field for field and step for step to a new accounting,
with the default definitions and with ``mgm`` (its step deviation entry for entry); a
running attempt, a changed file, other arguments, ``--no-cache`` or a damaged entry mean
the job is accounted again."""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from otlp_fixtures import T0_NS, Timeline, otlp_span, resource
from random_jobs import PROPS, jobs, otlp_requests, write_requests

from goodput import schema
from goodput_processor import definitions
from goodput_processor.account import run_dir
from goodput_processor.cli import main
from goodput_processor.read import reader, result_cache
from goodput_processor.read.cache import CACHE_DIR
from goodput_processor.results.report_json import to_json_dict
from goodput_processor.results.table import render_table

_COLUMNS = ("step", "attempt", "start_ns", "time_ns", "count", "time_s", "deviation_s",
            "anomalous")


def _age(run, seconds=3600):
    old = time.time() - seconds
    for p in run.rglob("*.jsonl"):
        os.utime(p, (old, old))
    return run


def _entries(run):
    return sorted(p.name for p in (run / CACHE_DIR).glob("results-*.json"))


def _same(got, want):
    """Every field of every result equal; the step arrays column by column."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for f in dataclasses.fields(w):
            if f.name != "steps":
                assert getattr(g, f.name) == getattr(w, f.name), f.name
        for c in _COLUMNS:
            np.testing.assert_array_equal(getattr(g.steps, c), getattr(w.steps, c), err_msg=c)
        assert g.steps.ideal_ns == w.steps.ideal_ns and g.steps.tol_ns == w.steps.tol_ns
        for a in w.attempts:
            (go, gp, _), (wo, wp, _) = g.steps.of_attempt(a.attempt), w.steps.of_attempt(a.attempt)
            assert go == wo and len(gp) == len(wp)
        assert g.steps.time_quantiles_s([50, 99]) == w.steps.time_quantiles_s([50, 99])


def _fresh(run, monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setenv("GOODPUT_REPORT_CACHE", "0")
        return run_dir.report_run_dir(run, **kw)


def _no_accounting(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("accounted again")

    monkeypatch.setattr(run_dir, "account", fail)


_RUN = {schema.RES_RUN_NAME: "r", schema.RES_FLOPS_PER_STEP: 4 * 10**12,
        schema.RES_PEAK_FLOPS: 10**12, schema.RES_DEVICE_COUNT: 8}


def _slices(tl, t, active):
    return tl.span(schema.ELASTIC_SLICES, t, t, {
        schema.ATTR_SLICES_ACTIVE: active, schema.ATTR_SLICES_AVAILABLE: 2,
        schema.ATTR_SLICES_TOTAL: 2})


def _finished(tmp_path):
    """Two hosts (stragglers), a restart, a checkpoint, an eval, MFU attributes, slice
    counts (slice efficiency)."""
    run = tmp_path / "run"
    for host in range(2):
        first = Timeline(job="c", process=host, count=2, **_RUN).job_start(0)
        _slices(first, 0, 2).steps(0, 20, start=1, step_time=1 + 0.1 * host).custom(
            "eval", 22, 23).write(run)
        second = Timeline(job="c", attempt=1, process=host, count=2, **_RUN).job_start(30)
        _slices(second, 30, 1).restore(30, 31, step=15).steps(
            15, 30, start=31, step_time=1).save(46, 47, step=30).job_end(50).write(run)
    return _age(run)


def test_second_report_reads_the_kept_results_equal_to_accounting(tmp_path, monkeypatch):
    run = _finished(tmp_path)
    want = _fresh(run, monkeypatch)
    assert not (run / CACHE_DIR).exists()
    first = run_dir.report_run_dir(run)
    _same(first, want)
    assert len(_entries(run)) == 1
    _no_accounting(monkeypatch)
    second = run_dir.report_run_dir(run)
    _same(second, want)
    assert to_json_dict(second) == to_json_dict(want)
    r = second[0]  # nested results kept
    assert r.stragglers is not None and r.recovery and r.slice_efficiency is not None
    assert r.mfu is not None and r.run[schema.RES_RUN_NAME] == "r"
    _, parts, _ = second[0].steps.of_attempt(0)
    assert isinstance(parts[0][0], np.memmap)  # mapped from the entry, not read


def test_table_and_json_of_the_cli_are_the_same_from_kept_results(tmp_path, capsys):
    run = _finished(tmp_path)
    outs = []
    for fmt in ("json", "table", "json", "table"):  # 1st json writes, the others read
        assert main(["report", str(run), "--format", fmt]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[2] and outs[1] == outs[3]
    assert main(["report", str(run), "--format", "json", "--no-cache"]) == 0
    assert capsys.readouterr().out == outs[0]


def test_a_running_attempt_is_not_kept(tmp_path):
    run = tmp_path / "run"
    t0 = time.time_ns() - 5 * 10**9  # alive 1 s ago with 1 s heartbeats: running
    Timeline(job="r", t0_ns=t0).job_start(0, interval_ms=1000).steps(0, 4, start=0,
                                                                    step_time=1).write(run)
    _age(run, 60)  # the files are quiet; the spans say the attempt is running
    (r,) = run_dir.report_run_dir(run)
    assert r.attempts[-1].end_reason == "running" and not result_cache.cacheable([r])
    assert _entries(run) == []


def test_a_live_run_a_changed_file_and_other_arguments_are_accounted(tmp_path, monkeypatch):
    run = _finished(tmp_path)
    _age(run, 5)  # written 5 s ago: not quiet yet
    run_dir.report_run_dir(run)
    assert _entries(run) == []
    _age(run)
    run_dir.report_run_dir(run)
    run_dir.report_run_dir(run, ideal_step_time_s=0.5)
    run_dir.report_run_dir(run, job="c")
    assert len(_entries(run)) == 3  # one per arguments
    now = time.time_ns()
    _same(run_dir.report_run_dir(run, now_ns=now), _fresh(run, monkeypatch, now_ns=now))
    assert len(_entries(run)) == 3  # an explicit now: neither read nor kept
    Timeline(job="c", attempt=2).job_start(60).restore(60, 61, step=29).steps(
        29, 40, start=61, step_time=1).write(run)  # a new attempt, in a new file
    _age(run)
    (r,) = run_dir.report_run_dir(run)
    assert [a.attempt for a in r.attempts] == [0, 1, 2]
    assert len(_entries(run)) == 1  # the entries of the old files are gone
    _same([r], _fresh(run, monkeypatch))


def test_no_cache_neither_reads_nor_writes_and_is_for_that_command(tmp_path, monkeypatch):
    monkeypatch.delenv("GOODPUT_REPORT_CACHE", raising=False)
    run = _finished(tmp_path)
    assert main(["report", str(run), "--no-cache"]) == 0
    assert not (run / CACHE_DIR).exists() and "GOODPUT_REPORT_CACHE" not in os.environ
    assert main(["report", str(run)]) == 0  # main() again in the same process
    assert len(_entries(run)) == 1


def test_entries_of_earlier_code_are_removed_when_a_new_one_is_written(tmp_path, monkeypatch):
    run = _finished(tmp_path)
    run_dir.report_run_dir(run)
    (name,) = _entries(run)
    path = run / CACHE_DIR / name
    doc = json.loads(path.read_text())
    old = {**doc, "key": "0" * 16, "steps": "results-0123-x.npy"}  # an earlier version's
    old.pop("arrays")
    (run / CACHE_DIR / old["steps"]).write_bytes(b"old steps")
    path.rename(run / CACHE_DIR / "results-0123.json")
    (run / CACHE_DIR / "results-0123.json").write_text(json.dumps(old))
    (run / CACHE_DIR / doc["arrays"]).unlink()
    _same(run_dir.report_run_dir(run), _fresh(run, monkeypatch))
    assert _entries(run) == [name]  # written anew; the earlier code's entry and its steps gone
    assert sorted(p.name for p in (run / CACHE_DIR).glob("results-*.npy")) == [
        json.loads(path.read_text())["arrays"]]


@pytest.mark.parametrize("damage", ["json", "class", "arrays", "array class", "key", "fields"])
def test_a_damaged_or_foreign_entry_is_a_miss(tmp_path, monkeypatch, damage):
    run = _finished(tmp_path)
    run_dir.report_run_dir(run)
    (name,) = _entries(run)
    path = run / CACHE_DIR / name
    doc = json.loads(path.read_text())
    if damage == "json":
        path.write_text(path.read_text()[:100])
    elif damage == "class":  # only dataclasses of goodput_processor are ever made
        doc["results"][0]["$c"] = "os:system"
        path.write_text(json.dumps(doc))
    elif damage == "arrays":
        (run / CACHE_DIR / doc["arrays"]).write_bytes(b"\x93NUMPY garbage")
    elif damage == "array class":  # only classes of goodput_processor are ever made
        doc["results"][0]["f"]["steps"]["$a"] = "numpy:memmap"
        path.write_text(json.dumps(doc))
    elif damage == "key":
        doc["key"] = "0" * 16
        path.write_text(json.dumps(doc))
    else:
        doc["results"][0]["f"]["no_such_field"] = 1
        path.write_text(json.dumps(doc))
    assert result_cache.load(run, result_cache.stats(run, sorted(run.glob("*.jsonl"))),
                             doc["params"]) is None
    _same(run_dir.report_run_dir(run), _fresh(run, monkeypatch))


def _or_error(report):
    """``report()``, or the message of the :class:`~goodput_processor.read.reader.RunDirError`
    it raises (a random job may hold only invalid spans: ``jobs`` draws them)."""
    try:
        return report()
    except reader.RunDirError as e:
        return str(e)


#: a job whose one span ends before it starts: no goodput span, the run is refused
_ONLY_INVALID = [(resource("prop", 0, 0, 3),
                  otlp_span(schema.DATA_LOADING, T0_NS + 2 * 10**9, T0_NS + 10**9,
                            trace_id=f"{1:016x}{1:016x}", span_id=1))]


@PROPS
@given(pairs=jobs(), ideal=st.sampled_from([None, 0.5]))
@example(pairs=_ONLY_INVALID, ideal=None)
def test_kept_results_equal_accounting_on_random_jobs(tmp_path_factory, pairs, ideal):
    run = _age(write_requests(tmp_path_factory.mktemp("kept"), otlp_requests(pairs, None)))
    os.environ["GOODPUT_REPORT_CACHE"] = "0"
    try:
        want = _or_error(lambda: run_dir.report_run_dir(run, ideal_step_time_s=ideal))
    finally:
        del os.environ["GOODPUT_REPORT_CACHE"]
    if isinstance(want, str):  # every span invalid: the same error with the cache, none kept
        assert _or_error(lambda: run_dir.report_run_dir(run, ideal_step_time_s=ideal)) == want
        assert not _entries(run)
        return
    first = run_dir.report_run_dir(run, ideal_step_time_s=ideal)
    assert len(_entries(run)) == 1
    second = run_dir.report_run_dir(run, ideal_step_time_s=ideal)
    for got in (first, second):
        _same(got, want)
    assert render_text(second) == render_text(want)


# --- mgm: its results kept too (they never depend on now)


def _mgm_fresh(run, monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setenv("GOODPUT_REPORT_CACHE", "0")
        return definitions.report(run, "mgm", **kw)


def _same_mgm(got, want):
    """Every field equal, the step deviation entry for entry and in order."""
    assert [type(g) for g in got] == [type(w) for w in want]
    for g, w in zip(got, want, strict=True):
        assert g.to_json_dict() == w.to_json_dict()
        for f in dataclasses.fields(w):
            assert getattr(g, f.name) == getattr(w, f.name), f.name
        if hasattr(w, "step_deviation_s"):
            assert list(g.step_deviation_s.items()) == list(w.step_deviation_s.items())


def _varied(tmp_path):
    """:func:`_finished` plus a job "v" of steps 1.0-1.6 s long, restarted at step 25."""
    run = _finished(tmp_path)
    tl, t = Timeline(job="v").job_start(0), 1.0
    for n in range(40):
        tl.step(n, t, t + 1 + (n * 7 % 11) * 0.06)
        t += 1 + (n * 7 % 11) * 0.06
    tl.write(run)
    tl, t = Timeline(job="v", attempt=1).job_start(t + 5).restore(t + 5, t + 6, step=25), t + 6
    for n in range(25, 60):
        tl.step(n, t, t + 1 + (n * 5 % 13) * 0.05)
        t += 1 + (n * 5 % 13) * 0.05
    tl.job_end(t).write(run)
    return _age(run)


def test_mgm_second_report_reads_the_kept_results(tmp_path, monkeypatch, capsys):
    run = _varied(tmp_path)
    want = _mgm_fresh(run, monkeypatch)
    assert len(want[0].step_deviation_s) > 20 and want[0].elastic
    assert len(set(want[1].step_deviation_s.values())) > 5 and want[1].disruptions
    _same_mgm(definitions.report(run, "mgm"), want)
    run_dir.report_run_dir(run)
    assert len(_entries(run)) == 2  # one per definitions
    with monkeypatch.context() as m:
        m.setattr(reader, "read_run_dir", lambda *a, **k: pytest.fail("read again"))
        second = definitions.report(run, "mgm")
    _same_mgm(second, want)
    assert isinstance(second[1].step_deviation_s._times, np.memmap)  # mapped, not read
    at = time.time_ns()  # --at: neither read nor kept
    _same_mgm(definitions.report(run, "mgm", at_ns=at), _mgm_fresh(run, monkeypatch, at_ns=at))
    assert len(_entries(run)) == 2
    outs = []
    for args in (["--format", "json"], [], ["--format", "json", "--no-cache"], ["--no-cache"]):
        assert main(["report", str(run), "--definitions", "mgm", *args]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[2] and outs[1] == outs[3]


@PROPS
@given(pairs=jobs(), ideal=st.sampled_from([None, 0.5, 2.0]))
@example(pairs=_ONLY_INVALID, ideal=None)
def test_kept_mgm_results_equal_accounting_on_random_jobs(tmp_path_factory, pairs, ideal):
    run = _age(write_requests(tmp_path_factory.mktemp("kept"), otlp_requests(pairs, None)))
    os.environ["GOODPUT_REPORT_CACHE"] = "0"
    try:
        want = _or_error(lambda: definitions.report(run, "mgm", ideal_step_time_s=ideal))
    finally:
        del os.environ["GOODPUT_REPORT_CACHE"]
    if isinstance(want, str):  # every span invalid: the same error with the cache, none kept
        assert _or_error(lambda: definitions.report(run, "mgm", ideal_step_time_s=ideal)) == want
        assert not _entries(run)
        return
    first = definitions.report(run, "mgm", ideal_step_time_s=ideal)
    assert len(_entries(run)) == 1
    second = definitions.report(run, "mgm", ideal_step_time_s=ideal)
    for got in (first, second):
        _same_mgm(got, want)


def render_text(results) -> str:
    from rich.console import Console

    console = Console(record=True, width=120, file=open(os.devnull, "w"))  # noqa: SIM115
    render_table(results, console)
    return console.export_text()
