"""What the HTML report ships per job: packed timeline, step and heat arrays, static charts.

The timeline (the job's lane, a lane per bucket group, the processes' heat strip) and the
step-time chart are drawn by ``report.js`` from the raw arrays (it aggregates what cannot
be seen at the current zoom); they travel as one gzip-compressed binary blob per job
(base64 in the page) described by a small JSON header. The goodput-over-time charts are
computed by the script from the same segments (:func:`over_time` is their reference); the
histogram is small and built here as a Plotly figure spec.
"""

from __future__ import annotations

import gzip
import math

import numpy as np

from goodput import schema

from .segments import NO_STEP, JobSegments

__all__ = ["BUCKET_COLORS", "LANES", "bucket_color", "histogram_figure", "lanes", "over_time",
           "pack_job", "pick_windows"]

_NS = 1_000_000_000
_US = 1_000
_MAX_U32 = 2**32 - 1
#: Step delta meaning "no step" in the packed per-segment step column.
STEP_NONE = -(2**31)

BUCKET_COLORS = {
    schema.PRODUCTIVE: "#2ca02c",
    "process_startup": "#7f7f7f",
    "accelerator_init": "#9467bd",
    "training_prep": "#c5b0d5",
    "program_startup": "#8c564b",
    "data_loading": "#17becf",
    "checkpoint_save": "#1f77b4",
    "checkpoint_restore": "#aec7e8",
    "wasted_progress": "#d62728",
    "infrastructure_recovery": "#ff7f0e",
    "training_slowdown": "#ffbb78",
    "other": "#c7c7c7",
}
_CUSTOM_COLORS = ("#e377c2", "#bcbd22", "#f7b6d2", "#dbdb8d", "#9edae5", "#c49c94", "#98df8a")
#: Nice rolling-window lengths (s) to choose from.
_NICE_WINDOWS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
                 21600, 43200, 86400, 172800, 604800)


def bucket_color(name: str, names) -> str:
    """Colour of bucket ``name`` (custom buckets cycle through a palette)."""
    if name in BUCKET_COLORS:
        return BUCKET_COLORS[name]
    customs = [n for n in names if n.startswith(schema.CUSTOM_PREFIX)]
    return _CUSTOM_COLORS[customs.index(name) % len(_CUSTOM_COLORS)] if name in customs \
        else "#7f7f7f"


def _delta_steps(step: np.ndarray) -> np.ndarray:
    """Step numbers as deltas from the previous segment's step (``STEP_NONE``: no step)."""
    out = np.full(len(step), STEP_NONE, np.int64)
    has = step != NO_STEP
    vals = step[has]
    out[has] = np.diff(np.concatenate(([0], vals)))
    return np.clip(out, STEP_NONE, 2**31 - 1).astype(np.int32)


