"""What every ``goodput`` subcommand shares at the terminal: :class:`UsageError` (a bad
command line or input, printed by :func:`goodput_processor.cli.main` as one line
``goodput: error: ...`` with exit status 2), :class:`Parser` (an ``ArgumentParser`` whose
errors are a :class:`UsageError` and whose help keeps URLs whole) and :func:`make_console`
(where tables and progress are drawn).

The command modules (:mod:`goodput_processor.cli`, :mod:`goodput_processor.serve.command`,
:mod:`goodput_processor.serve.config`, :mod:`goodput_processor.importers.command`) import
this one; it imports none of them (nor anything else of the processor).
"""

from __future__ import annotations

import argparse
import textwrap

__all__ = ["Formatter", "Parser", "UsageError", "make_console"]


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
