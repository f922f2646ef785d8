"""Tasks by name on a partitioned queue: the face's `Queue(location)` (`from queue_worker
import Queue`) of a queue created with partitions is a `PartitionedJobs`, so that a
program's `@queue.task`, `f.enqueue(...)`, `handle.result()`, `queue.cancel(id)` and
`@queue.periodic` are the same on it. (`queue_worker.producer.Queue`, below the
partitions, opens one queue's tasks log, and refuses a partitioned queue's location.)

It registers functions as any Queue does, and puts each call into one partition through
that partition's own Queue (`PartitionedQueue.partition_queue`: the one implementation of
an enqueue): round-robin from a random first partition, or by the key's hash when `key=` is
given (`PartitionedQueue.partition_for`), so that a key's first-task rule holds within its
partition, and a periodic tick, whose key names it, is enqueued once however many
supervisors enqueue it.

A task is named ``K:ID`` here as in every command (`qw task 1:7`, `qw cancel 1:7`): its
handle's `id` is that name, and errors name it so.

Dependencies: a task enqueued with `after=` goes to the partition of the tasks it waits for
(a partition's worker knows only its own partition's tasks), so they must all be of one
partition, and a `key=` given with them must hash to that partition: otherwise ValueError,
and nothing is written.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar, cast

from logstore import is_redis_url
from queue_worker import producer
from queue_worker.errors import QwError
from queue_worker.partition_layout import PartitionError, TaskRef, parse_task_ref, read_manifest
from queue_worker.partitions.queue import PartitionedQueue
from queue_worker.protocol.clock import Clock, now_us
from queue_worker.protocol.records import with_traceback
from queue_worker.results import ResultRemovedError, TaskFailed, TaskHandle

__all__ = ["PartitionedJobs", "Queue"]

#: how a partition's Queue names a task in its errors: "task 7 is …", "after= names task 7, …"
_TASK_ID = re.compile(r"^((?:after= names )?task )(\d+)\b")
_Q = TypeVar("_Q", bound="Queue")


class Queue(producer.Queue):
    """The face's Queue: `producer.Queue` on a queue without partitions (or with
    `immediate=` or `tasks_log=`), a `PartitionedJobs` on a partitioned queue's location."""

    def __new__(cls: type[_Q], location: str | Path, *args: Any, **kwargs: Any) -> _Q:
        one = kwargs.get("immediate") or kwargs.get("tasks_log") is not None
        if cls is Queue and not one and read_manifest(location) is not None:
            return cast("_Q", object.__new__(PartitionedJobs))  # (then its __init__ runs)
        return object.__new__(cls)

    def __enter__(self: _Q) -> _Q:
        return self


