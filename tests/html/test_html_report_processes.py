"""The HTML report's processes (docs/html-report.md): who was missing, late or gone early,
the heat strip's codes and cells, the expansion's choice of processes, and the blocks at
the top of a job (warnings grouped, recovery phases, hosts by badput, restart hover)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
from otlp_fixtures import T0_NS, Timeline

from goodput_processor import read_run_dir
from goodput_processor.html import bucket_segments, heat, render_html
from goodput_processor.html.fleet import format_ranks, process_lists
from goodput_processor.html.sections import (
    attempt_meta,
    host_badput_html,
    recovery_html,
    warnings_html,
)
from goodput_processor.model.warnings import ReportWarning

NS = 1_000_000_000
NOW = T0_NS + 10**6 * NS


def _four(tmp_path):
    """Attempt of 4 declared ranks over 100 s: p0 steps 1 s; p1 steps 1.5 s and falls silent
    at 50 s; p2 starts at 30 s and runs each step 30 s after p0; p3 never writes."""
    p0 = Timeline(process=0, count=4, host="h0").job_start(0)
    p0.steps(1, 90, start=5, step_time=1).job_end(100)
    p1 = Timeline(process=1, count=4, host="h1").job_start(0).steps(1, 30, start=5, step_time=1.5)
    p2 = Timeline(process=2, count=4, host="h2").job_start(30)
    p2.steps(1, 65, start=35, step_time=1).job_end(100)
    for tl in (p0, p1, p2):
        tl.write(tmp_path)
    (job,) = read_run_dir(tmp_path).jobs.values()
    return bucket_segments(job, None, NOW)


def test_missing_late_and_gone_early(tmp_path):
    segs = _four(tmp_path)
    f = segs.fleet
    assert f.p_rank.tolist() == [0, 1, 2] and f.hosts == ("h0", "h1", "h2")
    assert f.expected.tolist() == [4] and f.max_processes == 3
    assert np.bincount(f.s_rank).tolist() == [90, 30, 65]
    pl = process_lists(segs.result, f)
    assert pl.present == [3]
    assert (pl.missing[0].tolist(), pl.late[0].tolist(), pl.early[0].tolist()) == ([3], [2], [1])


def test_record_codes(tmp_path):
    """Step time 1.5x the ideal (1 s, p0's median) codes to 1 + 254 log2(1.5); p2, 30 s
    behind the median start of each step, saturates the lag code; p0 is at the ideal; a
    step no other process ran has no lag (code 0)."""
    segs = _four(tmp_path)
    f, r = segs.fleet, segs.result
    assert r.ideal_step_time_s == 1.0
    rc, lc = heat.record_codes(f, 1e9, np.array([a.start_ns for a in r.attempts]))
    assert set(rc[f.s_rank == 0].tolist()) == {1}
    assert set(rc[f.s_rank == 1].tolist()) == {1 + round(254 * math.log2(1.5))}
    assert set(lc[f.s_rank == 2].tolist()) == {255}
    p0 = f.s_rank == 0
    assert set(lc[p0 & (f.s_step <= 65)].tolist()) == {1}  # ahead of the median: no lag
    assert set(lc[p0 & (f.s_step > 65)].tolist()) == {0}  # no other process ran these


def test_strip_and_expansion_cells(tmp_path):
    segs = _four(tmp_path)
    head, arr = heat.heat_arrays(segs.result, segs.fleet)
    assert (head["ranks"], head["rows"], head["bins"]) == (3, 3, heat.STRIP_BINS)
    hr = arr["hr"].reshape(3, -1)
    slow = 1 + round(254 * math.log2(1.5))
    assert hr[1].max() == slow and set(arr["hrr"].reshape(3, -1)[1][hr[1] > 0]) == {1}
    assert set(arr["hrh"].reshape(3, -1)[1][hr[1] > 0]) == {1}  # host index of "h1"
    # p1 ran from 5 s to 50 s of a 100 s job: that share of the bins, and no more
    assert abs((hr[1] > 0).mean() - 0.45) < 0.01
    assert arr["hl"].reshape(3, -1)[2].max() == 255
    assert head["expand"]["attempts"] == [[0, 3, 3]]
    nb = head["expand"]["bins"]
    assert nb == 240 and arr["er"].shape == (3 * nb,) and arr["ek"].tolist() == [0, 1, 2]


def test_expansion_keeps_the_worst_processes(tmp_path, monkeypatch):
    """Past EXPAND_ROWS processes an attempt keeps those with the highest codes, by rank."""
    monkeypatch.setattr(heat, "EXPAND_ROWS", 2)
    segs = _four(tmp_path)
    head, arr = heat.heat_arrays(segs.result, segs.fleet)
    assert head["expand"]["attempts"] == [[0, 2, 3]]
    assert arr["ek"].tolist() == [1, 2] and arr["eh"].tolist() == [1, 2]


def test_format_ranks():
    assert format_ranks([]) == "-"
    assert format_ranks([1, 3, 4, 5, 9]) == "p1, p3\u2013p5, p9"
    assert format_ranks(list(range(0, 40, 2)), limit=3) == "p0, p2, p4, \u2026 (+17 more)"


def _result(tmp_path):
    a0 = Timeline(attempt=0).job_start(0).steps(1, 10, start=1, step_time=1)
    a1 = Timeline(attempt=1).job_start(20).restore(20, 21, 10).steps(11, 20, start=21,
                                                                      step_time=1)
    a1.job_end(32)
    for tl in (a0, a1):
        tl.write(tmp_path)
    (job,) = read_run_dir(tmp_path).jobs.values()
    return bucket_segments(job, None, NOW)


def test_recovery_hosts_and_restart_hover(tmp_path):
    """Recovery entries and host badput given as namespaces and dicts (the shapes
    JobResult.recovery / host_badput take); None phases are unknown, not zero."""
    segs = _result(tmp_path)
    r = segs.result
    failure = SimpleNamespace(process=3, host="h3", how="signal", at_ns=r.start_ns + 11 * NS)
    rec = (SimpleNamespace(attempt=r.attempts[0].attempt, first_failure=failure,
                           phases={"detection": 1.5, "termination": None, "rescheduling": 4.0,
                                   "restore": 1.0}),)
    hosts = ({"host": "h3", "process": 3, "slowdown_s": 2.0, "disruptions_caused": 1,
              "badput_s": 12.5},
             SimpleNamespace(host="h1", process=1, slowdown_s=0.5, disruptions_caused=0,
                             badput_s=0.5))
    fields = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
    r2 = SimpleNamespace(**{**fields, "recovery": rec, "host_badput": hosts})
    html = recovery_html(r2)
    assert "1 disruption(s)" in html and "detection" in html and "rendezvous_init" not in html
    assert "0/1" in html and "p3 h3 (signal) at +11.00 s" in html  # termination unknown
    hb = host_badput_html(r2)
    assert hb.index("h3") < hb.index("h1") and "12.50 s" in hb
    # charges on a last sign of life only: apart, after the observed ones, marked inferred
    inferred = (SimpleNamespace(host="h7", process=7, slowdown_s=0.0, disruptions_caused=2,
                                badput_s=40.0, evidence="inferred", badput_ns=40 * NS),)
    hb = host_badput_html(SimpleNamespace(**{**fields, "recovery": rec, "host_badput": hosts,
                                             "host_badput_inferred": inferred}))
    assert hb.index("h1") < hb.index("Charged on inference") < hb.index("h7")
    assert "<td>inferred</td>" in hb.split("Charged on inference")[1]
    meta = attempt_meta(r2, None)
    assert "hover" not in meta[0]
    hover = meta[1]["hover"]
    assert "restart: attempt 0 \u2192 attempt 1" in hover
    assert "first failure: p3 h3 (signal)" in hover
    assert "detection 1.50 s" in hover and "resumes at step 10" in hover
    # without the fields (a result from before them): no block, no failure line
    for k in ("recovery", "host_badput", "host_badput_inferred", "badput_charged"):
        fields.pop(k, None)
    bare = SimpleNamespace(**fields)
    assert recovery_html(bare) == "" and host_badput_html(bare) == ""
    assert "first failure" not in attempt_meta(bare, None)[1]["hover"]


def test_warnings_grouped_by_code(tmp_path):
    segs = _result(tmp_path)
    ws = tuple(ReportWarning("world_size_changed", f"attempt {i} runs {i} processes", i)
               for i in range(30)) + (ReportWarning("clock_jump", "clock <stepped>"),)
    r = dataclasses.replace(segs.result, warnings=ws)
    html = warnings_html(r)
    assert "Warnings (31)" in html and "\u00d730" in html and "\u00d71" in html
    assert html.count("<li>") == 2 + 31 and "clock &lt;stepped&gt;" in html
    page = render_html([dataclasses.replace(segs, result=r)])
    assert page.index("Warnings (31)") < page.index('id="gp-timeline-0"')  # at the top
