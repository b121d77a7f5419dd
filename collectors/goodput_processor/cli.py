"""The ``goodput`` command line.

``goodput report RUN_DIR [--format table|json] [--ideal-step-time SECONDS] [--job NAME]
[--definitions goodput|mgm|resiliency|ettr] [--at TIME] [--exclude START,END]... [--html PATH]``
prints the goodput report of every
job in a run directory, by this project's model or another tool's definitions
(``docs/definitions.md``); ``--html`` also writes the HTML report (``docs/html-report.md``).
``goodput serve [...]`` runs the processor as a live service
(:mod:`goodput_processor.serve.command`, ``docs/serve.md``). ``goodput import FILE...
[--to RUN_DIR]`` converts ml-goodput-measurement or resiliency logs into spool files
(:mod:`goodput_processor.importers.command`).
Usage errors and unreadable input print one line ``goodput: error: ...`` on stderr and
exit with status 2.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence

from goodput.links import DOCS_URL, doc_url

from .definitions import DEFINITIONS
from .importers.command import add_import_command
from .read.reader import ReadError
from .serve.command import add_serve_command
from .terminal import Parser as _Parser
from .terminal import ProgressBar, UsageError

__all__ = ["UsageError", "add_report_command", "build_parser", "main"]

PROG = "goodput"


class _Version(argparse.Action):
    """``--version``: the version read when asked for (not at every start)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from . import __version__

        print(f"{PROG} {__version__}")  # on stdout, as argparse's "version" action
        parser.exit()


def _ideal_step_time(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"--ideal-step-time must be a number of seconds > 0, got {text!r}")
    return value


