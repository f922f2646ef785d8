"""The commands that look at a data directory: `qw status`, `qw tail`, `qw task`, `qw kill`.

They read the logs and the run directory (stats snapshots, supervisor status files) and
never start anything; `register(app)` adds them to the `qw` app.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import deque
from typing import Annotated, Any, Final

import typer

from logstore import LogError, space_problem
from logstore.location import shown
from queue_worker.names import printable, worker_label
from queue_worker.records import (
    MAX_TASK_ID,
    Done,
)
from queue_worker.times import clock_text
from queue_worker.topics import CLAIMS_TOPIC, open_topic
from queue_worker.values import value_text
from supervisor import partitioned_cli
from supervisor.cli_options import (
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
from supervisor.queue_counts import queue_counts
from supervisor.record_lines import ClaimsPrinter, TasksPrinter
from supervisor.supervisor_lines import supervisor_lines

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
    from queue_worker.snapshot import read_snapshots
    from supervisor.end_state import held_text
    from supervisor.run_files import is_running_worker, read_status_files

    location = location_of(directory, log)
    from supervisor import partition_status

    if partition_status.status(directory, location, as_json):  # each partition, and the sum
        return
    require_logs(location)
    run_dir = directory / "run"
    supervisors = read_status_files(run_dir)
    snapshots = read_snapshots(run_dir)
    running = [s for s in snapshots if is_running_worker(s)]
    try:
        queue, held = queue_counts(location)
    except LogError as e:
        fail(str(e))
    disk = space_problem(location)
    now_us = time.time_ns() // 1000  # which held leases read as expired: this clock's view
    if as_json:
        body = {
            "disk": disk,
            "location": shown(location),
            "supervisors": supervisors,
            "workers": {
                "running": [s.to_dict() for s in running],
                "stopped": len(snapshots) - len(running),
            },
            "queue": {k: v for k, v in vars(queue).items() if k != "throughput_history"},
            "held": [
                {
                    "task": task,
                    "worker": lease.worker,
                    "label": worker_label(lease.worker),
                    "claim": lease.claim,
                    "expiry": lease.expiry,
                    "expired": lease.expiry <= now_us,
                }
                for task, lease, _ in held
            ],
        }
        typer.echo(json.dumps(body, indent=2))
        return
    typer.echo(f"qw on {shown(location)}")
    if disk is not None:
        typer.echo(f"disk         {disk}")
    for line in supervisor_lines(supervisors):
        typer.echo(line)
    typer.echo(f"workers      {len(running)} running, {len(snapshots) - len(running)} stopped")
    for snap in running:
        task = snap.current_task
        state = None if snap.state is None else snap.state.value
        doing = f"{state} task {task}" if task is not None else str(state)
        label = worker_label(snap.worker) if snap.worker is not None else snap.name
        typer.echo(f"  {label}  {printable(doing)}  finished {snap.finished}")
        if snap.log_error:  # a full disk, a server out of reach: say it, and where
            typer.echo(f"    log error: {printable(snap.log_error)}")
    expired = sum(1 for _, lease, _ in held if lease.expiry <= now_us)
    expired_text = f" ({expired} expired)" if expired else ""
    typer.echo(
        f"queue        published {queue.published}  pending {queue.pending}  "
        f"held {queue.held}{expired_text}  done {queue.done}  dead {queue.dead}  "
        f"failed attempts {queue.failed}"  # FAIL records: one task may fail several times
    )
    # workers on this directory's run dir; a holder elsewhere (another host on --log) is
    # not seen here, hence "here"
    here = {snap.worker for snap in running}
    for task, lease, died in held[:MAX_HELD_SHOWN]:
        gone = None if lease.worker in here else "not running here"
        typer.echo(f"  held: {held_text(task, lease, died, now_us, gone=gone)}")
    if len(held) > MAX_HELD_SHOWN:
        typer.echo(f"  … and {len(held) - MAX_HELD_SHOWN} more held (qw status --json lists all)")
    if expired:
        typer.echo("  (expired: by this machine's clock; a live worker may take the task over)")


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
    from supervisor import partition_tail

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
                typer.echo(line)
            while follow:
                topic_log.wait(position, 1.0)
                for entry in topic_log.iter_from(position):
                    typer.echo(printer.line(entry))
                    position = entry.next
    except KeyboardInterrupt:
        return  # Ctrl-C ends --follow: that is how it is meant to stop
    except LogError as e:
        fail(str(e))


# -- qw task -----------------------------------------------------------------------------------


def task_command(
    task_name: Annotated[
        str,
        typer.Argument(
            parser=partitioned_cli.task_parser(MAX_TASK_ID),
            metavar="ID",
            help="The task id (its index in the tasks log); PARTITION:ID on a partitioned queue.",
        ),
    ],
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """One task: its state, payload, result or error, and every record about it."""
    from queue_worker.explain import explain_task
    from queue_worker.report import ReportInputError, prefix_state, read_claims, read_task

    location, task_id, label = partitioned_cli.task_location(location_of(directory, log), task_name)
    require_logs(location)
    results: dict[int, Any] = {}

    def claims() -> Any:
        for position, record in read_claims(location):
            if isinstance(record, Done) and record.task == task_id:
                results[position] = record.result
            yield position, record

    try:
        now_us = time.time_ns() // 1000  # a lease that ran out by now reads as expired
        start = prefix_state(location)  # (compacted logs: the fold of what was removed)
        story = explain_task(
            task_id, read_task(location, task_id), claims(), now_us=now_us, start=start
        )
    except (ReportInputError, LogError) as e:
        fail(str(e))
    if not story.steps:
        fail(f"task {label} is not in {shown(location)}: no TASK record and no claims name it")
    accepted = [s.position for s in story.steps if s.kind == "DONE" and s.verdict == "done"]
    result = results.get(accepted[0]) if accepted else None
    if as_json:
        body = story.to_json()
        body["result"] = result
        try:
            text = json.dumps(body, indent=2, default=repr)
        except (ValueError, RecursionError):  # a result nested too deep for JSON
            body["result"] = value_text(result, 200)
            text = json.dumps(body, indent=2, default=repr)
        typer.echo(text)
        return
    typer.echo(f"task {label}: {printable(story.state)}")
    if accepted:
        typer.echo(f"  result  {value_text(result, 80)}")
    for step in story.steps:
        where = f"#{step.position}" if step.kind == "TASK" else f"@{step.position}"
        when = clock_text(step.at) if step.at else "?"
        extra = f"  {printable(step.why)}" if step.kind in ("TASK", "FAIL") else ""
        who = worker_label(step.worker) if step.worker is not None else ""
        typer.echo(f"  {where:>8}  {when}  {step.kind:5}  {who:16}  {step.verdict}{extra}")


# -- qw kill -----------------------------------------------------------------------------------


def kill(
    worker: Annotated[
        str, typer.Argument(metavar="WORKER", help="A worker's name (w3), id, or pid.")
    ],
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """kill -9 a running worker of this directory (its supervisor restarts it, and a
    survivor takes over its task once the lease lapses)."""
    from queue_worker.snapshot import read_snapshots
    from supervisor.ops_recorder import now_us, record_kill
    from supervisor.run_files import is_running_worker

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
