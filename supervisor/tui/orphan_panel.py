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

__all__ = ["TITLE", "orphan_line", "orphan_lines", "orphans_summary"]

TITLE = "orphans: tasks whose holder died"


def orphan_lines(orphans: Sequence[Orphan], *, now: float, lines: int) -> list[Text]:
    """At most `lines` lines: the ones still waiting first (newest first), then the
    takeovers (newest first); when they do not all fit, the last line sums up the rest:
    how many, the nearest lease to lapse among them, and their tasks."""
    waiting = [o for o in orphans if o.heir is None]
    taken = [o for o in orphans if o.heir is not None]
    ordered = [*reversed(waiting), *reversed(taken)]
    if len(ordered) > lines:
        shown = ordered[: max(0, lines - 1)]
        rest = ordered[len(shown) :]
        return [
            *(orphan_line(o, now=now) for o in shown),
            orphans_summary(rest, now=now, more=bool(shown)),
        ]
    return [orphan_line(o, now=now) for o in ordered]


def orphans_summary(orphans: Sequence[Orphan], *, now: float, more: bool) -> Text:
    """One line for several orphans: "5 orphans · 3 waiting, the next lease lapses in
    2.1s · 2 taken over · tasks 12, 40, …" (`more`: they come after lines of their own)."""
    waiting = [o for o in orphans if o.heir is None]
    count = len(orphans)
    line = Text(f"… {count} more" if more else f"{count} orphan{'s' * (count != 1)}", style="bold")
    if waiting:
        line.append(f" · {len(waiting)} waiting", style="")
        left = min(o.lease_expiry for o in waiting) - now
        if left > 0:
            line.append(", the next lease lapses in ")
            line.append(format_duration(left), style="bold yellow")
        else:
            line.append(", a lease lapsed ")
            line.append(f"{format_duration(-left)} ago", style="bold red")
    if len(waiting) < count:
        line.append(f" · {count - len(waiting)} taken over", style="cyan")
    line.append(" · tasks " + ", ".join(o.name for o in orphans), style="dim")
    return line


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
