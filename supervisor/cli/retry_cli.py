"""`qw retry ID` and `qw retry --dead`: a dead task enqueued again, as a new task with the
same call (linked to the dead one: `retry_of`) or the same payload; `qw cancel ID`."""

from __future__ import annotations

from typing import Annotated

import typer

from supervisor.options import DEFAULT_DIR, DirOption, LogOption, bad, fail, location_of


def register(app: typer.Typer) -> None:
    app.command(epilog="\b\nExamples:\n  qw retry 17\n  qw retry --dead")(retry)
    app.command(epilog="\b\nExamples:\n  qw cancel 17")(cancel)


def cancel(
    task: Annotated[int, typer.Argument(metavar="ID", help="The pending or held task.")],
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
) -> None:
    """Cancel a task: a CANCEL record makes it dead. A pending task never runs; a held
    one's next renewal is refused, so its handler sees ctx.cancelled."""
    from logstore import LogError
    from queue_worker.producer import Queue

    if task < 0:
        bad("ID", task, "a task id >= 0")
    try:
        with Queue(location_of(directory, log)) as queue:
            queue.cancel(task)
    except (ValueError, LogError) as e:
        fail(str(e))
    typer.echo(f"task {task} cancelled")


def retry(
    task: Annotated[int | None, typer.Argument(metavar="[ID]", help="The dead task.")] = None,
    dead: Annotated[
        bool, typer.Option("--dead", help="Every dead task that no task retries yet.")
    ] = False,
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
) -> None:
    """Enqueue a dead task again: a new task, the same call. Prints each new task's id.

    --dead retries the dead tasks by name that no task retries yet (a retry names the task
    it retries); a dead payload task carries no such link, so it is listed, for qw retry ID.
    """
    from logstore import LogError
    from queue_worker.producer import Queue

    if (task is None) == (not dead):
        bad("ID", task, "one task id, or --dead (not both)")
    if task is not None and task < 0:
        bad("ID", task, "a task id >= 0")
    location = location_of(directory, log)
    try:
        with Queue(location) as queue:
            ids, payloads = ([task], []) if task is not None else queue.dead_not_retried()
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
