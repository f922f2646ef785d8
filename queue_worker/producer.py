"""Enqueueing tasks: functions by name (`@queue.task`, `f.enqueue(...)`: queue_worker.tasks)
and their results (`handle.result(timeout=)`: queue_worker.results); or payloads for one
handler, `Queue(location).enqueue(payload) -> task id`.

    queue = Queue(".qw")

    @queue.task
    def add(a, b):
        return a + b

    print(add.enqueue(1, 2).result(timeout=10))   # once `qw up --app myjobs` runs

Inline mode, for tests of code that enqueues: `Queue(".qw", immediate=True)` runs each task
at enqueue, in the calling process, once (no retries, no time limit), with the encoding
checks and errors of a real enqueue; its handles answer as others do. Nothing is opened or
written at the location.

A task's id is its index in the tasks log (0, 1, 2, …): stable, short, and the same for
every reader, because the log's order is. An append returns only a *position*, so the
producer learns the index by counting the records before its own: from where the fold
checkpoint's task index ends, when there is one (the workers save it), else from the log's
start. It remembers how far it has counted (an index and its position), so that repeated
enqueues read only what other producers appended since.

    with Queue(".qw") as queue:
        first = queue.enqueue({"url": "https://example.org"})
        ids = queue.enqueue_many([{"n": n} for n in range(100)])
"""

from __future__ import annotations

import os
import reprlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast, overload

from logstore import Durability, Log, LogError, PositionCompactedError, is_redis_url
from queue_worker.errors import QwError
from queue_worker.protocol.clock import Clock, now_us, seconds_to_us
from queue_worker.protocol.records import (
    Done,
    RecordDecodeError,
    RecordEncodeError,
    TaskRecord,
    decode_task,
    encode,
    error_field,
    with_traceback,
)
from queue_worker.topics import READ_BATCH, TASKS_TOPIC, open_topic

# (loaded when first used: `qw enqueue` of payloads needs neither the fold nor the handlers)
if TYPE_CHECKING:
    from logstore.redis.log import RedisLog
    from queue_worker.periodic import Schedule
    from queue_worker.results import ResultReader, TaskHandle
    from queue_worker.tasks import TaskFunction
    from queue_worker.worker.handlers import Handler

#: a tasks log shorter than this is counted from its start (~30,000 tasks: ~20 ms, about
#: what loading the checkpoint's modules costs `qw enqueue`, which needs none of the fold's)
COUNT_FROM_START_BYTES = 1 << 20


