"""A named warning of a report: what its input could not settle, carried instead of a guess.

Made where the doubt is found: the model (:mod:`goodput_processor.model.attempts`: attempt
evidence), the accounting's checks (:mod:`goodput_processor.account.checks`) and the
reader's file problems; carried by :class:`~goodput_processor.results.job.JobResult`.
The codes are listed in ``docs/accounting.md``, "Warnings".
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReportWarning"]


@dataclass(frozen=True)
class ReportWarning:
    """Something the report's input could not settle or that looks wrong: the report
    carries it instead of guessing silently.

    ``code``: a stable name (listed in ``docs/accounting.md``, "Warnings"); ``message``: one
    line for people; ``attempt``/``process``/``file``: the attempt number, rank and spool
    file concerned, if any.
    """

    code: str
    message: str
    attempt: int | None = None
    process: int | None = None
    file: str | None = None
