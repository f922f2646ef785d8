"""`qw retry ID` and `qw retry --dead`: a dead task enqueued again, as a new task with the
same call (linked to the dead one: `retry_of`) or the same payload; `qw cancel ID`."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from supervisor.cli import partitioned_commands as partitioned_cli
from supervisor.cli.option_parsers import TASK_NAME
from supervisor.options import DEFAULT_DIR, DirOption, LogOption, bad, fail, location_of

#: what ID is, in both commands' help
ID_HELP = "; PARTITION:ID on a partitioned queue."


def register(app: typer.Typer) -> None:
    app.command(epilog="\b\nExamples:\n  qw retry 17\n  qw retry --dead")(retry)
    app.command(epilog="\b\nExamples:\n  qw cancel 17")(cancel)


def cancel(
    task: Annotated[
        str,
        typer.Argument(parser=TASK_NAME, metavar="ID", help="The pending or held task" + ID_HELP),
    ],
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
) -> None:
    """Cancel a task: a CANCEL record makes it dead. A pending task never runs; a held
    one's next renewal is refused, so its handler sees ctx.cancelled."""
    from logstore import LogError
    from queue_worker import Queue

    location = location_of(directory, log)
    named = _named(location, task)
    try:
        with Queue(location) as queue:
            queue.cancel(named)
    except (ValueError, LogError) as e:
        fail(str(e))
    typer.echo(f"task {task} cancelled")


def _named(location: str, task: str) -> Any:
    """`task` as the queue's handles name it: an id, or PARTITION:ID on a partitioned
    queue (one line and exit 2 for a name that does not fit the queue: `task_location`)."""
    _, task_id, label = partitioned_cli.task_location(location, task)
    return label if ":" in label else task_id


def retry(
    task: Annotated[
        str | None,
        typer.Argument(parser=TASK_NAME, metavar="[ID]", help="The dead task" + ID_HELP),
    ] = None,
    dead: Annotated[
        bool, typer.Option("--dead", help="Every dead task that no task retries yet.")
    ] = False,
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
) -> None:
    """Enqueue a dead task again: a new task, the same call. Prints each new task's id.
    A task is retried once: a dead task that a task retries already is refused.

    --dead retries the dead tasks by name that no task retries yet (a retry names the task
    it retries); a dead payload task carries no such link, so it is listed, for qw retry ID.
    """
    from logstore import LogError
    from queue_worker import Queue

    if (task is None) == (not dead):
        bad("ID", task, "one task id, or --dead (not both)")
    location = location_of(directory, log)
    named: Any = None if task is None else _named(location, task)
    try:
        with Queue(location) as queue:
            ids, payloads = ([named], []) if task is not None else queue.dead_not_retried()
            for dead_id in ids:
                new = queue.retry(dead_id)
                typer.echo(f"task {dead_id} retried as task {new.id}")
    except (ValueError, LogError) as e:
        fail(str(e))
    if payloads:  # no link in a payload task: whether it was retried is not known
        listed = ", ".join(map(str, payloads))
        typer.echo(f"dead payload tasks, not retried (retry each by id: qw retry ID): {listed}")
    elif not ids:
        typer.echo("no dead task to retry")
