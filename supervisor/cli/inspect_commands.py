"""The commands that look at a data directory: `qw status`, `qw tail`, `qw task`, `qw kill`.

They read the logs and the run directory (stats snapshots, supervisor status files) and
never start anything; `register(app)` adds them to the `qw` app.
"""

from __future__ import annotations

import os
import signal
from collections import deque
from typing import Annotated, Final

import typer

from logstore import LogError
from queue_worker.topics import CLAIMS_TOPIC, open_topic
from supervisor.cli import option_parsers, small_commands
from supervisor.cli.record_lines import ClaimsPrinter, TasksPrinter
from supervisor.options import (
    DEFAULT_DIR,
    TOPICS,
    DirOption,
    LogOption,
    bad,
    fail,
    location_of,
    one_of,
    require_logs,
    whole,
)
from supervisor.width import echo

# The monitor, the supervisor, the report and the run files are imported by the commands
# that use them: importing them here would make every `qw` command (and `qw --help`) pay
# for them.

#: `qw status`: held tasks named one per line (--json lists them all)
MAX_HELD_SHOWN: Final = 10
#: `qw tail -n`: more than this many records would be kept in memory before printing
MAX_TAIL_LINES: Final = 10_000_000


def register(app: typer.Typer) -> None:
    """Add `status`, `tail`, `task` and `kill` to the `qw` app."""
    app.command(epilog="Example:  qw status --dir .qw")(status)
    app.command(epilog="Examples:  qw tail  ·  qw tail --follow --topic tasks")(tail)
    app.command("task", epilog="Example:  qw task 17   (qw why 17 explains each verdict)")(
        task_command
    )
    app.command(epilog="Examples:  qw kill w3  ·  qw kill 4711  ·  qw kill w3-4711-9f3a")(kill)


# -- qw status ---------------------------------------------------------------------------------


def status(
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """What runs on a data directory: supervisors, workers alive and dead, queue counts
    (on a partitioned queue, each partition's and their totals)."""
    small_commands.status(directory, log, as_json)


# -- qw tail -----------------------------------------------------------------------------------


def tail(
    topic: Annotated[
        str,
        typer.Option(parser=one_of(*TOPICS), metavar="|".join(TOPICS), help="Which log."),
    ] = CLAIMS_TOPIC,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing records as they arrive.")
    ] = False,
    lines: Annotated[
        int,
        typer.Option(
            "--lines",
            "-n",
            parser=whole("a number of records", 0, MAX_TAIL_LINES),
            metavar="N",
            help="How many of the last records to print first.",
        ),
    ] = 20,
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
) -> None:
    """Print the last records of a log, readable: positions, times, workers, and for the
    claims log the verdict of each record (from a fold of the whole log). On a partitioned
    queue: every partition's, in time order, each line tagged p<k> (tasks named k:id)."""
    location = location_of(directory, log)
    from supervisor.cli import partition_tail

    if partition_tail.tail(location, topic, lines, follow):  # every partition's, merged
        return
    require_logs(location)
    try:
        with open_topic(location, topic, read_only=True) as topic_log:
            printer = ClaimsPrinter() if topic == CLAIMS_TOPIC else TasksPrinter()
            position = topic_log.start
            recent: deque[str] = deque(maxlen=lines)
            for entry in topic_log.iter_from(position):
                recent.append(printer.line(entry))
                position = entry.next
            for line in recent:
                echo(line)
            while follow:
                topic_log.wait(position, 1.0)
                for entry in topic_log.iter_from(position):
                    echo(printer.line(entry))
                    position = entry.next
    except KeyboardInterrupt:
        return  # Ctrl-C ends --follow: that is how it is meant to stop
    except LogError as e:
        fail(str(e))


# -- qw task -----------------------------------------------------------------------------------


def task_command(
    task_name: option_parsers.TaskArgument,
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """One task: its state, payload, result or error, and every record about it."""
    small_commands.task(task_name, directory, log, as_json)


# -- qw kill -----------------------------------------------------------------------------------


def kill(
    worker: Annotated[
        str, typer.Argument(metavar="WORKER", help="A worker's name (w3), id, or pid.")
    ],
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """kill -9 a running worker of this directory (its supervisor restarts it, and a
    survivor takes over its task once the lease lapses)."""
    from queue_worker.worker.snapshot import read_snapshots
    from supervisor.run.ops_recorder import now_us, record_kill
    from supervisor.run.run_files import is_running_worker

    running = [s for s in read_snapshots(directory / "run") if is_running_worker(s)]
    matches = [s for s in running if worker in (s.name, s.worker) or worker == str(s.pid)]
    if not matches:
        names = ", ".join(f"{s.name} (pid {s.pid})" for s in running) or "none"
        bad("WORKER", worker, f"a running worker on {directory}; running: {names}")
    if len(matches) > 1:
        pids = ", ".join(str(s.pid) for s in matches)
        bad("WORKER", worker, f"one worker, but {len(matches)} match (pids {pids}): name a pid")
    target = matches[0]
    pid = target.pid
    assert pid is not None  # is_running_worker: a running worker has a pid
    at = now_us()
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        fail(f"worker {target.worker} (pid {pid}) has already exited")
    record_kill(directory, target.name or "", target.worker, pid, at)
    typer.echo(f"kill -9 {target.name} (pid {pid}, id {target.worker})")
