"""The dashboard's worker table: one row per worker, columns that fit the screen whole.

A column is shown whole or not at all: a pid, a worker name or a task id cut mid-number
("118…") reads as another number. When the screen is too narrow, columns are dropped by
priority (memory first, then CPU, latency, counts …); the slot, the worker, its state, its
task and the lease stay to the last. Only when even those do not fit is a line cut.

A dead worker keeps its row, its task struck through and the log's lease counting down
(from the orphans the supervisor recorded), until its task is taken over: a restarted
slot shows the new process's row with the dead one's row beneath it. When the rows do not
all fit, the window shown keeps the selected row, or else that dead row, in view. A task
is named as everywhere else: ``#17``, or ``2:17`` on a partitioned queue, with its function
after it when it is a task by name (``#17 resize``, the name cut to 12 characters).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
from rich.text import Text

from queue_worker.names import function_label
from supervisor.run.model import Orphan, SlotState, WorkerView
from supervisor.tui.format import format_bytes, format_duration, format_micros

__all__ = ["COLUMNS", "STATE_STYLES", "Column", "TextGrid", "worker_table"]

#: below this many seconds of lease left, the lease column turns yellow: renewal is due
LEASE_WARN_SECONDS: Final = 1.0
#: the gap between columns
GAP: Final = 2

STATE_STYLES: dict[SlotState, str] = {
    SlotState.STARTING: "blue",
    SlotState.IDLE: "dim",
    SlotState.CLAIMING: "yellow",
    SlotState.WORKING: "bold green",
    SlotState.PAUSED: "bold magenta",
    SlotState.DRAINING: "cyan",
    SlotState.DEAD: "bold red",
    SlotState.EXITED: "dim",
}


@dataclass(frozen=True)
class Column:
    name: str
    justify: JustifyMethod
    usual: int  # the width it keeps while there is room, so the table does not jitter
    drop: int  # 0: never dropped; otherwise the highest number is dropped first


COLUMNS: Final = (
    Column("slot", "right", 4, 0),
    Column("worker", "left", 10, 0),  # w6·69750, w0·11704@host: never cut
    Column("state", "left", 9, 0),  # "dead KILL"
    Column("task", "right", 5, 0),
    Column("lease", "right", 7, 1),  # "expired"
    Column("held", "right", 5, 4),
    Column("fin", "right", 4, 3),
    Column("att/won/lost", "right", 12, 5),
    Column("p50/p99", "right", 12, 6),
    Column("cpu", "right", 5, 7),
    Column("rss", "right", 6, 8),
)
#: on a partitioned queue, after the worker: the partition it works (p3)
PART_COLUMN: Final = Column("part", "right", 4, 0)


def worker_table(
    workers: Sequence[WorkerView],
    *,
    now: float,
    selected: int | None = None,
    departed: Sequence[WorkerView] = (),
    orphans: Sequence[Orphan] = (),
    max_rows: int | None = None,
) -> TextGrid:
    """One row per worker slot, each departed worker's row beneath its slot's; at most
    `max_rows` rows: when the slots fit, the departed rows that fit (the newest); else a
    window that keeps the selected one, or else the first dead worker's, in view, and says
    how many are hidden."""
    by_holder: dict[str, list[Orphan]] = {}
    for orphan in orphans:
        by_holder.setdefault(orphan.holder_id, []).append(orphan)
    partitioned = any(w.partition is not None for w in (*workers, *departed))
    columns: Sequence[Column] = (
        (*COLUMNS[:2], PART_COLUMN, *COLUMNS[2:]) if partitioned else COLUMNS
    )

    def cells(w: WorkerView, *, selected: bool, departed: bool = False) -> list[Text]:
        row = _cells(w, now, by_holder, selected=selected, departed=departed)
        return _with_partition(row, w) if partitioned else row

    if max_rows is not None and len(workers) <= max_rows < len(workers) + len(departed):
        # Every slot fits, but not every departed row: the newest of those that fit, so
        # that no row is given to "… more rows" (the orphans panel names the rest's tasks)
        spare = max_rows - len(workers)
        departed = departed[len(departed) - spare :] if spare else ()
    rows: list[tuple[list[Text], str | None]] = []
    chosen: int | None = None  # the row the window keeps in view
    death: int | None = None  # the first row of a dead worker: without a selection, kept
    for w in workers:
        if w.slot == selected:
            chosen = len(rows)
        if death is None and w.ended and w.state is SlotState.DEAD:
            death = len(rows)
        is_selected = w.slot == selected
        rows.append((cells(w, selected=is_selected), "reverse" if is_selected else None))
        for gone in departed:
            if gone.slot == w.slot:
                death = len(rows) if death is None else death
                rows.append((cells(gone, selected=False, departed=True), None))
    if not rows:
        rows = [([Text(""), Text("no workers", style="dim")], None)]
    more = None
    if max_rows is not None and len(rows) > max_rows:
        shown = max(1, max_rows - 1)  # one line says how many are hidden
        # the selected row, else a death (what `k` makes happen: its row, struck-through
        # task and lease, and its neighbours — a worker of the same partition that takes
        # the task over — must be on screen however many rows are hidden), else the top
        focus = chosen if chosen is not None else death if death is not None else 0
        first = min(max(0, focus - shown // 2), len(rows) - shown)
        hidden = len(rows) - shown
        rows = rows[first : first + shown]
        more = Text(f"… {hidden} more rows: ↑/↓ select to scroll", style="dim")
    return TextGrid(columns, rows, more=more)


def _with_partition(cells: list[Text], w: WorkerView) -> list[Text]:
    """The row with the worker's partition after its name (PART_COLUMN)."""
    part = Text("" if w.partition is None else f"p{w.partition}", style="cyan")
    return [*cells[:2], part, *cells[2:]]


