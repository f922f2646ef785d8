"""`qw report` and `qw why` as text: pure builders, a Report or a TaskStory in, rich
renderables out (the commands in supervisor.cli.report_commands print them; the demos show the same
tables). Piped (`plain`), the tables are plain aligned columns.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from rich import box
from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from queue_worker.names import printable, worker_label
from queue_worker.proof.explain import TaskStory
from queue_worker.times import ago_text, clock_text, duration_text
from supervisor.story_text import positions_note as positions_note  # `qw why`'s, re-exported
from supervisor.story_text import story_rows

if TYPE_CHECKING:  # `qw why` renders a story without the report's module (~20 ms to import)
    from queue_worker.proof.report import HeldTask, Margin, Report

#: rows of a long section (takeovers, stale completions …) shown before "… and N more"
MAX_ROWS: Final = 20
HISTOGRAM_BAR: Final = 40


# -- `qw report` as text ---------------------------------------------------------------------


def _table(title: str, plain: bool, *columns: str) -> Table:
    table = Table(
        title=title,
        title_justify="left",
        box=None if plain else box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        header_style="" if plain else "bold",
        title_style="" if plain else "bold",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("worker", "error") else "right")
    return table


def _more(table: Table, total: int) -> None:
    if total > MAX_ROWS:
        table.caption = f"… and {total - MAX_ROWS} more (qw report --json lists them all)"


def _margin_text(m: Margin) -> str:
    if not m.samples or m.min is None or m.p50 is None:
        return "none"
    late = f", {m.late} after expiry" if m.late else ""
    return f"min {duration_text(m.min)}, p50 {duration_text(m.p50)} ({m.samples}{late})"


def summary_title(r: Report, location: str) -> str:
    where = f"@{r.claims_position}" if r.claims_position is not None else "(empty)"
    return (
        f"qw report: {location}, claims log replayed through {where} ({r.claims_records} records)"
    )


def _expired_text(r: Report, now_us: int) -> str:
    expired = sum(1 for h in r.held if h.lease.expiry <= now_us)
    return f" ({expired} with an expired lease)" if expired else ""


def _pending_text(r: Report) -> str:
    pending = r.checks.pending
    return f"{pending} (not run yet: the next qw up runs them if none runs now)" if pending else "0"


def _dead_text(r: Report) -> str:
    """The dead with their attempts; the report's count includes a compacted prefix's."""
    if not r.tasks_dead or r.checks.dead != r.tasks_dead:
        return f"{r.tasks_dead}"
    return f"{r.tasks_dead} ({r.checks.attempts_used})"


def render_summary(r: Report, plain: bool, now_us: int) -> Table:
    table = _table("", plain, "", "")
    table.show_header = False
    table.columns[0].justify = "left"
    table.columns[1].justify = "left"
    lost_reasons = ", ".join(f"{k} {v}" for k, v in sorted(r.lost_by_reason.items()))
    rows = [
        ("workers seen", f"{len(r.workers)}"),
        ("tasks published", f"{r.tasks_published}"),
        ("finished", f"{r.tasks_done}"),
        ("held now", f"{r.tasks_held}{_expired_text(r, now_us)}"),
        ("pending", _pending_text(r)),
        ("dead", _dead_text(r)),
        ("waiting to retry", f"{r.tasks_waiting}"),
        ("claim attempts", f"{r.attempts}"),
        ("wins", f"{r.wins} ({len(r.takeovers)} takeovers)"),
        (
            "lost attempts",
            f"{r.lost} ({r.lost_percent:.1f}%)" + (f": {lost_reasons}" if lost_reasons else ""),
        ),
        (
            "completions written",
            f"{r.completions} ({r.completions_accepted} accepted, {r.completions_stale} stale)",
        ),
        ("renewals", f"{r.renewals} ({r.renewals_refused} refused)"),
        ("failures", f"{r.fails_accepted} accepted, {r.fails_stale} stale"),
        ("lease margin, renewals", _margin_text(r.renewal_margin)),
        ("lease margin, completions", _margin_text(r.completion_margin)),
    ]
    if r.malformed:
        shown = ", ".join(f"@{p}" for p in r.malformed[:5])
        rows.append(("malformed records (skipped)", f"{len(r.malformed)}: {shown}"))
    if r.impossible_times:
        shown = ", ".join(f"@{p}" for p in r.impossible_times[:5])
        rows.append(("records with impossible times", f"{len(r.impossible_times)}: {shown}"))
    if r.clock_jumps:
        shown = "; ".join(j.text for j in r.clock_jumps[:5])
        more = f"; … and {len(r.clock_jumps) - 5} more" if len(r.clock_jumps) > 5 else ""
        rows.append(("clock jumps", f"{len(r.clock_jumps)}: {shown}{more}"))
    if r.unknown_records:
        rows.append(("records of unknown types", f"{r.unknown_records}"))
    if r.unpublished_tasks:
        shown = ", ".join(str(t) for t in r.unpublished_tasks[:10])
        rows.append(("claimed but not published", shown))
    for label, value in rows:
        table.add_row(label, value)
    return table


def render_histogram(r: Report, plain: bool) -> Table:
    table = _table("claim attempts per task", plain, "attempts", "tasks", "")
    table.columns[2].justify = "left"
    peak = max(r.attempts_histogram.values(), default=0)
    for attempts, tasks in sorted(r.attempts_histogram.items()):
        bar = "#" * max(1, round(HISTOGRAM_BAR * tasks / peak)) if peak and tasks else ""
        table.add_row(str(attempts), str(tasks), bar)
    return table


def render_takeovers(r: Report, plain: bool) -> Table:
    table = _table(
        "takeovers (redistribution)",
        plain,
        "task",
        "claim",
        "victim",
        "new holder",
        "after expiry",
        "after victim's last record",
    )
    table.columns[2].justify = table.columns[3].justify = "left"
    for t in r.takeovers[:MAX_ROWS]:
        table.add_row(
            str(t.task),
            f"@{t.position}",
            worker_label(t.victim),
            worker_label(t.new_holder),
            duration_text(t.gap_after_expiry),
            duration_text(t.gap_after_last),
        )
    _more(table, len(r.takeovers))
    return table


def render_stale(r: Report, plain: bool) -> Table:
    table = _table(
        "stale completions (results discarded)",
        plain,
        "task",
        "DONE",
        "worker",
        "its claim",
        "claim had won",
        "holder then",
    )
    table.columns[2].justify = table.columns[5].justify = "left"
    for s in r.stale_completions[:MAX_ROWS]:
        if s.holder is not None:
            holder = f"{worker_label(s.holder.worker)} (claim @{s.holder.claim})"
        elif s.done_position is not None:
            holder = f"none: done @{s.done_position}"
        else:
            holder = "none"
        table.add_row(
            str(s.task),
            f"@{s.position}",
            worker_label(s.worker),
            f"@{s.claim}",
            "yes" if s.claim_won else "no",
            holder,
        )
    _more(table, len(r.stale_completions))
    return table


def render_dead(r: Report, plain: bool) -> Table:
    table = _table("dead tasks", plain, "task", "FAIL", "worker", "last error")
    table.columns[2].justify = table.columns[3].justify = "left"
    for d in r.dead[:MAX_ROWS]:
        table.add_row(str(d.task), f"@{d.position}", worker_label(d.worker), printable(d.error))
    _more(table, len(r.dead))
    return table


#: the per-worker columns: (header, WorkerLine field, shown even when every value is 0)
WORKER_COLUMNS: Final = (
    ("attempts", "attempts", True),
    ("won", "won", True),
    ("takeovers", "takeovers", False),
    ("lost", "lost", True),
    ("renewals", "renewals", False),
    ("leases lost", "leases_lost", False),
    ("done", "done", True),
    ("stale", "stale", False),
    ("released", "released", False),
    ("dead", "dead", False),
)


def render_workers(r: Report, plain: bool) -> Table:
    """One row per worker; a column that is 0 for everyone is left out (it says nothing)."""
    columns = [
        (header, name)
        for header, name, always in WORKER_COLUMNS
        if always or any(getattr(w, name) for w in r.workers)
    ]
    table = _table("workers", plain, "worker", *(header for header, _ in columns))
    for w in r.workers:
        table.add_row(worker_label(w.worker), *(str(getattr(w, name)) for _, name in columns))
    return table


def lease_end_text(h: HeldTask, now_us: int) -> str:
    """When a held task's lease ends, or that it has run out and how long ago (by this
    machine's clock: it is what a person reads, never what decides ownership)."""
    expiry = h.lease.expiry
    if expiry <= now_us:
        return f"{clock_text(expiry)} (expired {ago_text(expiry, now_us)})"
    return clock_text(expiry)


