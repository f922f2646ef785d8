"""Partitions: one queue split into P sub-queues, each with its own topics and total order.

A queue created with ``--partitions P`` (P ≥ 2; P = 1 is today's queue, unchanged) is P
queues in the usual sense — partition k has its own tasks, claims and ops topics, its own
identity, its own fold — plus a **manifest** that names them as one queue:

    file log   <dir>/partitions             the manifest
               <dir>/p0/tasks.log, claims.log, ops.log   …   <dir>/p<P-1>/…
    Redis      qw:partitions                the manifest (P:qw:partitions with ?prefix=P)
               {p0}:qw:tasks, {p0}:qw:claims, {p0}:qw:ops, {p0}:qw:queue   …
               (with ?prefix=P: P:{P.p0}:qw:tasks …)

The braces are a Redis Cluster hash tag: every key of one partition (its streams, its
identity key, and the keys its append script touches) hashes to one slot, so one script
call never spans two nodes. The tag is ``p<k>``, or ``p<k>.<i>`` for the first i that puts
partition k in the k-th P-th of the slots (`hash_tag`), so that the partitions spread
evenly over the cluster's nodes.

A partition is opened at `partition_location(location, k, P)` like any queue: the file log,
the Redis log, the worker, the fold and the report run on it unchanged.

The manifest (bytes, big-endian)::

    magic "QWPART" + version 1 (7 bytes) · count u16 · queue id (16) · count × the queue id
    of each partition's logs (16) · CRC32 of everything before (u32)

The queue id is a hash of the partitions' ids, so two processes creating the same queue at
once write the same manifest. Opening partition k checks that its logs carry the id the
manifest names for k (`check_partition`): partitions swapped or copied from another queue
are refused, as a log of another queue is. Reading the manifest of a data directory checks
its layout too (`check_layout`): partition directories without a manifest, a partition or
one of its logs missing, a partition the manifest does not name, or a log at the top beside
the manifest are refused, so no command creates a log in a damaged partitioned queue.

Task ids: a task of a partitioned queue is named ``k:id`` — its partition, and its index in
that partition's tasks topic (`TaskRef`). ``3:17`` is task 17 of partition 3.
"""

import contextlib
import functools
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Final, NamedTuple
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from logstore import IdentityError, Log, LogError, LogIdentity, is_redis_url
from logstore.blob import read_blob
from logstore.identity import QUEUE_ID_SIZE, read_file_identity, sibling_topics
from logstore.location import shown
from logstore.locking import directory_lock
from queue_worker.protocol.topic_names import TOPICS

#: the manifest's name beside the logs (the file <dir>/partitions, the Redis key qw:partitions)
MANIFEST_NAME: Final = "partitions"
MAGIC: Final = b"QWPART\x01"
MAX_PARTITIONS: Final = 1024
#: the hash slots of a Redis Cluster
SLOTS: Final = 16384

_HEAD = struct.Struct(">7sH16s")
_CRC = struct.Struct(">I")


class PartitionError(IdentityError):
    """A partitioned queue that is not what was asked for, or a damaged manifest."""


class TaskRef(NamedTuple):
    """A task of a partitioned queue: its partition and its id there."""

    partition: int
    task: int

    def __str__(self) -> str:
        return f"{self.partition}:{self.task}"


def parse_task_ref(text: str, partitions: int) -> TaskRef:
    """``"3:17"`` → TaskRef(3, 17). ValueError naming what was expected otherwise."""
    part, sep, task = text.strip().partition(":")
    if not sep or not part.isdigit() or not task.isdigit():
        raise ValueError(
            f"{text!r} is not a task of a partitioned queue: expected PARTITION:ID, like 0:17"
        )
    ref = TaskRef(int(part), int(task))
    if ref.partition >= partitions:
        raise ValueError(
            f"partition {ref.partition} does not exist: the queue has {partitions} "
            f"(0–{partitions - 1})"
        )
    return ref


