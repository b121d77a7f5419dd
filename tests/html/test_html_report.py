"""The HTML report (docs/html-report.md): painted segments, CLI, serve, and a real browser.

The browser test reads the real crash-and-restart run that
tests/end_to_end/test_example_crash_restart.py checks (run once per session, tests/conftest.py),
writes its HTML report, opens it in headless
Chromium (Debian's ``chromium``, driven by Playwright), checks there are no script errors
and that the charts are drawn, zooms the timeline down to single steps, and keeps the
screenshots under ``test-artifacts/html-report/`` in the repository root (git-ignored).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from crash_run import CKPT_EVERY
from hypothesis import given, settings
from hypothesis import strategies as st
from otlp_fixtures import T0_NS, Timeline
from timeline_cases import timelines, worked_example

from goodput import schema
from goodput_processor import read_run_dir
from goodput_processor.cli import main
from goodput_processor.html import bucket_segments, render_html, report_html
from goodput_processor.html.data import over_time

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "html-report"
NS = 1_000_000_000
NOW = T0_NS + 10**6 * NS
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def _job(tmp_path, *tls):
    for tl in tls:
        tl.write(tmp_path)
    (job,) = read_run_dir(tmp_path).jobs.values()
    return job


def _totals(segs) -> dict:
    tot = np.zeros(len(segs.names), np.int64)
    for row in segs.primary_rows():
        np.add.at(tot, row.bucket.astype(np.int64), np.diff(row.bounds_ns))
    return dict(zip(segs.names, tot.tolist(), strict=True))


def _check_rows(segs) -> None:
    r = segs.result
    prim = segs.primary_rows()
    assert len(prim) == len(r.attempts)
    for row, a in zip(prim, r.attempts, strict=True):
        assert row.bounds_ns[0] == a.start_ns
        assert (np.diff(row.bounds_ns) > 0).all()
        same = (row.bucket[1:] == row.bucket[:-1]) & (row.step[1:] == row.step[:-1])
        assert not same.any()  # merged
    ends = [row.bounds_ns[-1] for row in prim]
    assert ends[:-1] == [a.start_ns for a in r.attempts[1:]]  # gaps included, contiguous
    assert ends[-1] == r.end_ns


def test_worked_example_segments(tmp_path):
    """docs/accounting.md's example: buckets per instant sum to the report's, exactly;
    each slow step is productive for the ideal 2 min, then slowdown for 1 min."""
    segs = bucket_segments(_job(tmp_path, *worked_example()), 120, NOW)
    assert _totals(segs) == segs.result.buckets_ns
    _check_rows(segs)
    row = segs.primary_rows()[1]
    code = {n: i for i, n in enumerate(segs.names)}
    at = np.flatnonzero(row.step == 51)
    assert [segs.names[k] for k in row.bucket[at]] == ["productive", "training_slowdown"]
    assert np.diff(row.bounds_ns)[at].tolist() == [120 * NS, 60 * NS]
    gap = segs.primary_rows()[0]
    assert gap.bucket[-1] == code["infrastructure_recovery"] and gap.step[-1] == -1
    wasted = gap.step[gap.bucket == code["wasted_progress"]]
    assert wasted.tolist() == list(range(51, 71))  # one segment per thrown-away step


@settings(max_examples=40, deadline=None)
@given(tls=timelines(), ideal=st.sampled_from([None, 0.5, 2.0]))
def test_segments_sum_to_buckets(tmp_path_factory, tls, ideal):
    """Any timeline: per bucket the painted time equals the report's (slowdown to 1 ns per
    anomalous step), rows are contiguous and merged, over-time ends at the totals."""
    segs = bucket_segments(_job(tmp_path_factory.mktemp("seg"), *tls), ideal, NOW)
    got, want = _totals(segs), segs.result.buckets_ns
    slack = segs.result.step_time.anomalous_steps
    for name in want:
        assert abs(got[name] - want[name]) <= slack, (name, got, want)
    _check_rows(segs)
    ot = over_time(segs, windows_s=(1.0,))
    for name in ot["names"]:
        assert ot["cumulative"][name][-1] == pytest.approx(
            100 * want[name] / segs.result.total_ns, abs=1e-3 + 100 * slack / want[name])


def test_other_processes_get_thin_rows(tmp_path):
    """On request, the other processes' rows, painted by the same rules (not accounted)."""
    p1 = Timeline(process=1, count=3).job_start(1)
    p1.steps(1, 10, start=2, step_time=1).job_end(12)
    p2 = Timeline(process=2, count=3).job_start(0)
    p2.steps(1, 10, start=2, step_time=2).job_end(25, reason="sigterm")
    segs = bucket_segments(_job(tmp_path, p1, p2), 1, NOW, max_process_rows=8)
    assert [(r.attempt, r.process, r.primary) for r in segs.rows] == [(0, 1, True),
                                                                     (0, 2, False)]
    other = segs.rows[1]
    steps = other.step[other.bucket == segs.names.index(schema.PRODUCTIVE)]
    assert steps.tolist() == list(range(1, 11))
    assert _totals(segs) == segs.result.buckets_ns


