"""What a report cannot trust: checks of a job's timeline that give named warnings.

Every check reads the job's attempts (:mod:`goodput_processor.model.attempts`) and its accounting
result, and
returns :class:`~goodput_processor.model.warnings.ReportWarning` objects with a stable ``code``
(the table in ``docs/accounting.md``, "Warnings"); none changes a number. The reader's own
(files it skipped) are made by :func:`file_warnings`.
"""

from __future__ import annotations

import numpy as np

from goodput import schema

from ..model.attempts import Attempt
from ..model.memo import cached, folded, proc_key
from ..model.summaries import StepOrder, step_order_of
from ..model.warnings import ReportWarning
from ..read.rows import C_KIND, K_CHECKPOINT_RESTORE, K_CHECKPOINT_SAVE, JobSpans
from ..results.job import JobResult

__all__ = ["CODES", "file_warnings", "job_warnings", "recovery_warnings"]

#: Every warning code, in the order the checks run (attempt-structure ones first).
CODES = (
    "orphaned_processes", "process_rank_unknown", "missing_attempt",
    "steps_restart_without_restore", "steps_backwards", "clock_jump", "world_size_changed",
    "spool_file_skipped", "empty_spool_file", "spans_rejected", "ideal_step_time_contradicted",
    "over_limit", "first_failure_uncertain", "run_dirs_merged", "source_records_lost",
)
_MS = 1_000_000


def job_warnings(job: JobSpans, attempts: list[Attempt], result: JobResult,
                 memo=None, done: tuple | None = None) -> list:
    """The warnings of one accounted job (see the module docstring). ``memo``: an
    :class:`~goodput_processor.model.memo.AccountingMemo` keeping each attempt's;
    ``done``: :func:`fold_attempts` of the first attempts, made before (the caller keeps
    it: :mod:`goodput_processor.account.live`)."""
    f = fold_attempts(attempts, len(attempts), done, memo)
    out = f[0] + f[1] + f[2] + f[3] + f[4]
    rejected = result.skipped.get("invalid_span", 0) + result.skipped.get(
        "unsupported_schema", 0)
    if rejected:
        out.append(ReportWarning(
            "spans_rejected",
            f"{rejected} span(s) rejected as impossible or unreadable (see skipped "
            "records); the numbers leave them out"))
    st = result.step_time
    if (result.ideal_step_time_source == "given" and st.count >= 4
            and st.anomalous_steps > st.count / 2):
        out.append(ReportWarning(
            "ideal_step_time_contradicted",
            f"{st.anomalous_steps} of {st.count} kept steps are slower than the given ideal "
            f"step time {result.ideal_step_time_s:g} s (+ noise band): the ideal looks wrong "
            "for this job, and the slowdown bucket holds the difference"))
    for limit, n in sorted(job.over_limit.items()):
        what = {"custom_types": f"{n} span(s) of custom badput types past the job's "
                "limit (--max-custom-types) were skipped: their time is in other",
                "attribute_bytes": f"{n} string attribute value(s) were cut to "
                "--max-attribute-bytes"}.get(limit, f"{n} value(s) past the limit {limit}")
        out.append(ReportWarning("over_limit", f"goodput serve limit {limit}: {what}"))
    if len(job.run_dirs) > 1:
        dirs = sorted(job.run_dirs)
        out.append(ReportWarning(
            "run_dirs_merged",
            f"job {job.name!r} has spool files in {len(dirs)} directories, merged into one "
            f"job: {', '.join(dirs)}. If they are separate runs that share the job name, "
            "report each directory on its own (or give each run its own job name); if they "
            "are one run's (e.g. a directory per host), nothing is wrong"))
    return out


#: ``goodput.imported_from`` values of the log importers (whole logs, nothing held back).
_LOG_IMPORTS = ("ml-goodput-measurement", "resiliency")


