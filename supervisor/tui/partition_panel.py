"""The dashboard's partitions section: each partition's backlog and progress, for the
dashboard of a partitioned `qw up` (`SupervisorSnapshot.partitions` not empty).

    ── partitions: 4 ──────────────────────────────────────────────────────────
    p0 ━━━━━━━━━──────  60%  done 12/20  pending 6  held 2  1.2/s  w0·6975 w4·6980
    p1 …

One line per partition while they fit; with fewer lines than partitions, each partition
is one cell (``p3 12/20``), as many cells to a line as the width takes, and the last line
says how many are left out. A partition with a task whose holder died (an orphan waiting
for its lease to lapse) is marked ``orphaned``: its takeover is in the orphans section.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from supervisor.run.model import Orphan, QueueView, WorkerView

__all__ = ["TITLE", "PartitionSection", "partition_section"]

TITLE = "partitions"
#: the progress bar of a partition's line
BAR = 12


def partition_section(
    partitions: Sequence[QueueView],
    workers: Sequence[WorkerView],
    orphans: Sequence[Orphan],
    *,
    lines: int,
) -> PartitionSection:
    """The title and `lines` lines below it (see the module docstring)."""
    return PartitionSection(partitions, workers, orphans, lines)


class PartitionSection:
    def __init__(
        self,
        partitions: Sequence[QueueView],
        workers: Sequence[WorkerView],
        orphans: Sequence[Orphan],
        lines: int,
    ) -> None:
        self.partitions = partitions
        self.lines = lines
        self.workers: dict[int, list[str]] = {}
        for w in workers:
            if w.partition is not None and not w.ended:
                self.workers.setdefault(w.partition, []).append(w.label)
        self.orphaned = {o.partition for o in orphans if o.heir is None}

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        title = Text.assemble(("── ", "dim"), (f"{TITLE}: {len(self.partitions)}", "bold"), " ")
        title.append("─" * max(0, width - title.cell_len), style="dim")
        yield title
        if self.lines >= len(self.partitions):
            rows = [self._line(k, q) for k, q in enumerate(self.partitions)]
        else:
            rows = self._packed(width)
        rows.extend(Text("") for _ in range(self.lines - len(rows)))
        body = Text("\n").join(rows)
        body.no_wrap, body.overflow = True, "ellipsis"
        yield body

    def _line(self, k: int, q: QueueView) -> Text:
        closed = q.done + q.dead
        fraction = closed / q.published if q.published else 0.0
        done = round(fraction * BAR)
        line = Text.assemble(
            (f"p{k:<3}", "bold cyan"),
            ("━" * done, "green"),
            ("─" * (BAR - done), "dim"),
            f" {100 * fraction:3.0f}%" if q.published else "   —",
            ("  done ", "dim"),
            (f"{q.done:,}", "green"),
            f"/{q.published:,}",
            ("  pending ", "dim"),
            (f"{q.pending:,}", "yellow"),
            ("  held ", "dim"),
            (f"{q.held:,}", "cyan"),
        )
        if q.dead:
            line.append("  dead ", style="dim")
            line.append(f"{q.dead:,}", style="red")
        line.append(f"  {q.throughput_now:.1f}/s", style="bold")
        if k in self.orphaned:
            line.append("  orphaned", style="bold red")
        names = self.workers.get(k)
        line.append("  " + " ".join(names) if names else "  no worker", style="dim")
        return line

    def _cell(self, k: int, q: QueueView) -> Text:
        cell = Text.assemble((f"p{k} ", "bold cyan"), f"{q.done:,}/{q.published:,}")
        if k in self.orphaned:
            cell.append(" !", style="bold red")
        return cell

    def _packed(self, width: int) -> list[Text]:
        """The partitions as cells, several to a line; the last line ends with how many
        did not fit."""
        rows: list[Text] = []
        line = Text()
        count = len(self.partitions)
        for k, q in enumerate(self.partitions):
            cell = self._cell(k, q)
            if line.cell_len and line.cell_len + 2 + cell.cell_len > width:
                rows.append(line)
                line = Text()
            if len(rows) == self.lines - 1:
                rest = Text(f"… {count - k} more", style="dim")
                if line.cell_len + 2 + cell.cell_len + 2 + rest.cell_len > width and k < count - 1:
                    line.append("  " if line.cell_len else "")
                    line.append_text(rest)
                    rows.append(line)
                    return rows
            line.append("  " if line.cell_len else "")
            line.append_text(cell)
        rows.append(line)
        return rows[: self.lines]
