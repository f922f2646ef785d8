"""logstore — logs of opaque byte records, one topic per log.

The layer below the protocol: it knows nothing of tasks. `open_log` picks a backend from a
location: a directory (the file log, one file per topic) or a ``redis://`` URL (a stream per
topic).

It imports nothing of `queue_worker` or `supervisor` (tests/test_layers.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from logstore.base import (
    AppendError,
    CorruptLogError,
    Durability,
    Entry,
    ForeignFileError,
    Log,
    LogClosedError,
    LogError,
    PositionCompactedError,
    RecordTooLargeError,
)
from logstore.identity import (
    IdentityError,
    LogIdentity,
    LostHistoryError,
    directory_queue,
    new_queue_id,
    sibling_topics,
)
from logstore.location import is_redis_url
from logstore.locking import maintenance_lock

if TYPE_CHECKING:
    from logstore.memory import MemoryLog as MemoryLog

__all__ = [
    # the interface
    "Durability",
    "Entry",
    "Log",
    # backends
    "MemoryLog",
    "open_log",
    "is_redis_url",
    "space_problem",
    # errors
    "AppendError",
    "CorruptLogError",
    "ForeignFileError",
    "IdentityError",
    "LogIdentity",
    "LogClosedError",
    "LogError",
    "LostHistoryError",
    "PositionCompactedError",
    "RecordTooLargeError",
]


def __getattr__(name: str) -> Any:
    """`MemoryLog` on first use: its `threading` is ~1 ms of every command's start, and only
    tests and in-process demos use it."""
    if name == "MemoryLog":
        from logstore.memory import MemoryLog

        return MemoryLog
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_log(
    location: str | Path,
    topic: str,
    durability: Durability = Durability.COMMIT,
    *,
    family: Sequence[str] = (),
    read_only: bool = False,
    segment_bytes: int | None = None,
    create: bool = True,
) -> Log:
    """Open (creating if needed) the log for `topic` at `location`.

    `location` is a data directory (the file log: ``<dir>/<topic>.log``) or a Redis URL
    (the stream ``qw:<topic>`` in that database).

    `family`: the topics of the queue `topic` belongs to (default: the qw logs the data
    directory holds). The log must belong to the same queue as the family's logs that
    exist (IdentityError otherwise, see `logstore.identity`); a new queue is created with
    every log of its family.
    `read_only`: create and write nothing at all (LogError when the log does not exist).
    `create=False`: the queue must exist already (IdentityError otherwise: on Redis, a
    server reset under the queue's run); a missing log of it is still made.
    `segment_bytes`: the file log's segment size from now on (None: the log's own; see
    `FileLog.open`). Not used by Redis.
    """
    text = str(location)
    topics = tuple(dict.fromkeys((*family, topic)))
    if is_redis_url(text):
        from logstore.redis.log import RedisLog  # imported here: redis is an optional extra

        return RedisLog.open(
            text, topic, family=topics if family else (), read_only=read_only, create=create
        )
    from logstore.file.log import FileLog

    directory = Path(text)
    _usable_directory(directory, read_only)
    if not family:  # the queue's logs are whatever qw logs the directory holds
        topics = tuple(dict.fromkeys((*sibling_topics(directory), topic)))
    path = directory / f"{topic}.log"
    queue = directory_queue(directory, topics)
    if queue is None and not create:
        raise IdentityError(f"{directory}: no qw queue there any more (its logs are gone)")
    if queue is None and not read_only:
        # The queue's first log: choose its id under a lock, so that two processes creating
        # two of its logs at once cannot give them two ids.
        try:
            with maintenance_lock(str(directory / "queue.lock")):
                queue = directory_queue(directory, topics)
                if queue is None:  # a new queue: every log of it, so that it is a whole set
                    queue = new_queue_id()
                    for other in topics:
                        if other != topic:
                            sibling = LogIdentity(queue, other)
                            FileLog.open(directory / f"{other}.log", identity=sibling).close()
                return FileLog.open(
                    path,
                    durability,
                    identity=LogIdentity(queue, topic),
                    segment_bytes=segment_bytes,
                )
        except OSError as exc:
            why = exc.strerror or exc
            raise LogError(f"{directory}: cannot create a queue there: {why}") from exc
    identity = None if queue is None else LogIdentity(queue, topic)
    if identity is None and read_only:  # no log of the queue exists
        raise LogError(f"{path}: no such log (opened read-only, so not created)")
    return FileLog.open(
        path, durability, identity=identity, read_only=read_only, segment_bytes=segment_bytes
    )


def _usable_directory(directory: Path, read_only: bool) -> None:
    """Raise LogError (one line naming the path) for a data directory that cannot be used."""
    if directory.exists() and not directory.is_dir():
        raise LogError(f"{directory} is not a directory (a data directory was expected)")
    if read_only:
        if not directory.is_dir():
            raise LogError(f"{directory}: no such data directory")
        return
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = exc.strerror or exc
        raise LogError(f"{directory}: cannot create the data directory: {why}") from exc


#: below this many bytes free, a data directory's device counts as full (an append of a
#: few records, the stats snapshots and a checkpoint would not fit)
LOW_SPACE_BYTES = 64 * 1024


def space_problem(location: str | Path) -> str | None:
    """Why the device of a data directory cannot take appends (it is full), or None. A full
    disk stops the workers' appends *and* their stats snapshots, so the readers of those
    (`qw status`, ``/health``) ask the device too. A Redis location: None (the server says)."""
    text = str(location)
    if is_redis_url(text):
        return None
    try:
        st = os.statvfs(text)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free >= LOW_SPACE_BYTES:
        return None
    return f"{text}: the device is full ({free} bytes free): appends to its logs fail"
