"""The ``goodput import`` subcommand (registered by :mod:`goodput_processor.cli`).

``goodput import FILE... [--to RUN_DIR] [--from auto|mgm|resiliency|SOURCE] [--job NAME]
[--timezone TZ] [--duplicate-window SECONDS] [--overwrite] [--format table|json]``
converts ml-goodput-measurement or resiliency logs into spool files under
``RUN_DIR/<job>/`` (:func:`~.import_logs`), prints a summary (jobs, attempts, processes,
spans, problems with examples) and the command that reports each job. Exit status 0 when
something was imported (problems are listed), 2 with a one-line error otherwise. A progress
bar goes to stderr for large inputs when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from goodput import schema
from goodput.links import doc_url

from ..terminal import ProgressBar
from .resiliency_attempts import DEFAULT_DUPLICATE_WINDOW_S

__all__ = ["add_import_command", "cmd_import"]

#: Inputs at least this large get a progress bar (when stderr is a terminal).
_PROGRESS_MIN_BYTES = 8 << 20


def _want_bar(paths) -> bool:
    if not sys.stderr.isatty():
        return False
    try:
        return sum(os.path.getsize(p) for p in paths) >= _PROGRESS_MIN_BYTES
    except OSError:
        return False


def _next_commands(summary) -> list[str]:
    return [f"goodput report {shlex.quote(j.run_dir)}" for j in summary.jobs.values()]


def _render(summary, console) -> None:
    from rich.table import Table
    from rich.text import Text

    head = Text()
    head.append(f"Imported {len(summary.jobs)} job(s)", style="bold")
    head.append(f" from {summary.source}: {summary.entries:,} entries read from "
                f"{len(summary.files)} file(s)")
    console.print(head)
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("job", overflow="fold")
    for col in ("attempts", "processes", "spans"):
        table.add_column(col, justify="right")
    table.add_column("run directory", overflow="fold")
    for name, j in sorted(summary.jobs.items()):
        table.add_row(Text(name), str(j.attempts), str(j.processes), f"{j.spans:,}",
                      Text(j.run_dir))
    console.print(table)
    if summary.duplicates:
        console.print(f"duplicates: {summary.duplicates:,} duplicate lines dropped (identical "
                      "events, job_started repeated within the duplicate window, repeated "
                      "job_terminated: first start and last end per node kept)", markup=False)
    total = sum(summary.problems.values())
    console.print(
        "problems: " + (f"{total:,} (" + ", ".join(
            f"{k} {v:,}" for k, v in sorted(summary.problems.items())) + ")" if total else "none"),
        style="yellow" if total else None, markup=False)
    for ex in summary.examples:
        console.print(f"  {ex}", style="dim", markup=False, highlight=False)
    if total > len(summary.examples):
        console.print(f"  ... and {total - len(summary.examples):,} more", style="dim",
                      markup=False)
    for name, n in sorted(summary.warnings.items()):
        console.print(f"warning [{name}]: {n:,}", style="yellow", markup=False)
    for cmd in _next_commands(summary):
        console.print(f"next: {cmd}", markup=False, highlight=False)


def cmd_import(args: argparse.Namespace) -> int:
    """Run ``goodput import``; returns the exit status."""
    from ..terminal import UsageError
    from . import LogImportError, import_logs

    try:
        if _want_bar(args.files):
            with ProgressBar() as bar:
                summary = _run(import_logs, args, bar)
        else:
            summary = _run(import_logs, args, None)
    except (LogImportError, ValueError) as e:
        raise UsageError(str(e)) from e
    except OSError as e:
        raise UsageError(f"cannot write to {args.to}: {e.strerror or e}") from e
    if args.format == "json":
        doc = summary.to_dict()
        doc["next"] = _next_commands(summary)
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        from ..terminal import make_console

        _render(summary, make_console())
    return 0


def _run(import_logs, args, progress):
    return import_logs(args.files, args.to, source=args.source, job=args.job,
                       timezone=args.timezone, overwrite=args.overwrite,
                       duplicate_window_s=args.duplicate_window, progress=progress)


def _builtin_sources() -> list[str]:
    from .sources import BUILTIN

    return sorted(BUILTIN)


def add_import_command(subparsers) -> argparse.ArgumentParser:
    """Add the ``import`` subcommand to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "import",
        help="convert other tools' logs and telemetry into goodput spans",
        description="Convert ml-goodput-measurement entries (Cloud Logging JSON export, log "
        "sink, or its local timeline cache), resiliency event logs, or another tool's own "
        "telemetry (--from SOURCE: NVIDIA one-logger, Megatron-LM, torchtitan, torchft, the "
        "NVRx launcher, plain Megatron/NeMo/MaxText logs) into spool files under "
        "RUN_DIR/<job>/, which `goodput report` reads.",
        epilog="Example: goodput import my-run.json --to goodput-runs, then goodput report "
        "goodput-runs/my-run. How entries become spans, and the options: "
        + doc_url("migration.md", "1. Import the logs"),
    )
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="log files: JSON lines or a JSON array")
    p.add_argument("--to", metavar="RUN_DIR", default=schema.DEFAULT_RUN_ROOT,
                   help=f"directory to write RUN_DIR/<job>/ into (default: "
                   f"{schema.DEFAULT_RUN_ROOT})")
    p.add_argument("--from", dest="source", default="auto", metavar="SOURCE",
                   help="input format: auto (default: told from the first entries), mgm, "
                   "resiliency, or a source of another tool's telemetry: "
                   + ", ".join(_builtin_sources()) + " (" + doc_url("sources/README.md") + ")")
    p.add_argument("--job", metavar="NAME", default=None,
                   help="mgm, resiliency: import only this job (entries without a job name "
                   "belong to it); a source: write every record into job NAME (e.g. to merge "
                   "a launcher's log with the workers' spans)")
    p.add_argument("--timezone", metavar="TZ", default="UTC",
                   help="time zone of resiliency timestamps without an offset (default: UTC)")
    p.add_argument("--duplicate-window", metavar="SECONDS", type=float,
                   default=DEFAULT_DUPLICATE_WINDOW_S,
                   help="resiliency: a node's job_started repeated within SECONDS of its "
                   "start, with no checkpoint or termination in between, is a duplicate "
                   "line, not a restart (default: %(default)g)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace spans already in a job's directory")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="summary format (default: table)")
    p.set_defaults(func=cmd_import)
    return p
