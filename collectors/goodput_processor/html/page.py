"""The HTML around the charts: per-job summary and metadata tables, and the whole page."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from html import escape
from importlib import resources

from goodput import schema

from ..report import JobResult, format_duration
from .data import bucket_color, histogram_figure, over_time, over_time_figures, pack_job
from .segments import JobSegments

__all__ = ["job_section", "page"]


def _utc(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _table(rows, head=None, cls="kv") -> str:
    out = [f'<table class="{cls}">']
    if head:
        out.append("<thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head)
                   + "</tr></thead>")
    out.append("<tbody>")
    for row in rows:
        attrs = ""
        if isinstance(row, dict):
            attrs, row = f' class="{row["cls"]}"', row["cells"]
        out.append(f"<tr{attrs}>" + "".join(f"<td>{escape(str(c))}</td>" for c in row)
                   + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _summary(r: JobResult, names) -> str:
    """The terminal report's bucket table: bucket, seconds, duration, %."""
    rows = []
    total = r.total_time_s
    for name in names:
        sec = r.buckets_ns[name] / 1e9
        pct = 100 * sec / total if total else 0.0
        swatch = f'<span class="sw" style="background:{bucket_color(name, names)}"></span>'
        cls = "good" if name == schema.PRODUCTIVE else ("zero" if sec == 0 else "")
        rows.append(f'<tr class="{cls}"><td>{swatch}{escape(name)}</td><td>{sec:.6f}</td>'
                    f"<td>{escape(format_duration(sec))}</td><td>{pct:.2f}</td></tr>")
    rows.append(f'<tr class="total"><td>total</td><td>{total:.6f}</td>'
                f"<td>{escape(format_duration(total))}</td><td>100.00</td></tr>")
    return ('<table class="summary"><thead><tr><th>bucket</th><th>seconds</th><th>duration'
            "</th><th>%</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:.2f} %"


def _metadata(r: JobResult) -> str:
    st = r.step_time
    ideal = "-" if r.ideal_step_time_s is None else \
        f"{format_duration(r.ideal_step_time_s)} ({r.ideal_step_time_source})"
    hosts = sorted({h for a in r.attempts for h in a.hosts})
    skipped = {k: v for k, v in r.skipped.items() if v}
    rows = [
        ("job", r.job), ("schema version", r.schema_version or "-"),
        ("start", _utc(r.start_ns)), ("end", _utc(r.end_ns)),
        ("total time", format_duration(r.total_time_s)), ("goodput", _pct(r.goodput)),
        ("attempts", len(r.attempts)), ("disruptions", r.disruptions),
        ("hosts", ", ".join(hosts) or "-"),
        ("processes", max((a.processes for a in r.attempts), default=0)),
        ("max productive step", "-" if r.max_productive_step is None
         else r.max_productive_step),
        ("ideal step time", ideal),
        ("noise tolerance", format_duration(r.noise_tolerance_s)),
        ("kept steps", st.count),
        ("step time p50 / p90 / p99 / max", " / ".join(
            format_duration(x) for x in (st.p50_s, st.p90_s, st.p99_s, st.max_s))),
        ("anomalous steps", st.anomalous_steps),
        ("skipped records", ", ".join(f"{k} {v}" for k, v in skipped.items()) or "none"),
        ("recorder errors / dropped", f"{r.recorder_errors} / {r.recorder_dropped}"),
        ("spans with error status", sum(a.error_spans for a in r.attempts)),
    ]
    if r.async_work_s:
        rows.append(("asynchronous work (not badput)", ", ".join(
            f"{k} {format_duration(v)}" for k, v in r.async_work_s.items())))
    if r.mfu is not None:
        rows += [("MFU in productive time", _pct(r.mfu)),
                 ("useful compute (goodput × MFU)", _pct(r.useful_compute))]
    rows += [(f"run: {k}", v) for k, v in r.run.items()]
    out = _table(rows)
    if r.skipped_examples:
        out += "<details><summary>skipped record examples</summary><pre>" + escape(
            "\n".join(r.skipped_examples)) + "</pre></details>"
    return out


def _attempts(r: JobResult) -> str:
    head = ("attempt", "start", "duration", "end", "processes", "primary", "hosts", "resume",
            "kept", "wasted", "error spans", "recorder err/drop")
    rows = []
    for a in r.attempts:
        procs = str(a.processes) + ("" if a.declared_processes is None
                                    else f"/{a.declared_processes}")
        rows.append((f"attempt {a.attempt}",
                     "+" + format_duration((a.start_ns - r.start_ns) / 1e9),
                     format_duration(a.duration_s), a.end_reason + (" (cut)" if a.cut else ""),
                     procs, f"p{a.primary_process}", ", ".join(a.hosts) or "-",
                     "-" if a.resume_step is None else a.resume_step, a.steps_kept,
                     a.steps_wasted, a.error_spans,
                     f"{a.recorder_errors}/{a.recorder_dropped}"))
    return _table(rows, head, "attempts")


def job_section(i: int, js: JobSegments, windows_s=None) -> tuple[str, dict, bytes]:
    """One job's HTML section, its JSON metadata for ``report.js`` and its data blob."""
    r, names = js.result, js.names
    header, blob = pack_job(js)
    goodput_fig, buckets_fig = over_time_figures(over_time(js, windows_s), names)
    present = sorted({int(k) for row in js.rows for k in set(row.bucket.tolist())})
    meta = {
        "job": r.job, "total_s": r.total_ns / 1e9, "names": list(names),
        "present": [names[k] for k in present],
        "colors": {n: bucket_color(n, names) for n in names},
        "ideal_ms": None if r.ideal_step_time_s is None else r.ideal_step_time_s * 1e3,
        "tol_ms": None if r.noise_tolerance_s is None else r.noise_tolerance_s * 1e3,
        "start_utc": _utc(r.start_ns), **header,
        "figures": {"goodput": goodput_fig, "buckets": buckets_fig,
                    "histogram": histogram_figure(js)},
    }
    head = (f'<div class="kpis"><span class="kpi good">goodput {_pct(r.goodput)}</span>'
            f"<span class=\"kpi\">total {escape(format_duration(r.total_time_s))}</span>"
            f'<span class="kpi">{len(r.attempts)} attempt(s), {r.disruptions} disruption(s)'
            f"</span><span class=\"kpi\">{r.step_time.count} kept steps</span></div>")
    if r.mfu is not None:
        head += (f'<div class="kpis"><span class="kpi">MFU {_pct(r.mfu)}</span>'
                 f'<span class="kpi">useful compute {_pct(r.useful_compute)}</span></div>')
    if r.warnings:  # at the top: what the numbers below cannot be trusted for
        head += ('<div class="warnings"><strong>Warnings</strong><ul>' + "".join(
            f"<li><code>{escape(w.code)}</code> {escape(w.message)}</li>" for w in r.warnings)
            + "</ul></div>")
    charts = "".join(
        f'<div class="gp-chart" id="gp-{kind}-{i}" data-chart="{kind}" data-job="{i}"></div>'
        for kind in ("timeline", "goodput", "buckets", "steptime", "histogram"))
    html = (f'<section class="job" id="job-{i}"><h2>Job {escape(r.job)}</h2>{head}'
            f'<p class="hint">Timeline: drag to zoom into a range (double-click: whole job); '
            f"time is in seconds since the job's start ({escape(_utc(r.start_ns))}). Spans "
            "shorter than the screen can show are drawn as each bucket's share of their "
            "stretch; zoom in to see single steps.</p>"
            f'{charts}<div class="tables"><div><h3>Summary</h3>{_summary(r, names)}</div>'
            f"<div><h3>Job</h3>{_metadata(r)}</div></div>"
            f"<h3>Attempts</h3>{_attempts(r)}</section>")
    return html, meta, blob


def _json_script(obj) -> str:
    # no "<" at all inside the script element ("</script>", "<!--" in a job name)
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def page(sections: list[tuple[str, dict, bytes]], title: str) -> str:
    """The whole self-contained page (Plotly and ``report.js`` inlined)."""
    from plotly.offline import get_plotlyjs

    here = resources.files(__package__)
    template = here.joinpath("template.html").read_text(encoding="utf-8")
    nav = "".join(f'<a href="#job-{i}">{escape(m["job"])}</a>'
                  for i, (_, m, _) in enumerate(sections))
    blobs = "".join(
        f'<script type="application/octet-stream" id="gp-blob-{i}">'
        f"{base64.b64encode(b).decode('ascii')}</script>"
        for i, (_, _, b) in enumerate(sections))
    parts = {
        "TITLE": escape(title),
        "NAV": nav if len(sections) > 1 else "",
        "BODY": "".join(s for s, _, _ in sections) or "<p>No jobs.</p>",
        "META": _json_script([m for _, m, _ in sections]),
        "BLOBS": blobs,
        "PLOTLY": get_plotlyjs(),
        "APP": here.joinpath("report.js").read_text(encoding="utf-8"),
    }
    # one pass over the template: nothing inserted is searched again
    return re.sub(r"<!--GP:([A-Z]+)-->", lambda m: parts[m.group(1)], template)
