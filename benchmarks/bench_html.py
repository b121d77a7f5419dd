"""HTML report (`goodput report --html`): file size and render time in Chromium.

For synthetic jobs of 10^4, 10^5 and 10^6 steps (benchmarks/synth.py: 3 restarts, a data
loading span per step, checkpoints, evals) this writes the report and measures:

- ``write s``: wall time of :func:`goodput_processor.html.report_html` (read the run
  directory, account, paint, pack, write);
- ``size MB``: the HTML file (Plotly's ~4.8 MB included);
- ``render s``: headless Chromium, from navigation start to every chart drawn (the page's
  ``gp-charts-drawn`` performance mark), median of ``--repeat`` fresh pages;
- ``zoom ms``: redrawing the timeline for a new range (the whole job, then 1/1000 of it,
  then ~4 steps), the slowest of the three, as the page does on a zoom.

    python benchmarks/bench_html.py [--sizes 10000 100000 1000000] [--chromium PATH]

Needs plotly, playwright (Python) and Chromium (Debian: ``apt-get install chromium``).
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
import synth  # noqa: E402

from goodput_processor.html import report_html  # noqa: E402

_ZOOM = """async () => {
  const gd = document.getElementById('gp-timeline-0');
  const total = JSON.parse(document.getElementById('gp-meta').textContent)[0].total_s;
  let worst = 0;
  for (const r of [[0, total], [total / 2, total / 2 + total / 1000], [total / 2,
                   total / 2 + 2]]) {
    const t0 = performance.now();
    await Plotly.relayout(gd, {'xaxis.range': r});
    await new Promise(res => requestAnimationFrame(() => res()));
    worst = Math.max(worst, performance.now() - t0);
  }
  return worst;
}"""


def render(browser, path: str) -> tuple[float, float]:
    """(seconds from navigation start to charts drawn, slowest zoom redraw in ms)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(Path(path).as_uri())
        page.wait_for_selector("body[data-gp-ready], body[data-gp-error]", timeout=120_000)
        if errors or page.get_attribute("body", "data-gp-error"):
            raise SystemExit(f"page errors: {errors}")
        drawn = page.evaluate("() => performance.getEntriesByName('gp-charts-drawn')[0]"
                              ".startTime")
        return drawn / 1e3, page.evaluate(_ZOOM)
    finally:
        page.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    print(f"{'steps':>9} {'write s':>8} {'size MB':>8} {'render s':>9} {'zoom ms':>8}")
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium,
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])
        for n in args.sizes:
            run_dir, out = os.path.join(tmp, f"run{n}"), os.path.join(tmp, f"r{n}.html")
            synth.write_job(run_dir, n)
            t0 = time.perf_counter()
            report_html(run_dir, out)
            write_s = time.perf_counter() - t0
            runs = [render(browser, out) for _ in range(args.repeat)]
            print(f"{n:>9} {write_s:>8.2f} {os.path.getsize(out) / 1e6:>8.2f} "
                  f"{statistics.median(r[0] for r in runs):>9.2f} "
                  f"{max(r[1] for r in runs):>8.0f}", flush=True)
        browser.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