def _row_arrays(row, job_start: int):
    """A row as (first boundary µs, uint32 µs lengths, uint8 buckets, int32 step deltas);
    segments longer than 2^32-1 µs (71 min) are split in pieces."""
    us = np.rint((row.bounds_ns - job_start) / _US).astype(np.int64)
    length = np.diff(us)
    bucket, step = row.bucket, row.step
    pieces = np.maximum(1, -(-length // _MAX_U32))
    if (pieces > 1).any():
        idx = np.repeat(np.arange(len(length)), pieces)
        first = np.concatenate(([0], np.cumsum(pieces)[:-1]))
        k = np.arange(len(idx)) - np.repeat(first, pieces)
        length = np.minimum(length[idx] - k * _MAX_U32, _MAX_U32)
        bucket, step = bucket[idx], step[idx]
    return int(us[0]), length.astype(np.uint32), bucket.astype(np.uint8), _delta_steps(step)


def _step_arrays(js: JobSegments):
    """Kept steps for the step-time chart: x (step number, or kept index when some step
    has no number), time per step in ms, attempt, anomalous; sorted by x."""
    st = js.result.steps
    if len(st.step) and (st.step != -(2**63)).all():
        x, xlabel = st.step, "step"
    else:
        x, xlabel = np.arange(len(st.step)), "kept step (in time order)"
    order = np.argsort(x, kind="stable")
    x = x[order].astype(np.int64)
    xd = np.diff(np.concatenate(([0], x))).astype(np.int32)
    return xlabel, {
        "sx": xd,
        "st": (st.time_s[order] * 1e3).astype(np.float32),
        "sa": st.attempt[order].astype(np.int32),
        "sk": st.anomalous[order].astype(np.uint8),
    }


#: The timeline's lanes below the job's own: each shows one group of buckets.
LANES = (
    ("training", (schema.PRODUCTIVE, "training_slowdown")),
    ("start-up", ("process_startup", "accelerator_init", "training_prep", "program_startup")),
    ("data", ("data_loading",)),
    ("checkpoints", ("checkpoint_save", "checkpoint_restore")),
    ("disruptions", ("wasted_progress", "infrastructure_recovery", "elastic_slice_down",
                     "elastic_scale_up", "elastic_reinitialization")),
    ("custom", ()),  # every custom:<type>
    ("other", ("other",)),
)


def lanes(names, present) -> list[dict]:
    """The lanes with a bucket present: ``[{"name", "buckets": [bucket index, ...]}]``."""
    out = []
    for lane, members in LANES:
        idx = [i for i, n in enumerate(names) if n in present and (
            n in members or (lane == "custom" and n.startswith(schema.CUSTOM_PREFIX)))]
        if idx:
            out.append({"name": lane, "buckets": idx})
    return out


def pack_job(js: JobSegments) -> tuple[dict, bytes]:
    """The header (JSON-able dict) and gzip-compressed blob of one job's arrays: the
    primary rows (the job's lane), kept steps, and the heat strip and expansions
    (:mod:`.heat`) when the job has a fleet."""
    r = js.result
    header: dict = {"rows": [], "arrays": {}, "heat": None}
    arrays: dict[str, np.ndarray] = {}
    for i, row in enumerate(js.primary_rows()):
        t0, length, bucket, step = _row_arrays(row, r.start_ns)
        header["rows"].append({"attempt": row.attempt, "process": row.process,
                               "host": row.host, "t0_us": t0, "n": int(len(length))})
        arrays[f"d{i}"], arrays[f"k{i}"], arrays[f"s{i}"] = length, bucket, step
    header["step_x_label"], steps = _step_arrays(js)
    arrays.update(steps)
    if js.fleet is not None and len(js.fleet.p_rank) and r.attempts:
        from .heat import heat_arrays

        header["heat"], heat = heat_arrays(r, js.fleet)
        arrays.update(heat)
    parts, offset = [], 0
    for name, a in arrays.items():
        raw = np.ascontiguousarray(a).tobytes()
        header["arrays"][name] = [a.dtype.name, offset, int(len(a))]
        pad = (-len(raw)) % 8
        parts += [raw, b"\0" * pad]
        offset += len(raw) + pad
    return header, gzip.compress(b"".join(parts), compresslevel=6, mtime=0)


def pick_windows(total_s: float) -> list[float]:
    """Two rolling windows near 1/20 and 1/5 of the job (nice round lengths)."""
    if total_s <= 0:
        return []
    out = []
    for frac in (20, 5):
        target = total_s / frac
        w = min(_NICE_WINDOWS, key=lambda n: abs(math.log(n / target)))
        if w < total_s and w not in out:
            out.append(float(w))
    return out


def over_time(js: JobSegments, windows_s=None, points: int = 600) -> dict:
    """Each bucket's share of time, cumulative and in rolling windows, at ``points``
    evenly spaced instants (exact in ns from the painted segments). The page's script
    computes the same curves from the same segments (in float seconds); this is their
    reference (tested against each other in the browser test).

    Returns ``{"t": seconds since job start, "windows": [...], "names": [...],
    "cumulative": {name: [%]}, "rolling": [{name: [%]} per window]}``.
    """
    r = js.result
    total = r.total_ns
    if total <= 0:
        return {"t": [], "windows": [], "names": [], "cumulative": {}, "rolling": []}
    windows = list(windows_s) if windows_s is not None else pick_windows(total / _NS)
    rows = js.primary_rows()
    starts = np.concatenate([row.bounds_ns[:-1] for row in rows])
    ends = np.concatenate([row.bounds_ns[1:] for row in rows])
    bucket = np.concatenate([row.bucket for row in rows])
    t = r.start_ns + np.rint(np.linspace(0, total, points + 1)[1:]).astype(np.int64)
    names = [n for n in js.names if r.buckets_ns[n]]
    cum = {}
    for n in names:
        sel = bucket == js.names.index(n)
        s, e = starts[sel], ends[sel]
        cum[n] = (s, e, np.concatenate(([0], np.cumsum(e - s))))
    out = {"t": _r((t - r.start_ns) / _NS), "windows": windows, "names": names,
           "cumulative": {n: _r(100 * _cum_at(*cum[n], t) / (t - r.start_ns)) for n in names},
           "rolling": []}
    for w in windows:
        lo = np.maximum(t - round(w * _NS), r.start_ns)
        out["rolling"].append({n: _r(100 * (_cum_at(*cum[n], t) - _cum_at(*cum[n], lo))
                                     / (t - lo)) for n in names})
    return out


def _cum_at(s, e, c, x):
    """Time (ns) of the segments ``[s, e)`` (sorted, disjoint; ``c`` their cumulative
    lengths) before each instant of ``x``."""
    i = np.searchsorted(e, x, side="right")  # segments ending at or before x
    j = np.minimum(i, len(s) - 1)
    part = np.where(i < len(s), np.clip(x - s[j], 0, e[j] - s[j]), 0)
    return c[i] + part


def _r(a, digits: int = 4) -> list:
    return [float(x) for x in np.round(np.asarray(a, np.float64), digits)]


def histogram_figure(js: JobSegments) -> dict | None:
    """Plotly spec of the step-time histogram (ms; anomalous bins red), None without steps."""
    r = js.result
    t = r.steps.time_s * 1e3
    if not len(t):
        return None
    nbins = int(min(120, max(10, math.sqrt(len(t)))))
    lo, hi = float(t.min()), float(t.max())
    if hi <= lo:
        hi = lo + max(abs(lo) * 1e-3, 1e-6)
    counts, edges = np.histogram(t, bins=nbins, range=(lo, hi))
    centers = (edges[:-1] + edges[1:]) / 2
    shapes, colors = [], ["#1f77b4"] * nbins
    if r.ideal_step_time_s is not None:
        ideal = r.ideal_step_time_s * 1e3
        thr = ideal + (r.noise_tolerance_s or 0) * 1e3
        colors = ["#d62728" if c > thr else "#1f77b4" for c in centers]
        shapes = [_vline(ideal, "#2ca02c", "solid"), _vline(thr, "#d62728", "dash")]
    return {
        "data": [{"type": "bar", "x": _r(centers, 6), "y": counts.tolist(),
                  "width": float(edges[1] - edges[0]), "marker": {"color": colors},
                  "hovertemplate": "%{x:.4g} ms: %{y} steps<extra></extra>", "name": "steps"}],
        "layout": {"title": {"text": "Step time histogram (kept steps)"},
                   "xaxis": {"title": {"text": "step time (ms)"}},
                   "yaxis": {"title": {"text": "steps"}},
                   "shapes": shapes, "bargap": 0, "height": 320,
                   "updatemenus": [{"type": "buttons", "direction": "right", "x": 1,
                                    "xanchor": "right", "y": 1.18, "showactive": True,
                                    "buttons": [{"label": s, "method": "relayout",
                                                 "args": [{"yaxis.type": s}]}
                                                for s in ("linear", "log")]}],
                   "margin": {"l": 60, "r": 20, "t": 40, "b": 50}},
    }


def _vline(x: float, color: str, dash: str) -> dict:
    return {"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
            "line": {"color": color, "dash": dash, "width": 1.5}}
