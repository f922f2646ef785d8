"""Results that wait: a task's handle (`TaskHandle`), and the reader of the claims log that
answers it (`ResultReader`).

A result is the accepted DONE's: the one the fold accepted (protocol rule 4), read from the
claims log, never a copy kept elsewhere. The reader folds the claims log as a worker does
(`queue_worker.protocol.state.ClaimState`, on the server's clock on Redis) and keeps the
results of the tasks its queue asked about; `result(timeout=)` waits for the next record
with the log's own wait (inotify on a file log, a blocking XREAD on Redis): no polling.

The words of `TaskHandle.state()`: ``pending`` (not held: never claimed yet, or waiting for
its retry time), ``scheduled`` (enqueued here with a delay that has not ended), ``held`` (a
claim holds it), ``done``, ``dead``, ``cancelled`` (a CANCEL made it dead: `Queue.cancel`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

from logstore import Durability, Log, PositionCompactedError
from queue_worker.errors import QwError
from queue_worker.protocol.records import (
    Cancel,
    Done,
    Fail,
    RecordDecodeError,
    encode,
    error_traceback,
)
from queue_worker.protocol.state import ClaimState, Verdict
from queue_worker.topics import CLAIMS_TOPIC, READ_BATCH, decode_claims_entry, open_topic
from queue_worker.worker.handlers import resolved_to

if TYPE_CHECKING:
    from logstore.redis.log import RedisLog
    from queue_worker.producer import Queue

#: the longest single wait on the log (a wait with no time-out is a loop of these)
WAIT_CHUNK_S: Final = 60.0


class TaskFailed(QwError):
    """The task is dead: its last error ("Type: message") and the handler's traceback."""

    def __init__(self, task_id: int | str, error: str) -> None:
        self.task_id = task_id  # (a partitioned queue's task: its name, K:ID)
        self.error = error.partition("\n")[0]
        self.traceback = error_traceback(error)
        text = f"task {task_id} is dead: {self.error}"
        super().__init__(text if self.traceback is None else f"{text}\n{self.traceback}")


class ResultRemovedError(QwError):
    """The task is done, but compaction removed its DONE record, and its result with it."""