class TextGrid:
    """Columns of one-line cells laid out as one Text.

    Why not `rich.table.Table`: a 13-column Table of 8 workers costs ~16 ms a frame to lay
    out, more than the dashboard's whole budget (5% of a core at 4 frames a second); this
    grid lays out the same cells for a tenth of that.
    """

    def __init__(
        self,
        columns: Sequence[Column],
        rows: Sequence[tuple[Sequence[Text], str | None]],
        *,
        more: Text | None = None,
    ) -> None:
        self.columns = columns
        self.rows = rows  # (cells, style of the whole row)
        self.more = more

    def layout(self, max_width: int) -> list[tuple[int, int]]:
        """(column index, width) of the columns shown at `max_width`: each as wide as its
        widest cell, the droppable ones dropped highest first until the rest fit."""
        natural = [max(c.usual, cell_len(c.name)) for c in self.columns]
        for cells, _ in self.rows:
            for i, cell in enumerate(cells[: len(natural)]):
                natural[i] = max(natural[i], cell.cell_len)
        shown = list(range(len(self.columns)))

        def total() -> int:
            return sum(natural[i] for i in shown) + GAP * (len(shown) - 1)

        for i in sorted(shown, key=lambda i: -self.columns[i].drop):
            if total() <= max_width or self.columns[i].drop == 0:
                break
            shown.remove(i)
        return [(i, natural[i]) for i in shown]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        layout = self.layout(options.max_width)
        head = Text(style="bold")
        for n, (i, width) in enumerate(layout):
            column = self.columns[i]
            _append_cell(head, Text(column.name), width, column.justify, GAP if n else 0)
        # the rule spans the screen, as the sections' rules below the table do
        rule = Text("─" * options.max_width, style="dim")
        lines = [head, rule]
        for cells, style in self.rows:
            line = Text()
            for n, (i, width) in enumerate(layout):
                cell = cells[i] if i < len(cells) else Text("")
                _append_cell(line, cell, width, self.columns[i].justify, GAP if n else 0)
            if style:
                line.stylize(style)
            lines.append(line)
        if self.more is not None:
            lines.append(self.more)
        out = Text("\n").join(lines)
        out.no_wrap = True
        out.overflow = "ellipsis"  # only when even the columns kept do not fit
        yield out