def fold_attempts(attempts: list[Attempt], n: int, done: tuple | None = None,
                  memo=None) -> tuple:
    """The attempt-by-attempt warnings of ``attempts`` (the first of a job of ``n``
    attempts, or the rest after ``done``: this function's result for the attempts before):
    ``(structure, missing attempts, source losses, per attempt, world size, state)``, each a
    list in attempt order; ``state`` carries what the next attempt's checks read (highest
    step reached, a checkpoint saved, the last attempt number and declared count)."""
    i0 = 0 if done is None else done[5][4]
    reached, saved, prev, count = (None, False, -1, None) if done is None else done[5][:4]
    lists = ([], [], [], [], []) if done is None else tuple(list(x) for x in done[:5])
    structure, missing, sources, per, world = lists
    for i, a in enumerate(attempts[i0:], i0):
        structure += a.warnings
        missing += _missing_attempts([a], prev)
        prev = a.attempt
        sources += _source_losses([a])
        key = ("warnings", proc_key(a.primary), a.attempt, a.start_ns, a.primary.index,
               i > 0, reached, saved)
        found, reached = cached(memo, key, lambda a=a, i=i, r=reached, c=saved: (
            _attempt_warnings(a, i, r, memo, c)))
        per += found
        if i + 1 < n:  # (what the last attempt saved matters to none)
            saved = saved or any(_checkpointed(p, memo) for p in a.processes)
        if a.declared_process_count is not None:
            if count is not None and count[1] != a.declared_process_count:
                world.append(ReportWarning(
                    "world_size_changed",
                    f"attempt {a.attempt} runs {a.declared_process_count} processes, "
                    f"attempt {count[0]} ran {count[1]}: per-host step times (stragglers) "
                    "compare ranks of different world sizes", a.attempt))
            count = (a.attempt, a.declared_process_count)
    return (*lists, (reached, saved, prev, count, len(attempts)))


def _source_losses(attempts: list[Attempt]) -> list:
    """``source_records_lost``: an attempt whose spans a source translated from another
    tool's telemetry ended with no end record (killed): that tool drops what it still held
    (open spans, records queued for its next export), so the attempt's last work is told
    from its last record, not read."""
    out = []
    for a in attempts:
        if a.end_reason != "killed":
            continue
        src = a.primary.run.get(schema.RES_IMPORTED_FROM)
        if not isinstance(src, str) or src in _LOG_IMPORTS:
            continue
        delay = a.primary.run.get(schema.RES_SOURCE_EXPORT_DELAY)
        held = (f"; {src} holds records up to {delay / 1000:g} s before it exports them, "
                "so up to that much of its last work may be missing" if isinstance(
                    delay, int) and not isinstance(delay, bool) and delay > 0 else "")
        out.append(ReportWarning(
            "source_records_lost",
            f"attempt {a.attempt} ({src} telemetry) ended without its end records (the "
            f"process was killed or its last export lost): its end is its last record "
            f"received, and the open phase it was in is inferred{held}",
            a.attempt, a.primary.index))
    return out


def _checkpointed(p, memo=None) -> bool:
    """Whether process ``p`` recorded a checkpoint save or restore (any row of either
    kind; read through ``memo``, :func:`~goodput_processor.model.memo.folded`)."""
    return folded(memo, "checks.checkpointed", p,
                  lambda d: bool(np.isin(d[:, C_KIND], (K_CHECKPOINT_SAVE,
                                                        K_CHECKPOINT_RESTORE)).any()),
                  lambda x, y: x or y)


def _attempt_warnings(a: Attempt, i: int, reached: int | None,
                      memo=None, saved: bool = True) -> tuple[list, int | None]:
    """The warnings of attempt ``a`` (the ``i``-th) from its primary's steps, given the
    highest step reached before it and whether a checkpoint was saved or restored before
    it (``saved``: without one, a restart from the first steps is the only way to go on,
    not a restore left unrecorded); -> (warnings, highest step reached so far). The
    primary's rows are read through ``memo``
    (:func:`goodput_processor.model.summaries.step_order_of`)."""
    out: list = []
    s = step_order_of(a.primary, a.start_ns, memo)
    if (i and saved and s.steps and reached is not None and not s.restored
            and s.first[1] <= reached):
        out.append(ReportWarning(
            "steps_restart_without_restore",
            f"attempt {a.attempt} starts at step {s.first[1]}, at or below step "
            f"{reached} reached before, and records no checkpoint restore, though a "
            "checkpoint was saved or restored earlier in the job: its earlier steps count "
            "as wasted. If it resumed from a checkpoint, record the restore "
            "(goodput.checkpoint_restore(step=...) or an instrumented checkpoint API)",
            a.attempt, a.primary.index))
    if s.back:
        out.append(ReportWarning(
            "steps_backwards",
            f"attempt {a.attempt}: the step number goes down {s.back} time(s) within the "
            "attempt (a counter reset, or two loops recording steps)",
            a.attempt, a.primary.index))
    out += _clock(a, s)
    if s.steps:
        reached = s.highest if reached is None else max(reached, s.highest)
    return out, reached