class TaskHandle:
    """A task this program enqueued (or looked up by id: `Queue.handle`). Its `id` is its
    index in the tasks log, or on a partitioned queue its name ``K:ID`` (a str: partition K,
    index ID there; queue_worker.partitions.jobs), which `Queue.cancel` and the commands take
    as they take an index."""

    __slots__ = ("id", "queue")

    def __init__(self, queue: Queue, task_id: int | str) -> None:
        self.queue = queue
        self.id: Any = task_id  # (Any: the int of most queues passes where an int is asked)

    @property
    def partition(self) -> int | None:
        """The task's partition (None: its queue has no partitions)."""
        return None if isinstance(self.id, int) else int(self.id.partition(":")[0])

    def state(self) -> str:
        """``pending``, ``held``, ``done`` or ``dead`` (see the module docstring)."""
        return self.queue.state(self.id)

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the task to end (at most `timeout` seconds; None: for ever) and return
        its accepted result. Raises TaskFailed when it is dead, TimeoutError when it has
        not ended in time, ResultRemovedError when compaction removed its result."""
        return self.queue.result(self.id, timeout)

    def __repr__(self) -> str:
        return f"<TaskHandle {self.id}>"


class ResultReader:
    """The claims fold of one queue, caught up on demand, with the results of the tasks
    asked about (`want`)."""

    def __init__(self, location: str | Path, durability: Durability = Durability.COMMIT) -> None:
        self._location = location
        self._durability = durability
        self._log: Log | None = None
        self._wanted: set[int] = set()
        self._results: dict[int, Any] = {}
        self._errors: dict[int, str] = {}  # a dead task's error and traceback
        self._not_before: dict[int, int] = {}  # the delayed tasks this program enqueued
        self._cancelled: set[int] = set()  # the wanted tasks a CANCEL made dead
        self._state = ClaimState()
        self._position = 0
        self._stale = False  # a task wanted since needs the log read again (`want`)

    def _opened(self) -> Log:
        if self._log is None:
            self._log = open_topic(self._location, CLAIMS_TOPIC, self._durability)
            self._restart()
        return self._log

    def _restart(self) -> None:
        """Fold from the log's start (or from the compacted prefix's fold)."""
        log = self._log
        assert log is not None
        self._state, self._position = ClaimState(), log.start
        self._stale = False
        self._results.clear()
        self._errors.clear()
        self._cancelled.clear()
        if log.start != log.origin:
            from queue_worker.proof.log_reading import compacted_prefix

            compacted = compacted_prefix(self._location)
            if compacted is not None:
                self._state = ClaimState.restore(compacted[0].state)
                self._position = compacted[1]

    def want(self, task: int, not_before: int = 0) -> None:
        """Keep `task`'s result from now on (re-reading the log if it may be behind us).
        `not_before`: its delay's end, when this program enqueued it (µs; 0: none)."""
        if not_before:
            self._not_before[task] = not_before
        if task in self._wanted:
            return
        self._wanted.add(task)
        if self._log is not None and self._state.is_done(task):
            self._stale = True  # its DONE was read before we wanted it: read again, once

    def catch_up(self) -> None:
        log = self._opened()
        if self._stale:  # (one read again for every handle made since)
            self._restart()
        while True:
            try:
                entries = log.read(self._position, READ_BATCH)
            except PositionCompactedError:  # compacted meanwhile: fold from its prefix
                self._restart()
                continue
            if not entries:
                return
            state, wanted = self._state, self._wanted
            for entry in entries:
                try:
                    record = decode_claims_entry(entry)
                except RecordDecodeError:
                    continue  # (every reader skips a malformed record)
                outcome = state.apply(record, entry.position)
                verdict = outcome.verdict
                if outcome.task not in wanted:
                    continue
                if verdict is Verdict.DONE and isinstance(record, Done):
                    self._results[record.task] = record.result
                elif verdict is Verdict.DEAD and isinstance(record, Fail):
                    self._errors[record.task] = record.error  # (the fold keeps one line)
                    if type(record) is Cancel:
                        self._cancelled.add(record.task)
            self._position = entries[-1].next

    def cancel(self, task: int, by: str) -> None:
        """Append a CANCEL of `task` (durably), after checking that it is open."""
        self.want(task)
        word = self.state(task)
        if word in ("done", "dead", "cancelled"):
            raise ValueError(f"task {task} is {word}; expected a pending or held task")
        at = time.time_ns() // 1000
        record = Cancel(task, by, at, -1, f"cancelled by {by}", None)
        log = self._opened()
        # (server verdicts fold it as it is appended: a Redis queue's mode)
        if log.verdicts == "server":
            from queue_worker.redis.server_verdicts import ServerVerdicts

            ServerVerdicts(cast("RedisLog", log)).append(record)
        else:
            log.append(encode(record), durable=True)

    def dead_tasks(self) -> list[int]:
        self.catch_up()
        return list(self._state.dead_tasks())

    def state(self, task: int) -> str:
        self.catch_up()
        return self._word(task)

    def _word(self, task: int) -> str:
        if self._state.is_done(task):
            return "done"
        if self._state.is_dead(task):
            return "cancelled" if task in self._cancelled else "dead"
        if self._state.holder(task) is not None:
            return "held"
        not_before = self._not_before.get(task, 0)
        return "scheduled" if not_before > time.time_ns() // 1000 else "pending"

    def result(self, task: int, timeout: float | None) -> Any:
        self.want(task)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.catch_up()
            if self._state.is_done(task):
                if task in self._results:
                    result = self._results[task]
                    first = resolved_to(result)
                    if first is None:
                        return result
                    left = None if deadline is None else deadline - time.monotonic()
                    return self.result(first, left)  # a later task of a key: the first's
                raise ResultRemovedError(
                    f"task {task} is done, but its result was removed by compaction "
                    "(settled history: qw compact keeps only the fold of it)"
                )
            if self._state.is_dead(task):
                error = self._errors.get(task, self._state.dead_error(task) or "")
                raise TaskFailed(task, error)
            wait = WAIT_CHUNK_S if deadline is None else deadline - time.monotonic()
            if wait <= 0:
                raise TimeoutError(f"task {task} is still {self._word(task)} after {timeout:g} s")
            self._opened().wait(self._position, min(wait, WAIT_CHUNK_S))

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
