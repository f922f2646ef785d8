"""The commands that look at a data directory: `qw status`, `qw tail`, `qw task`, `qw kill`.

They read the logs and the run directory (stats snapshots, supervisor status files) and
never start anything; `register(app)` adds them to the `qw` app.
"""

from __future__ import annotations

import json
import os
import signal
from collections import deque
from typing import TYPE_CHECKING, Annotated, Any

import typer

from queue_worker.topics import CLAIMS_TOPIC, ClaimsFollower
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
    shown,
    whole,
)

if TYPE_CHECKING:
    from queue_worker.records import ClaimsRecord
    from queue_worker.state import Outcome
    from supervisor.model import QueueView

# Each command imports what it needs when it runs (`qw --help` imports this module).


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
    """What runs on a data directory: supervisors, workers alive and dead, queue counts."""
    from logstore import LogError
    from queue_worker.stats import read_all
    from supervisor.supervisor import is_running_worker, read_status_files

    location = location_of(directory, log)
    require_logs(location)
    run_dir = directory / "run"
    supervisors = read_status_files(run_dir)
    snapshots = read_all(run_dir)
    running = [s for s in snapshots if is_running_worker(s)]
    try:
        queue = _queue_counts(location)
    except LogError as e:
        fail(str(e))
    if as_json:
        body = {
            "location": shown(location),
            "supervisors": supervisors,
            "workers": {"running": running, "stopped": len(snapshots) - len(running)},
            "queue": {k: v for k, v in vars(queue).items() if k != "throughput_history"},
        }
        typer.echo(json.dumps(body, indent=2))
        return
    typer.echo(f"qw on {shown(location)}")
    typer.echo(f"supervisors  {len(supervisors)} running")
    for sup in supervisors:
        alive = sum(1 for w in sup.get("workers", []) if w.get("alive"))
        http = f"  http {sup['http']}" if sup.get("http") else ""
        draining = "  draining" if sup.get("draining") else ""
        typer.echo(f"  pid {sup.get('pid')}  {alive} workers alive{http}{draining}")
    typer.echo(f"workers      {len(running)} running, {len(snapshots) - len(running)} stopped")
    for snap in running:
        task = snap.get("current_task")
        doing = f"{snap.get('state')} task {task}" if task is not None else snap.get("state")
        typer.echo(
            f"  {snap.get('name')}  pid {snap.get('pid')}  {doing}  "
            f"finished {snap.get('finished', 0)}  id {snap.get('worker')}"
        )
    typer.echo(
        f"queue        published {queue.published}  pending {queue.pending}  "
        f"held {queue.held}  done {queue.done}  dead {queue.dead}  "
        f"failed attempts {queue.failed}"  # FAIL records: one task may fail several times
    )


def _queue_counts(location: str) -> QueueView:
    """The queue as a fold of the whole claims log says it is now."""
    from supervisor.monitor import Monitor

    monitor = Monitor(location)
    try:
        while True:
            monitor.poll()
            if monitor.caught_up:
                return monitor.queue_view()
    finally:
        monitor.close()


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
            parser=whole("a number of records", 0),
            metavar="N",
            help="How many of the last records to print first.",
        ),
    ] = 20,
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
) -> None:
    """Print the last records of a log, readable: positions, times, workers, and for the
    claims log the verdict of each record (from a fold of the whole log)."""
    from logstore import LogError, open_log

    location = location_of(directory, log)
    require_logs(location)
    try:
        with open_log(location, topic) as topic_log:
            printer = _ClaimsPrinter() if topic == CLAIMS_TOPIC else _TasksPrinter()
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


class _TasksPrinter:
    def __init__(self) -> None:
        self.index = 0

    def line(self, entry: Any) -> str:
        task, self.index = self.index, self.index + 1
        from queue_worker.records import RecordDecodeError, Unknown, decode_task
        from queue_worker.report import clock_text

        head = f"#{task}  @{entry.position}"
        try:
            record = decode_task(entry.data)
        except RecordDecodeError as e:
            return f"{head}  malformed: {e}"
        if isinstance(record, Unknown):
            return f"{head}  a record of unknown type {record.code!r}"
        return f"{head}  {clock_text(record.enqueued_at)}  {_short(record.payload)}"


class _ClaimsPrinter:
    def __init__(self) -> None:
        self.follower = ClaimsFollower(0)

    def line(self, entry: Any) -> str:
        outcome, record = self.follower.apply(entry)
        return f"@{entry.position}  {_record_text(record)}  → {_verdict_text(outcome)}"


