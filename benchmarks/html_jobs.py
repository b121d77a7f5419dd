"""Many-process jobs for the HTML report's scale tests, built in memory.

- :func:`fleet_job`: a :class:`~goodput_processor.read.rows.JobSpans` of ``attempts`` x
  ``processes`` (68 x 112 by default, the shape of the real job in issue 18), every process
  with its own spans: start-up phases, a restore, data loading and steps, checkpoints every
  10 steps; one slow host (steps 25 % slower), one host that starts each step 0.6 s late,
  1-3 processes missing from some attempts, one starting 30-60 s late in others; each
  attempt but the last ends with one process failing first and the others killed 5-40 s
  later. Accounted by the real code (``bucket_segments``), as a read spool would be.
- :func:`big_job`: ``attempts`` x ``processes`` (10^3 x 10^4): the primary process of each
  attempt as spans (accounted by the real code) and the 10^7 other processes given directly
  as a :class:`~goodput_processor.html.fleet.Fleet` (one step span per process and attempt,
  covering its steps with ``goodput.step.count``, as an imported log has): reading 10^7
  spool resources is not what it measures, the page is.

    python benchmarks/html_jobs.py OUT.html [--big]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

import numpy as np

from goodput_processor.html.fleet import Fleet
from goodput_processor.read.rows import (
    K_ACCELERATOR_INIT,
    K_CHECKPOINT_RESTORE,
    K_CHECKPOINT_SAVE,
    K_DATA_LOADING,
    K_HEARTBEAT,
    K_JOB_END,
    K_JOB_START,
    K_PROGRAM_STARTUP,
    K_STEP,
    K_TRAINING_PREP,
    NCOLS,
    NONE,
    JobSpans,
    ProcessSpans,
)

SEC = 1_000_000_000
T0 = 1_750_000_000 * SEC
SLOW_HOST, LAGGY_HOST = 37, 53


@dataclasses.dataclass
class _Plan:
    """One attempt: start, resume step, steps, crash (first failure) and kill times."""

    start: int
    resume: int
    steps: int
    fail_rank: int | None
    fail_at: int
    kill_at: int
    missing: set
    late: dict


def _plans(attempts: int, processes: int, rng: random.Random, step_s: float):
    t, resume, out = T0, 0, []
    for i in range(attempts):
        last = i == attempts - 1
        steps = rng.randint(10, 60)
        train_start = t + int((5 + 3 + (4 if resume else 0) + 10 + 3) * SEC)
        end = train_start + int(steps * (step_s + 0.05) * SEC + steps // 10 * SEC)
        missing = set(rng.sample(range(1, processes), rng.randint(1, 3))) \
            if processes > 4 and rng.random() < 0.3 else set()
        late = {rng.randrange(1, processes): rng.randint(30, 60) * SEC} \
            if processes > 4 and rng.random() < 0.3 else {}
        fail = None if last else rng.choice([71 % processes, rng.randrange(processes)])
        kill = end + (0 if last else rng.randint(5, 40) * SEC)
        out.append(_Plan(t, resume, steps, fail, end, kill, missing, late))
        resume += steps // 10 * 10
        t = kill + rng.randint(20, 90) * SEC
    return out


def _rows(plan: _Plan, rank: int, rng: random.Random, step_s: float, last: bool):
    """The span rows of one process in one attempt (COLUMNS order, sid column unique
    per process; string index 0 = "exit")."""
    rows = []
    t = plan.start + rng.randint(0, 3000) * 1_000_000 + plan.late.get(rank, 0)
    stop = plan.fail_at if rank == plan.fail_rank else plan.kill_at

    def span(kind, s, e, ival=NONE, aux=NONE, sidx=-1):
        if s < stop or kind == K_JOB_END:
            rows.append((s, min(e, stop) if kind != K_JOB_END else e, kind, ival, aux, 0, sidx,
                         0, len(rows) + 1))

    span(K_JOB_START, t, t, 1000)
    for kind, d in ((K_ACCELERATOR_INIT, 5), (K_TRAINING_PREP, 3)):
        span(kind, t, t + d * SEC)
        t += d * SEC
    if plan.resume:
        span(K_CHECKPOINT_RESTORE, t, t + 4 * SEC, plan.resume)
        t += 4 * SEC
    span(K_PROGRAM_STARTUP, t, t + 10 * SEC)
    t = max(t + 10 * SEC, plan.start + 21 * SEC + (4 * SEC if plan.resume else 0))
    slow = 1.25 if rank == SLOW_HOST else 1.0
    lag = int(0.6 * SEC) if rank == LAGGY_HOST else 0
    for k in range(plan.resume + 1, plan.resume + plan.steps + 1):
        span(K_DATA_LOADING, t, t + SEC // 20)
        t += SEC // 20
        d = int(step_s * slow * rng.uniform(0.98, 1.02) * SEC)
        span(K_STEP, t + lag, t + lag + d, k)
        t += int(step_s * SEC) if slow == 1.0 else d
        if k % 10 == 0:
            span(K_CHECKPOINT_SAVE, t, t + SEC, k)
            t += SEC
        if t >= stop:
            break
    span(K_HEARTBEAT, stop - SEC // 5, stop - SEC // 5)  # waiting for the others, alive
    if last:
        span(K_JOB_END, plan.kill_at, plan.kill_at, sidx=0)
    return np.array(rows, np.int64).reshape(-1, NCOLS)


def fleet_job(attempts: int = 68, processes: int = 112, seed: int = 0,
              step_s: float = 2.0, name: str = "fleet-68x112") -> JobSpans:
    """A job of ``attempts`` x ``processes`` with every process's spans (module docstring)."""
    rng = random.Random(seed)
    job = JobSpans(name, strings=["exit"])
    plans = _plans(attempts, processes, rng, step_s)
    for i, plan in enumerate(plans):
        for rank in range(processes):
            if rank in plan.missing:
                continue
            data = _rows(plan, rank, rng, step_s, i == attempts - 1)
            job.processes[(i, rank, "")] = ProcessSpans(
                name, i, rank, host=f"node{rank:03d}", process_count=processes, data=data)
    return job


