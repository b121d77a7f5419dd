"""``--definitions ettr``: Meta's effective training time ratio (ETTR) and ETT%.

Sources:

- **ETTR**: A. Kokolis, M. Kuchnik, J. Hoffman, A. Kumar, P. Malani, F. Ma, Z. DeVito,
  S. Sengupta, K. Saladi, C.-J. Wu (FAIR at Meta), "Revisiting Reliability in Large-Scale
  Machine Learning Research Clusters", HPCA 2025, arXiv:2410.21680: ETTR is "the ratio of
  productive runtime to available wallclock time of a job run". A job run is every scheduler
  job of one training (restarts included); its wallclock time ``W = Q + R + U`` is the time it
  was *eligible to be scheduled but queued* (``Q``), plus its *productive* (``R``) and
  *unproductive* (``U``) runtime; ``ETTR = R / W``. The paper's expected value for a job of
  ``N`` nodes, a failure rate ``r_f`` per node-day, restart overhead ``u0`` (initialisation,
  loading the checkpoint), checkpoint interval ``dt`` and checkpoint write time ``w`` is
  ``E[ETTR] ~ (1 - N r_f (u0 + dt/2)) / (1 + w/dt)`` (:func:`expected_ettr`).
- **ETT%**: Meta's PyTorch blog "Optimizing Effective Training Time for Meta's Internal
  Recommendation/Ranking Workloads": "the percentage of total end-to-end (E2E) wall time
  dedicated to productive training" (time spent consuming new data), with *Time to Start*
  counted "from when a job is allocated hardware to when it begins training the first batch".

On this project's timeline (``docs/definitions.md``, "ETTR"):

- ``R``, productive runtime: the time of kept steps, ``productive`` + ``training_slowdown``
  (a slow step still consumes new data; ETTR does not discount it, this project's goodput
  does);
- ``U``: every other second of the job's total (start-up, initialisation, checkpoints,
  wasted progress, recovery, ...);
- ``Q``, queueing: the time the job was eligible but waiting for resources, known only from
  a scheduler's evidence: the Kubernetes pod times on the resource (schema 1.3), from the
  first attempt's earliest pod creation to its earliest scheduling; between attempts, the
  part of each recovery from a pod's creation to its scheduling. Without them ``Q`` before
  the first attempt is unknown and ``W`` starts at its first process (``queue_known`` False);
- ``W`` = from the first attempt's earliest pod creation (else its start) to the end;
  ``ETTR = R / W``;
- ``E2E`` = from the allocation (the first attempt's earliest pod scheduled, else its start)
  to the end; ``ETT% = 100 R / E2E``. Queueing before the allocation is outside ETT%, inside
  ETTR; the time between attempts is inside both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from goodput import schema
from goodput.links import doc_url

from ..results.table import format_duration

if TYPE_CHECKING:
    from rich.console import Console

    from ..read.rows import JobSpans

__all__ = ["EttrResult", "account_ettr", "expected_ettr", "render_ettr"]

_NS = 1_000_000_000
_DAY_S = 86_400.0


@dataclass(frozen=True)
class EttrResult:
    """ETTR and ETT% of one job (seconds; ``ettr`` a fraction, ``ett_percent`` percent).

    ``queue_time_s``: the known queueing (None when the job reports no pod times);
    ``queue_known``/``allocation_known``: whether ``W``/``E2E`` start at a pod's creation /
    scheduling (else at the first process start). ``restart_overhead_s``: the mean, over the
    job's disruptions, of the time from the failed attempt's end to the next first kept step
    plus the warm-up (rescheduling + startup + initialisation + restore + recompilation: the
    paper's ``u0`` with its queueing), None without disruptions. ``goodput``: this project's,
    for comparison.
    """

    job: str
    ettr: float
    ett_percent: float
    productive_runtime_s: float
    unproductive_runtime_s: float
    queue_time_s: float | None
    wallclock_s: float
    e2e_s: float
    total_time_s: float
    goodput: float
    disruptions: int
    restart_overhead_s: float | None
    queue_known: bool
    allocation_known: bool

    def to_json_dict(self) -> dict:
        """JSON-ready dict: the fields above plus ``definitions: "ettr"``."""
        return {"definitions": "ettr", **asdict(self)}


def expected_ettr(n_nodes: float, failures_per_node_day: float, restart_overhead_s: float,
                  checkpoint_interval_s: float, checkpoint_write_s: float = 0.0) -> float:
    """The paper's expected ETTR of a long job (Kokolis et al., HPCA 2025):
    ``(1 - N r_f (u0 + dt/2)) / (1 + w/dt)``, rates per node-day, times in seconds.

    A small-loss approximation: every failure costs the restart overhead ``u0`` and, on
    average, half a checkpoint interval of work; blocking checkpoint writes ``w`` stretch each
    interval. (The paper finds it within 5 % of a Monte Carlo simulation for its clusters.)

    Raises:
        ValueError: a count or time is negative, or the interval is not > 0.
    """
    vals = (n_nodes, failures_per_node_day, restart_overhead_s, checkpoint_write_s)
    if min(vals) < 0 or not checkpoint_interval_s > 0 or not all(
            math.isfinite(v) for v in (*vals, checkpoint_interval_s)):
        raise ValueError("expected_ettr needs finite values >= 0 and an interval > 0")
    rate = n_nodes * failures_per_node_day / _DAY_S  # failures per second
    return ((1 - rate * (restart_overhead_s + checkpoint_interval_s / 2))
            / (1 + checkpoint_write_s / checkpoint_interval_s))


def _first_time(attempt, key: str) -> int | None:
    vals = [p.run.get(key) for p in attempt.processes]
    vals = [v for v in vals if isinstance(v, int) and not isinstance(v, bool)]
    return min(vals) if vals else None


def account_ettr(job: JobSpans, ideal_step_time_s: float | None = None,
                 now_ns: int | None = None) -> EttrResult:
    """ETTR and ETT% of ``job`` (see the module docstring).

    Args:
        job: one job's spans (``read_run_dir(path).jobs[name]``).
        ideal_step_time_s: as for this project's accounting (it splits productive time from
            slowdown, whose sum is ``R`` either way; it matters only through which steps the
            warm-up excess counts in ``restart_overhead_s``).
        now_ns: "now", to tell a running attempt (default now).

    Raises:
        ValueError: bad ``ideal_step_time_s``.
    """
    from ..account.accounting import _account

    r, attempts, _acc = _account(job, ideal_step_time_s, now_ns, False)
    b = r.buckets_ns
    run_ns = b[schema.PRODUCTIVE] + b["training_slowdown"]
    end = r.end_ns
    start = eligible = alloc = r.start_ns
    queue_ns, queue_known, alloc_known = 0, False, False
    if attempts:
        created = _first_time(attempts[0], schema.RES_K8S_POD_CREATED)
        scheduled = _first_time(attempts[0], schema.RES_K8S_POD_SCHEDULED)
        if created is not None and created <= start:
            eligible, queue_known = created, True
        if scheduled is not None and scheduled <= start:
            alloc, alloc_known = scheduled, True
            if queue_known and created <= scheduled:
                queue_ns += scheduled - created
        for a in attempts[1:]:  # queued again between attempts (inside the total)
            c = _first_time(a, schema.RES_K8S_POD_CREATED)
            s = _first_time(a, schema.RES_K8S_POD_SCHEDULED)
            if c is not None and s is not None and c <= s <= a.start_ns:
                queue_ns += s - c
    wall_ns = max(end - eligible, 0)
    e2e_ns = max(end - alloc, 0)
    overheads = [sum(v for k, v in x.phases.items() if v is not None
                     and k not in ("detection", "termination")) for x in r.recovery]
    return EttrResult(
        job=job.name,
        ettr=run_ns / wall_ns if wall_ns else 0.0,
        ett_percent=100.0 * run_ns / e2e_ns if e2e_ns else 0.0,
        productive_runtime_s=run_ns / _NS,
        unproductive_runtime_s=(r.total_ns - run_ns) / _NS,
        queue_time_s=queue_ns / _NS if queue_known else None,
        wallclock_s=wall_ns / _NS,
        e2e_s=e2e_ns / _NS,
        total_time_s=r.total_time_s,
        goodput=r.goodput,
        disruptions=r.disruptions,
        restart_overhead_s=sum(overheads) / len(overheads) if overheads else None,
        queue_known=queue_known,
        allocation_known=alloc_known,
    )


def render_ettr(results: Iterable[EttrResult], console: Console) -> None:
    """Print each result as a table of ETTR's terms, to ``console`` (rich)."""
    from rich.table import Table

    for i, r in enumerate(results):
        if i:
            console.print()
        t = Table(title=f"Job {r.job}: Meta's ETTR and ETT%", title_justify="left",
                  show_edge=False, box=None, header_style="bold")
        t.add_column("metric")
        t.add_column("value", justify="right")
        queue = ("unknown (no pod times: W starts at the first process)"
                 if r.queue_time_s is None else format_duration(r.queue_time_s))
        rows = [
            ("ETTR = R / W", f"{r.ettr:.4f}"),
            ("ETT% = R / E2E", f"{r.ett_percent:.2f} %"),
            ("R: productive runtime (kept steps)", format_duration(r.productive_runtime_s)),
            ("U: unproductive runtime", format_duration(r.unproductive_runtime_s)),
            ("Q: queued while eligible", queue),
            ("W: wallclock (eligible -> end)", format_duration(r.wallclock_s)),
            ("E2E: allocated -> end" + ("" if r.allocation_known else " (first process)"),
             format_duration(r.e2e_s)),
            ("disruptions", str(r.disruptions)),
            ("mean restart overhead (u0)", format_duration(r.restart_overhead_s)),
            ("goodput (this project)", f"{r.goodput * 100:.2f} %"),
        ]
        for k, v in rows:
            t.add_row(k, v, style="bold green" if k.startswith("ETTR") else None)
        console.print(t)
    console.print("Meta's ETTR (Kokolis et al., HPCA 2025) and ETT% (PyTorch blog); this "
                  "project's breakdown: goodput report without --definitions. See "
                  + doc_url("definitions.md", "ETTR: Meta's effective training time ratio"),
                  style="dim", markup=False)