class PartitionedJobs(Queue):
    """A Queue on a partitioned queue (see the module docstring): one Queue per partition."""

    def __init__(
        self,
        location: str | Path,
        fsync: str = "commit",
        *,
        immediate: bool = False,
        tasks_log: object = None,
        clock: Clock = now_us,
    ) -> None:
        """`immediate`, `tasks_log` and `clock` are a single queue's (`Queue.__new__` never
        gives the first two here)."""
        if immediate or tasks_log is not None or clock is not now_us:
            raise QwError("a partitioned queue has no immediate mode, given tasks log or clock")
        manifest = read_manifest(location)
        if manifest is None:
            raise PartitionError(f"{location} holds no partitioned queue")
        self._registered = {}
        self._schedules = []
        self.immediate = False
        self._location = location if is_redis_url(str(location)) else Path(location)
        self.partitions = PartitionedQueue(location, manifest, fsync)

    def enqueue_call(
        self,
        name: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        delay: float | None = None,
        eta: datetime | None = None,
        priority: int = 0,
        key: str | None = None,
        retry_of: int | None = None,
        after: Iterable[TaskHandle | int | str] = (),
    ) -> TaskHandle:
        """Append the call to its partition (the module docstring); its handle."""
        partition, dependencies = self._partition_of(key, after)
        queue = self.partitions.partition_queue(partition)
        with _naming(partition):
            handle = queue.enqueue_call(
                name, args, kwargs, delay=delay, eta=eta, priority=priority, key=key,
                retry_of=retry_of, after=dependencies,
            )  # fmt: skip
        return TaskHandle(self, str(TaskRef(partition, handle.id)))

    def _partition_of(
        self, key: str | None, after: Iterable[TaskHandle | int | str]
    ) -> tuple[int, list[int]]:
        """The partition of a call (`after=`'s, else `key`'s, else the next in turn), and its
        dependencies' ids there. ValueError for dependencies that cannot share one."""
        if isinstance(after, TaskHandle | int | str | bytes) or not isinstance(after, Iterable):
            raise ValueError(f"after is {after!r}; expected a list of task handles or names")
        refs = {self._ref(item, "after= holds") for item in after}
        hashed = key if isinstance(key, str) else None  # (another type: the Queue refuses it)
        if not refs:
            return self.partitions.partition_for(hashed), []
        found = sorted({ref.partition for ref in refs})
        if len(found) > 1:
            raise ValueError(
                f"after= names tasks of partitions {', '.join(map(str, found))}; expected tasks "
                "of one partition (a task waits only for tasks of its own partition)"
            )
        partition = found[0]
        if hashed is not None and self.partitions.partition_for(hashed) != partition:
            raise ValueError(
                f"key {key!r} belongs to partition {self.partitions.partition_for(hashed)}, but "
                f"after= names tasks of partition {partition}; expected a key of that partition, "
                "or no key"
            )
        return partition, sorted(ref.task for ref in refs)

    def _ref(self, task: object, what: str = "task") -> TaskRef:
        """The partition and id of `task`: a handle of this queue's, or its name "K:ID"."""
        if isinstance(task, TaskHandle):
            mine = (
                isinstance(task.queue, PartitionedJobs) and task.queue._location == self._location
            )
            if mine:
                task = task.id
        if isinstance(task, str):
            return parse_task_ref(task, self.partitions.manifest.count)
        raise ValueError(
            f"{what} {task!r}; expected a task of this partitioned queue: its handle or its "
            "name PARTITION:ID, like 0:17"
        )

    def handle(self, task_id: int | str) -> TaskHandle:
        ref = self._ref(task_id)
        self.partitions.partition_queue(ref.partition).handle(ref.task)
        return TaskHandle(self, str(ref))

    def state(self, task_id: int | str) -> str:
        ref = self._ref(task_id)
        return self.partitions.partition_queue(ref.partition).state(ref.task)

    def result(self, task_id: int | str, timeout: float | None = None) -> Any:
        ref = self._ref(task_id)
        with _naming(ref.partition):
            return self.partitions.partition_queue(ref.partition).result(ref.task, timeout)

    def cancel(self, task_id: int | str) -> None:
        ref = self._ref(task_id)
        with _naming(ref.partition):
            self.partitions.partition_queue(ref.partition).cancel(ref.task)

    def retry(self, task_id: int | str) -> TaskHandle:
        """A dead task enqueued again in its partition (`Queue.retry`); its handle."""
        ref = self._ref(task_id)
        with _naming(ref.partition):
            again = self.partitions.partition_queue(ref.partition).retry(ref.task)
        return TaskHandle(self, str(TaskRef(ref.partition, again.id)))

    def enqueue_many(self, payloads: Iterable[Any]) -> list[int]:
        raise QwError(
            "a partitioned queue names its tasks PARTITION:ID, not by an id: payloads go in "
            "with qw enqueue or queue_worker.partitions.queue.PartitionedQueue"
        )

    def dead_not_retried(self) -> tuple[list[Any], list[Any]]:
        """Each partition's (`Queue.dead_not_retried`), named K:ID."""
        by_name: list[str] = []
        payloads: list[str] = []
        for k in range(self.partitions.manifest.count):
            named, plain = self.partitions.partition_queue(k).dead_not_retried()
            by_name += [str(TaskRef(k, task)) for task in named]
            payloads += [str(TaskRef(k, task)) for task in plain]
        return by_name, payloads

    def close(self) -> None:
        self.partitions.close()


@contextlib.contextmanager
def _naming(partition: int) -> Iterator[None]:
    """Errors of a partition's Queue, which names its tasks by their ids there, naming them
    K:ID as the commands do."""
    try:
        yield
    except TaskFailed as e:
        error = with_traceback(e.error, e.traceback)
        raise TaskFailed(f"{partition}:{e.task_id}", error) from None
    except (ValueError, TimeoutError, ResultRemovedError) as e:
        text = _TASK_ID.sub(rf"\g<1>{partition}:\2", str(e), count=1)
        if text == str(e):
            raise
        raise type(e)(text) from None
