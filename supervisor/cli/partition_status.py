"""`qw status` on a partitioned queue: each partition's counts and workers, and the totals.

    qw on parts · 4 partitions
    supervisors  1 running
      pid 4711  8 workers alive  4 partitions
    partition  published  pending  held  done  dead  failed  workers
    p0                50       20     2    28     0       0  2 running
    …
    total            200       80     8   112     0       0  8 running
      held: task 2:5 by w1·3857 (dead, lease expired 0.40 s ago)

Each partition is read as `qw status` reads a queue (a read-only fold of its logs, damage
anywhere an error); a partition no task went to yet has no logs and counts zero. Workers
are found in each partition's run directory (``<dir>/p<k>/run``: `qw up --partitions`) and
in the queue's (``<dir>/run``: the members of `qw up --rebalance`, whose workers are named
``<member>.p<k>``).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, NamedTuple

import typer

from logstore import LogError, space_problem
from logstore.location import shown
from queue_worker.names import printable, worker_label
from queue_worker.partition_layout import Manifest, partition_location
from queue_worker.worker.stats_file import read_stats
from supervisor.cli.queue_counts import Held, QueueCounts, sum_counts
from supervisor.cli.supervisor_lines import supervisor_lines
from supervisor.options import fail
from supervisor.width import echo

#: held tasks named one per line (--json lists them all)
MAX_HELD_SHOWN = 10
#: a member's worker on partition k is named <member>.p<k> (queue_worker.partitions.member)
_MEMBER_WORKER = re.compile(r"\.p(\d+)$")
_COUNTS = ("published", "pending", "held", "done", "dead", "failed")


class PartitionStatus(NamedTuple):
    partition: int
    queue: QueueCounts
    held: Held
    running: list[dict[str, Any]]  # its workers' stats (queue_worker.worker.stats_file)


def status(directory: Path, location: str, manifest: Manifest, as_json: bool) -> None:
    """Print the status of the partitioned queue at `location`, whose manifest `qw status`
    has read (it imports this module only for a queue that has one)."""
    from supervisor.run.run_files import is_running, read_status_files

    try:
        parts = _read(directory, location, manifest)
    except LogError as e:
        fail(str(e))
    supervisors = [s for run in _run_dirs(directory, manifest) for s in read_status_files(run)]
    running = [w for p in parts for w in p.running if is_running(w)]
    total = sum_counts([p.queue for p in parts])
    disk = space_problem(location)
    now_us = time.time_ns() // 1000
    if as_json:
        typer.echo(
            json.dumps(_json(location, manifest, parts, supervisors, disk, now_us), indent=2)
        )
        return
    echo(f"qw on {shown(location)} · {manifest.count} partitions")
    if disk is not None:
        echo(f"disk         {disk}")
    for line in supervisor_lines(supervisors):  # (one line for a qw up's partitions)
        echo(line)
    rows = [
        [f"p{p.partition}", *_counts(p.queue), f"{_alive(p, is_running)} running"] for p in parts
    ]
    rows.append(["total", *_counts(total), f"{len(running)} running"])
    for line in _table(["partition", *_COUNTS, "workers"], rows):
        echo(line)
    here = {w["worker"] for w in running}
    held = [(p.partition, *h) for p in parts for h in p.held]
    from supervisor.run.end_state import held_text

    for k, task, lease, died in held[:MAX_HELD_SHOWN]:
        gone = None if lease.worker in here else "not running here"
        text = held_text(task, lease, died, now_us, gone=gone)
        echo(f"  held: {text.replace(f'task {task} ', f'task {k}:{task} ', 1)}")
    if len(held) > MAX_HELD_SHOWN:
        echo(f"  … and {len(held) - MAX_HELD_SHOWN} more held (qw status --json lists all)")
    if any(lease.expiry <= now_us for _, _, lease, _ in held):
        echo("  (expired: by this machine's clock; a live worker may take the task over)")


def _read(directory: Path, location: str, manifest: Manifest) -> list[PartitionStatus]:
    from queue_worker.partitions.queue import open_partition_topic
    from queue_worker.proof.report import has_logs
    from supervisor.cli.queue_counts import queue_counts

    members = read_stats(directory / "run")
    parts = []
    for k in range(manifest.count):
        where = open_partition_topic(location, manifest, k)  # its logs are this queue's
        queue, held = queue_counts(where) if has_logs(where) else (QueueCounts(), [])
        running = read_stats(directory / f"p{k}" / "run")
        running += [w for w in members if _member_partition(w) == k]
        parts.append(PartitionStatus(k, queue, held, running))
    return parts


def _member_partition(stats: dict[str, Any]) -> int | None:
    found = _MEMBER_WORKER.search(stats["name"] or "")
    return int(found.group(1)) if found else None


def _run_dirs(directory: Path, manifest: Manifest) -> list[Path]:
    return [directory / "run", *(directory / f"p{k}" / "run" for k in range(manifest.count))]


def _alive(part: PartitionStatus, running: Any) -> int:
    return sum(1 for w in part.running if running(w))


def _counts(q: QueueCounts) -> list[str]:
    return [str(getattr(q, key)) for key in _COUNTS]


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    """Columns as wide as their widest cell: the first and last left, numbers right."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        out = [
            c.ljust(w) if i in (0, len(cells) - 1) else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    return [line(head), *(line(r) for r in rows)]


def _json(
    location: str,
    manifest: Manifest,
    parts: list[PartitionStatus],
    supervisors: list[dict[str, Any]],
    disk: str | None,
    now_us: int,
) -> dict[str, Any]:
    def queue(q: QueueCounts) -> dict[str, Any]:
        return q._asdict()

    return {
        "partitioned": True,
        "partitions_count": manifest.count,
        "queue_id": manifest.queue.hex(),
        "disk": disk,
        "location": shown(location),
        "supervisors": supervisors,
        "queue": queue(sum_counts([p.queue for p in parts])),
        "partitions": [
            {
                "partition": p.partition,
                "location": shown(partition_location(location, p.partition, manifest.count)),
                "queue": queue(p.queue),
                "workers": p.running,
                "held": [
                    {
                        "task": f"{p.partition}:{task}",
                        "worker": lease.worker,
                        "label": printable(worker_label(lease.worker)),
                        "claim": lease.claim,
                        "expiry": lease.expiry,
                        "expired": lease.expiry <= now_us,
                    }
                    for task, lease, _ in p.held
                ],
            }
            for p in parts
        ],
    }


__all__ = ["status"]
