"""The orphans panel: each task a death left behind, its lease counting down, its takeover.

    ── orphans: tasks whose holder died ─────────────────────────────────────
    task 246  w6·6975 died 1.4s ago   lease 6.6s left, then a survivor takes it over
    task 231  w3·6961 → w1·6957  took over 0.3s after the lease lapsed · 4.2s ago

The task and the workers come first and are never cut; the explanation after them is cut
to fit the screen.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from supervisor.run.model import Orphan
from supervisor.tui.format import format_duration

__all__ = ["TITLE", "orphan_line", "orphan_lines"]

TITLE = "orphans: tasks whose holder died"


def orphan_lines(orphans: Sequence[Orphan], *, now: float, lines: int) -> list[Text]:
    """At most `lines` lines: the ones still waiting first (newest first), then the
    takeovers (newest first); a last line says how many did not fit."""
    waiting = [o for o in orphans if o.heir is None]
    taken = [o for o in orphans if o.heir is not None]
    ordered = [*reversed(waiting), *reversed(taken)]
    if len(ordered) > lines:
        shown = ordered[: max(0, lines - 1)]
        rest = len(ordered) - len(shown)
        return [*(orphan_line(o, now=now) for o in shown), Text(f"… {rest} more", style="dim")]
    return [orphan_line(o, now=now) for o in ordered]


def orphan_line(orphan: Orphan, *, now: float) -> Text:
    line = Text.assemble(("task ", "dim"), (orphan.name, "bold"), "  ")
    line.append(orphan.holder, style="red")
    if orphan.heir is None or orphan.taken_at is None:
        line.append(f" died {format_duration(now - orphan.died_at)} ago", style="dim")
        left = orphan.lease_expiry - now
        if left > 0:
            line.append("   lease ")
            line.append(f"{format_duration(left)} left", style="bold yellow")
            line.append(", then a survivor takes over", style="dim")
        else:
            line.append("   lease lapsed ")
            line.append(f"{format_duration(-left)} ago", style="bold red")
            line.append(": waiting for a survivor to claim it", style="dim")
        return line
    line.append(" → ", style="dim")
    line.append(orphan.heir, style="bold cyan")
    lag = orphan.taken_at - orphan.lease_expiry
    line.append("  took over ")
    line.append(format_duration(lag), style="bold")
    line.append(" after the lease lapsed")
    line.append(f" · {format_duration(now - orphan.taken_at)} ago", style="dim")
    return line
