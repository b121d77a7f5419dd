"""``--definitions resiliency``: the goodput of ``resiliency.goodput_measure``'s calculator.

Source: ``resiliency/goodput_measure/calculator.py`` (``GoodputCalculator.calculate_goodput``)
and the README's primer (``docs/definitions.md`` sets it beside the other definitions)::

    goodput = (max saved step - min loaded step) * reference step time / total runtime

The total runtime runs from the job's first event to its last; here from the first
attempt's start to the last attempt's end (the same instants for an imported log: the first
``user_scheduled``/``job_started`` and the last ``job_terminated``). The calculator only knows
checkpoint events, so a job that trained well but saved no checkpoint has goodput 0, and
work after the last save counts for nothing even when the job ended cleanly.

Read from this project's timeline (native or imported by ``goodput import``):

- saved steps: ``goodput.checkpoint.step`` of every ``goodput.checkpoint_save`` span, blocking
  or not, of any process; a step saved twice in one attempt counts once;
- loaded steps: ``goodput.checkpoint.step`` of every ``goodput.checkpoint_restore`` span of
  any process; an attempt with none contributes the step it resumed from (its first step
  span's step minus the steps that span covers: 0 for a fresh start), which the
  calculator would only see if the job logged ``checkpoint_loaded`` with step 0, as the
  resiliency examples do.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from goodput.links import doc_url

from ..account.accounting import resume_step
from ..model.attempts import build_attempts
from ..read.rows import (
    C_IVAL,
    C_KIND,
    K_CHECKPOINT_RESTORE,
    K_CHECKPOINT_SAVE,
    NONE,
    JobSpans,
)
from ..results.table import format_duration

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["ResiliencyResult", "account_resiliency", "render_resiliency"]

_NS = 1_000_000_000


@dataclass(frozen=True)
class ResiliencyResult:
    """The resiliency calculator's metrics for one job.

    Times in seconds; ``goodput`` is a fraction in [0, 1] (the calculator prints percent:
    :attr:`goodput_percent`). ``min_loaded_step``/``max_saved_step`` are None when the job
    has no such checkpoint, and then ``goodput`` is 0 as in the calculator.
    """

    job: str
    total_time_s: float
    reference_step_time_s: float
    min_loaded_step: int | None
    max_saved_step: int | None
    step_diff: int
    effective_time_s: float
    goodput: float
    job_started_count: int
    checkpoints_loaded: int
    checkpoints_saved: int

    @property
    def goodput_percent(self) -> float:
        """Goodput in percent (0..100), as the calculator prints it."""
        return self.goodput * 100

    def to_json_dict(self) -> dict:
        """JSON-ready dict: the fields above plus ``definitions: "resiliency"``."""
        return {"definitions": "resiliency", **asdict(self)}


def account_resiliency(
    job: JobSpans, reference_step_time_s: float, now_ns: int | None = None
) -> ResiliencyResult:
    """The resiliency calculator's goodput of ``job`` (see the module docstring).

    Args:
        job: one job's spans (``read_run_dir(path).jobs[name]``).
        reference_step_time_s: the ideal time of one step in seconds (the calculator's
            ``--reference-step-time``).
        now_ns: "now" in ns since the epoch, to tell a running attempt (default now).

    Returns:
        A :class:`ResiliencyResult`; an empty job gives total 0 and goodput 0.

    Raises:
        ValueError: ``reference_step_time_s`` is not a finite number > 0.
    """
    if reference_step_time_s is None or not (
        math.isfinite(reference_step_time_s) and reference_step_time_s > 0
    ):
        raise ValueError(
            "the resiliency definition needs a reference step time in seconds > 0 "
            f"(goodput report --ideal-step-time SECONDS), got {reference_step_time_s!r}"
        )
    attempts = build_attempts(job, now_ns)
    total_ns = attempts[-1].end_ns - attempts[0].start_ns if attempts else 0
    saved, loaded = set(), set()
    for a in attempts:
        restored = False
        for p in a.processes:
            d = p.data
            for kind, out in ((K_CHECKPOINT_SAVE, saved), (K_CHECKPOINT_RESTORE, loaded)):
                steps = d[(d[:, C_KIND] == kind) & (d[:, C_IVAL] != NONE)][:, C_IVAL]
                out.update((a.attempt, int(s)) for s in np.unique(steps))
                restored |= kind == K_CHECKPOINT_RESTORE and len(steps) > 0
        if not restored:
            r = resume_step(a.primary.data)
            if r is not None:
                loaded.add((a.attempt, r))
    min_loaded = min((s for _, s in loaded), default=None)
    max_saved = max((s for _, s in saved), default=None)
    diff = 0
    if min_loaded is not None and max_saved is not None and max_saved > 0:
        diff = max(max_saved - min_loaded, 0)
    effective = diff * reference_step_time_s
    total_s = total_ns / _NS
    return ResiliencyResult(
        job=job.name,
        total_time_s=total_s,
        reference_step_time_s=reference_step_time_s,
        min_loaded_step=min_loaded,
        max_saved_step=max_saved,
        step_diff=diff,
        effective_time_s=effective,
        goodput=effective / total_s if total_s > 0 and diff > 0 else 0.0,
        job_started_count=len(attempts),
        checkpoints_loaded=sum(1 for _, s in loaded if s > 0),
        checkpoints_saved=len(saved),
    )


def render_resiliency(results: Iterable[ResiliencyResult], console: Console) -> None:
    """Print each result as the calculator's summary table, to ``console`` (rich)."""
    from rich.table import Table

    for i, r in enumerate(results):
        if i:
            console.print()
        t = Table(title=f"Job {r.job}: resiliency.goodput_measure definitions",
                  title_justify="left", show_edge=False, box=None, header_style="bold")
        t.add_column("metric")
        t.add_column("value", justify="right")
        rows = [
            ("job started count", str(r.job_started_count)),
            ("checkpoints loaded", str(r.checkpoints_loaded)),
            ("checkpoints saved", str(r.checkpoints_saved)),
            ("total runtime", format_duration(r.total_time_s)),
            ("min loaded step", "-" if r.min_loaded_step is None else str(r.min_loaded_step)),
            ("max saved step", "-" if r.max_saved_step is None else str(r.max_saved_step)),
            ("step difference", str(r.step_diff)),
            ("reference step time", f"{r.reference_step_time_s:g} s"),
            ("effective computation time", format_duration(r.effective_time_s)),
            ("goodput", f"{r.goodput_percent:.2f} %"),
        ]
        for k, v in rows:
            t.add_row(k, v, style="bold green" if k == "goodput" else None)
        console.print(t)
    console.print("Definitions of resiliency's calculator; the breakdown of this project's own "
                  "model: goodput report without --definitions. See "
                  + doc_url("definitions.md", "Where resiliency's calculator is fragile"),
                  style="dim", markup=False)
