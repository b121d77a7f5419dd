"""The HTML around the charts: a job's section (top blocks, chart slots, tables) and the
whole page, with Plotly's basic bundle (``plotly-basic.min.js``: bar, scatter and pie
traces, 1.2 MB, MIT licence, vendored from the npm package ``plotly.js-basic-dist-min``,
v4.1.1, the plotly.js of plotly.py 7.1.0) and the scripts (``heat.js``, ``charts.js``,
``report.js``) inlined."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from html import escape
from importlib import resources

from goodput import schema

from ..results.job import JobResult
from ..results.table import format_duration
from .data import bucket_color, histogram_figure, lanes, pack_job, pick_windows
from .fleet import process_lists
from .sections import (
    attempt_meta,
    host_badput_html,
    process_lists_html,
    recovery_html,
    warnings_html,
)
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


def _hosts_text(hosts, limit: int = 6) -> str:
    if len(hosts) <= limit:
        return ", ".join(hosts) or "-"
    return f"{len(hosts)}: " + ", ".join(hosts[:limit]) + ", \u2026"


def _metadata(r: JobResult, fleet=None) -> str:
    st = r.step_time
    ideal = "-" if r.ideal_step_time_s is None else \
        f"{format_duration(r.ideal_step_time_s)} ({r.ideal_step_time_source})"
    hosts = sorted(fleet.hosts if fleet is not None and fleet.hosts
                   else {h for a in r.attempts for h in a.hosts})
    procs = fleet.max_processes if fleet is not None else \
        max((a.processes for a in r.attempts), default=0)
    skipped = {k: v for k, v in r.skipped.items() if v}
    rows = [
        ("job", r.job), ("schema version", r.schema_version or "-"),
        ("start", _utc(r.start_ns)), ("end", _utc(r.end_ns)),
        ("total time", format_duration(r.total_time_s)), ("goodput", _pct(r.goodput)),
        ("attempts", len(r.attempts)), ("disruptions", r.disruptions),
        ("hosts", _hosts_text(hosts)),
        ("processes (most in an attempt)", procs),
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


def _attempts(r: JobResult, pl=None) -> str:
    head = ("attempt", "start", "duration", "end", "processes", "primary", "hosts", "resume",
            "kept", "wasted", "error spans", "recorder err/drop")
    rows = []
    for i, a in enumerate(r.attempts):
        procs = str(a.processes if pl is None else pl.present[i]) + (
            "" if a.declared_processes is None else f"/{a.declared_processes}")
        hosts = a.hosts if len(a.hosts) <= 4 else (*a.hosts[:4], f"\u2026 ({len(a.hosts)})")
        rows.append((f"attempt {a.attempt}",
                     "+" + format_duration((a.start_ns - r.start_ns) / 1e9),
                     format_duration(a.duration_s), a.end_reason + (" (cut)" if a.cut else ""),
                     procs, f"p{a.primary_process}", ", ".join(hosts) or "-",
                     "-" if a.resume_step is None else a.resume_step, a.steps_kept,
                     a.steps_wasted, a.error_spans,
                     f"{a.recorder_errors}/{a.recorder_dropped}"))
    return _table(rows, head, "attempts")


def job_section(i: int, js: JobSegments, windows_s=None) -> tuple[str, dict, bytes]:
    """One job's HTML section, its JSON metadata for ``report.js`` and its data blob."""
    r, names = js.result, js.names
    header, blob = pack_job(js)
    pl = process_lists(r, js.fleet) if js.fleet is not None else None
    windows = list(windows_s) if windows_s is not None else pick_windows(r.total_ns / 1e9)
    present = sorted({int(k) for row in js.primary_rows() for k in set(row.bucket.tolist())})
    meta = {
        "job": r.job, "total_s": r.total_ns / 1e9, "names": list(names),
        "present": [names[k] for k in present],
        "lanes": lanes(names, {names[k] for k in present}),
        "colors": {n: bucket_color(n, names) for n in names},
        "ideal_ms": None if r.ideal_step_time_s is None else r.ideal_step_time_s * 1e3,
        "tol_ms": None if r.noise_tolerance_s is None else r.noise_tolerance_s * 1e3,
        "start_utc": _utc(r.start_ns), "attempts": attempt_meta(r, pl), **header,
        "windows": [{"s": w, "label": "rolling " + format_duration(w)} for w in windows],
        "figures": {"histogram": histogram_figure(js)},
    }
    procs = js.fleet.max_processes if js.fleet is not None else max(
        (a.processes for a in r.attempts), default=0)
    head = (f'<div class="kpis"><span class="kpi good">goodput {_pct(r.goodput)}</span>'
            f"<span class=\"kpi\">total {escape(format_duration(r.total_time_s))}</span>"
            f'<span class="kpi">{len(r.attempts)} attempt(s), {r.disruptions} disruption(s)'
            f'</span><span class="kpi">{r.step_time.count} kept steps</span>'
            f'<span class="kpi">{procs} process(es)</span></div>')
    if r.mfu is not None:
        head += (f'<div class="kpis"><span class="kpi">MFU {_pct(r.mfu)}</span>'
                 f'<span class="kpi">useful compute {_pct(r.useful_compute)}</span></div>')
    # at the top: what the numbers below cannot be trusted for, and where restarts went
    head += warnings_html(r)
    top = recovery_html(r) + host_badput_html(r)
    if top:
        head += f'<div class="top2">{top}</div>'
    chart = '<div class="gp-chart" id="gp-{0}-{1}" data-chart="{0}" data-job="{1}"></div>'
    heat_ctl = "" if header["heat"] is None else (
        f'<div class="heatctl" id="gp-heatctl-{i}">Processes\' heat strip: '
        f'<button type="button" data-mode="ratio" class="on">step time</button>'
        f'<button type="button" data-mode="lag">start lag</button>'
        '<span class="scale" id="gp-scale-' + str(i) + '"></span> '
        f'<label>Processes of <select id="gp-expand-sel-{i}"></select></label>'
        f'<button type="button" id="gp-expand-btn-{i}">expand</button>'
        f'<button type="button" id="gp-collapse-btn-{i}" hidden>collapse</button>'
        " (or click an attempt on the job's lane)</div>"
        f'<div class="gp-procs" id="gp-procbox-{i}" hidden><p class="hint" '
        f'id="gp-procs-info-{i}"></p>{chart.format("procs", i)}</div>')
    attempts_open = " open" if len(r.attempts) <= 12 else ""
    html = (f'<section class="job" id="job-{i}"><h2>Job {escape(r.job)}</h2>{head}'
            f'<p class="hint">Timeline: the job on one lane (attempts side by side, '
            "\u25bc marks a restart: hover it), a lane per group of buckets, and every "
            "process as a heat strip (ranks \u00d7 time: the worst process in each cell). "
            "Drag to zoom (double-click: whole job); time is in seconds since the job's "
            f"start ({escape(_utc(r.start_ns))}).</p>"
            f'{chart.format("timeline", i)}{heat_ctl}{process_lists_html(r, pl)}'
            '<div class="grid2">' + "".join(chart.format(k, i) for k in (
                "goodput", "buckets", "steptime", "histogram")) + "</div>"
            f'<div class="tables"><div><h3>Summary</h3>{_summary(r, names)}</div>'
            f"<div><h3>Job</h3>{_metadata(r, js.fleet)}</div></div>"
            f"<details{attempts_open}><summary>Attempts ({len(r.attempts)})</summary>"
            f'<div class="scroll tall">{_attempts(r, pl)}</div></details></section>')
    return html, meta, blob


def _json_script(obj) -> str:
    # no "<" at all inside the script element ("</script>", "<!--" in a job name)
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def page(sections: list[tuple[str, dict, bytes]], title: str) -> str:
    """The whole self-contained page (Plotly's basic bundle and ``report.js`` inlined)."""
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
        "PLOTLY": here.joinpath("plotly-basic.min.js").read_text(encoding="utf-8"),
        "APP": "\n".join(here.joinpath(f).read_text(encoding="utf-8")
                          for f in ("heat.js", "charts.js", "report.js")),
    }
    # one pass over the template: nothing inserted is searched again
    return re.sub(r"<!--GP:([A-Z]+)-->", lambda m: parts[m.group(1)], template)
