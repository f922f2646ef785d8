"""The `qw` commands on a partitioned queue: what `up`, `enqueue` and `report` do when the
queue at their location has partitions (`queue_worker.partition_layout`).

Each function returns None when the queue has none, and the command goes on as today: a
queue created without partitions behaves exactly as before.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from logstore import LogError
from queue_worker.partition_layout import MAX_PARTITIONS, Manifest, read_manifest, slot_partitions
from supervisor.options import fail, shown
from supervisor.width import echo, fit_parts, output_width

if TYPE_CHECKING:  # the supervisor is imported by `up` only (enqueue and report skip it)
    from queue_worker.periodic import Ticker
    from supervisor.http_api import StatsServer
    from supervisor.partitioned.members import MemberSupervisor
    from supervisor.partitioned.members_view import MembersView
    from supervisor.partitioned.run import PartitionedSupervisor
    from supervisor.partitioned.view import PartitionedView
    from supervisor.run.supervisor import SupervisorOptions


def manifest_at(location: str, asked: int | None = None, *, create: bool = True) -> Manifest | None:
    """The queue's manifest (creating a partitioned queue when `asked` ≥ 2 and there is no
    queue yet); one line and exit 2 for a count that does not match, or a location that
    cannot be read."""
    try:
        if asked is None:
            # all that resolve_partitions does when nothing is asked, without importing the
            # producer it creates queues with (`qw status`, `task`, `why` and `enqueue` ask
            # nothing)
            return read_manifest(location)
        from queue_worker.partitions.queue import resolve_partitions

        return resolve_partitions(location, asked, create=create)
    except (LogError, ValueError) as e:
        fail(str(e))


def prepare(
    location: str,
    asked: int | None,
    workers: int,
    *,
    rebalance: bool = False,
    http: str | None = None,
    http_address: tuple[str, int] | None = None,
) -> Manifest | None:
    """The manifest `qw up` runs (None: the queue has no partitions), after every check of
    the options: a new partitioned queue is created only then, so that a refused `qw up`
    writes nothing. `qw up --app` calls it before importing the app, whose `Queue(location)`
    must find the partitions."""
    manifest = manifest_at(location, asked, create=False)
    count = manifest.count if manifest is not None else asked
    if count is None or count == 1:
        if rebalance:
            fail("--rebalance: the queue has no partitions (create it with --partitions P)")
        return None
    if not rebalance:
        try:
            slot_partitions(workers, count)
        except ValueError as e:
            fail(f"--workers {workers}: {e} (or --rebalance: a member takes several)")
    if manifest is None:
        if http_address is not None:
            _check_listen(http, http_address)
        manifest = manifest_at(location, count)
        assert manifest is not None
    return manifest


def up(
    options: SupervisorOptions,
    asked: int | None,
    *,
    http: str | None,
    http_address: tuple[str, int] | None = None,
    control_token: str | None = None,
    rebalance: bool = False,
    tui: bool = False,
    ticker: Ticker | None = None,
) -> int | None:
    """`qw up` on a partitioned queue: runs it and returns the exit code. `rebalance`:
    member processes that share the partitions with every other `qw up --rebalance`.
    `tui`: the live dashboard (`supervisor.partitioned.view`,
    `supervisor.partitioned.members_view`),
    else a status line a second;
    `http_address`: serve /stats, /metrics, /health and /task/K:ID there, and the page
    (with kill and pause for `control_token`'s holder, when given); `ticker`: the app's
    periodic ticks, enqueued while the workers run."""
    manifest = prepare(
        options.location,
        asked,
        options.workers,
        rebalance=rebalance,
        http=http,
        http_address=http_address,
    )
    if manifest is None:
        return None
    from supervisor.partitioned.members import MemberSupervisor
    from supervisor.partitioned.run import PartitionedSupervisor

    sup: PartitionedSupervisor | MemberSupervisor = (
        MemberSupervisor(options, manifest)
        if rebalance
        else PartitionedSupervisor(options, manifest)
    )
    view: PartitionedView | MembersView
    if isinstance(sup, MemberSupervisor):
        from supervisor.partitioned.members_view import MembersView

        view = MembersView(sup, shown=shown(options.location))
    else:
        from supervisor.partitioned.view import PartitionedView

        view = PartitionedView(sup, shown=shown(options.location))
    server = None
    if http_address is not None:
        from supervisor.http_api import StatsServer
        from supervisor.web.control import ControlDesk

        desk = None if control_token is None else ControlDesk(view, control_token)
        try:
            server = StatsServer(view, *http_address, logs=options.location, control=desk)
        except OSError as e:
            fail(_unlistenable(http, e))
        if isinstance(sup, MemberSupervisor):  # in the status files (`qw status`)
            sup.http_address = server.address
        else:
            for part in sup.parts:
                part.http_address = server.address
    _run(sup, view if tui else None, server, control_token, ticker)
    code = sup.exit_code
    assert code is not None
    q = sup.snapshot().queue
    counts = (
        f"{manifest.count} partitions: published {q.published}, done {q.done}, "
        f"dead {q.dead}, pending {q.pending}"
    )
    if sup.log_failure is not None:
        typer.echo(f"qw: error: stopped on a log: {sup.log_failure} ({counts})", err=True)
    elif q.pending or q.held:
        echo(f"qw: stopped with {q.pending} pending, {q.held} held ({counts})")
    else:
        echo(f"qw: drained ({counts})")
    return code


def announce_http(address: str, token: str | None) -> str | None:
    """Say on stderr where the endpoints and the page are, and --http-control's token;
    returns the line the terminal dashboard keeps showing about the token (None: none)."""
    typer.echo(f"qw: stats on http://{address}/stats", err=True)
    typer.echo(f"qw: dashboard on http://{address}/", err=True)
    if token is None:
        return None
    from supervisor.web.control import announce

    for line in announce(address, token):
        typer.echo(line, err=True)
    return f"page controls: http://{address}/#token={token}"


def _check_listen(http: str | None, address: tuple[str, int]) -> None:
    """One line and exit 2 when `--http`'s address cannot be listened on: said before a new
    queue is created (the server itself binds once the queue exists)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(address)
        except OSError as e:
            fail(_unlistenable(http, e))


def _unlistenable(http: str | None, error: OSError) -> str:
    return f"--http {http}: not an address this machine can listen on ({error.strerror})"


def _run(
    sup: PartitionedSupervisor | MemberSupervisor,
    dashboard: PartitionedView | MembersView | None,
    server: StatsServer | None,
    token: str | None = None,
    ticker: Ticker | None = None,
) -> None:
    """Start `sup` (and `ticker` once it runs), show it (the dashboard, or a status line a
    second) until it has ended; on any way out, no worker is left behind."""
    from supervisor.partitioned.run import run_partitioned_progress
    from supervisor.run.signals import stop_on_signals

    with stop_on_signals(sup.request_stop):
        try:
            sup.start()
        except (LogError, OSError) as e:
            fail(str(e))
        try:
            if ticker is not None:
                ticker.start()
            note = None
            if server is not None:
                server.start()
                note = announce_http(server.address, token)
            if dashboard is not None:
                from supervisor.tui.live import run_dashboard

                run_dashboard(dashboard, note=note)
            else:
                run_partitioned_progress(sup, sys.stdout)
            sup.wait()
        except BaseException:
            sup.stop_now()
            sup.wait(10)
            raise
        finally:
            if server is not None:
                server.close()
            if ticker is not None:
                ticker.stop()


def task_parser(high: int) -> Callable[[str], str]:
    """The parser of a task argument: an id (``17``) as everywhere, or a task of a
    partitioned queue (``3:17``); the bad value named as `whole` names it."""
    from supervisor.options import whole

    task_id = whole("a task id", 0, high)
    partition = whole("a partition (PARTITION:ID)", 0, MAX_PARTITIONS - 1)

    def parse(text: str) -> str:
        head, sep, tail = text.partition(":")
        if not sep:
            return str(task_id(text))
        return f"{partition(head)}:{task_id(tail)}"

    return parse


def task_location(location: str, task: str) -> tuple[str, int, str]:
    """Where task `task` (as `task_parser` gave it) lives: the location to read, its id
    there, and its name as messages show it. One line and exit 2 when the name does not
    fit the queue (``3:17`` on a queue without partitions, ``17`` on one with)."""
    sep = task.partition(":")[1]
    manifest = manifest_at(location, create=False)
    if manifest is None:
        if sep:
            fail(f"task {task}: {shown(location)} has no partitions (name a task by its id)")
        return location, int(task), task
    if not sep:
        fail(
            f"task {task}: {shown(location)} holds a queue of {manifest.count} partitions; "
            "name a task PARTITION:ID, like 0:17"
        )
    from queue_worker.partition_layout import parse_task_ref
    from queue_worker.partitions.queue import open_partition_topic

    try:
        ref = parse_task_ref(task, manifest.count)
        where = open_partition_topic(location, manifest, ref.partition)
    except (LogError, ValueError) as e:
        fail(str(e))
    return where, ref.task, str(ref)


def enqueue(location: str, payloads: Sequence[Any], fsync: str) -> list[str] | None:
    """`qw enqueue` on a partitioned queue: the new tasks' names (``k:id``)."""
    manifest = manifest_at(location, create=False)
    if manifest is None:
        return None
    from queue_worker.partitions.queue import PartitionedQueue

    with PartitionedQueue(location, manifest, fsync) as queue:
        return [str(ref) for ref in queue.enqueue_many(payloads)]


def enqueued_text(names: list[str], where: str) -> str:
    """What `qw enqueue` says: the tasks per partition, first and last of each."""
    by_partition: dict[str, list[str]] = {}
    for name in names:
        by_partition.setdefault(name.partition(":")[0], []).append(name)
    if len(names) == 1:
        return f"enqueued task {names[0]} on {where}"
    spans = ", ".join(
        f"{ids[0]}–{ids[-1]}" if len(ids) > 1 else ids[0]
        for _, ids in sorted(by_partition.items(), key=lambda kv: int(kv[0]))
    )
    return f"enqueued {len(names)} tasks ({spans}) on {where}"


def refuse_rules(location: str, rules: str) -> None:
    """One line and exit 2 for `qw report --rules` other than qw's on a partitioned queue
    (the comparison reads one claims log)."""
    if manifest_at(location, create=False) is not None:
        fail(
            f"--rules {rules}: {shown(location)} is a partitioned queue; give one "
            "partition's location"
        )


def refuse_at(location: str) -> None:
    """One line and exit 2 for `qw report --at` on the whole of a partitioned queue: a
    claims position is one partition's."""
    manifest = manifest_at(location, create=False)
    if manifest is None:
        return
    from queue_worker.partition_layout import partition_location

    first = shown(partition_location(location, 0, manifest.count))
    last = shown(partition_location(location, manifest.count - 1, manifest.count))
    fail(
        f"--at: {shown(location)} holds a queue of {manifest.count} partitions and a claims "
        f"position is one partition's: give a partition's location, {first} to {last} "
        "(qw report alone proves the whole queue)"
    )


def write_timeline(location: str, manifest: Manifest, out: Path) -> None:
    """`qw report --timeline FILE` on a partitioned queue: the page of every partition."""
    from queue_worker.proof.report import ReportInputError
    from supervisor.timeline.partitioned import load_partition_views, write_page

    try:
        write_page(load_partition_views(location, manifest, None, None, None), shown(location), out)
    except (ReportInputError, OSError) as e:
        fail(f"--timeline {out}: {e}")
    typer.echo(f"qw: timeline: {out}", err=True)


def report(location: str, as_json: bool, timeline: Path | None = None) -> int | None:
    """`qw report` on a partitioned queue: each partition's line and the whole queue's
    verdict (or one JSON object), and the page of `timeline`; returns the exit code."""
    manifest = manifest_at(location, create=False)
    if manifest is None:
        return None
    from queue_worker.partitions.report import load_partitioned_report
    from queue_worker.proof.report import ReportInputError

    try:
        result = load_partitioned_report(location, manifest)
    except ReportInputError as e:
        fail(str(e))
    if timeline is not None:
        write_timeline(location, manifest, timeline)
    if as_json:
        import json  # (`qw enqueue`, which imports this module, has no JSON to write)

        body = result.to_json()
        now_us = time.time_ns() // 1000
        for part, r in zip(body["per_partition"], result.partitions, strict=True):
            part["held_expired"] = [h.task for h in r.held if h.lease.expiry <= now_us]
        typer.echo(json.dumps(body, indent=2))
    else:
        width = output_width()
        lines = [
            f"qw report: {shown(location)} · queue {manifest.queue.hex()} · "
            f"{manifest.count} partitions",
            *(result.partition_line(k) for k in range(manifest.count)),
            *result.accounting_errors(),
            f"whole queue: published {result.tasks_published} · done {result.tasks_done} · "
            f"completions {result.completions_accepted}",
        ]
        for line in lines:
            typer.echo(fit_parts(line, width))
        echo(result.verdict)
    return result.exit_code


__all__ = ["enqueue", "enqueued_text", "manifest_at", "report", "up"]
