"""What every ``goodput`` subcommand shares at the terminal: :class:`UsageError` (a bad
command line or input, printed by :func:`goodput_processor.cli.main` as one line
``goodput: error: ...`` with exit status 2), :class:`Parser` (an ``ArgumentParser`` whose
errors are a :class:`UsageError` and whose help keeps URLs whole), :func:`make_console`
(where tables are drawn) and :class:`ProgressBar` (progress on stderr).

The command modules (:mod:`goodput_processor.cli`, :mod:`goodput_processor.serve.command`,
:mod:`goodput_processor.serve.config`, :mod:`goodput_processor.importers.command`) import
this one; it imports none of them (nor anything else of the processor).
"""

from __future__ import annotations

import argparse
import textwrap

__all__ = ["Formatter", "Parser", "ProgressBar", "UsageError", "make_console"]


class UsageError(Exception):
    """Bad command line or input; ``main`` prints it as one line and returns 2."""


class Formatter(argparse.HelpFormatter):
    """Help wrapped at spaces only, so that a URL or a hyphenated name stays whole."""

    def _split_lines(self, text, width):
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False,
                             break_long_words=False)

    def _fill_text(self, text, width, indent):
        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent,
                             subsequent_indent=indent, break_on_hyphens=False,
                             break_long_words=False)


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line (``goodput: error: ...``), not a usage dump,
    and whose help keeps URLs whole (:class:`Formatter`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


def make_console():
    """A rich console on stdout; 120 columns when stdout is not a terminal (pipes, files)."""
    import sys

    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 120)


class ProgressBar:
    """``progress(phase, advance, total)`` callback drawing a rich progress bar on stderr,
    one line per phase, labelled by ``labels`` (phase -> text; default: ``goodput
    import``'s "reading logs" and "writing spans"); ``goodput report`` draws its reading
    of the spool with it (:mod:`goodput_processor.read.progress`). Use as a context
    manager; the bar appears at the first call (a command that reads nothing, e.g. from a
    cache, draws none) and is erased at the end: print nothing to stdout before then."""

    def __init__(self, labels: dict[str, str] | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TimeRemainingColumn

        self.progress = Progress("{task.description}", BarColumn(), TaskProgressColumn(),
                                 TimeRemainingColumn(), console=Console(stderr=True),
                                 transient=True)
        self.labels = labels or {"read": "reading logs", "write": "writing spans"}
        self.tasks: dict[str, int] = {}
        self.started = False

    def __call__(self, phase: str, advance: int, total: int) -> None:
        if not self.started:
            self.progress.start()
            self.started = True
        task = self.tasks.get(phase)
        if task is None:
            label = self.labels.get(phase, phase)
            task = self.tasks[phase] = self.progress.add_task(label, total=total)
        self.progress.update(task, advance=advance)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if self.started:
            self.progress.stop()