class Queue:
    """A producer handle on one queue's tasks log."""

    def __init__(
        self,
        location: str | Path,
        fsync: str = "commit",
        *,
        immediate: bool = False,
        tasks_log: Log | None = None,
        clock: Clock = now_us,
    ) -> None:
        """Open the tasks log at `location` (a data directory or a redis:// URL), or use
        `tasks_log` when given (tests). `immediate`: run each task at enqueue, here (the
        module docstring); nothing is opened."""
        durability = Durability.parse(fsync)
        self._registered: dict[str, TaskFunction[Any, Any]] = {}
        self._schedules: list[Schedule] = []
        self.immediate = immediate
        self._clock = clock
        self._location = location if is_redis_url(str(location)) else Path(location)
        self._durability = durability
        self._results: ResultReader | None = None
        #: immediate mode: each task's end, by id ("done", result) or ("dead", error)
        self._ran: list[tuple[str, Any]] = []
        self._owns_log = False
        #: the first task of each key seen so far, and where that look has read to
        self._keys: dict[str, int] = {}
        self._keys_at: tuple[int, int] | None = None
        self._duplicates: dict[int, int] = {}  # a later task of a key -> the first
        self._retried: dict[int, int] = {}  # a dead task -> the first task that retries it
        if immediate:
            return
        self._owns_log = tasks_log is None
        self.log = (
            tasks_log if tasks_log is not None else open_topic(location, TASKS_TOPIC, durability)
        )
        try:  # ids are counted: a log that lost records would hand out ids already given
            self.log.verify_history()
        except BaseException:
            self.close()
            raise
        # How far this producer has counted: the record at `_counted_position` is task
        # `_counted`. Starts at the beginning of the log (of what compaction left of it).
        self._counted, self._counted_position = self._count_from()

    def _count_from(self) -> tuple[int, int]:
        """Where counting starts: where the fold checkpoint's task index ends, when there is
        a checkpoint of this log (`checkpoint.tasks_counted`); else task 0 at the log's
        start; or, once compaction removed settled tasks, the first retained task's id and
        position by the checkpoint's prefix (ids go on from there)."""
        if self._long():
            from queue_worker.history.checkpoint import CheckpointRefused, tasks_counted

            try:
                return tasks_counted(self._location, self.log)
            except CheckpointRefused:
                pass
        return self._count_from_start()

    def _count_from_start(self) -> tuple[int, int]:
        """Task 0 at the log's start; or, once compaction removed settled tasks, the first
        retained task's id and position by the checkpoint's prefix."""
        start = self.log.start
        if start == self.log.origin:
            return 0, start
        from queue_worker.history.checkpoint import CheckpointRefused
        from queue_worker.history.prefix import first_retained_task

        try:
            return first_retained_task(self._location, self.log.origin)
        except CheckpointRefused as e:
            raise LogError(str(e)) from e

    def _long(self) -> bool:
        """Whether the tasks log is long enough for the checkpoint to pay: a file log whose
        first segment holds COUNT_FROM_START_BYTES, a compacted one, or a log elsewhere (a
        count over the network)."""
        size = self.log.local_bytes()
        if size is None or self.log.start != self.log.origin:
            return True  # (compacted: the checkpoint is the count's only start anyway)
        return size >= COUNT_FROM_START_BYTES

    # -- tasks by name ---------------------------------------------------------------------

    @overload
    def task(self, function: Callable[..., Any], /) -> TaskFunction[Any, Any]: ...

    @overload
    def task(
        self,
        function: None = None,
        /,
        *,
        name: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> Callable[[Callable[..., Any]], TaskFunction[Any, Any]]: ...

    def task(
        self,
        function: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> TaskFunction[Any, Any] | Callable[[Callable[..., Any]], TaskFunction[Any, Any]]:
        """Register a function (``@queue.task`` or ``@queue.task(max_attempts=5,
        timeout=30)``) under its name, or `name`: see queue_worker.tasks. `max_attempts`
        and `timeout` (seconds) override the worker's --max-attempts and --task-timeout."""

        from queue_worker.tasks import TaskFunction

        def register(function: Callable[..., Any]) -> TaskFunction[Any, Any]:
            task_name = name if name is not None else getattr(function, "__name__", "")
            if task_name in self._registered:
                raise ValueError(
                    f"task name {task_name!r} is registered already on this queue; "
                    "expected one function per name (name= chooses another)"
                )
            registered = TaskFunction(self, function, task_name, max_attempts, timeout)
            self._registered[task_name] = registered
            return registered

        return register if function is None else register(function)

    def periodic(
        self,
        *,
        every: float | None = None,
        cron: str | None = None,
        name: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
    ) -> Callable[[Callable[..., Any]], TaskFunction[Any, Any]]:
        """Register a function of no arguments (or only `ctx`) as a task that `qw up --app`
        enqueues every `every` seconds, or by the `cron` expression (queue_worker.periodic):
        each tick once, however many supervisors run."""
        from queue_worker.periodic import Schedule

        def register(function: Callable[..., Any]) -> TaskFunction[Any, Any]:
            task_name = name if name is not None else getattr(function, "__name__", "")
            schedule = Schedule(task_name, every, cron)  # (ValueError before registering)
            registered = self.task(name=task_name, max_attempts=max_attempts, timeout=timeout)(
                function
            )
            self._schedules.append(schedule)
            return registered

        return register

    @property
    def schedules(self) -> list[Schedule]:
        """The periodic tasks' schedules (`periodic`)."""
        return list(self._schedules)

    @property
    def registered(self) -> Mapping[str, TaskFunction[Any, Any]]:
        """The functions registered with this queue, by name."""
        return dict(self._registered)

    def handlers(self, spec: str) -> Mapping[str, Handler]:
        """How a worker runs each registered function (`qw up --app`)."""
        return {name: f.handler() for name, f in self._registered.items()}

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
        after: Iterable[TaskHandle | int] = (),
    ) -> TaskHandle:
        """Append a task calling the function registered as `name`; its handle (the options:
        `TaskFunction.enqueue`). Raises RecordEncodeError, naming the call, when msgpack
        cannot encode an argument, ValueError for a bad option: then nothing is written."""
        at = self._clock()
        not_before = _not_before(at, delay, eta)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority is {priority!r}; expected an integer")
        if key is not None and not isinstance(key, str):
            raise ValueError(f"key is {key!r}; expected a string")
        dependencies = self._dependencies(after)
        call = (None, at, name, list(args), dict(kwargs or {}))
        record = TaskRecord(*call, not_before, priority, key, retry_of, dependencies)
        try:
            data = encode(record)
        except RecordEncodeError as e:
            raise RecordEncodeError(f"{_call_text(record)} cannot be enqueued: {e}") from e
        if self.immediate:
            return self._run_now(record)
        options = not_before or priority or key is not None or dependencies
        if options and is_redis_url(str(self._location)):
            return self._enqueue_on_redis(data, key, not_before, priority, dependencies)
        if key is not None:
            first = self._first_of_key(key)
            if first is not None:  # enqueued before: that task is the task
                return self.handle(first)
        task_id = self._append([data])[0]
        if key is not None:  # another producer's, appended before ours, is the task
            first = self._first_of_key(key)
            if first is not None and first != task_id:
                return self.handle(first)
        self._reader().want(task_id, not_before)
        from queue_worker.results import TaskHandle

        return TaskHandle(self, task_id)

    def _dependencies(self, after: Iterable[TaskHandle | int]) -> tuple[int, ...]:
        """The task ids of `after=` (handles of this queue's tasks, or ids), ascending, each
        a task already in the tasks log (a later task of a key stands for its first). Raises
        ValueError naming the first one that is not."""
        from queue_worker.results import TaskHandle

        if isinstance(after, TaskHandle | int | str | bytes) or not isinstance(after, Iterable):
            raise ValueError(f"after is {after!r}; expected a list of task handles or ids")
        ids: set[int] = set()
        for item in after:
            # (a handle of another Queue object on this location is of this queue too)
            if isinstance(item, TaskHandle) and item.queue._location == self._location:
                ids.add(item.id)
            elif type(item) is int and item >= 0:
                ids.add(item)
            else:
                raise ValueError(
                    f"after= holds {item!r}; expected a handle of this queue's task or a task id"
                )
        if not ids:
            return ()
        known = len(self._ran) if self.immediate else self._known_tasks()
        unknown = [t for t in sorted(ids) if t >= known]
        if unknown:
            raise ValueError(
                f"after= names task {unknown[0]}, which is not in the tasks log "
                f"({known} tasks); expected the id of a task enqueued before"
            )
        return tuple(sorted({self._duplicates.get(t, t) for t in ids}))

    def _enqueue_on_redis(
        self, data: bytes, key: str | None, not_before: int, priority: int, after: Sequence[int]
    ) -> TaskHandle:
        """A task with options on Redis: appended with them where the server sees them, the
        key's first task found in the same call (queue_worker.redis.task_options)."""
        from queue_worker.redis.task_options import append_with_options
        from queue_worker.results import TaskHandle

        position, fresh = append_with_options(
            cast("RedisLog", self.log),  # (a redis:// location's topic is a stream)
            data,
            key=key,
            not_before=not_before,
            priority=priority,
            after=after,
        )
        try:
            task_id = self._index_of(position)
        except PositionCompactedError as e:  # (only a key's first task can be that old)
            first = self._links_before(e.start)[0].get(key or "")
            if first is None:
                raise LogError(
                    f"{self.log.name}: the first task of key {key!r} was removed by "
                    "compaction, and the checkpoint does not know it"
                ) from e
            task_id = first  # the task for ever: its handle says its result was removed
        if not fresh:  # enqueued before: that task is the task
            return self.handle(task_id)
        self._reader().want(task_id, not_before)
        return TaskHandle(self, task_id)

    def _first_of_key(self, key: str) -> int | None:
        """The first task of `key` in the tasks log (None: none yet): the tasks with keys
        are indexed as far as the log goes, from where this producer's counting starts."""
        if self._keys_at is None:
            self._keys_at = self._count_from()
            if self._keys_at[1] != self.log.origin:  # (the tasks before: the checkpoint's)
                keys, retried = self._links_before(self._keys_at[1])
                self._keys.update(keys)
                self._retried.update(retried)
        index, position = self._keys_at
        while entries := self.log.read(position, READ_BATCH):
            for entry in entries:
                if entry.data.startswith(_OPTIONS_PREFIXES):
                    try:
                        record = decode_task(entry.data)
                    except RecordDecodeError:
                        record = None
                    if isinstance(record, TaskRecord) and record.key is not None:
                        first = self._keys.setdefault(record.key, index)
                        if first != index:
                            self._duplicates[index] = first
                    if isinstance(record, TaskRecord) and record.retry_of is not None:
                        self._retried.setdefault(record.retry_of, index)
                index += 1
            position = entries[-1].next
        self._keys_at = index, position
        return self._keys.get(key)

    def _links_before(self, position: int) -> tuple[dict[str, int], dict[int, int]]:
        """The first task of each key, and the first retry of each dead task retried, among
        the tasks before `position`, whose records this producer does not read: the
        checkpoint's index keeps them (`links_counted`)."""
        from queue_worker.history.checkpoint import CheckpointRefused, links_counted

        try:
            return links_counted(self._location, self.log)
        except CheckpointRefused as e:
            raise LogError(
                f"{self.log.name}: the keys and retries of the tasks before position "
                f"{position} are not known: {e}"
            ) from e

    def retry(self, task_id: int) -> TaskHandle:
        """Enqueue a dead task again: a new task with the same call (linked to the dead one
        by `retry_of`) or the same payload; its handle. ValueError when the task is not dead,
        a task retries it already (its retry is in the tasks log), or its record cannot be
        read."""
        from queue_worker.proof.log_reading import read_task

        if self.immediate:
            raise QwError("an immediate queue has no dead tasks to retry in its logs")
        state = self._reader().state(task_id)
        if state != "dead":
            raise ValueError(f"task {task_id} is {state}; expected a dead task")
        self._first_of_key("")  # (reads the retries in the tasks log as far as it goes)
        if task_id in self._retried:
            raise ValueError(
                f"task {task_id} was retried already, by task {self._retried[task_id]}; "
                "expected a dead task that no task retries yet"
            )
        record = read_task(self._location, task_id)
        if not isinstance(record, TaskRecord):
            why = "it is not in the tasks log" if record is None else record
            raise ValueError(f"task {task_id} cannot be retried: {why}")
        if record.function is None:
            return self.handle(self.enqueue(record.payload))
        args, kwargs = record.args, record.kwargs
        # (a dead dependency would make the retry dead again: it waits for the others only)
        after = [d for d in record.after if self._reader().state(d) not in ("dead", "cancelled")]
        return self.enqueue_call(
            record.function, args, kwargs, priority=record.priority, retry_of=task_id, after=after
        )

    def cancel(self, task_id: int) -> None:
        """Cancel a pending or held task: a CANCEL record in the claims log makes it dead
        (protocol rule 6). A pending one never runs; a held one's holder has its next
        renewal refused, so its handler sees `ctx.cancelled`. Its handle's `result()` raises
        TaskFailed ("cancelled by …"). ValueError for a task that has ended."""
        import socket

        if self.immediate:
            raise QwError("an immediate queue runs each task at enqueue: none is left to cancel")
        if not 0 <= task_id < self._known_tasks():
            raise ValueError(f"task {task_id} is not in the tasks log; expected a task id")
        self._reader().cancel(task_id, f"qw-cancel@{socket.gethostname()}-{os.getpid()}")

    def _known_tasks(self) -> int:
        self._first_of_key("")  # (reads the tasks log as far as it goes, counting)
        assert self._keys_at is not None
        return self._keys_at[0]

    def dead_not_retried(self) -> tuple[list[int], list[int]]:
        """The dead tasks by name that no task in the tasks log retries yet, and the dead
        payload tasks (a payload task carries no link to the task it retries, so whether
        one was retried is not in the log): `qw retry --dead`."""
        from queue_worker.proof.log_reading import read_task

        if self.immediate:
            return [], []
        self._first_of_key("")  # (reads the tasks log's options as far as it goes)
        by_name, payloads = [], []
        for task in sorted(self._reader().dead_tasks()):
            if task in self._retried:
                continue
            record = read_task(self._location, task)
            if isinstance(record, TaskRecord) and record.function is None:
                payloads.append(task)
            else:
                by_name.append(task)
        return by_name, payloads

    def handle(self, task_id: int) -> TaskHandle:
        """The handle of task `task_id` (one enqueued elsewhere, say)."""
        from queue_worker.results import TaskHandle

        if not self.immediate:
            self._reader().want(task_id)
        return TaskHandle(self, task_id)

    def state(self, task_id: int) -> str:
        """``pending``, ``held``, ``done`` or ``dead`` (queue_worker.results)."""
        if self.immediate:
            return self._ran[task_id][0] if 0 <= task_id < len(self._ran) else "pending"
        return self._reader().state(task_id)

    def result(self, task_id: int, timeout: float | None = None) -> Any:
        """Task `task_id`'s result, waiting at most `timeout` seconds (TaskHandle.result)."""
        if self.immediate:
            if not 0 <= task_id < len(self._ran):
                raise TimeoutError(f"task {task_id} was never enqueued on this immediate queue")
            end, value = self._ran[task_id]
            if end == "dead":
                from queue_worker.results import TaskFailed

                raise TaskFailed(task_id, value)
            return value
        return self._reader().result(task_id, timeout)

    def _reader(self) -> ResultReader:
        if self._results is None:
            from queue_worker.results import ResultReader

            self._results = ResultReader(self._location, self._durability)
        return self._results

    def _run_now(self, record: TaskRecord) -> TaskHandle:
        """Immediate mode: run the task here, once, as a worker would."""
        from queue_worker.results import TaskHandle
        from queue_worker.worker.handlers import (
            NamedHandlers,
            TaskContext,
            failure_traceback,
            run_task,
        )

        if record.key is not None and record.key in self._keys:
            return TaskHandle(self, self._keys[record.key])
        task_id = len(self._ran)
        if record.key is not None:
            self._keys[record.key] = task_id
        dead = [d for d in record.after if self._ran[d][0] == "dead"]
        if dead:  # as a worker does (queue_worker.worker.dependencies)
            error = str(self._ran[dead[0]][1]).partition("\n")[0]
            self._ran.append(("dead", error_field(f"dependency {dead[0]} is dead: {error}")))
            return TaskHandle(self, task_id)
        handlers = NamedHandlers(f"{self._location}", self.handlers(""))
        ctx = TaskContext(task_id, 1, threading.Event(), "immediate")
        outcome = run_task(handlers, record, ctx)
        if outcome.error is None:
            try:  # the result must encode, as a worker's DONE must
                encode(Done(task_id, "immediate", self._clock(), 0, outcome.result))
            except RecordEncodeError as e:
                self._ran.append(("dead", f"result cannot be recorded: {e}"))
            else:
                self._ran.append(("done", outcome.result))
        else:
            traceback = failure_traceback(outcome.exception)
            self._ran.append(("dead", with_traceback(outcome.error, traceback)))
        return TaskHandle(self, task_id)

    # -- payload tasks ---------------------------------------------------------------------

    def enqueue(self, payload: Any) -> int:
        """Append one task; return its id."""
        return self.enqueue_many([payload])[0]

    def enqueue_many(self, payloads: Iterable[Any]) -> list[int]:
        """Append tasks as one contiguous run (one durable append); return their ids.

        Raises RecordEncodeError, naming the value, if a payload cannot be encoded: then
        nothing is written.
        """
        if self.immediate:
            raise QwError(
                "an immediate queue runs tasks by name only (@queue.task); "
                "expected f.enqueue(...), not a payload"
            )
        at = self._clock()
        return self._append([_encode_payload(i, payload, at) for i, payload in enumerate(payloads)])

    def _append(self, records: list[bytes]) -> list[int]:
        if not records:
            return []
        positions = self.log.append_many(records, durable=True)
        first = self._index_of(positions[0])
        return list(range(first, first + len(records)))

    def _index_of(self, position: int) -> int:
        """The index of the record at `position` (one this producer appended, or the first
        task of a key on Redis: maybe before where this producer has counted to)."""
        index, at = self._counted, self._counted_position
        if position < at:
            index, at = self._count_from()
            if position < at:  # (before the checkpoint's count: from the log's start)
                index, at = self._count_from_start()
            if position < at:
                raise PositionCompactedError(self.log.name, position, at)
        while True:
            try:
                entries = self.log.read(at, READ_BATCH)
            except PositionCompactedError as e:  # settled tasks removed since: count on
                index, at = self._counted, self._counted_position = self._count_from()
                if at < e.start:  # (the checkpoint does not cover what went: never loop)
                    raise LogError(f"{e}, but the checkpoint covers only up to {at}") from e
                continue
            if not entries:
                raise LogError(f"{self.log.name}: appended record at {position} is not readable")
            for entry in entries:
                if entry.position == position:
                    self._counted, self._counted_position = index, position
                    return index
                if entry.position > position:
                    raise LogError(f"{self.log.name}: no record at position {position}")
                index += 1
            at = entries[-1].next

    def close(self) -> None:
        if self._results is not None:
            self._results.close()
            self._results = None
        if self._owns_log:
            self.log.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


_QUOTE = reprlib.Repr()
_QUOTE.maxlevel = 3
_QUOTE.maxstring = 40
_QUOTE.maxother = 40


def check_payloads(payloads: Sequence[Any]) -> None:
    """Raise RecordEncodeError, naming the payload, for the first one that cannot be
    enqueued (a producer over several logs checks them all before it appends anything)."""
    for index, payload in enumerate(payloads):
        _encode_payload(index, payload, 0)


#: how a task with options (type "S", or "A" with dependencies) begins on the wire: the
#: only records with a key
_OPTIONS_PREFIXES = (b"\x97\x01\xa1S", b"\x97\x01\xa1A")


def _not_before(at: int, delay: float | None, eta: datetime | None) -> int:
    """A task's `not_before` (µs; 0: at once) from `delay` seconds after `at` or `eta`."""
    if delay is not None and eta is not None:
        raise ValueError(f"delay={delay!r} and eta={eta!r}; expected one of them, not both")
    if delay is not None:
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not delay >= 0:
            raise ValueError(f"delay is {delay!r}; expected a number of seconds >= 0")
        return at + seconds_to_us(delay) if delay else 0
    if eta is not None:
        if not isinstance(eta, datetime) or eta.utcoffset() is None:
            raise ValueError(f"eta is {eta!r}; expected an aware datetime (with a time zone)")
        return max(round(eta.timestamp() * 1_000_000), 1)
    return 0


def _call_text(record: TaskRecord) -> str:
    """``resize('a.png', width=400)``, quoted bounded, for an error naming a call."""
    args = [_QUOTE.repr(a) for a in record.args]
    args += [f"{k}={_QUOTE.repr(v)}" for k, v in record.kwargs.items()]
    return f"call {record.function}({', '.join(args)})"


def _encode_payload(index: int, payload: Any, enqueued_at: int) -> bytes:
    try:
        return encode(TaskRecord(payload, enqueued_at))
    except RecordEncodeError as e:
        raise RecordEncodeError(
            f"payload {index} ({_QUOTE.repr(payload)}) cannot be enqueued: {e}"
        ) from e
