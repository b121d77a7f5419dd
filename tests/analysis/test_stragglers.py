"""Straggler report (per-host step times against the median host) from real spool files
with several processes: the report, its JSON and table forms (the real CLI), and the
``goodput.straggler.step_time_ratio`` gauge.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from cli_util import goodput
from metric_points import reader_points
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from otlp_fixtures import Timeline

from goodput import schema
from goodput_processor.account.accounting import account
from goodput_processor.account.run_dir import report_run_dir
from goodput_processor.analysis.stragglers import straggler_report
from goodput_processor.exporters.metrics import GoodputMetrics
from goodput_processor.model.attempts import build_attempts
from goodput_processor.read.reader import read_run_dir
from goodput_processor.read.rows import (
    C_END,
    C_IVAL,
    C_KIND,
    C_SID,
    C_START,
    K_JOB_START,
    K_STEP,
    NCOLS,
    NONE,
    JobSpans,
    ProcessSpans,
)

HOSTS = 8
SLOW, LATE, WASTEFUL = 5, 6, 3  # process indexes


def _process(attempt, p, first, last, t0, slow=1.5):
    """Steps first..last every 2 s from t0: 1 s data loading, then the step.

    Process SLOW's steps take ``slow`` s, the others' 1 s; process LATE starts each step 0.2 s
    late; process WASTEFUL's steps above 10 take 10 s in attempt 0 (wasted by the restart).
    """
    tl = Timeline(attempt=attempt, process=p, count=HOSTS, host=f"host{p}").job_start(t0)
    if attempt:
        tl.restore(t0, t0 + 1, step=10)
        t0 += 1
    for i, n in enumerate(range(first, last + 1)):
        s = t0 + 2 * i + 1 + (0.2 if p == LATE else 0)
        d = slow if p == SLOW else (10 if p == WASTEFUL and attempt == 0 and n > 10 else 1)
        tl.span("data_loading", t0 + 2 * i, s)
        tl.step(n, s, s + d)
    if attempt == 0:
        tl.save(t0 + 2 * 10, t0 + 2 * 10 + 0.5, step=10)
    return tl


def _write(d, slow=1.5):
    """8 processes; attempt 0 runs steps 1..20 and is killed, attempt 1 resumes at 10."""
    for p in range(HOSTS):
        _process(0, p, 1, 20, 0, slow).write(d)
        _process(1, p, 11, 30, 100, slow).job_end(200).write(d)
    return d


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("stragglers"))


def test_report_names_the_slow_host(run_dir):
    (r,) = report_run_dir(run_dir)
    s = r.stragglers
    assert s.hosts == HOSTS
    assert s.median_step_time_s == pytest.approx(1.0)
    top = s.slowest[0]
    assert (top.host, top.process) == ("host5", SLOW)
    assert top.ratio == pytest.approx(1.5) and s.max_ratio == top.ratio
    assert top.median_step_time_s == pytest.approx(1.5)
    assert top.steps == 10 + 20  # kept: 1..10 of attempt 0, 11..30 of attempt 1
    assert top.median_start_lag_s == pytest.approx(0.0, abs=1e-9)
    # the wasted 10 s steps of attempt 0 do not make process 3 a straggler
    by_proc = {h.process: h for h in s.slowest}
    assert len(s.slowest) == 5
    assert all(h.ratio == pytest.approx(1.0) for h in s.slowest[1:])
    assert WASTEFUL not in by_proc or by_proc[WASTEFUL].median_step_time_s == pytest.approx(1.0)
    # the late host is not slow, but starts 0.2 s after the median host
    spans = read_run_dir(run_dir).jobs["job"]
    full = straggler_report(build_attempts(spans), [10, None], top=HOSTS)
    late = next(h for h in full.slowest if h.process == LATE)
    assert late.ratio == pytest.approx(1.0)
    assert late.median_start_lag_s == pytest.approx(0.2)
    assert [h.process for h in full.slowest[1:]] == [p for p in range(HOSTS) if p != SLOW]


def test_a_slow_host_changes_the_report_not_the_buckets(run_dir, tmp_path):
    (even,) = report_run_dir(_write(tmp_path / "even", slow=1.0))
    (r,) = report_run_dir(run_dir)
    assert even.stragglers.max_ratio == pytest.approx(1.0)
    assert r.buckets_ns == even.buckets_ns and r.goodput == even.goodput
    # the primary process alone: nothing to compare
    (tmp_path / "alone").mkdir()
    for f in run_dir.glob("spans-p00000-*.jsonl"):
        shutil.copy(f, tmp_path / "alone" / f.name)
    (alone,) = report_run_dir(tmp_path / "alone")
    assert alone.stragglers is None


def test_json_and_table_from_the_cli(run_dir):
    p = goodput("report", run_dir, "--format", "json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)["jobs"][0]["stragglers"]
    assert s["hosts"] == HOSTS and s["max_ratio"] == pytest.approx(1.5)
    assert s["slowest"][0] == {"host": "host5", "process": SLOW, "steps": 30,
                               "median_step_time_s": pytest.approx(1.5),
                               "ratio": pytest.approx(1.5),
                               "median_start_lag_s": pytest.approx(0.0, abs=1e-9)}
    assert len(s["slowest"]) == 5
    t = goodput("report", run_dir)
    assert t.returncode == 0, t.stderr
    assert "stragglers: 8 hosts, median step time 1.00 s; slowest:" in t.stdout
    assert "host5 (process 5): 1.50x, 1.50 s over 30 steps" in t.stdout


def test_single_process_job_has_no_straggler_report(tmp_path):
    _process(0, 0, 1, 5, 0).job_end(20).write(tmp_path)
    p = goodput("report", tmp_path, "--format", "json")
    assert json.loads(p.stdout)["jobs"][0]["stragglers"] is None
    assert "stragglers" not in goodput("report", tmp_path).stdout
    reader = InMemoryMetricReader()
    GoodputMetrics(lambda: [read_run_dir(tmp_path).jobs["job"]],
                   MeterProvider(metric_readers=[reader]))
    pts, units = reader_points(reader)
    assert "goodput.goodput" in units and "goodput.straggler.step_time_ratio" not in units


def test_gauge_lists_the_slowest_hosts(run_dir):
    reader = InMemoryMetricReader()
    GoodputMetrics(lambda: [read_run_dir(run_dir).jobs["job"]],
                   MeterProvider(metric_readers=[reader]))
    pts, units = reader_points(reader)
    assert units["goodput.straggler.step_time_ratio"] == "1"
    got = {dict(a)["goodput.straggler.rank"]: (dict(a)[schema.RES_HOST_NAME],
                                               dict(a)[schema.RES_PROCESS_INDEX], v)
           for (name, a), v in pts.items() if name == "goodput.straggler.step_time_ratio"}
    assert sorted(got) == [1, 2, 3, 4, 5]
    assert got[1][:2] == ("host5", SLOW) and got[1][2] == pytest.approx(1.5)
    assert all(v == pytest.approx(1.0) for _, _, v in list(got.values())[1:])
    assert all(dict(a)[schema.RES_JOB_NAME] == "job" for (n, a) in pts
               if n == "goodput.straggler.step_time_ratio")


def _synthetic_job(hosts, steps, slow, seed=0):
    """A job of ``hosts`` processes in memory (rows as the reader makes them)."""
    rng = np.random.default_rng(seed)
    job = JobSpans("big")
    step_ns = 1_000_000_000
    for p in range(hosts):
        d = np.full((steps + 1, NCOLS), NONE, np.int64)
        d[:, 5:8] = (0, -1, 0)  # flags, sidx, tidx
        d[0, [C_START, C_END, C_KIND]] = (0, 0, K_JOB_START)
        n = np.arange(1, steps + 1)
        dur = (step_ns * rng.uniform(0.98, 1.02, steps)).astype(np.int64)
        if p == slow:
            dur = dur * 13 // 10
        d[1:, C_START] = (n - 1) * 2 * step_ns
        d[1:, C_END] = d[1:, C_START] + dur
        d[1:, C_KIND], d[1:, C_IVAL] = K_STEP, n
        d[:, C_SID] = np.arange(steps + 1) + p * (steps + 1)
        job.processes[(0, p, "")] = ProcessSpans("big", 0, p, f"h{p}", hosts, "1", d)
    return job


def test_4096_hosts_vectorised():
    job = _synthetic_job(4096, 40, slow=2345)
    r = account(job, now_ns=10**18)
    s = r.stragglers
    assert s.hosts == 4096
    assert (s.slowest[0].host, s.slowest[0].process) == ("h2345", 2345)
    assert s.slowest[0].ratio == pytest.approx(1.3, rel=0.03)
    assert all(h.ratio < 1.03 for h in s.slowest[1:])
    assert s.median_step_time_s == pytest.approx(1.0, rel=0.01)


def test_bad_arguments(run_dir):
    attempts = build_attempts(read_run_dir(run_dir).jobs["job"])
    with pytest.raises(ValueError, match="top must be >= 1"):
        straggler_report(attempts, [10, None], top=0)
    with pytest.raises(ValueError, match="1 bounds for 2 attempts"):
        straggler_report(attempts, [None])