def render_held(r: Report, plain: bool, now_us: int) -> Table:
    table = _table("held now", plain, "task", "worker", "claim", "since", "lease until")
    table.columns[1].justify = "left"
    for h in r.held[:MAX_ROWS]:
        lease = h.lease
        table.add_row(
            str(h.task),
            worker_label(lease.worker),
            f"@{lease.claim}",
            clock_text(lease.at),
            lease_end_text(h, now_us),
        )
    _more(table, len(r.held))
    if any(h.lease.expiry <= now_us for h in r.held):
        note = "expired: by this machine's clock; a live worker may take the task over"
        table.caption = f"{table.caption}; {note}" if table.caption else note
    return table


def worked_twice_lines(r: Report) -> list[str]:
    """One line per task worked twice, naming its decisive records and their positions."""
    lines = []
    for w in r.worked_twice:
        records = "; ".join(
            f"{ref.kind} @{ref.position} by {worker_label(ref.worker)} ({ref.verdict.value})"
            for ref in w.records
        )
        lines.append(f"task {w.task} was worked twice: {records}")
    return lines


def render_report(
    r: Report, location: str, plain: bool = False, now_us: int | None = None
) -> RenderableType:
    """The report as text; `now_us` (default: this machine's clock) decides which held
    leases read as expired."""
    now = time.time_ns() // 1000 if now_us is None else now_us
    title = Text(summary_title(r, location), style="" if plain else "bold")
    parts: list[RenderableType] = [title, render_summary(r, plain, now), ""]
    if r.prefix is not None:
        parts += [Text(prefix_line(r)), ""]
    if r.verified:
        parts += [*(Text(line) for line in verified_lines(r)), ""]
    if r.history_verified:
        parts += [Text(f"history verified: {'; '.join(r.history_verified)}"), ""]
    if r.attempts_histogram:
        parts += [render_histogram(r, plain), ""]
    if r.takeovers:
        parts += [render_takeovers(r, plain), ""]
    if r.stale_completions:
        parts += [render_stale(r, plain), ""]
    if r.dead:
        parts += [render_dead(r, plain), ""]
    if r.held:
        parts += [render_held(r, plain, now), ""]
    if r.workers:
        parts += [render_workers(r, plain), ""]
    parts += render_checks(r, plain)
    for proof in r.periodic:  # each tick enqueued once, completed at most once
        parts.append(Text(proof.line, style="" if plain or proof.ok else "red"))
        parts += [Padding(Text(line), (0, 0, 0, 2)) for line in proof.problems]
    deps = r.dependencies
    if deps is not None:  # no task run before its dependencies were done
        parts.append(Text(deps.line, style="" if plain or deps.ok else "red"))
        parts += [Padding(Text(line), (0, 0, 0, 2)) for line in deps.problems]
    if r.periodic or deps is not None:
        parts.append(Text(""))
    style = "" if plain else ("bold green" if r.ok else "bold red")
    for line in worked_twice_lines(r) + r.accounting_errors():
        parts.append(Text(line, style="" if plain else "red"))
    parts.append(Text(r.verdict, style=style))
    return Group(*parts)


