"""`qw timeline --text`: the same lanes drawn in the terminal with rich.

Each lane is one row of cells, each cell a slice of the window: a claim's bar is drawn in
its outcome's colour, starting with the last digit of its task's id (a takeover's with ↷),
its lapsed lease ends with ⌁, a lost claim is ·, a stale DONE !, a pause ░, a kill or a
death ✕, a restart ↺. Pure: `render_lanes` returns a rich Table; `print_lanes` prints it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from queue_worker.names import function_label, printable, worker_label
from queue_worker.ops import PAUSE, RESTART, SKEW
from queue_worker.proof.report import clock_text, duration_text
from supervisor.timeline.model import DEAD, DONE, HELD, LOST, RELEASED, STALE, TAKEN_OVER
from supervisor.timeline.view import View

STYLE: Final = {
    DONE: "green",
    RELEASED: "yellow",
    DEAD: "red",
    TAKEN_OVER: "magenta",
    HELD: "blue",
}


#: what the lanes' characters mean, each kept whole on one line of the legend
LEGEND: Final = (
    "0-9 a claim starts (its task id's last digit)",
    "━ claim: green done, yellow released, red dead, magenta taken over, blue held",
    "↷ takeover",
    "· lost claim",
    "! stale DONE",
    "⌁ lease lapsed",
    "╌ worked past its lease",
    "░ paused",
    "✕ kill/death",
    "↺ restart",
)
#: the columns beside the cells: the worker labels and the space after them
LABEL_COLUMNS: Final = 16


def _legend(width: int) -> str:
    """The legend's items, as many on a line as fit in `width`, two spaces apart."""
    lines = [""]
    for item in LEGEND:
        if lines[-1] and len(lines[-1]) + 2 + len(item) > width:
            lines.append("")
        lines[-1] += ("  " if lines[-1] else "") + item
    return "\n".join(lines)


Cell = tuple[str, str]  # a character and its rich style


def lane_cells(view: View, cells: int) -> dict[str, list[Cell]]:
    """Each lane of `view` as `cells` cells, each a slice of its window (`qw replay` draws
    its lanes with these too)."""
    span = max(1, view.end - view.start)

    def col(t: int) -> int:
        return min(cells - 1, max(0, (t - view.start) * cells // span))

    rows: dict[str, list[Cell]] = {lane.worker: [(" ", "")] * cells for lane in view.lanes}
    for o in view.ops:
        if o.lane in rows and o.kind in (PAUSE, SKEW):
            last = col(o.end if o.end is not None else view.end)
            for c in range(col(o.at), last + 1):
                rows[o.lane][c] = ("░", "yellow")
    for b in view.bars:
        row = rows.get(b.worker)
        if row is None:
            continue
        style = STYLE[b.end_kind]
        first, last = col(b.start), col(b.end)
        for c in range(first, last + 1):
            row[c] = ("━", style)
        row[first] = ("↷" if b.takeover else str(b.task % 10), f"bold {style}")
        if b.end_kind == TAKEN_OVER:
            row[last] = ("⌁", "bold red")
        if b.late is not None:
            for c in range(last + 1, col(b.late) + 1):
                row[c] = ("╌", "red")
    for m in view.marks:
        row = rows.get(m.worker)
        if row is not None:
            c = col(m.at)
            if m.kind == LOST:
                if row[c][0] == " ":
                    row[c] = ("·", "dim")
            else:
                row[c] = ("!", "bold red" if m.kind == STALE else "red")
    for o in view.ops:
        if o.lane in rows and o.kind not in (PAUSE, SKEW):
            restart = o.kind == RESTART
            rows[o.lane][col(o.at)] = ("↺", "bold green") if restart else ("✕", "bold red")
    return rows


def render_lanes(view: View, width: int = 100, extra: Sequence[str] = ()) -> RenderableType:
    """The lanes of `view` as a table `width` cells wide (plus the labels), then the
    `extra` lines (a second layer's: supervisor.timeline.unfenced)."""
    span = max(1, view.end - view.start)
    cells = max(10, width)
    rows = lane_cells(view, cells)
    table = Table(box=None, show_header=True, pad_edge=False, header_style="bold")
    table.add_column("worker", no_wrap=True)
    table.add_column(
        f"{clock_text(view.start)} → {clock_text(view.end)} ({duration_text(span)})",
        no_wrap=True,
    )
    for lane in view.lanes:
        line = Text()
        for char, style in rows[lane.worker]:
            line.append(char, style=style)
        table.add_row(printable(lane.label), line)
    parts: list[RenderableType] = [table]
    functions = view.model.functions
    for a in view.arrows:
        function = functions.get(a.task)
        named = "" if function is None else f" ({function_label(function)})"
        parts.append(
            Text(
                f"↷ takeover of task {a.task}{named}: claim @{a.from_claim} "
                f"({worker_label(a.from_worker)}) lapsed at {clock_text(a.from_expiry)} → "
                f"CLAIM @{a.to_claim} ({worker_label(a.to_worker)}), "
                f"{duration_text(a.to_at - a.from_expiry)} later",
                style="magenta",
            )
        )
    parts.append(Text(_legend(cells + LABEL_COLUMNS), style="dim"))
    parts += [Text(f"note: {n}", style="yellow") for n in view.notes]
    parts += [Text(line, style="green") for line in extra]
    return Group(*parts)


def print_lanes(view: View, console: Console | None = None, extra: Sequence[str] = ()) -> None:
    """Print the lanes on `console` (stdout's: plain at the reader's width when piped)."""
    if console is None:
        from supervisor.console import stdout_console

        console = stdout_console()
    width = max(20, console.width - LABEL_COLUMNS)
    console.print(render_lanes(view, width, extra))