def parse_time_ns(text: str, what: str) -> int:
    """A moment on the command line -> ns since the epoch: an ISO 8601 date and time
    (``2026-03-01T08:00:00Z``, ``2026-03-01 08:00:00.5+01:00``; without a zone it is UTC) or
    seconds since the epoch (``1772352000.5``).

    Raises:
        UsageError: neither (the message names ``what`` and the text).
    """
    import datetime as dt

    t = text.strip()
    try:
        sec = float(t)
    except ValueError:
        pass
    else:
        if math.isfinite(sec) and sec >= 0:
            return round(sec * 1e9) if "." in t or "e" in t.lower() else int(t) * 10**9
        raise UsageError(f"{what} must be a time (ISO 8601 or seconds since the epoch), "
                         f"got {text!r}")
    try:
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise UsageError(f"{what} must be a time (ISO 8601 or seconds since the epoch), "
                         f"got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    delta = when - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1000


def _exclusion(text: str) -> tuple[int, int]:
    start, sep, end = text.partition(",")
    if not sep:
        raise UsageError(f"--exclude must be START,END, got {text!r}")
    a, b = parse_time_ns(start, "--exclude START"), parse_time_ns(end, "--exclude END")
    if b <= a:
        raise UsageError(f"--exclude {text!r}: END is not after START")
    return a, b


#: ``goodput report`` draws a progress bar on stderr (a terminal) while it reads span files
#: of at least this many MiB on disk; ``GOODPUT_PROGRESS_MIN_MB`` sets another (0: always).
PROGRESS_MIN_MB = 256.0


def _read_bar(run_dir: str):
    """A context manager giving ``goodput report``'s progress callback: a
    :class:`~.terminal.ProgressBar` (``goodput import``'s) when stderr is a terminal and
    the span files under ``run_dir`` hold at least ``GOODPUT_PROGRESS_MIN_MB`` (default
    :data:`PROGRESS_MIN_MB`) MiB on disk, else None (nothing drawn).

    Raises:
        UsageError: ``GOODPUT_PROGRESS_MIN_MB`` is not a number.
    """
    import contextlib

    if not sys.stderr.isatty():
        return contextlib.nullcontext()
    text = os.environ.get("GOODPUT_PROGRESS_MIN_MB", "")
    try:
        min_mb = float(text) if text.strip() else PROGRESS_MIN_MB
    except ValueError:
        raise UsageError(f"GOODPUT_PROGRESS_MIN_MB must be a number of MiB, got {text!r}"
                         ) from None
    from pathlib import Path

    from .read.reader import span_files

    try:
        size = sum(p.stat().st_size for p in span_files(Path(run_dir)))
    except OSError:  # (the report says what is wrong with the directory)
        return contextlib.nullcontext()
    if size < min_mb * 2**20:
        return contextlib.nullcontext()
    return ProgressBar({"read": "reading spool"})


def cmd_report(args: argparse.Namespace) -> int:
    """Run ``goodput report``; returns the exit status. A progress bar of the spool's
    reading goes to stderr when it is a terminal and the spool is large (:func:`_read_bar`)."""
    if not args.no_cache:
        return _report(args)
    old = os.environ.get("GOODPUT_REPORT_CACHE")
    os.environ["GOODPUT_REPORT_CACHE"] = "0"  # read by .cache wherever the run is read
    try:
        return _report(args)
    finally:  # (for this command only: main() may run again in the same process)
        if old is None:
            del os.environ["GOODPUT_REPORT_CACHE"]
        else:
            os.environ["GOODPUT_REPORT_CACHE"] = old


def _report(args: argparse.Namespace) -> int:
    from . import definitions
    from .read import progress

    ideal = None if args.ideal_step_time is None else _ideal_step_time(args.ideal_step_time)
    at_ns = None if args.at is None else parse_time_ns(args.at, "--at")
    exclusions = [_exclusion(x) for x in args.exclude or ()]
    if exclusions and args.definitions in ("resiliency", "ettr"):
        raise UsageError(f"--exclude is not defined for --definitions {args.definitions}")
    if args.html is not None and (at_ns is not None or exclusions):
        raise UsageError("--html cannot be combined with --at or --exclude")
    if args.definitions == "resiliency" and ideal is None:
        raise UsageError("--definitions resiliency needs --ideal-step-time SECONDS (the "
                         "resiliency calculator's --reference-step-time)")
    if args.html is not None and args.definitions != "goodput":
        raise UsageError("--html needs the default --definitions goodput")
    try:  # (the progress bar, if any, is gone before anything is printed)
        with _read_bar(args.run_dir) as bar, progress.watching(bar):
            if args.html is not None:  # the HTML report (docs/html-report.md) and the results
                from .html import report_html

                results = report_html(args.run_dir, args.html, ideal_step_time_s=ideal,
                                      job=args.job)
            else:
                results = definitions.report(args.run_dir, args.definitions,
                                             ideal_step_time_s=ideal, job=args.job,
                                             at_ns=at_ns, exclusions_ns=exclusions)
        if args.html is not None:
            print(f"{PROG}: wrote {args.html}", file=sys.stderr)
    except OSError as e:
        if args.html is None:
            raise
        raise UsageError(f"--html {args.html}: {e}") from e
    except ReadError as e:
        raise UsageError(str(e)) from e
    except KeyError as e:
        raise UsageError(e.args[0]) from e
    if args.format == "json":
        definitions.write_json(args.definitions, results, sys.stdout)
    else:
        definitions.render(args.definitions, results)
    warned = sum(len(getattr(r, "warnings", ())) for r in results)
    failed = sum(1 for r in results if getattr(r, "error", None))
    if args.strict and (warned or failed):
        print(f"{PROG}: {warned} warning(s), {failed} job(s) not accounted: the report "
              "cannot be fully trusted (--strict)", file=sys.stderr)
        return 3
    return 0


def add_report_command(subparsers) -> argparse.ArgumentParser:
    """Add the ``report`` subcommand to ``subparsers``; returns its parser."""
    p = subparsers.add_parser(
        "report",
        help="goodput and badput of the jobs in a run directory",
        description="Account the spans in RUN_DIR (every *.jsonl and *.jsonl.gz span file, "
        "and the *.tail of a killed process, under it, recursively) into goodput buckets, "
        "per job, and print the report.",
        epilog="Example: goodput report goodput-runs/my-run. The recorder writes to "
        "goodput.configure(run_dir=...), else $GOODPUT_RUN_DIR, else "
        "./goodput-runs/JOB_NAME. Exit status: 0; 2: bad command line or unreadable "
        "input; 3: --strict, and the report has warnings or a job that could not be "
        "accounted. The buckets: " + doc_url("accounting.md", "Buckets"),
    )
    p.add_argument("run_dir", metavar="RUN_DIR",
                   help="the run directory the training job's recorder wrote (spool files "
                   "spans-*.jsonl, and the .tail a killed process left); a parent of several "
                   "run directories is read whole: "
                   "spools with the same job name are one job (a run_dirs_merged warning "
                   "names the directories), so report each run's directory alone")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="output format (default: table)")
    p.add_argument("--ideal-step-time", metavar="SECONDS", default=None,
                   help="ideal step time in seconds (default: median of kept step times)")
    p.add_argument("--job", metavar="NAME", default=None, help="report only this job")
    p.add_argument("--definitions", choices=DEFINITIONS, default=DEFINITIONS[0],
                   help="goodput: this project's model (default); mgm: ml-goodput-measurement "
                   "0.2.3's numbers; resiliency: resiliency.goodput_measure's calculator "
                   "(needs --ideal-step-time as its reference step time); ettr: Meta's "
                   "effective training time ratio and ETT%%. See " + doc_url("definitions.md"))
    p.add_argument("--html", metavar="PATH", default=None,
                   help="also write a self-contained HTML report (timeline, processes, goodput "
                   "over time, step times) to PATH; see " + doc_url("html-report.md"))
    p.add_argument("--at", metavar="TIME", default=None,
                   help="account each job as it stood at TIME (ISO 8601, UTC unless a zone is "
                   "given, or seconds since the epoch): later spans are left out, a job still "
                   "running then is measured up to TIME (with --definitions mgm: the "
                   "numbers ml-goodput-measurement gave when queried at TIME)")
    p.add_argument("--exclude", metavar="START,END", action="append", default=None,
                   help="leave the time from START to END out of the total and the buckets "
                   "(repeatable; times as for --at); with --definitions mgm: "
                   "ml-goodput-measurement's get_job_goodput_with_exclusions")
    p.add_argument("--strict", action="store_true",
                   help="exit with status 3 when the report has warnings (what the input "
                   "could not settle), e.g. in CI; the warnings: "
                   + doc_url("accounting.md", "Warnings"))
    p.add_argument("--no-cache", action="store_true",
                   help="neither read nor write RUN_DIR/.goodput-cache, the spans and "
                   "results kept for a finished run (files unchanged for 30 s, no attempt "
                   "running); also GOODPUT_REPORT_CACHE=0")
    p.set_defaults(func=cmd_report)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The ``goodput`` argument parser with all subcommands."""
    parser = _Parser(prog=PROG, description="Goodput of ML training jobs from OpenTelemetry "
                     "spans.", epilog=f"Run '{PROG} COMMAND --help' for a command's options. "
                     f"Documentation: {DOCS_URL}")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="show the program's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    add_report_command(sub)
    add_serve_command(sub)  # grpcio & co. are imported only when serve runs
    add_import_command(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``goodput`` console script; returns the exit status (0; 2: bad
    command line or input; 3: ``report --strict`` and the report has warnings)."""
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help / --version
            return e.code if isinstance(e.code, int) else 0
        if getattr(args, "func", None) is None:
            raise UsageError("a command is required (try: goodput report RUN_DIR)")
        return args.func(args)
    except UsageError as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `goodput report ... | head`: as rich does, exit 1 quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
