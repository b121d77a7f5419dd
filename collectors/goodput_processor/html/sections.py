"""The HTML report's blocks at the top of a job and beside its timeline: warnings grouped by
code, the recovery phases of each disruption, the hosts that caused the most badput, the
missing and late processes of each attempt, and the restart markers' hover text.

``JobResult.recovery`` and ``JobResult.host_badput`` (the breakdown of recovery into
phases and badput attributed to hosts) are read with ``getattr``: a result without them
shows neither block. Their entries may be objects or dicts.
"""

from __future__ import annotations

import statistics
from collections import Counter
from html import escape

from ..results.job import JobResult
from ..results.table import format_duration
from .fleet import ProcessLists, format_ranks

__all__ = ["PHASES", "attempt_meta", "host_badput_html", "process_lists_html", "recovery_html",
           "warnings_html"]

#: Recovery phases in the order they happen (docs/accounting.md).
PHASES = ("detection", "termination", "rescheduling", "startup", "rendezvous_init", "restore",
          "recompilation_warmup")
PHASE_COLORS = ("#d62728", "#ff7f0e", "#bcbd22", "#7f7f7f", "#9467bd", "#aec7e8", "#8c564b")
#: Warnings listed one by one at most (the rest are counted).
MAX_WARNINGS = 2000