def test_page_is_self_contained(tmp_path):
    tl = Timeline(job="a</script><!--GP:META-->").job_start(0).custom("eval", 0, 1)
    tl.steps(1, 20, start=1, step_time=1).job_end(22)
    html = render_html([_job(tmp_path, tl)], now_ns=NOW)
    low = html.lower()
    assert "<script src" not in low and "<link" not in low and "@import" not in low
    assert low.count("</script>") == low.count("<script")  # the job name is escaped
    assert "Summary" in html and "custom:eval" in html and "a&lt;/script&gt;" in html
    meta = html.split('id="gp-meta">', 1)[1].split("</script>", 1)[0]
    (job,) = json.loads(meta)
    assert job["job"] == "a</script><!--GP:META-->" and job["figures"]["histogram"]
    assert job["present"][0] == schema.PRODUCTIVE and len(job["rows"]) == 1


def test_cli_html(tmp_path, capsys):
    tl = Timeline().job_start(0).steps(1, 10, start=1, step_time=1).job_end(12)
    tl.write(tmp_path / "run")
    out = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "run"), "--html", str(out), "--format", "json"]) == 0
    cap = capsys.readouterr()
    assert json.loads(cap.out)["jobs"][0]["step_time"]["count"] == 10
    assert str(out) in cap.err and out.read_text().startswith("<!DOCTYPE html>")
    assert main(["report", str(tmp_path / "run"), "--html", str(out), "--definitions",
                 "mgm"]) == 2
    assert "--html needs" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "run"), "--html", str(tmp_path / "no/such.html")]) == 2
    assert "no/such.html" in capsys.readouterr().err


def test_serve_report_html(tmp_path):
    pytest.importorskip("grpc")
    from goodput_processor.serve.server import GoodputServer

    tl = Timeline(job="live").job_start(0).steps(1, 10, start=1, step_time=1).job_end(12)
    tl.write(tmp_path / "run")
    srv = GoodputServer(grpc_port=None, http_port=0, spool_dirs=[tmp_path / "run"])
    try:
        url = srv.addresses()["http"] + "/v1/report.html"
        for q in ("", "?job=live"):
            with urllib.request.urlopen(url + q, timeout=30) as r:
                assert r.headers["Content-Type"].startswith("text/html")
                assert "Job live" in r.read().decode()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "?job=nope", timeout=30)
        assert e.value.code == 404
    finally:
        srv.stop(5)