def _append_cell(line: Text, cell: Text, width: int, justify: JustifyMethod, lead: int) -> None:
    """Append `cell` to `line` in `width` cells (it is never wider), after `lead` blanks."""
    pad = max(0, width - cell.cell_len)
    if justify == "right":
        line.append(" " * (lead + pad))
        line.append_text(cell)
    else:
        if lead:
            line.append(" " * lead)
        line.append_text(cell)
        line.append(" " * pad)


def _cells(
    w: WorkerView,
    now: float,
    orphans_by_holder: Mapping[str, list[Orphan]],
    *,
    selected: bool,
    departed: bool = False,
) -> list[Text]:
    s = w.stats
    dead = w.ended
    figures = "dim" if dead else ""  # a dead worker's figures are its last, not live ones

    name = Text(w.label, style="dim" if departed else "")
    if w.restarts and not departed:
        name.append(f" ↻{w.restarts}", style="yellow")

    state = Text(w.state.value, style=STATE_STYLES.get(w.state, ""))
    if w.state is SlotState.DEAD and w.exit_code is not None:
        state.append(f" {_exit_reason(w.exit_code)}", style="red")

    orphans = orphans_by_holder.get(w.worker_id or "", []) if dead else []
    task, since, expiry = s.current_task, s.current_since, s.lease_expiry
    if orphans:
        # the log's word on what it held (its own stats may be a claim behind)
        task_cell = Text(" ".join(_orphan_name(o) for o in orphans), style="strike")
        held = Text("")
        waiting = [o for o in orphans if o.heir is None]
        lease = (
            _lease_cell(min(o.lease_expiry for o in waiting), now)
            if waiting
            else Text("taken", style="cyan")
        )
    elif task is None:
        task_cell, held, lease = Text("—", style="dim"), Text(""), Text("")
    elif dead:
        task_cell = Text(_task_name(task, w.partition), style="dim strike")
        _with_function(task_cell, s.current_function)
        held, lease = Text(""), Text("")
    else:
        task_cell = Text(_task_name(task, w.partition), style="bold")
        _with_function(task_cell, s.current_function)
        held = Text(format_duration(now - since) if since is not None else "")
        lease = _lease_cell(expiry, now)

    att_won_lost = f"{s.attempts}/{s.won}/{s.lost_total}"

    lat = s.claim_latency_micros
    latency = f"{format_micros(lat.p50)}/{format_micros(lat.p99)}" if lat.samples else "—"

    return [
        Text(f"▶{w.slot}" if selected else str(w.slot), style="dim" if departed else ""),
        name,
        state,
        task_cell,
        lease,
        held,
        Text(str(s.finished), style=figures or "green"),
        Text(att_won_lost, style=figures),
        Text(latency, style=figures),
        Text(f"{w.cpu_percent:.1f}%" if not dead else "—", style=figures),
        Text(format_bytes(w.rss_bytes) if w.rss_bytes and not dead else "—", style=figures),
    ]


def _task_name(task: int, partition: int | None) -> str:
    """A task as every screen names it: ``#17``, or ``2:17`` on a partitioned queue (a
    partition's ids are its own: ``#17`` alone would name a task of every partition)."""
    return f"#{task}" if partition is None else f"{partition}:{task}"


def _with_function(cell: Text, function: str | None) -> None:
    """The task's function after its id (``#17 resize``), when it is a task by name."""
    if function is not None:
        cell.append(f" {function_label(function)}", style="cyan")


def _orphan_name(orphan: Orphan) -> str:
    return _task_name(orphan.task, orphan.partition)


def _lease_cell(expiry: float | None, now: float) -> Text:
    if expiry is None:
        return Text("")
    left = expiry - now
    if left <= 0:
        return Text("expired", style="bold red")
    return Text(format_duration(left), style="yellow" if left < LEASE_WARN_SECONDS else "")


def _exit_reason(code: int) -> str:
    # a negative exit code is the signal that killed it: "KILL" reads better than -9
    if code < 0:
        try:
            return signal.Signals(-code).name.removeprefix("SIG")
        except ValueError:
            return f"sig {-code}"
    return f"exit {code}"