def _missing_attempts(attempts: list[Attempt], prev: int = -1) -> list:
    """Gaps in the attempt numbers a launcher declared (the numbers found from evidence
    alone have none): the spool of those attempts is missing (``prev``: the number of the
    attempt before them; -1: none)."""
    out = []
    for a in attempts:
        if a.attempt > prev + 1:
            gap = (f"attempt {prev + 1}" if a.attempt == prev + 2
                   else f"attempts {prev + 1}-{a.attempt - 1}")
            out.append(ReportWarning(
                "missing_attempt",
                f"{gap} left no spans (attempt {a.attempt} is the "
                f"{'first' if prev < 0 else 'next'} found): a spool file deleted or never "
                "written; the time before attempt "
                f"{a.attempt} is not in the total", a.attempt))
        prev = a.attempt
    return out


def _clock(a: Attempt, s: StepOrder) -> list:
    """The wall clock moved under the process: spans that end well before the attempt
    started, or steps that overlap (``s``: the primary's steps, :func:`_attempt_warnings`)."""
    out = []
    early, overlap, unset = s.early, s.overlap, s.unset
    if unset:
        out.append(ReportWarning(
            "clock_jump",
            f"attempt {a.attempt}: {unset} span(s) start before 2001-09-09 or after "
            f"2191-10-26: the wall clock of process {a.primary.index} was not set (1970), "
            "or explicit timestamps are not ns since the epoch (or are a sentinel such as "
            "2^63 - 1); the times of this attempt are not reliable",
            a.attempt, a.primary.index))
    if early or overlap:
        what = []
        if early:
            what.append(f"{early} span(s) end before the attempt started")
        if overlap:
            what.append(f"{overlap} step(s) start over a second before the previous ended")
        out.append(ReportWarning(
            "clock_jump",
            f"attempt {a.attempt}: {' and '.join(what)}: the wall clock of process "
            f"{a.primary.index} stepped back or jumped; the time around it is not reliable",
            a.attempt, a.primary.index))
    return out


def recovery_warnings(recoveries) -> list:
    """``first_failure_uncertain`` for each disruption whose first failure is one of several
    processes that fell silent together (:attr:`~goodput_processor.analysis.recovery.FirstFailure.
    uncertain_among`): nothing orders them, so which failed first, and the detection phase,
    may be another's."""
    out = []
    for rec in recoveries:
        f = rec.first_failure
        if not f.uncertain_among:
            continue
        others = ", ".join(str(p) for p in f.uncertain_among)
        out.append(ReportWarning(
            "first_failure_uncertain",
            f"attempt {rec.attempt}: process {f.process} and process(es) {others} fell silent "
            "within one heartbeat interval of each other, with no end marker or launcher event "
            f"to order them: process {f.process} (silent first) is reported as the first "
            "failure, but any of them may have failed first, and detection may be up to one "
            "interval off; run the launcher as `python -m goodput.torchrun` to record the "
            "worker it saw fail", rec.attempt, f.process))
    return out


def file_warnings(files: list[tuple[str, str, str]]) -> list:
    """Warnings for the files the reader skipped: ``(path, code, why)`` with code
    ``spool_file_skipped`` (unreadable, not OTLP) or ``empty_spool_file``."""
    return [ReportWarning(code, f"{path}: {why}", file=path) for path, code, why in files]