def _short(value: Any, limit: int = 80) -> str:
    from queue_worker.values import value_text

    return value_text(value, limit)  # payloads and results read as JSON everywhere


def _record_text(r: ClaimsRecord) -> str:
    from queue_worker.records import Claim, Done, Fail, Renew, Unknown
    from queue_worker.report import clock_text, duration_text

    if isinstance(r, Unknown):
        return f"a record of unknown type {r.code!r}"
    head = f"{clock_text(r.at)}  {type(r).__name__.upper():5}  task {r.task}  by {r.worker}"
    if isinstance(r, Claim):
        return f"{head}  lease {duration_text(r.lease)}"
    if isinstance(r, Renew):
        return f"{head}  claim @{r.claim}  lease {duration_text(r.lease)}"
    if isinstance(r, Done):
        return f"{head}  claim @{r.claim}  result {_short(r.result, 40)}"
    assert isinstance(r, Fail)
    then = "dead" if r.retry_at is None else f"retry at {clock_text(r.retry_at)}"
    return f"{head}  claim @{r.claim}  {then}: {_short(r.error, 60)}"


def _verdict_text(o: Outcome) -> str:
    from queue_worker.report import clock_text
    from queue_worker.state import Verdict

    text = o.verdict.value
    if o.verdict is Verdict.TAKEOVER and o.previous is not None:
        return f"{text} from {o.previous.worker}"
    if o.verdict is Verdict.LOST_HELD and o.holder is not None:
        return f"{text} by {o.holder.worker} until {clock_text(o.holder.expiry)}"
    return text


# -- qw task -----------------------------------------------------------------------------------


def task_command(
    task_id: Annotated[int, typer.Argument(metavar="ID", help="The task id (its index).")],
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
) -> None:
    """One task: its state, payload, result or error, and every record about it."""
    from logstore import LogError
    from queue_worker.explain import explain_task
    from queue_worker.records import Done
    from queue_worker.report import ReportInputError, clock_text, read_claims, read_task

    location = location_of(directory, log)
    require_logs(location)
    results: dict[int, Any] = {}

    def claims() -> Any:
        for position, record in read_claims(location):
            if isinstance(record, Done) and record.task == task_id:
                results[position] = record.result
            yield position, record

    try:
        story = explain_task(task_id, read_task(location, task_id), claims())
    except (ReportInputError, LogError) as e:
        fail(str(e))
    if not story.steps:
        fail(f"task {task_id} is not in {shown(location)}: no TASK record and no claims name it")
    accepted = [s.position for s in story.steps if s.kind == "DONE" and s.verdict == "done"]
    result = results.get(accepted[0]) if accepted else None
    if as_json:
        body = story.to_json()
        body["result"] = result
        typer.echo(json.dumps(body, indent=2, default=repr))
        return
    typer.echo(f"task {task_id}: {story.state}")
    if accepted:
        typer.echo(f"  result  {_short(result)}")
    for step in story.steps:
        where = f"#{step.position}" if step.kind == "TASK" else f"@{step.position}"
        when = clock_text(step.at) if step.at else "?"
        extra = f"  {step.why}" if step.kind == "TASK" or step.kind == "FAIL" else ""
        typer.echo(
            f"  {where:>8}  {when}  {step.kind:5}  {step.worker or '':24}  {step.verdict}{extra}"
        )


# -- qw kill -----------------------------------------------------------------------------------


def kill(
    worker: Annotated[
        str, typer.Argument(metavar="WORKER", help="A worker's name (w3), id, or pid.")
    ],
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """kill -9 a running worker of this directory (its supervisor restarts it, and a
    survivor takes over its task once the lease lapses)."""
    from queue_worker.stats import read_all
    from supervisor.supervisor import is_running_worker

    running = [s for s in read_all(directory / "run") if is_running_worker(s)]
    matches = [
        s
        for s in running
        if worker in (s.get("name"), s.get("worker")) or worker == str(s.get("pid"))
    ]
    if not matches:
        names = ", ".join(f"{s.get('name')} (pid {s.get('pid')})" for s in running) or "none"
        bad("WORKER", worker, f"a running worker on {directory}; running: {names}")
    if len(matches) > 1:
        pids = ", ".join(str(s.get("pid")) for s in matches)
        bad("WORKER", worker, f"one worker, but {len(matches)} match (pids {pids}): name a pid")
    target = matches[0]
    try:
        os.kill(int(target["pid"]), signal.SIGKILL)
    except ProcessLookupError:
        fail(f"worker {target.get('worker')} (pid {target['pid']}) has already exited")
    typer.echo(f"kill -9 {target.get('name')} (pid {target['pid']}, id {target.get('worker')})")
