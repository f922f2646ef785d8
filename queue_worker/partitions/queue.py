"""A partitioned queue: creating it, finding it, and enqueueing into it.

`resolve_partitions(location, asked)` is the one answer to "how many partitions has the
queue at `location`?" for every command: it creates a new partitioned queue when asked for
P ≥ 2 partitions and there is no queue yet, and refuses (PartitionError, one line) a count
that differs from the one fixed at creation, or partitions asked of a queue created
without them.

`PartitionedQueue` is the producer: each task goes to one partition at enqueue, round-robin
from a random first partition (so that many small producers spread evenly), or by a key's
hash when the caller gives one (tasks of one key then share a partition and its order).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from logstore import Durability, LogError, is_redis_url, open_log
from logstore.blob import create_blob
from logstore.location import shown
from logstore.locking import directory_lock
from queue_worker.partition_layout import (
    MANIFEST_NAME,
    MAX_PARTITIONS,
    Manifest,
    PartitionError,
    TaskRef,
    check_partition,
    partition_location,
    read_manifest,
)
from queue_worker.producer import Queue, check_payloads
from queue_worker.topics import TASKS_TOPIC, TOPICS

if TYPE_CHECKING:
    import random


def resolve_partitions(
    location: str | Path, asked: int | None, *, create: bool = True
) -> Manifest | None:
    """The manifest of the queue at `location` (None: a queue without partitions).

    `asked`: the partitions the user asked for (None: whatever the queue has; 1: none).
    A new queue is created with them when `create` and no queue exists yet."""
    manifest = read_manifest(location)
    where = shown(location)
    if manifest is not None:
        if asked is not None and asked != manifest.count:
            raise PartitionError(
                f"{where} holds a queue of {manifest.count} partitions, not {asked}: the "
                "count is fixed when the queue is created"
            )
        return manifest
    if asked is None or asked == 1:
        return None
    if not 2 <= asked <= MAX_PARTITIONS:
        raise ValueError(f"{asked} partitions: expected 1 to {MAX_PARTITIONS}")
    if _has_plain_queue(location):
        raise PartitionError(
            f"{where} holds a queue created without partitions: --partitions is fixed when "
            "a queue is created (use another directory, or another ?prefix=)"
        )
    if not create:
        return None
    return create_partitioned(location, asked)


def create_partitioned(location: str | Path, count: int) -> Manifest:
    """Create (or join the creation of) a queue of `count` partitions at `location`: every
    partition's logs first, then the manifest that names them (first writer wins: a second
    creator computes the same manifest from the same partition logs). A data directory is
    locked meanwhile (`directory_lock`): a reader that meets the partitions before their
    manifest waits, rather than call the queue damaged."""
    if is_redis_url(str(location)):
        return _create_partitioned(location, count)
    directory = Path(location)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with directory_lock(str(directory)):
            found = read_manifest(location, creating=True)  # a creator before us
            if found is None:
                return _create_partitioned(location, count)
    except OSError as exc:
        raise LogError(f"{directory}: cannot create a queue there: {exc.strerror or exc}") from exc
    if found.count != count:
        raise _created_meanwhile(location, found, count)
    return found


def _create_partitioned(location: str | Path, count: int) -> Manifest:
    ids = []
    for k in range(count):
        where = partition_location(location, k, count)
        logs = [open_log(where, topic, family=TOPICS) for topic in TOPICS]
        try:
            identity = getattr(logs[0], "identity", None)
            if identity is None:
                raise PartitionError(f"{logs[0].name}: a log without an identity")
            ids.append(identity.queue)
        finally:
            for log in logs:
                log.close()
    manifest = Manifest.of(ids)
    stored = Manifest.decode(
        create_blob(location, MANIFEST_NAME, manifest.encode()),
        f"{shown(location)} {MANIFEST_NAME}",
    )
    if stored != manifest:
        raise _created_meanwhile(location, stored, count)
    return manifest


def _created_meanwhile(location: str | Path, found: Manifest, asked: int) -> PartitionError:
    return PartitionError(
        f"{shown(location)}: another process created this queue with {found.count} "
        f"partitions at the same time (asked: {asked})"
    )


def _has_plain_queue(location: str | Path) -> bool:
    """Does `location` hold a queue created without partitions (any log of ours)?"""
    text = str(location)
    if not is_redis_url(text):
        return any((Path(text) / f"{topic}.log").exists() for topic in TOPICS)
    from logstore.blob import read_blob

    return read_blob(text, "queue") is not None  # the identity key qw:queue


class PartitionedQueue:
    """A producer on a partitioned queue: `enqueue(payload) -> TaskRef`."""

    def __init__(
        self,
        location: str | Path,
        manifest: Manifest,
        fsync: str = "commit",
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.location = str(location)
        self.manifest = manifest
        self._fsync = fsync
        Durability.parse(fsync)  # a bad policy is refused before anything opens
        self._queues: dict[int, Queue] = {}
        if rng is None:
            import random  # here: only a producer on a partitioned queue draws (~2 ms to import)

            rng = random.Random()
        self._next = rng.randrange(manifest.count)

    def partition_queue(self, partition: int) -> Queue:
        """The producer of partition `partition` (opened once, its identity checked)."""
        queue = self._queues.get(partition)
        if queue is None:
            queue = Queue(
                partition_location(self.location, partition, self.manifest.count), self._fsync
            )
            try:
                check_partition(queue.log, self.manifest, partition)
            except BaseException:
                queue.close()
                raise
            self._queues[partition] = queue
        return queue

    def partition_for(self, key: str | bytes | None = None) -> int:
        """The partition of the next task: by `key`'s hash, or the next in turn."""
        count = self.manifest.count
        if key is not None:
            data = key.encode() if isinstance(key, str) else key
            return zlib.crc32(data) % count
        partition = self._next
        self._next = (partition + 1) % count
        return partition

    def enqueue(self, payload: Any, key: str | bytes | None = None) -> TaskRef:
        return self.enqueue_many([payload], keys=None if key is None else [key])[0]

    def enqueue_many(
        self, payloads: Iterable[Any], keys: Sequence[str | bytes] | None = None
    ) -> list[TaskRef]:
        """Append the tasks, each to its partition (one append per partition: all of a
        partition's tasks or none of them); return their refs in the order given.

        Every payload is encoded before anything is appended, so a payload that cannot be
        encoded writes nothing anywhere. A log failing midway can leave the partitions
        appended before it written (each partition's batch is whole)."""
        items = list(payloads)
        if keys is not None and len(keys) != len(items):
            raise ValueError(f"{len(keys)} keys for {len(items)} payloads")
        groups: dict[int, list[int]] = {}
        for i in range(len(items)):
            partition = self.partition_for(None if keys is None else keys[i])
            groups.setdefault(partition, []).append(i)
        check_payloads(items)  # nothing anywhere when one payload cannot be encoded
        queues = {
            p: self.partition_queue(p) for p in sorted(groups)
        }  # each checked before any append
        refs: list[TaskRef | None] = [None] * len(items)
        for partition, indices in sorted(groups.items()):
            ids = queues[partition].enqueue_many([items[i] for i in indices])
            for i, task in zip(indices, ids, strict=True):
                refs[i] = TaskRef(partition, task)
        return [ref for ref in refs if ref is not None]

    def close(self) -> None:
        for queue in self._queues.values():
            queue.close()
        self._queues.clear()

    def __enter__(self) -> PartitionedQueue:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_partition_topic(location: str | Path, manifest: Manifest, partition: int) -> str:
    """Partition `partition`'s location, after checking that its tasks log is that
    partition's (PartitionError otherwise; LogError when it cannot be opened)."""
    where = partition_location(location, partition, manifest.count)
    try:
        log = open_log(where, TASKS_TOPIC, family=TOPICS, read_only=True)
    except LogError as e:
        raise PartitionError(f"partition {partition} of {shown(location)}: {e}") from e
    with log:
        check_partition(log, manifest, partition)
    return where


__all__ = [
    "PartitionedQueue",
    "create_partitioned",
    "open_partition_topic",
    "resolve_partitions",
]
