"""Compact a queue wherever its logs are: the one entry point of `qw compact` and of the
supervisor's compactor. A data directory's segments (`queue_worker.history.compaction`), or a Redis
queue's streams (`queue_worker.redis.compaction`: redis is an optional extra, imported only
for a Redis URL)."""

from __future__ import annotations

from pathlib import Path

from logstore import is_redis_url
from queue_worker.history.checkpoint import Location
from queue_worker.history.compaction import Compacted, compact
from queue_worker.history.settled import Retention


def compact_queue(
    location: Location, retention: Retention, *, now: float | None = None
) -> Compacted:
    """Compact the queue at `location`: a data directory (`compact`), or a Redis URL given
    as a str (`queue_worker.redis.compaction`: its streams trimmed)."""
    if isinstance(location, str) and is_redis_url(location):
        from queue_worker.redis.compaction import compact_redis

        return compact_redis(location, retention, now=now)
    return compact(Path(location), retention, now=now)


__all__ = ["compact_queue"]