def _get(obj, name, default=None):
    """``obj.name`` or ``obj[name]`` (entries may be dataclasses, namespaces or dicts)."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _dur(s) -> str:
    return "-" if s is None else format_duration(s)


def warnings_html(r: JobResult) -> str:
    """Warnings grouped by code (count and first message), then every one in a closed box."""
    ws = r.warnings
    if not ws:
        return ""
    counts = Counter(w.code for w in ws)
    first = {}
    for w in ws:
        first.setdefault(w.code, w.message)
    items = "".join(f"<li><code>{escape(c)}</code> \u00d7{n}: {escape(first[c])}</li>"
                    for c, n in counts.items())
    out = (f'<div class="warnings"><strong>Warnings ({len(ws)})</strong>: what the input '
           f"could not settle; read them before the numbers.<ul>{items}</ul>")
    if len(ws) > len(counts):
        rows = "".join(f"<li><code>{escape(w.code)}</code> {escape(w.message)}</li>"
                       for w in ws[:MAX_WARNINGS])
        more = len(ws) - MAX_WARNINGS
        rows += f"<li>\u2026 and {more} more</li>" if more > 0 else ""
        out += (f'<details><summary>all {len(ws)} warnings</summary><div class="scroll">'
                f"<ul>{rows}</ul></div></details>")
    return out + "</div>"


def _phase_list(entry) -> list[tuple[str, float | None]]:
    phases = _get(entry, "phases") or {}
    names = [p for p in PHASES if p in phases] + [p for p in phases if p not in PHASES]
    return [(p, phases[p]) for p in names]


def _phase_label(rec, p: str) -> str:
    """The name to show for phase ``p`` over the records ``rec`` (their ``labels``, e.g.
    ``initialization`` for ``rendezvous_init`` after a one-process restart); names that
    differ between records are joined with `` / ``."""
    seen = [(_get(e, "labels") or {}).get(p, p) for e in rec
            if p in (_get(e, "phases") or {})]
    return " / ".join(dict.fromkeys(seen)) or p


def _failure_text(entry, r: JobResult) -> str:
    f = _get(entry, "first_failure")
    if f is None:
        return "-"
    proc, host, how, at = (_get(f, k) for k in ("process", "host", "how", "at_ns"))
    if proc is None:
        return "none shown (every process recorded only its start)"
    where = f"p{proc}"
    if host:
        where += f" {host}"
    when = "" if at is None else f" at +{format_duration((at - r.start_ns) / 1e9)}"
    among = _get(f, "uncertain_among") or ()
    maybe = f" or {', '.join(f'p{p}' for p in among)} (uncertain)" if among else ""
    inferred = ", inferred" if _get(f, "evidence") == "inferred" else ""
    return f"{where} ({how or '?'}{inferred}){when}{maybe}"


def recovery_html(r: JobResult) -> str:
    """The recovery phases over all disruptions (a bar and totals), and per disruption."""
    rec = tuple(getattr(r, "recovery", None) or ())
    if not rec:
        return ""
    names = list(dict.fromkeys(p for e in rec for p, _ in _phase_list(e)))
    vals = {p: [v for e in rec for q, v in _phase_list(e) if q == p and v is not None]
            for p in names}
    total = sum(sum(v) for v in vals.values()) or 1.0
    color = {p: PHASE_COLORS[PHASES.index(p) % 7] if p in PHASES else "#c7c7c7" for p in names}
    label = {p: _phase_label(rec, p) for p in names}
    bar = "".join(
        f'<span style="flex-grow:{sum(vals[p]) / total:.6f};background:{color[p]}" '
        f'title="{escape(label[p])}: {escape(_dur(sum(vals[p])))}"></span>'
        for p in names if vals[p])
    head = "".join(f'<th><span class="sw" style="background:{color[p]}"></span>'
                   f"{escape(label[p])}</th>" for p in names)

    def row(label, fn):
        return f"<tr><td>{label}</td>" + "".join(
            f"<td>{escape(fn(vals[p]))}</td>" for p in names) + "</tr>"

    table = (f'<table class="phases"><thead><tr><th></th>{head}</tr></thead><tbody>'
             + row("total", lambda v: _dur(sum(v)) if v else "-")
             + row("median", lambda v: _dur(statistics.median(v)) if v else "-")
             + row("max", lambda v: _dur(max(v)) if v else "-")
             + row("known in", lambda v: f"{len(v)}/{len(rec)}") + "</tbody></table>")
    per = "".join(
        f"<tr><td>attempt {escape(str(_get(e, 'attempt')))}</td>"
        f"<td>{escape(_failure_text(e, r))}</td>"
        + "".join(f"<td>{escape(_dur(dict(_phase_list(e)).get(p)))}</td>" for p in names)
        + "</tr>" for e in rec)
    per_head = "".join(f"<th>{escape(label[p])}</th>" for p in names)
    return (f'<div class="recovery"><h3>Recovery phases: {len(rec)} disruption(s), '
            f"{escape(_dur(total))} known</h3><div class=\"phasebar\">{bar}</div>{table}"
            f"<details><summary>per disruption (the attempt that failed, the process that "
            f'failed first)</summary><div class="scroll"><table class="phases"><thead><tr>'
            f"<th>attempt</th><th>first failure</th>{per_head}</tr></thead><tbody>{per}"
            "</tbody></table></div></details></div>")


def host_badput_html(r: JobResult, top: int = 5) -> str:
    """The hosts that caused the most badput on observed evidence (``JobResult.host_badput``),
    top ``top``, and apart, marked inferred, those charged on a last sign of life only
    (``JobResult.host_badput_inferred``)."""
    def table(key: str, title: str, note: str) -> str:
        hb = sorted(tuple(getattr(r, key, None) or ()),
                    key=lambda h: -(_get(h, "badput_s") or 0))
        if not hb:
            return ""
        rows = "".join(
            f"<tr><td>{escape(str(_get(h, 'host') or '-'))}</td><td>p{_get(h, 'process')}</td>"
            f"<td>{escape(_dur(_get(h, 'slowdown_s')))}</td>"
            f"<td>{_get(h, 'disruptions_caused', 0)}</td>"
            f"<td>{escape(_dur(_get(h, 'badput_s')))}</td>"
            f"<td>{escape(str(_get(h, 'evidence') or 'observed'))}</td></tr>" for h in hb[:top])
        more = (f"<p class=\"hint\">{len(hb) - top} more in the JSON report ({key}).</p>"
                if len(hb) > top else "")
        return (f"<h3>{title}</h3>{note}<table class=\"hosts\">"
                "<thead><tr><th>host</th><th>process</th><th>slowdown caused</th>"
                "<th>disruptions caused</th><th>badput</th><th>evidence</th></tr></thead>"
                f"<tbody>{rows}</tbody></table>{more}")

    observed = table("host_badput", "Top hosts by badput caused", "")
    inferred = table("host_badput_inferred", "Charged on inference (not ranked above)",
                     '<p class="hint">Each of these processes fell silent first; no '
                     "exception, end marker or launcher event says it failed.</p>")
    if not observed and not inferred:
        return ""
    c = getattr(r, "badput_charged", None) or {}
    rest = (f'<p class="hint">Badput charged to no host: '
            f"{escape(_dur(c['unattributed_ns'] / 1e9))} of "
            f"{escape(_dur(c['total_badput_ns'] / 1e9))}.</p>" if c else "")
    return f'<div class="hostbad">{observed}{inferred}{rest}</div>'


def process_lists_html(r: JobResult, pl: ProcessLists | None) -> str:
    """Per attempt with any: the missing, late and gone-early processes (a scroll box)."""
    if pl is None:
        return ""
    rows = [(a, i) for i, a in enumerate(r.attempts)
            if len(pl.missing[i]) or len(pl.late[i]) or len(pl.early[i])]
    title = "<h3>Missing and late processes</h3>"
    if not rows:
        return (f'{title}<p class="hint">None: every attempt had all its processes, none '
                "started late or fell silent early.</p>")
    body = "".join(
        f"<tr><td>attempt {a.attempt}</td><td>{pl.present[i]}</td>"
        f"<td>{escape(format_ranks(pl.missing[i]))}</td>"
        f"<td>{escape(format_ranks(pl.late[i]))}</td>"
        f"<td>{escape(format_ranks(pl.early[i]))}</td></tr>" for a, i in rows)
    return (f"{title}<p class=\"hint\">{len(rows)} of {len(r.attempts)} attempts. Missing: "
            "a rank below the expected count with no spans; late: first seen more than "
            "max(10 s, 10 % of the attempt) after the median process; gone early: last seen "
            "(after its start) that long before the attempt's end.</p>"
            '<div class="scroll"><table class="plist"><thead><tr><th>attempt</th>'
            "<th>processes</th><th>missing</th><th>late</th><th>gone early</th></tr></thead>"
            f"<tbody>{body}</tbody></table></div>")


def attempt_meta(r: JobResult, pl: ProcessLists | None) -> list[dict]:
    """Per attempt, what the page's script shows: times (s since the job's start), label,
    process counts and lists, and (from the second attempt) the restart marker's hover."""
    rec = {_get(e, "attempt"): e for e in (getattr(r, "recovery", None) or ())}
    out = []
    for i, a in enumerate(r.attempts):
        m = {"n": a.attempt, "t0": (a.start_ns - r.start_ns) / 1e9,
             "t1": (a.end_ns - r.start_ns) / 1e9, "end": a.end_reason,
             "procs": a.processes if pl is None else pl.present[i]}
        if pl is not None:
            m.update(missing=format_ranks(pl.missing[i], 6), late=format_ranks(pl.late[i], 6),
                     early=format_ranks(pl.early[i], 6), nmissing=int(len(pl.missing[i])))
        if i:
            m["hover"] = _restart_hover(r, i, rec.get(r.attempts[i - 1].attempt), m)
        out.append(m)
    return out


