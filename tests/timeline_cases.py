"""Timelines shared by the tests of several stages (account, html, exporters).

:func:`worked_example` is the "Checked example" of docs/accounting.md as two
:class:`otlp_fixtures.Timeline` attempts (minutes); :func:`timelines` draws random jobs of
1-3 attempts (Hypothesis).
"""

from __future__ import annotations

from hypothesis import strategies as st
from otlp_fixtures import Timeline

from goodput import schema


def worked_example():
    """docs/accounting.md "Checked example" (minutes; reference step time 2 min)."""
    a0 = Timeline(attempt=0, unit=60)
    a0.job_start(0).restore(0, 5, step=25)
    a0.steps(26, 50, start=5, step_time=2)
    a0.save(55, 60, step=50)
    a0.steps(51, 70, start=60, step_time=2)  # then killed: no job_end, last span ends at 100
    a1 = Timeline(attempt=1, unit=60)
    a1.job_start(115).restore(115, 120, step=50)
    a1.steps(51, 75, start=120, step_time=3)
    a1.save(195, 200, step=75).job_end(200)
    return a0, a1


_PHASES = [n for n in schema.PHASES if n != schema.CUSTOM_BADPUT]


@st.composite
def timelines(draw) -> list:
    """1-3 attempts (unit 1 s, possibly overlapping) of 1-12 phases each: any schema
    phase, custom badput, restores, non-blocking saves; job start and end drawn."""
    tls = []
    n_attempts = draw(st.integers(1, 3))
    t = 0
    for attempt in range(n_attempts):
        tl = Timeline(attempt=attempt, unit=1)
        if draw(st.booleans()):
            tl.job_start(t)
        for _ in range(draw(st.integers(1, 12))):
            start = t + draw(st.integers(0, 30))
            end = start + draw(st.integers(0, 10))
            kind = draw(st.sampled_from(_PHASES + ["custom", "restore", "nonblocking"]))
            if kind == "custom":
                tl.custom(draw(st.sampled_from(["a", "b"])), start, end)
            elif kind == "restore":
                tl.restore(start, end, step=draw(st.integers(0, 20)))
            elif kind == "nonblocking":
                tl.save(start, end, step=draw(st.integers(0, 20)), blocking=False)
            elif kind == schema.STEP:
                tl.step(draw(st.integers(0, 20)), start, end)
            else:
                tl.span(kind, start, end)
        if draw(st.booleans()):
            tl.job_end(t + draw(st.integers(0, 40)))
        tls.append(tl)
        t += draw(st.integers(0, 40))  # attempts may overlap
    return tls
