"""Every second of badput is charged once (docs/accounting.md, "Recovery phases" and "Badput
attributed to hosts").

Random multi-attempt, multi-process jobs (Hypothesis, seeded and bounded), written as real
spool files and read by the real reader: kills before the first step and before the first
checkpoint, several kills in a row, restores recorded or implied, exceptions, steps in
flight, slow hosts with collective waits, and a second run of the job merged into the same
run directory. Checked on each:

- each disruption's window (``Recovery.window_ns``) lies inside the job; no two windows
  overlap; no window holds productive or slowdown time (the painted timeline of the HTML
  report, :func:`~goodput_processor.html.segments.bucket_segments`);
- its phases partition the window (detection and termination inside the failed attempt's
  wasted region, rescheduling the gap, the rest up to the window's end) plus the warm-up
  after it, and ``lost_ns`` is exactly that;
- per-host charges (observed and inferred, all hosts) plus the unattributed part equal the
  job's badput to the nanosecond, and the unattributed part is at least the slowdown that
  no host explains (nothing is charged twice);
- a process whose only record is its start is never the first to fail, and a charge is
  ``observed`` only when an observed failure (exception, end marker) exists.
"""

from __future__ import annotations

from charged_once import check_charged_once
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otlp_fixtures import T0_NS, Timeline, write_spool

from goodput import schema
from goodput_processor import read_run_dir
from goodput_processor.html.segments import bucket_segments
from goodput_processor.model.attempts import build_attempts
from goodput_processor.read.rows import C_KIND, K_JOB_START

NS = 1_000_000_000
NOW = T0_NS + 10**6 * NS
PROPS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow,
                                        HealthCheck.function_scoped_fixture])


@st.composite
def jobs(draw):
    """``[(file name, Timeline)]``: 1-2 runs of one job, of 1-4 attempts of 1-3 processes."""
    out, t = [], 0.0
    runs = draw(st.integers(1, 2))
    for run in range(runs):
        attempts, ckpt = draw(st.integers(1, 4)), None
        for att in range(attempts):
            last = run == runs - 1 and att == attempts - 1
            nproc = draw(st.integers(1, 3))
            t0 = t + draw(st.sampled_from([0.5, 2.0, 7.0]))
            kind = "scratch" if ckpt is None else draw(
                st.sampled_from(["restore", "implied", "scratch"]))
            first = 1 if kind == "scratch" else ckpt + 1
            nsteps = draw(st.integers(0, 6))  # 0: killed before its first step
            times = [draw(st.sampled_from([1.0, 1.0, 1.0, 1.4, 3.0])) for _ in range(nsteps)]
            saves = set(draw(st.lists(st.integers(0, 5), max_size=2)))
            end = "exit" if last else draw(st.sampled_from(["kill", "kill", "exception",
                                                            "in_step"]))
            init = draw(st.sampled_from([0.0, 0.4, 1.5]))
            waits = [draw(st.sampled_from([0.0, 0.1, 0.5])) for _ in range(nproc)]
            silent = [draw(st.booleans()) for _ in range(nproc)]  # writes only its start
            tls = [Timeline(attempt=att, process=p, count=nproc) for p in range(nproc)]
            for p, tl in enumerate(tls):
                tl.job_start(t0 + 0.1 * p)
            if not last and nproc > 1 and any(silent[1:]):
                tls = [tl if p == 0 or not silent[p] else None for p, tl in enumerate(tls)]
                for p, tl in enumerate(tls):  # those silent write their start only
                    if tl is None:
                        tl = Timeline(attempt=att, process=p, count=nproc).job_start(
                            t0 + 0.1 * p)
                        out.append((f"r{run}-a{att}-p{p}.jsonl", tl))
            live = [(p, tl) for p, tl in enumerate(tls) if tl is not None]
            c = t0 + 0.5
            for _p, tl in live:
                if init:
                    tl.span("accelerator_init", c, c + init)
            c += init
            if kind == "restore":
                for _p, tl in live:
                    tl.restore(c, c + 0.5, step=ckpt)
                c += 0.5
            for k, dt in enumerate(times):
                n = first + k
                for p, tl in live:
                    tl.step(n, c, c + dt)
                    if waits[p]:
                        tl.span(schema.COLLECTIVE_WAIT, c + dt - waits[p], c + dt)
                c += dt
                if k in saves:
                    for _p, tl in live:
                        tl.save(c, c + 0.3, step=n)
                    c += 0.3
                    ckpt = n
            if end == "exit":
                for _p, tl in live:
                    tl.job_end(c + 0.2)
                c += 0.2
            elif end == "exception":
                live[0][1].job_end(c + 0.1, reason="exception")
                for _p, tl in live[1:]:
                    tl.heartbeat(c, c + 0.4)
                c += 0.4
            elif end == "in_step":  # killed inside the next step: its open record
                for p, tl in live:
                    tl.open(schema.STEP, c, c + 0.2 + 0.1 * p, {schema.ATTR_STEP: first + nsteps})
                c += 0.2 + 0.1 * len(live)
            else:  # killed: some processes heartbeat a little longer
                for p, tl in live:
                    if p:
                        tl.heartbeat(c, c + 0.1 * p)
                c += 0.1 * len(live)
            out += [(f"r{run}-a{att}-p{p}.jsonl", tl) for p, tl in live]
            t = c
    return out


def _write(run_dir, job) -> None:
    for name, tl in job:
        write_spool(run_dir / name, tl.resource, tl.spans)


@PROPS
@given(job=jobs(), ideal=st.sampled_from([None, 1.0]))
def test_every_second_of_badput_is_charged_once(tmp_path_factory, job, ideal):
    run_dir = tmp_path_factory.mktemp("charged")
    _write(run_dir, job)
    jobs_ = read_run_dir(run_dir).jobs
    if not jobs_:
        return
    (spans,) = jobs_.values()
    segs = bucket_segments(spans, ideal, NOW)
    check_charged_once(segs)
    # a process whose only records are its start markers is never the first to fail
    attempts = {a.attempt: a for a in build_attempts(spans, NOW)}
    for rec in segs.result.recovery:
        f = rec.first_failure
        if f.process is None:
            assert all((p.data[:, C_KIND] == K_JOB_START).all()
                       for p in attempts[rec.attempt].processes)
            continue
        (p,) = [p for p in attempts[rec.attempt].processes if p.index == f.process]
        assert (p.data[:, C_KIND] != K_JOB_START).any(), rec