class Manifest:
    """What makes P partitions one queue. Immutable, compared and hashed by its fields (a
    frozen dataclass's behaviour, without importing `dataclasses`: with inspect, ~15 ms of
    every command's start)."""

    __slots__ = ("partition_ids", "queue")
    queue: bytes  # QUEUE_ID_SIZE bytes: a hash of `partition_ids`
    partition_ids: tuple[bytes, ...]  # partition k's logs carry queue id partition_ids[k]

    def __init__(self, queue: bytes, partition_ids: tuple[bytes, ...]) -> None:
        object.__setattr__(self, "queue", queue)
        object.__setattr__(self, "partition_ids", partition_ids)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Manifest)
        return (self.queue, self.partition_ids) == (other.queue, other.partition_ids)

    def __hash__(self) -> int:
        return hash((self.queue, self.partition_ids))

    def __reduce__(self) -> "tuple[type[Manifest], tuple[bytes, tuple[bytes, ...]]]":
        return Manifest, (self.queue, self.partition_ids)  # pickled as its fields

    def __repr__(self) -> str:
        return f"Manifest(queue={self.queue!r}, partition_ids={self.partition_ids!r})"

    @property
    def count(self) -> int:
        return len(self.partition_ids)

    @classmethod
    def of(cls, partition_ids: Sequence[bytes]) -> "Manifest":
        import hashlib  # here, not at the top: loading OpenSSL is ~3 ms of every reader's start

        ids = tuple(partition_ids)
        return cls(hashlib.blake2b(b"".join(ids), digest_size=QUEUE_ID_SIZE).digest(), ids)

    def encode(self) -> bytes:
        body = _HEAD.pack(MAGIC, self.count, self.queue) + b"".join(self.partition_ids)
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def decode(cls, raw: bytes, where: str) -> "Manifest":
        """The manifest in `raw`; PartitionError naming `where` when it is not one."""
        if len(raw) < _HEAD.size + _CRC.size or not raw.startswith(MAGIC[:6]):
            raise PartitionError(f"{where} is not a qw partitions manifest")
        magic, count, queue = _HEAD.unpack_from(raw)
        if magic != MAGIC:
            raise PartitionError(
                f"{where} is a partitions manifest of version {magic[-1]}; this qw reads "
                f"version {MAGIC[-1]}"
            )
        size = _HEAD.size + count * QUEUE_ID_SIZE
        if len(raw) != size + _CRC.size or _CRC.unpack_from(raw, size)[0] != zlib.crc32(raw[:size]):
            raise PartitionError(f"{where}: the partitions manifest is damaged (bad CRC or size)")
        ids = tuple(
            raw[_HEAD.size + k * QUEUE_ID_SIZE : _HEAD.size + (k + 1) * QUEUE_ID_SIZE]
            for k in range(count)
        )
        manifest = cls(queue, ids)
        if cls.of(ids).queue != queue:
            raise PartitionError(f"{where}: the partitions manifest's queue id does not match")
        return manifest


def read_manifest(location: str | Path, *, creating: bool = False) -> Manifest | None:
    """The manifest of the partitioned queue at `location`; None for a queue created
    without partitions (or no queue yet). PartitionError for a damaged manifest, and for a
    data directory whose partitions do not agree with it (`check_layout`): every command
    finds out here whether a queue is partitioned, so every one refuses such a directory
    before it creates anything.

    `creating`: the caller holds the directory's creation lock (`directory_lock`)."""
    manifest = _stored_manifest(location)
    if is_redis_url(location):
        return manifest
    directory = Path(location)
    if manifest is None and not creating and partition_directories(directory):
        # Partitions without their manifest: a creator may be between the two. It holds the
        # directory's lock until the manifest is in place, so wait for it and look again.
        with contextlib.suppress(OSError), directory_lock(str(directory), shared=True):
            manifest = _stored_manifest(location)
    check_layout(directory, manifest)
    return manifest


