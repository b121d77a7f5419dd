"""HTML report (`goodput report --html`): file size, height and draw time in Chromium.

Two kinds of job:

- steps: synthetic jobs of 10^4, 10^5 and 10^6 steps (benchmarks/synth.py: one process, 3
  restarts, a data loading span per step, checkpoints, evals), through the spool reader;
- fleets: a 68-attempt x 112-process job and a 10^3 x 10^4 one (benchmarks/html_jobs.py,
  built in memory; the 10^7 processes of the second given as arrays).

For each it measures:

- ``write s``: wall time of writing the page (steps: :func:`report_html`, read the run
  directory included; fleets: :func:`render_html` of the accounted job);
- ``size MB``: the HTML file (Plotly's basic bundle, 1.19 MB, included);
- ``draw s``: headless Chromium, from navigation start to every chart drawn (the page's
  ``gp-charts-drawn`` performance mark), median of ``--repeat`` fresh pages;
- ``px``: the page's height before any expansion (viewport 1400 x 900);
- ``zoom ms``: redrawing the timeline for a new range (the whole job, then 1/1000 of it,
  then ~4 s), the slowest of the three;
- ``expand ms``: expanding an attempt's processes (click to chart drawn).

    python benchmarks/bench_html.py [--sizes 10000 100000 1000000] [--fleets] [--repeat 3]
        [--screenshots docs/img] [--chromium PATH]

Needs playwright (Python) and Chromium (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import html_jobs  # noqa: E402
import synth  # noqa: E402

from goodput_processor.html import bucket_segments, render_html, report_html  # noqa: E402

_ZOOM = """async () => {
  const gd = document.getElementById('gp-timeline-0');
  const total = JSON.parse(document.getElementById('gp-meta').textContent)[0].total_s;
  let worst = 0;
  for (const r of [[0, total], [total / 2, total / 2 + total / 1000], [total / 2,
                   total / 2 + 4]]) {
    const t0 = performance.now();
    await Plotly.relayout(gd, {'xaxis.range': r});
    await gd.gpDrawn;
    await new Promise(res => requestAnimationFrame(() => res()));
    worst = Math.max(worst, performance.now() - t0);
  }
  return worst;
}"""


def measure(browser, path: str, shots: tuple[Path, Path] | None = None) -> dict:
    """Draw time, height, zoom and expansion of one page (a fresh browser page)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(Path(path).as_uri())
        page.wait_for_selector("body[data-gp-ready], body[data-gp-error]", timeout=120_000)
        if errors or page.get_attribute("body", "data-gp-error"):
            raise SystemExit(f"page errors: {errors}")
        out = {"draw": page.evaluate("() => performance.getEntriesByName('gp-charts-drawn')"
                                     "[0].startTime") / 1e3,
               "px": page.evaluate("() => document.documentElement.scrollHeight")}
        if shots:
            page.screenshot(path=str(shots[0]), full_page=True)
        if shots:  # the expansion shown: start lag, of the first attempt with a late process
            page.click("#gp-heatctl-0 button[data-mode=lag]")
            late = page.evaluate("() => JSON.parse(document.getElementById('gp-meta')"
                                 ".textContent)[0].attempts.findIndex(a => a.late !== '-')")
            page.select_option("#gp-expand-sel-0", str(max(late, 0)))
        t0 = time.perf_counter()
        page.click("#gp-expand-btn-0")
        page.wait_for_function("() => (document.getElementById('gp-procs-0').layout || {})"
                               ".images", timeout=60_000)
        out["expand"] = (time.perf_counter() - t0) * 1e3
        if shots:
            page.locator("#gp-procbox-0").screenshot(path=str(shots[1]))
        page.click("#gp-collapse-btn-0")
        out["zoom"] = page.evaluate(_ZOOM)
        return out
    finally:
        page.close()


def _row(name, write_s, path, runs) -> None:
    print(f"{name:>14} {write_s:>8.2f} {os.path.getsize(path) / 1e6:>8.2f} "
          f"{statistics.median(r['draw'] for r in runs):>7.2f} {runs[0]['px']:>6} "
          f"{max(r['zoom'] for r in runs):>8.0f} {max(r['expand'] for r in runs):>9.0f}",
          flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--fleets", action="store_true", help="also the 68x112 and 10^3x10^4 jobs")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--screenshots", type=Path, help="write the fleets' screenshots here")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    print(f"{'job':>14} {'write s':>8} {'size MB':>8} {'draw s':>7} {'px':>6} {'zoom ms':>8} "
          f"{'expand ms':>9}")
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium,
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])
        for n in args.sizes:
            run_dir, out = os.path.join(tmp, f"run{n}"), os.path.join(tmp, f"r{n}.html")
            synth.write_job(run_dir, n)
            t0 = time.perf_counter()
            report_html(run_dir, out)
            write_s = time.perf_counter() - t0
            _row(f"{n} steps", write_s, out, [measure(browser, out)
                                             for _ in range(args.repeat)])
        fleets = [("68x112", lambda: bucket_segments(html_jobs.fleet_job())),
                  ("1000x10000", html_jobs.big_job)] if args.fleets else []
        for name, build in fleets:
            segs, out = build(), os.path.join(tmp, f"{name}.html")
            t0 = time.perf_counter()
            render_html([segs], out)
            write_s = time.perf_counter() - t0
            shots = None
            if args.screenshots:
                args.screenshots.mkdir(parents=True, exist_ok=True)
                shots = (args.screenshots / f"html-report-{name}.png",
                         args.screenshots / f"html-report-{name}-procs.png")
            runs = [measure(browser, out, shots if i == 0 else None)
                    for i in range(args.repeat)]
            _row(name, write_s, out, runs)
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