def prefix_line(r: Report) -> str:
    """What of the report comes from the checkpoint, for logs compaction removed history of."""
    p = r.prefix
    assert p is not None
    return (
        f"compacted history: the claims records before position {p.position} "
        f"({p.records} records, {p.state.done_count} tasks done, {p.state.dead_count} dead, "
        f"{p.tasks} tasks published) are taken from the fold checkpoint, whose digest chain "
        f"names the {r.compacted_segments} segments removed; the totals include them, and "
        "every record after them was replayed and checked"
    )


def verified_lines(r: Report) -> list[str]:
    """What of each log's files the report verified beyond its records (protocol §5, "What
    a reader may cut"), a line for each."""
    lines = []
    for topic, v in r.verified.items():
        count = len(v.segments)
        files = f"{count} segment file{'s' * (count != 1)}"
        if count > 1:
            files += f", each sealed one ({count - 1}) as long as the next one's base says"
        forced = f"forced to disk to position {v.forced}" if v.forced else "none forced to disk"
        lines.append(
            f"verified {topic}: {files}; records whole to position {v.end}, {forced}; after "
            "them only zeros (or a torn tail past the forced offset)"
        )
    return lines


def render_checks(r: Report, plain: bool) -> list[RenderableType]:
    """The total-queue classes (queue_worker.proof.checker), and the one line they add up to."""
    c = r.checks
    lines: list[RenderableType] = [
        Text("total-queue classes (Jepsen)", style="" if plain else "bold")
    ]
    lines += [Padding(Text(line), (0, 0, 0, 2)) for line in c.lines()]
    style = "" if plain else ("green" if c.valid else "red")
    return [*lines, Text(c.summary, style=style), ""]


# -- `qw why` as text ------------------------------------------------------------------------


def render_story(story: TaskStory, plain: bool = False, name: str | None = None) -> RenderableType:
    title, rows = story_rows(story, name)  # (supervisor.story_text lays them out plain)
    # The title above the table, not as its title: a table's title wraps to the table's
    # width, and the state of a task reads better whole, wrapped only by the terminal.
    table = _table("", plain, "position", "time", "record", "worker", "why")
    table.title = None
    for column in table.columns[2:]:
        column.justify = "left"
    table.columns[4].overflow = "fold"
    for row in rows:
        table.add_row(*row)
    return Group(Text(title, style="" if plain else "bold"), table)
