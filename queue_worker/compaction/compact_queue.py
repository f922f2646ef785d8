"""Compact a queue wherever its logs are: the one entry point of `qw compact` and of the
supervisor's compactor. A data directory's segments (`queue_worker.compaction.files`), or a Redis
queue's streams (`queue_worker.compaction.redis_streams`: redis is an optional extra, imported only
for a Redis URL)."""

from __future__ import annotations

from pathlib import Path

from logstore import is_redis_url
from queue_worker.compaction.files import Compacted, compact
from queue_worker.compaction.settled import Retention
from queue_worker.history.checkpoint import Location


def compact_queue(
    location: Location, retention: Retention, *, now: float | None = None
) -> Compacted:
    """Compact the queue at `location`: a data directory (`compact`), or a Redis URL given
    as a str (`queue_worker.compaction.redis_streams`: its streams trimmed)."""
    if isinstance(location, str) and is_redis_url(location):
        from queue_worker.compaction.redis_streams import compact_redis

        return compact_redis(location, retention, now=now)
    return compact(Path(location), retention, now=now)


__all__ = ["compact_queue"]