def _restart_hover(r: JobResult, i: int, entry, m: dict) -> str:
    """The hover of the marker at attempt ``i``'s start (Plotly's ``<br>`` lines)."""
    prev, a = r.attempts[i - 1], r.attempts[i]
    gap = (a.start_ns - prev.end_ns) / 1e9
    lines = [f"restart: attempt {prev.attempt} \u2192 attempt {a.attempt}",
             f"attempt {prev.attempt} ended {prev.end_reason} at "
             f"+{format_duration((prev.end_ns - r.start_ns) / 1e9)}; gap {format_duration(gap)}",
             f"resumes at step {'-' if a.resume_step is None else a.resume_step}; "
             f"{prev.steps_wasted} step(s) of attempt {prev.attempt} wasted"]
    if entry is not None:
        lines.append("first failure: " + escape(_failure_text(entry, r)))
        known = [f"{_phase_label((entry,), p)} {format_duration(v)}"
                 for p, v in _phase_list(entry) if v is not None]
        if known:
            lines.append("phases: " + ", ".join(known[:4]))
            if len(known) > 4:
                lines.append("\u2003" + ", ".join(known[4:]))
    if "missing" in m:
        lines.append(f"{m['procs']} processes; missing {escape(m['missing'])}; "
                     f"late {escape(m['late'])}")
    return "<br>".join(lines)
