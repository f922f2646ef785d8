"""`qw compact`, and the disk options it shares with `qw up` (--segment-bytes, --retention,
--retention-bytes).

Compaction itself is `queue_worker.compaction.files`; what may go,
`queue_worker.compaction.settled`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Final

import typer

from logstore import LogError, is_redis_url
from logstore.file.segments import DEFAULT_SEGMENT_BYTES
from logstore.location import shown
from queue_worker.compaction.settled import DEFAULT_RETENTION_BYTES, DEFAULT_RETENTION_S, Retention
from supervisor.options import (
    DEFAULT_DIR,
    DirOption,
    LogOption,
    fail,
    fail_os,
    location_of,
    real,
)
from supervisor.width import echo

EXIT_UNSAFE: Final = 1  # compaction refused to run: nothing was removed

_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS: Final = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size(what: str, low: int, high: int) -> Callable[[str], int]:
    """A parser of a byte size: a number, or one with K, M, G or T (binary: 1K = 1024)."""

    def parse(text: str) -> int:
        found = _SIZE.match(str(text))  # (typer passes a default through as it is: an int)
        value = -1
        if found is not None:
            unit = (found[2] or "")[:1].upper()
            value = int(found[1]) * _UNITS[unit]
        if not low <= value <= high:
            raise typer.BadParameter(
                f"got {str(text)[:40]!r}; expected {what}: a number of bytes from {low} to {high} "
                "(K, M, G, T allowed: 64M)"
            )
        return value

    return parse


SegmentBytesOption = Annotated[
    int | None,
    typer.Option(
        "--segment-bytes",
        parser=size("a segment size", 4096, 1 << 40),
        metavar="N",
        help="Start a new segment file of each log once the last one holds N bytes "
        f"(default {DEFAULT_SEGMENT_BYTES >> 20}M; the log keeps the last size given).",
    ),
]
RetentionOption = Annotated[
    float,
    typer.Option(
        "--retention",
        parser=real("seconds", 0, 10 * 365 * 86_400),
        metavar="SECONDS",
        show_default=False,
        help="Settled history (segments, or Redis stream entries, whose tasks are all done "
        "or dead) older than this may be removed (default 86400: a day).",
    ),
]
RetentionBytesOption = Annotated[
    int,
    typer.Option(
        "--retention-bytes",
        parser=size("a retention size", 0, 1 << 50),
        metavar="N",
        show_default=False,
        help="Settled history of a log over N bytes may be removed too, the oldest first "
        "(default 1G; on Redis, bytes by Redis's MEMORY USAGE estimate).",
    ),
]


def register(app: typer.Typer) -> None:
    """Add `qw compact` to the `qw` app."""
    app.command("compact")(compact_command)


def compact_command(
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
    retention: RetentionOption = DEFAULT_RETENTION_S,
    retention_bytes: RetentionBytesOption = DEFAULT_RETENTION_BYTES,
    recover: Annotated[
        bool,
        typer.Option(
            "--recover",
            help="Compact nothing: put the previous fold checkpoint (kept beside it) back "
            "in place of a damaged one.",
        ),
    ] = False,
) -> None:
    """Remove settled history from the logs of a data directory (or the streams of a
    --log redis://… queue) now (qw up does it as it runs): the oldest segments (stream
    entries) whose tasks are all done or dead and that are older than --retention or beyond
    --retention-bytes. The fold checkpoint keeps what they held (which tasks are done, the
    report's totals) and a digest of each segment removed."""
    from queue_worker.partition_layout import PartitionError, partition_location, read_manifest
    from queue_worker.proof.report import has_logs

    location = location_of(directory, log)
    on_redis = is_redis_url(location)
    if recover:
        _recover(location, on_redis)
        return
    try:
        manifest = read_manifest(location)
    except (PartitionError, LogError) as e:
        fail(str(e), EXIT_UNSAFE)
    if manifest is None:
        if not has_logs(location):
            where = "streams qw:tasks and qw:claims" if on_redis else "tasks.log and claims.log"
            fail(f"{shown(location)}: no qw logs there (expected {where})")
        _compact_one(location, Retention(retention, retention_bytes), "")
        return
    # a partitioned queue: each partition is a queue of its own, compacted in turn
    for k in range(manifest.count):
        where = partition_location(location, k, manifest.count)
        if has_logs(where):
            _compact_one(where, Retention(retention, retention_bytes), f"p{k} ")


def _recover(location: str, on_redis: bool) -> None:
    """`qw compact --recover`: the previous checkpoint back in place of a damaged one."""
    from queue_worker.history.checkpoint import CheckpointRefused, recover_checkpoint

    if on_redis:
        fail(f"{shown(location)}: --recover is for a data directory's fold.checkpoint")
    try:
        echo(recover_checkpoint(Path(location)))
    except CheckpointRefused as e:
        fail(str(e), EXIT_UNSAFE)
    except OSError as e:  # a read-only mount, files it may not write: nothing was changed
        fail_os(e, "recover the checkpoint")


def _compact_one(location: str, retention: Retention, label: str) -> None:
    """Compact the one queue at `location` and say what went (`label` names a partition)."""
    from queue_worker.compaction.compact_queue import compact_queue  # (not for `qw --help`)
    from queue_worker.compaction.files import CompactionError

    on_redis = is_redis_url(location)
    try:
        done = compact_queue(location if on_redis else Path(location), retention)
    except CompactionError as e:
        fail(f"{shown(location)}: {e}", EXIT_UNSAFE)
    except LogError as e:
        fail(str(e), EXIT_UNSAFE)
    except OSError as e:  # a read-only mount, files it may not write: nothing was removed
        fail_os(e, "compact")
    for topic, removed in done.removed.items():
        count = len(removed)
        if on_redis:  # one trim per topic at most, of however many entries
            what = "trimmed" if count else "not trimmed"
            echo(f"{label}{topic}: {what}, the stream starts at position {done.starts[topic]}")
        else:
            echo(
                f"{label}{topic}: {count} segment{'s' * (count != 1)} removed, "
                f"the log starts at position {done.starts[topic]}"
            )
    estimate = " (Redis's estimate: MEMORY USAGE)" if on_redis else ""
    echo(f"{label}freed {done.freed_bytes} bytes{estimate}")


__all__ = [
    "RetentionBytesOption",
    "RetentionOption",
    "SegmentBytesOption",
    "compact_command",
    "register",
]