def big_job(attempts: int = 1000, processes: int = 10_000, seed: int = 0,
            step_s: float = 2.0, name: str = "big-1000x10000"):
    """:class:`~goodput_processor.html.segments.JobSegments` of ``attempts`` x
    ``processes``: the primary processes accounted from spans, the fleet built here."""
    from goodput_processor.html import bucket_segments

    rng = random.Random(seed)
    plans = _plans(attempts, processes, rng, step_s)
    job = JobSpans(name, strings=["exit"])
    for i, plan in enumerate(plans):
        plan.fail_rank = None if plan.fail_rank is None else max(plan.fail_rank, 1)
        job.processes[(i, 0, "")] = ProcessSpans(
            name, i, 0, host="h00000", process_count=processes,
            data=_rows(plan, 0, rng, step_s, i == attempts - 1))
    segs = bucket_segments(job)
    return dataclasses.replace(segs, fleet=_big_fleet(segs.result, plans, processes, seed,
                                                          step_s))


def _big_fleet(result, plans, processes: int, seed: int, step_s: float) -> Fleet:
    """Every process of every attempt, from the primary's times (numpy, no spans)."""
    gen = np.random.default_rng(seed)
    pa, pr, first, last, ended, sr, ss, se, cnt, stp = ([] for _ in range(10))
    for i, (plan, a) in enumerate(zip(plans, result.attempts, strict=True)):
        ranks = np.setdiff1d(np.arange(processes), sorted(plan.missing))
        n = len(ranks)
        f = a.start_ns + gen.integers(0, 3 * SEC, n)
        late = gen.random(n) < 0.0005
        f[late] += gen.integers(30 * SEC, 60 * SEC, int(late.sum()))
        lst = np.full(n, a.end_ns)
        if plan.fail_rank is not None:
            lst[ranks == plan.fail_rank] = plan.fail_at
        train = plan.start + 21 * SEC + (4 * SEC if plan.resume else 0)
        s = train + gen.integers(0, SEC // 50, n)
        s[ranks % 997 == LAGGY_HOST] += int(0.6 * SEC)
        e = np.minimum(lst, plan.fail_at)
        c = np.maximum(1, (e - s) // int(step_s * SEC))  # the span at the ideal step time
        slow = ranks % 997 == SLOW_HOST
        c[slow] = np.maximum(1, c[slow] * 4 // 5)
        ok = e > s
        pa.append(np.full(n, i))
        pr.append(ranks)
        first.append(f)
        last.append(lst)
        ended.append(np.full(n, i == len(plans) - 1))
        sr.append(ranks[ok])
        ss.append(s[ok])
        se.append(e[ok])
        cnt.append(c[ok])
        stp.append(np.full(int(ok.sum()), plan.resume + plan.steps))
    cat = np.concatenate
    s_att = cat([np.full(len(x), i) for i, x in enumerate(ss)])
    return Fleet(
        hosts=tuple(f"h{r:05d}" for r in range(processes)),
        expected=np.full(len(plans), processes, np.int64),
        p_attempt=cat(pa).astype(np.int32), p_rank=cat(pr).astype(np.int32),
        p_host=cat(pr).astype(np.int32), p_first_ns=cat(first).astype(np.int64),
        p_last_ns=cat(last).astype(np.int64), p_ended=cat(ended).astype(bool),
        s_attempt=s_att.astype(np.int32), s_rank=cat(sr).astype(np.int32),
        s_start_ns=cat(ss).astype(np.int64), s_end_ns=cat(se).astype(np.int64),
        s_count=cat(cnt).astype(np.int32), s_step=cat(stp).astype(np.int64))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--big", action="store_true", help="10^3 x 10^4 instead of 68 x 112")
    args = ap.parse_args(argv)
    from goodput_processor.html import bucket_segments, render_html

    t0 = time.perf_counter()
    segs = big_job() if args.big else bucket_segments(fleet_job())
    t1 = time.perf_counter()
    html = render_html([segs], args.out)
    print(f"built {t1 - t0:.1f} s, page {time.perf_counter() - t1:.1f} s, "
          f"{len(html.encode()) / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