def test_file_size_bound_1e5_steps(tmp_path):
    """The 10^5-step synthetic job (benchmarks/synth.py) gives a page under 3 MB."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import synth

    synth.write_job(str(tmp_path / "run"), 100_000)
    out = tmp_path / "r.html"
    (r,) = report_html(tmp_path / "run", out)
    assert r.step_time.count == 100_000
    assert out.stat().st_size < 3_000_000


# ---- the real example in a real browser ------------------------------------------------

_BROWSER = importlib.util.find_spec("playwright") is not None and os.path.exists(CHROMIUM)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "src"), str(REPO / "collectors")] + ([env["PYTHONPATH"]]
                                                          if env.get("PYTHONPATH") else []))
    return env


@pytest.fixture(scope="module")
def crash_report(tmp_path_factory, crash_restart_truth: dict) -> Path:
    """The HTML report of a real SIGKILL-and-restart PyTorch run (examples/crash_restart.py,
    run once per session by tests/conftest.py and shared with test_example_crash_restart)."""
    out = tmp_path_factory.mktemp("crash-html") / "report.html"
    rep = subprocess.run([sys.executable, "-m", "goodput_processor.cli", "report",
                          crash_restart_truth["run_dir"], "--html", str(out)],
                         cwd=REPO, env=_env(), capture_output=True, text=True, timeout=60,
                         check=False)
    assert rep.returncode == 0, rep.stderr
    assert str(out) in rep.stderr and "wasted_progress" in rep.stdout
    return out


needs_browser = pytest.mark.skipif(
    not _BROWSER, reason="needs playwright and Chromium (apt-get install chromium; "
    "pip install playwright)")


def launch(p):
    """Debian's headless Chromium through Playwright (no browser download)."""
    return p.chromium.launch(executable_path=CHROMIUM,
                             args=["--headless", "--no-sandbox", "--disable-gpu"])


