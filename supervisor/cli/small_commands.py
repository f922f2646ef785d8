"""The bodies of the small commands: `qw status`, `qw task`, `qw why` and `qw enqueue`.

Each is called with the values typer parsed (its command in supervisor.cli.app, inspect_cli or
report_cli is a signature, its help, and a call here).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Final

import typer

from logstore import LogError, space_problem
from logstore.location import is_redis_url, shown
from queue_worker.names import printable, worker_label
from queue_worker.protocol.records import Done
from supervisor.cli import partitioned_commands as partitioned_cli
from supervisor.options import (
    bad,
    check_log_url,
    fail,
    fail_os,
    location_of,
    require_logs,
)
from supervisor.width import echo

#: `qw status`: held tasks named one per line (--json lists them all)
MAX_HELD_SHOWN: Final = 10


def status(directory: Path, log: str | None, as_json: bool) -> None:
    # workers' stats as plain JSON values (no dataclass) and the counts without the
    # supervisor's monitor: tests/test_startup_imports.py
    from queue_worker.worker.stats_file import read_stats
    from supervisor.cli.queue_counts import queue_counts  # (the fold: not for `qw enqueue`)
    from supervisor.cli.supervisor_lines import supervisor_lines
    from supervisor.run.end_state import held_text
    from supervisor.run.run_files import is_running, read_status_files

    location = location_of(directory, log)
    manifest = partitioned_cli.manifest_at(location, create=False)
    if manifest is not None:  # a partitioned queue: each partition, and the sum
        from supervisor.cli import partition_status

        partition_status.status(directory, location, manifest, as_json)
        return
    require_logs(location)
    run_dir = directory / "run"
    try:
        supervisors = read_status_files(run_dir)
        snapshots = read_stats(run_dir)
    except OSError as e:  # a run directory it may not read
        fail_os(e, "read the run state")
    running = [s for s in snapshots if is_running(s)]
    try:
        queue, held = queue_counts(location)
    except LogError as e:
        fail(str(e))
    disk = space_problem(location)
    now_us = time.time_ns() // 1000  # which held leases read as expired: this clock's view
    if as_json:
        import json  # (not for `qw enqueue`, which has no JSON to read or write: ~1 ms)

        body = {
            "disk": disk,
            "location": shown(location),
            "supervisors": supervisors,
            "workers": {
                "running": running,  # (what WorkerSnapshot.to_dict() gives)
                "stopped": len(snapshots) - len(running),
            },
            "queue": queue._asdict(),  # (QueueView's fields, less its history)
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
    echo(f"qw on {shown(location)}")
    if disk is not None:
        echo(f"disk         {disk}")
    for line in supervisor_lines(supervisors):
        echo(line)
    echo(f"workers      {len(running)} running, {len(snapshots) - len(running)} stopped")
    for snap in running:
        task, state = snap["current_task"], snap["state"]
        doing = f"{state} task {task}" if task is not None else str(state)
        label = worker_label(snap["worker"]) if snap["worker"] is not None else snap["name"]
        echo(f"  {label}  {printable(doing)}  finished {snap['finished']}")
        if snap["log_error"]:  # a full disk, a server out of reach: say it, and where
            echo(f"    log error: {printable(snap['log_error'])}")
    expired = sum(1 for _, lease, _ in held if lease.expiry <= now_us)
    expired_text = f" ({expired} expired)" if expired else ""
    echo(
        f"queue        published {queue.published}  pending {queue.pending}  "
        f"held {queue.held}{expired_text}  done {queue.done}  dead {queue.dead}  "
        f"failed attempts {queue.failed}"  # FAIL records: one task may fail several times
    )
    # workers on this directory's run dir; a holder elsewhere (another host on --log) is
    # not seen here, hence "here"
    here = {snap["worker"] for snap in running}
    for task, lease, died in held[:MAX_HELD_SHOWN]:
        gone = None if lease.worker in here else "not running here"
        echo(f"  held: {held_text(task, lease, died, now_us, gone=gone)}")
    if len(held) > MAX_HELD_SHOWN:
        echo(f"  … and {len(held) - MAX_HELD_SHOWN} more held (qw status --json lists all)")
    if expired:
        echo("  (expired: by this machine's clock; a live worker may take the task over)")


def task(task_name: str, directory: Path, log: str | None, as_json: bool) -> None:
    import json

    from queue_worker.proof.explain import explain_batches
    from queue_worker.proof.log_reading import (
        ReportInputError,
        prefix_state,
        read_claims_batches,
        read_task,
    )
    from queue_worker.times import clock_text
    from queue_worker.values import value_text

    location, task_id, label = partitioned_cli.task_location(location_of(directory, log), task_name)
    require_logs(location)
    results: dict[int, Any] = {}

    def seen(position: int, record: Any) -> None:
        if isinstance(record, Done):
            results[position] = record.result

    try:
        now_us = time.time_ns() // 1000  # a lease that ran out by now reads as expired
        start = prefix_state(location)  # (compacted logs: the fold of what was removed)
        # the task's own records: the others need not be decoded nor folded (explain.py)
        claims = read_claims_batches(location, task_id)
        story = explain_batches(
            task_id,
            read_task(location, task_id),
            claims,
            now_us=now_us,
            start=start,
            seen=seen,
            fold_others=False,
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
    echo(f"task {story.named(label)}: {printable(story.state)}")
    if accepted:
        echo(f"  result  {value_text(result, 80)}")
    for step in story.steps:
        where = f"#{step.position}" if step.kind == "TASK" else f"@{step.position}"
        when = clock_text(step.at) if step.at else "?"
        extra = f"  {printable(step.why)}" if step.kind in ("TASK", "FAIL") else ""
        who = worker_label(step.worker) if step.worker is not None else ""
        echo(f"  {where:>8}  {when}  {step.kind:5}  {who:16}  {step.verdict}{extra}")
        if step.traceback is not None:
            echo(traceback_block(step.traceback))


def why(task_name: str, directory: Path, log: str | None, as_json: bool) -> None:
    import json

    from logstore import LogError
    from queue_worker.ops import read_ops
    from queue_worker.proof.explain import explain_batches
    from queue_worker.proof.log_reading import (
        ReportInputError,
        has_logs,
        missing_logs_text,
        prefix_state,
        read_claims_batches,
        read_task,
    )
    from supervisor.story_text import plain_story, plain_wanted, positions_note

    location, task, shown_task = partitioned_cli.task_location(
        report_location(directory, log), task_name
    )
    try:
        if not has_logs(location):
            raise report_fail(missing_logs_text(location))
        ops, _ = read_ops(location)
        now_us = time.time_ns() // 1000  # a lease that ran out by now reads as expired
        claims = read_claims_batches(location, task)  # its own records (as `task` reads)
        start = prefix_state(location)  # (compacted logs: the fold of what was removed)
        story = explain_batches(
            task,
            read_task(location, task),
            claims,
            ops,
            now_us=now_us,
            start=start,
            fold_others=False,
        )
    except (ReportInputError, LogError, OSError) as e:
        raise report_fail(str(e)) from None
    if not story.steps:
        raise report_fail(
            f"task {shown_task} is not in {shown(location)}: no TASK record and no claims name it"
        )
    if as_json:
        typer.echo(json.dumps(story.to_json(), indent=2))
    else:
        typer.echo(positions_note(location))
        text = plain_story(story, name=shown_task) if plain_wanted() else None
        tracebacks = [s.traceback for s in story.steps if s.traceback is not None]
        if text is not None:  # what rich would print, without importing it (~60 ms)
            typer.echo(text)
        else:
            from supervisor.console import stdout_console
            from supervisor.report_text import render_story

            console = stdout_console()
            console.print(render_story(story, plain=not console.is_terminal, name=shown_task))
        if tracebacks:  # the last failure's, as the handler raised it
            typer.echo(f"the last failure's traceback:\n{traceback_block(tracebacks[-1])}")


def traceback_block(traceback: str) -> str:
    """A FAIL's traceback, indented under its record, each line printable."""
    return "\n".join(f"            | {printable(line)}" for line in traceback.splitlines())


