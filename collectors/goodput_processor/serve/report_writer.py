"""Where ``goodput serve`` writes its reports: ``--format`` (JSON lines or rich tables) to
``--report-file`` or stdout."""

from __future__ import annotations

import json
import sys

__all__ = ["ReportWriter"]


class ReportWriter:
    """Writes reports as JSON lines (one line per report, with ``"final"``) or rich tables;
    ``path`` None: stdout. ``write`` raises OSError when the file cannot be written."""

    def __init__(self, fmt: str, path: str | None):
        self.fmt, self.path = fmt, path

    def write(self, results, final: bool = False) -> None:
        from ..results.report_json import to_json_dict

        if self.fmt == "json":
            doc = to_json_dict(results)
            doc["final"] = final
            line = json.dumps(doc, separators=(",", ":")) + "\n"
            if self.path:
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(line)
            else:
                sys.stdout.write(line)
                sys.stdout.flush()
        elif results:
            from rich.console import Console

            from ..results.table import render_table
            from ..terminal import make_console

            if self.path:
                with open(self.path, "a", encoding="utf-8") as f:
                    render_table(results, Console(file=f, width=120, highlight=False))
            else:
                render_table(results, make_console())
