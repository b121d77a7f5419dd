"""Every second of badput is charged once (docs/accounting.md, "Recovery phases" and
"Badput attributed to hosts"): :func:`check_charged_once` on a painted job.

- each disruption's window lies inside the job, after the previous one, and holds no
  productive or slowdown time;
- its phases partition the window plus the warm-up after it, and ``lost_ns`` is exactly
  that; the first failure is ``observed`` only when an observed failure exists;
- per-host charges (observed and inferred) plus the unattributed part equal the job's
  badput to the nanosecond, and the unattributed part is at least the slowdown no host
  explains.

Used by tests/analysis/test_recovery_partition.py (random jobs) and
tests/end_to_end/test_charged_once_real.py (a real job killed twice).
"""

from __future__ import annotations

import numpy as np

from goodput import schema

NS = 1_000_000_000


def check_charged_once(segs) -> None:
    """Every second of badput charged once, on ``segs`` (the answer of
    :func:`goodput_processor.html.segments.bucket_segments`): the checks listed in this
    module's docstring. AssertionError names the first that fails."""
    r = segs.result
    assert sum(r.buckets_ns.values()) == r.total_ns
    code = {n: i for i, n in enumerate(segs.names)}
    kept = {code[schema.PRODUCTIVE], code["training_slowdown"]}
    rows = segs.primary_rows()
    by_attempt = {a.attempt: a for a in r.attempts}
    order = [a.attempt for a in r.attempts]
    prev_end = r.start_ns
    for rec in r.recovery:
        w0, w1 = rec.window_ns
        a, nxt = by_attempt[rec.attempt], by_attempt[rec.next_attempt]
        assert order.index(rec.next_attempt) == order.index(rec.attempt) + 1
        # inside the job, after the previous window, from a's end region to nxt's start on
        assert prev_end <= w0 <= a.end_ns <= nxt.start_ns <= w1 <= nxt.end_ns, (rec, a, nxt)
        prev_end = w1
        # no kept-step (productive or slowdown) time inside the window
        for row in rows:
            b = row.bounds_ns
            lo, hi = np.maximum(b[:-1], w0), np.minimum(b[1:], w1)
            inside = np.isin(row.bucket, list(kept)) & (hi > lo)
            assert not inside.any(), (rec, row.attempt, b[:-1][inside], row.bucket[inside])
        # the phases partition the window (plus the warm-up after it), lost is exactly that
        ph = {k: None if v is None else round(v * NS) for k, v in rec.phases.items()}
        assert all(v is None or v >= 0 for v in ph.values()), rec.phases
        assert (ph["detection"] or 0) + ph["termination"] <= a.end_ns - w0
        assert ph["rescheduling"] == nxt.start_ns - a.end_ns
        after = sum(v or 0 for k, v in ph.items() if k not in ("detection", "termination",
                                                               "rescheduling"))
        assert after >= w1 - nxt.start_ns
        assert rec.lost_ns == (w1 - w0) + (after - (w1 - nxt.start_ns))
        assert abs(rec.lost_s * NS - rec.lost_ns) <= 1e-6 * NS
        # evidence: a start-only process is never named; observed needs an observed failure
        f = rec.first_failure
        assert f.evidence == ("inferred" if f.how == "missing_heartbeat" else "observed")
    # hosts + unattributed == the job's badput, exactly; nothing charged twice
    c = r.badput_charged
    badput = r.total_ns - r.buckets_ns[schema.PRODUCTIVE]
    assert c["total_badput_ns"] == badput
    assert c["observed_ns"] + c["inferred_ns"] + c["unattributed_ns"] == badput
    hosts = (*r.host_badput, *r.host_badput_inferred)
    assert sum(h.badput_ns for h in r.host_badput) == c["observed_ns"]
    assert sum(h.badput_ns for h in r.host_badput_inferred) == c["inferred_ns"]
    named = [x for x in r.recovery if x.first_failure.process is not None]
    assert sum(h.disruptions_caused for h in hosts) == len(named)
    assert sum(x.lost_ns for x in named) == sum(
        h.badput_ns - round(h.slowdown_s * NS) for h in hosts)
    assert all(h.evidence == "inferred" for h in r.host_badput_inferred)
    assert all(h.slowdown_s == 0 for h in r.host_badput_inferred)
    assert c["unattributed_ns"] >= 0
    # what no host explains of the slowdown is inside the unattributed part (rounding: 1 ns
    # per attempt and host)
    slack = len(r.attempts) * (len(hosts) + 2)
    assert c["unattributed_ns"] >= round(r.slowdown_unattributed_s * NS) - slack