def open_report(browser, path: Path):
    """A fresh page on the report, network blocked, waited until drawn (bounded); returns
    (page, errors), errors collecting page errors and console errors and warnings."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.route("**/*", lambda route: route.abort()
               if route.request.url.startswith("http") else route.continue_())
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-gp-ready], body[data-gp-error]", timeout=120_000)
    assert page.get_attribute("body", "data-gp-error") is None, errors
    return page, errors


def draw_seconds(page) -> float:
    """Navigation start to every chart drawn (the page's ``gp-charts-drawn`` mark), s."""
    return page.evaluate("() => performance.getEntriesByName('gp-charts-drawn')[0]"
                         ".startTime") / 1e3


def page_height(page) -> int:
    return page.evaluate("() => document.documentElement.scrollHeight")


def _timeline_xy(page, x, y) -> tuple[float, float]:
    """Viewport pixel of data point (x s, y lane units) on the timeline."""
    page.locator("#gp-timeline-0").scroll_into_view_if_needed()
    return tuple(page.evaluate("""([x, y]) => {
        const gd = document.getElementById('gp-timeline-0'), fl = gd._fullLayout;
        const r = gd.getBoundingClientRect();
        return [r.left + fl.xaxis._offset + fl.xaxis.l2p(x),
                r.top + fl.yaxis._offset + fl.yaxis.l2p(y)]; }""", [x, y]))


def zoom_timeline(page, t0: float, t1: float) -> None:
    page.evaluate("""async ([a, b]) => {
        const gd = document.getElementById('gp-timeline-0');
        await Plotly.relayout(gd, {'xaxis.range': [a, b]});
        await gd.gpDrawn; }""", [t0, t1])


def hover_restart(page, i: int) -> str:
    """Zoom to attempt ``i``'s start, hover its restart marker, return the hover's text."""
    a = page.evaluate(f"() => JSON.parse(document.getElementById('gp-meta').textContent)[0]"
                      f".attempts[{i}]")
    width = max(a["t1"] - a["t0"], 1.0)
    zoom_timeline(page, a["t0"] - width, a["t0"] + width)
    marker_y = page.evaluate("() => document.getElementById('gp-timeline-0').data"
                             ".find(t => t.name === 'restart').y[0]")
    page.mouse.move(*_timeline_xy(page, a["t0"], marker_y))
    page.wait_for_selector(".hoverlayer .hovertext", timeout=10_000)
    return page.evaluate("""() => { const h = document.querySelector('.hoverlayer .hovertext');
        const lines = Array.from(h.querySelectorAll('tspan.line'));
        return lines.length ? lines.map(t => t.textContent).join('\\n') : h.textContent; }""")


def strip_tip(page, x: float) -> str:
    """Hover the processes' heat strip at ``x`` s (its middle row); the tooltip's text."""
    y = page.evaluate("() => { const fl = document.getElementById('gp-timeline-0')"
                      "._fullLayout; return fl.yaxis.range[0] + 2.5; }")
    page.mouse.move(*_timeline_xy(page, x, y))
    page.wait_for_selector(".gp-tip", state="visible", timeout=10_000)
    return page.inner_text(".gp-tip")


def click_attempt(page, i: int) -> str:
    """Click attempt ``i`` on the job's lane; the expansion's info line once drawn."""
    a = page.evaluate(f"() => JSON.parse(document.getElementById('gp-meta').textContent)[0]"
                      f".attempts[{i}]")
    zoom_timeline(page, a["t0"], a["t1"])
    xy = _timeline_xy(page, (a["t0"] + a["t1"]) / 2, 0)
    page.mouse.move(*xy)  # Plotly clicks what it hovers
    page.wait_for_selector(".hoverlayer .hovertext", timeout=10_000)
    page.mouse.click(*xy)
    page.wait_for_selector("#gp-procbox-0:not([hidden])", timeout=10_000)
    page.wait_for_function("() => (document.getElementById('gp-procs-0').layout || {}).images",
                           timeout=10_000)
    return page.inner_text("#gp-procs-info-0")


@needs_browser
def test_crash_restart_report_in_chromium(crash_report):
    """The small job's page: under 1.5 MB, every chart drawn, the restart marker's hover,
    the single process expanded, then zoomed down to single steps."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    size = crash_report.stat().st_size
    assert size < 1_500_000, size
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page, errors = open_report(browser, crash_report)
            charts = page.evaluate("""() => Object.fromEntries(
                Array.from(document.querySelectorAll('.gp-chart')).map(d => [d.dataset.chart,
                  (d.data || []).reduce((n, t) => n + (t.x ? t.x.length : 0), 0)]))""")
            assert set(charts) == {"timeline", "goodput", "buckets", "steptime", "histogram",
                                   "procs"}
            assert charts.pop("procs") == 0  # not expanded yet
            assert all(n > 0 for n in charts.values()), charts
            names = page.evaluate("() => document.getElementById('gp-timeline-0').data"
                                  ".map(t => t.name)")
            assert {"productive", "wasted_progress", "infrastructure_recovery",
                    "checkpoint_restore", "custom:eval", "restart"} <= set(names)
            assert page.locator(".js-plotly-plot .bars .point").count() > 100  # drawn bars
            summary = page.inner_text("table.summary")
            assert "wasted_progress" in summary and "total" in summary
            assert "killed" in page.inner_text("table.attempts")
            print(f"crash-restart page: {size / 1e6:.2f} MB, drawn in "
                  f"{draw_seconds(page):.2f} s, {page_height(page)} px")
            page.screenshot(path=str(ARTIFACTS / "crash-restart.png"), full_page=True)
            hover = hover_restart(page, 1)
            assert "restart: attempt 0 \u2192 attempt 1" in hover, hover
            assert "ended killed" in hover and f"resumes at step {CKPT_EVERY}" in hover, hover
            info = click_attempt(page, 0)
            assert "Attempt 0" in info and "all 1 processes" in info, info
            # zoom the timeline to 0.3 s near the end: single steps, with hover text
            texts = page.evaluate("""async () => {
                const gd = document.getElementById('gp-timeline-0');
                const meta = JSON.parse(document.getElementById('gp-meta').textContent)[0];
                const t0 = meta.total_s - 1.3;  // the second attempt's last steps
                await Plotly.relayout(gd, {'xaxis.range': [t0, t0 + 0.3]});
                await new Promise(r => setTimeout(r, 100));
                return gd.data.filter(t => t.type === 'bar').flatMap(t => t.hovertext); }""")
            assert any("step time" in t for t in texts), texts[:5]
            page.locator("#gp-timeline-0").screenshot(
                path=str(ARTIFACTS / "crash-restart-zoomed.png"))
        finally:
            browser.close()
    assert not errors, errors
    print(f"screenshots in {ARTIFACTS}")