def _stored_manifest(location: str | Path) -> Manifest | None:
    raw = read_blob(location, MANIFEST_NAME)
    return None if raw is None else Manifest.decode(raw, f"{shown(location)} {MANIFEST_NAME}")


def partition_directories(directory: Path) -> list[int]:
    """The partitions whose directory (``p<k>``) holds a qw log in `directory`, in order
    (a directory of that name without one is not ours, and is left alone)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = (int(name[1:]) for name in names if name[:1] == "p" and name[1:].isdigit())
    return sorted(k for k in found if sibling_topics(directory / f"p{k}"))


def check_layout(directory: Path, manifest: Manifest | None) -> None:
    """Raise PartitionError unless the data directory is one queue. Without a manifest: no
    partition directories. With one: its P partitions and no other, each holding the tasks,
    claims and ops logs of the queue id the manifest names for it, and no log at the top
    (a partition removed, or a log of one, would be created anew, empty, by the next
    command; a queue made at the top would be worked while the partitions wait)."""
    found = partition_directories(directory)
    named = directory / MANIFEST_NAME
    if manifest is None:
        if found:
            raise PartitionError(
                f"{directory} holds partition directories ({_spans(found)}) but no "
                f"partitions manifest {named}: removed, or the queue's creation cut short? "
                "Refused, nothing written"
            )
        return
    count = manifest.count
    extra = [k for k in found if k >= count]
    if extra:
        raise PartitionError(
            f"{directory / f'p{extra[0]}'} holds logs but {named} names {count} partitions "
            f"(p0–p{count - 1}): refused, nothing written"
        )
    top = sibling_topics(directory)
    if top:
        raise PartitionError(
            f"{directory / f'{top[0]}.log'} is beside {named}: a partitioned queue keeps its "
            f"logs in p0–p{count - 1}, none at the top (a queue made there without "
            "partitions?): refused, nothing written"
        )
    for k in range(count):
        part = directory / f"p{k}"
        for topic in TOPICS:
            path = part / f"{topic}.log"
            identity = read_file_identity(path)
            if identity is None:
                raise PartitionError(
                    f"{path if part.is_dir() else part}: missing, but {named} names partition "
                    f"{k} of {count}, which keeps its tasks, claims and ops logs in {part} "
                    "(removed?): refused, nothing written"
                )
            if identity.topic != topic:
                raise PartitionError(
                    f"{path} is the {identity.topic!r} log, not the {topic!r} log (logs "
                    "swapped or copied from elsewhere?)"
                )
            check_identity(str(path), identity, manifest, k)


def _spans(partitions: list[int]) -> str:
    names = ", ".join(f"p{k}" for k in partitions[:4])
    return names if len(partitions) <= 4 else f"{names}, … {len(partitions)} in all"


def one_partition_text(location: str | Path) -> str | None:
    """What to tell a command that works one queue's topics when `location` holds a
    partitioned queue (None when it does not): which locations it can be given instead."""
    try:
        manifest = read_manifest(location)
    except (PartitionError, LogError):
        return None  # (a damaged manifest is reported by the commands that read it)
    if manifest is None:
        return None
    count = manifest.count
    first = shown(partition_location(location, 0, count))
    last = shown(partition_location(location, count - 1, count))
    return (
        f"{shown(location)} holds a queue of {count} partitions and this command works on "
        f"one: give a partition's location, {first} to {last} (qw report, enqueue, task, "
        "why and compact take the whole queue)"
    )


def partition_location(location: str | Path, partition: int, count: int) -> str:
    """Where partition `partition` (of `count`) of the queue at `location` keeps its logs:
    the data directory's ``p<k>`` sub-directory, or the same Redis URL with a hash-tagged
    prefix (`hash_tag`)."""
    text = str(location)
    if not is_redis_url(text):
        return str(Path(text) / f"p{partition}")
    parts = urlsplit(text)
    query = parse_qsl(parts.query, keep_blank_values=True)
    base = next((v for k, v in query if k == "prefix"), "")
    if "{" in base or "}" in base:
        raise ValueError(
            f"prefix={base!r}: a partitioned queue's prefix must not hold braces (each "
            "partition's keys get a hash tag of their own)"
        )
    tag = hash_tag(f"{base}.p{partition}" if base else f"p{partition}", partition, count)
    prefix = f"{base}:{{{tag}}}" if base else f"{{{tag}}}"
    rest = [(k, v) for k, v in query if k != "prefix"]
    return urlunsplit(parts._replace(query=urlencode([("prefix", prefix), *rest])))


@functools.lru_cache(maxsize=4096)
def hash_tag(name: str, partition: int, count: int) -> str:
    """The hash tag of a partition's Redis keys: `name`, or ``name.i`` for the first i
    whose slot falls in the partition's share of the 16384 slots (``[k·16384/P,
    (k+1)·16384/P)``). A cluster made by ``redis-cli --cluster create`` gives each node an
    even run of slots, so the partitions spread evenly over its nodes instead of where
    their names happen to hash."""
    from redis.crc import key_slot  # only Redis locations get here: redis is installed

    low, high = partition * SLOTS // count, (partition + 1) * SLOTS // count
    candidate, i = name, 0
    while not low <= key_slot(candidate.encode()) < high:
        i += 1
        candidate = f"{name}.{i}"
    return candidate


def check_partition(log: Log, manifest: Manifest, partition: int) -> None:
    """Raise PartitionError unless `log` (opened at partition `partition`'s location) is a
    log of that partition of the manifest's queue."""
    check_identity(log.name, getattr(log, "identity", None), manifest, partition)


def check_identity(
    name: str, identity: LogIdentity | None, manifest: Manifest, partition: int
) -> None:
    """Raise PartitionError unless `identity` (of the log `name`) is partition `partition`'s
    of the manifest's queue."""
    expected = manifest.partition_ids[partition]
    if identity is None or identity.queue != expected:
        found = "no identity" if identity is None else f"queue {identity.queue.hex()}"
        raise PartitionError(
            f"{name} belongs to {found}, not to partition {partition} of queue "
            f"{manifest.queue.hex()} ({expected.hex()}): partitions swapped or copied?"
        )


def assign(members: Sequence[str], partitions: int) -> dict[str, list[int]]:
    """Which partitions each member works: the same answer for the same members in any
    order (every member computes it alone). Every partition has a member and every member a
    partition: with M ≤ P members, member i (in sorted order) takes the partitions
    p ≡ i (mod M); with M > P, member i takes partition i mod P (several share one)."""
    ordered = sorted(set(members))
    count = len(ordered)
    if count == 0:
        return {}
    if count <= partitions:
        return {m: list(range(i, partitions, count)) for i, m in enumerate(ordered)}
    return {m: [i % partitions] for i, m in enumerate(ordered)}


def slot_partitions(workers: int, partitions: int) -> list[int]:
    """One supervisor's workers (slots 0 … workers-1): the partition of each slot, as
    `assign` gives it to members named by their slot. ValueError for fewer workers than
    partitions (a partition no worker works)."""
    if workers < partitions:
        raise ValueError(
            f"{workers} workers for {partitions} partitions: each worker works one "
            "partition, so every partition needs one"
        )
    names = [f"{slot:06d}" for slot in range(workers)]
    given = assign(names, partitions)
    return [given[name][0] for name in names]


__all__ = [
    "MANIFEST_NAME",
    "Manifest",
    "PartitionError",
    "TaskRef",
    "assign",
    "check_identity",
    "check_layout",
    "check_partition",
    "parse_task_ref",
    "partition_directories",
    "partition_location",
    "read_manifest",
    "slot_partitions",
]
