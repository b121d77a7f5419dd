"""The table of ``goodput report --definitions mgm`` (:func:`render`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from goodput.links import doc_url

from ..results.table import format_duration
from ..terminal import make_console
from .mgm_result import MGM_VERSION

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["render"]


def _sec(x: float) -> str:
    return f"{x:.3f}" if abs(x) >= 1 or x == 0 else f"{x:.6f}"


def render(results, console: Console | None = None) -> None:
    """Print each :class:`~.mgm.MgmResult` as a table to ``console`` (default stdout):
    productive time and every badput type of mgm (elastic ones for elastic results), in
    seconds and in percent as mgm reports them, then disruptions, steps, the ideal step
    time and deviation, the slice efficiency and the excluded time when there are some."""
    from rich.table import Table
    from rich.text import Text

    if console is None:
        console = make_console()
    for i, r in enumerate(results):
        if i:
            console.print()
        total = r.total_time_s
        head = Text()
        head.append(f"Job {r.job}", style="bold")
        if r.interval is not None:
            head.append(f"   interval {r.interval[0]}..{r.interval[1]} ns")
        head.append(f"   total {format_duration(total)}")
        head.append(f"   goodput {r.goodput_percent:.2f} %", style="bold green")
        console.print(head)
        console.print(
            f"ml-goodput-measurement {MGM_VERSION} definitions (see "
            f"{doc_url('definitions.md')}); "
            "percentages as mgm reports them",
            style="dim", markup=False, highlight=False,
        )
        table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
        table.add_column("bucket")
        table.add_column("seconds", justify="right")
        table.add_column("duration", justify="right")
        table.add_column("%", justify="right")
        pct = r.badput_percent
        rows = [("PRODUCTIVE", r.productive_time_s, r.goodput_percent)]
        for name, sec in r.badput_s.items():
            if name == "OTHER":
                for t, csec in r.custom_badput_s.items():
                    rows.append((f"CUSTOM_BADPUT_EVENTS/{t}", csec,
                                 pct.get("CUSTOM_BADPUT_EVENTS", {}).get(t, 0.0)))
            label = name + (" (not badput)" if name == "DATA_LOADING_ASYNC" else "")
            rows.append((label, sec, pct.get(name, 0.0)))
        for name, sec, p in rows:
            style = "green" if name == "PRODUCTIVE" else ("dim" if sec == 0 else None)
            table.add_row(Text(name), _sec(sec), format_duration(sec), f"{p:.2f}",
                          style=style)
        table.add_row("total", _sec(total), format_duration(total), "100.00", style="bold")
        console.print(table)
        console.print(
            f"disruptions: {r.disruptions}   max productive step: {r.max_productive_step}   "
            f"last recorded step: {r.last_recorded_step}",
            markup=False,
        )
        ideal = "-" if r.ideal_step_time_s is None else f"{_sec(r.ideal_step_time_s)} s"
        dev = r.step_deviation_s
        worst = (f", max {format_duration(max(dev.values()))} (step "
                 f"{max(dev, key=dev.get)})") if dev else ""
        console.print(f"ideal step time: {ideal}   step deviation: {len(dev)} steps{worst}",
                      markup=False)
        if r.slice_efficiency is not None:
            console.print(f"slice efficiency: stepping {r.slice_efficiency[0] * 100:.2f} %, "
                          f"available {r.slice_efficiency[1] * 100:.2f} %", markup=False)
        if r.excluded_time_s:
            console.print(f"excluded (mgm's total_excluded_time): "
                          f"{format_duration(r.excluded_time_s)}", markup=False)
