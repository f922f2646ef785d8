"""logstore — logs of opaque byte records, one topic per log.

The layer below the protocol: it knows nothing of tasks. `open_log` picks a backend from a
location: a directory (the file log, one file per topic) or a ``redis://`` URL (a stream per
topic).
"""

from __future__ import annotations

from pathlib import Path

from logstore.base import (
    AppendError,
    CorruptLogError,
    Durability,
    Entry,
    ForeignFileError,
    Log,
    LogClosedError,
    LogError,
    RecordTooLargeError,
)
from logstore.memory import MemoryLog

__all__ = [
    # the interface
    "Durability",
    "Entry",
    "Log",
    # backends
    "MemoryLog",
    "open_log",
    "is_redis_url",
    # errors
    "AppendError",
    "CorruptLogError",
    "ForeignFileError",
    "LogClosedError",
    "LogError",
    "RecordTooLargeError",
]


def is_redis_url(location: str) -> bool:
    return location.startswith(("redis://", "rediss://", "unix://"))


def open_log(location: str | Path, topic: str, durability: Durability = Durability.COMMIT) -> Log:
    """Open (creating if needed) the log for `topic` at `location`.

    `location` is a data directory (the file log: ``<dir>/<topic>.log``) or a Redis URL
    (the stream ``qw:<topic>`` in that database).
    """
    text = str(location)
    if is_redis_url(text):
        from logstore.redis_log import RedisLog  # imported here: redis is an optional extra

        return RedisLog.open(text, topic)
    from logstore.file_log import FileLog

    directory = Path(text)
    directory.mkdir(parents=True, exist_ok=True)
    return FileLog.open(directory / f"{topic}.log", durability=durability)
