"""The `qw report`, `qw why` and `qw demo …` commands (registered on the main app).

The builders here are pure (a Report or a TaskStory in, rich renderables out); the command
bodies only read the logs, print, and exit with the report's code. On a terminal the tables
are drawn and coloured; piped, they are plain aligned columns.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Final

import typer
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from logstore import LogError, is_redis_url
from queue_worker.explain import TaskStory, explain_task
from queue_worker.names import printable, worker_label
from queue_worker.ops import read_ops
from queue_worker.records import MAX_TASK_ID
from queue_worker.report import (
    EXIT_BAD_INPUT,
    HeldTask,
    Margin,
    Report,
    ReportInputError,
    clock_text,
    duration_text,
    has_logs,
    load_report,
    missing_logs_text,
    read_claims,
    read_task,
)
from queue_worker.times import ago_text
from supervisor.cli_options import DirOption, LogOption, check_log_url, shown, whole
from supervisor.demos import demo_app
from supervisor.demos.common import stdout_console

DEFAULT_DIR: Final = Path(".qw")
#: the largest log position: every backend's positions fit in a signed 64-bit integer
MAX_POSITION: Final = 2**63 - 1
#: rows of a long section (takeovers, stale completions …) shown before "… and N more"
MAX_ROWS: Final = 20
HISTOGRAM_BAR: Final = 40

JsonOption = Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")]


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `qw` app."""
    app.command("report")(report_command)
    app.command("why")(why_command)
    app.add_typer(demo_app, name="demo")


def _fail(message: str) -> typer.Exit:
    """Say what is wrong on one line of stderr (as every `qw` command does); the caller
    raises the returned Exit."""
    typer.echo(f"qw: error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


def _location(directory: Path, log: str | None) -> str:
    if log is None:
        return str(directory)
    if not is_redis_url(log):
        raise _fail(
            f"--log is {log!r}; expected a redis:// URL (the files in --dir are the default)"
        )
    check_log_url(log)  # a malformed URL is one line and exit 2, before anything connects
    return log


# -- the commands ----------------------------------------------------------------------------


def report_command(
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
    as_json: JsonOption = False,
    at: Annotated[
        int | None,
        typer.Option(
            "--at",
            parser=whole("a log position", 0, MAX_POSITION),
            metavar="POSITION",
            help="Replay the claims log only up to the record at this position (inclusive).",
        ),
    ] = None,
    timeline: Annotated[
        Path | None,
        typer.Option(
            "--timeline",
            metavar="FILE",
            help="Also write the run's picture (as `qw timeline --out FILE`).",
        ),
    ] = None,
) -> None:
    """Replay both logs from the beginning and prove that no task was worked twice.

    Exit 0: every finished task was completed exactly once and none was worked twice.

    Exit 1: a task was worked twice (each is named with the positions of its records).

    Exit 2: no logs there, or a damaged log (the message names the file and byte offset).
    """
    location = _location(directory, log)
    try:
        report = load_report(location, up_to=at)
    except ReportInputError as e:
        raise _fail(str(e)) from None
    if timeline is not None:
        _write_timeline(location, timeline)
    if as_json:
        body = report.to_json()
        # by this machine's clock, for the reader (the report itself is a pure replay)
        now_us = time.time_ns() // 1000
        body["held_expired"] = [h.task for h in report.held if h.lease.expiry <= now_us]
        typer.echo(json.dumps(body, indent=2))
    else:
        console = stdout_console()
        console.print(render_report(report, shown(location), plain=not console.is_terminal))
    raise typer.Exit(report.exit_code)


def _write_timeline(location: str, out: Path) -> None:
    """`--timeline`: the page, named on stderr (stdout may be the JSON)."""
    from supervisor.timeline.cli import write_timeline

    try:
        write_timeline(location, out)
    except (ReportInputError, OSError) as e:
        raise _fail(f"--timeline {out}: {e}") from None
    typer.echo(f"qw: timeline: {out}", err=True)


def why_command(
    task: Annotated[
        int,
        typer.Argument(
            parser=whole("a task id", 0, MAX_TASK_ID),
            metavar="ID",
            help="The task id (its index in the tasks log).",
        ),
    ],
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every record about one task, in log order, with the rule that decided each."""
    location = _location(directory, log)
    try:
        if not has_logs(location):
            raise _fail(missing_logs_text(location))
        ops, _ = read_ops(location)
        now_us = time.time_ns() // 1000  # a lease that ran out by now reads as expired
        claims = read_claims(location)
        story = explain_task(task, read_task(location, task), claims, ops, now_us=now_us)
    except (ReportInputError, LogError, OSError) as e:
        raise _fail(str(e)) from None
    if not story.steps:
        raise _fail(
            f"task {task} is not in {shown(location)}: no TASK record and no claims name it"
        )
    if as_json:
        typer.echo(json.dumps(story.to_json(), indent=2))
    else:
        typer.echo(positions_note(location))
        console = stdout_console()
        console.print(render_story(story, plain=not console.is_terminal))


def positions_note(location: str) -> str:
    """What the numbers after @ and # are, said once at the top of `qw why`."""
    if is_redis_url(location):
        where = "its stream entry id MS-SEQ packed into one number, MS·2^20 + SEQ"
    else:
        where = f"its byte offset in {Path(location) / 'claims.log'}"
    return (
        f"@N      a record's position in the claims log: {where}\n"
        "task #N a task's id: its index in the tasks log\n"
    )


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
        ("dead", f"{r.tasks_dead}"),
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
    style = "" if plain else ("bold green" if r.ok else "bold red")
    for line in worked_twice_lines(r) + r.accounting_errors():
        parts.append(Text(line, style="" if plain else "red"))
    parts.append(Text(r.verdict, style=style))
    return Group(*parts)


def render_checks(r: Report, plain: bool) -> list[RenderableType]:
    """The total-queue classes (queue_worker.checker), and the one line they add up to."""
    c = r.checks
    lines: list[RenderableType] = [
        Text("total-queue classes (Jepsen)", style="" if plain else "bold")
    ]
    lines += [Text(f"  {line}") for line in c.lines()]
    style = "" if plain else ("green" if c.valid else "red")
    return [*lines, Text(c.summary, style=style), ""]


# -- `qw why` as text ------------------------------------------------------------------------


def render_story(story: TaskStory, plain: bool = False) -> RenderableType:
    table = _table(
        f"task {story.task}: {printable(story.state)}",
        plain,
        "position",
        "time",
        "record",
        "worker",
        "why",
    )
    for column in table.columns[2:]:
        column.justify = "left"
    table.columns[4].overflow = "fold"
    for step in story.steps:
        where = f"task #{step.position}" if step.kind == "TASK" else f"@{step.position}"
        where = "ops log" if step.kind == "OP" else where
        table.add_row(
            where,
            clock_text(step.at) if step.at else "",
            step.kind,
            worker_label(step.worker) if step.worker is not None else "",
            printable(step.why),
        )
    return table