def enqueue(
    count: int | None,
    payload: str | None,
    file: Path | None,
    directory: Path,
    log: str | None,
    fsync: str,
) -> None:
    from logstore import LogError, RecordTooLargeError
    from queue_worker.protocol.records import RecordEncodeError
    from supervisor.cli import enqueue_input
    from supervisor.run.demo_traffic import demo_payloads

    location = location_of(directory, log)
    if file is not None and (payload is not None or count is not None):
        bad("--file", str(file), "--file alone (without --payload or --count)")
    if file is not None:
        payloads = enqueue_input.from_file(file)
    elif payload is not None:
        payloads = enqueue_input.repeated(payload, count or 1)
    else:
        payloads = list(demo_payloads(0, count or 1))
    from queue_worker.producer import Queue

    try:
        names = partitioned_cli.enqueue(location, payloads, fsync)
        if names is None:
            with Queue(location, fsync) as queue:
                ids = queue.enqueue_many(payloads)
    except RecordTooLargeError as e:  # refused before anything was written
        fail(f"{'--file' if file is not None else '--payload'}: {e}")
    except (LogError, RecordEncodeError) as e:
        fail(str(e))
    where = str(directory) if log is None else shown(log)
    if names is not None:  # a partitioned queue: tasks are named PARTITION:ID
        echo(partitioned_cli.enqueued_text(names, where))
        return
    if len(ids) == 1:
        echo(f"enqueued task {ids[0]} on {where}")
    else:
        echo(f"enqueued {len(ids)} tasks ({ids[0]}–{ids[-1]}) on {where}")


# -- what `qw report` and `qw why` share ------------------------------------------------------


def report_fail(message: str, code: int | None = None) -> typer.Exit:
    """Say what is wrong on one line of stderr (as every `qw` command does); the caller
    raises the returned Exit (`code`, or EXIT_BAD_INPUT)."""
    from queue_worker.proof.report import EXIT_BAD_INPUT

    typer.echo(f"qw: error: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT if code is None else code)


def report_location(directory: Path, log: str | None) -> str:
    if log is None:
        return str(directory)
    if not is_redis_url(log):
        raise report_fail(
            f"--log is {log!r}; expected a redis:// URL (the files in --dir are the default)"
        )
    check_log_url(log)  # a malformed URL is one line and exit 2, before anything connects
    return log
