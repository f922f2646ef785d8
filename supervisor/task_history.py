"""One task's history read from the logs: its TASK record, every claims record about it with
the fold's verdict and why (`queue_worker.proof.explain`), its accepted result, and its attempts.

The live fold (`supervisor.run.monitor`) forgets a task once it is finished, so this is what
`/task/ID` serves beside it for a finished task. It reads the whole claims log, as `qw task`
does: a request costs a replay, which is why the stats endpoint calls it only for /task/ID.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queue_worker.proof.explain import TaskStory, explain_task
from queue_worker.proof.report import prefix_state, read_claims, read_task
from queue_worker.protocol.records import ClaimsRecord, Done, TaskRecord
from queue_worker.protocol.state import Verdict
from queue_worker.values import json_value

_WINS = frozenset({Verdict.WON.value, Verdict.TAKEOVER.value})


@dataclass(frozen=True)
class TaskHistory:
    story: TaskStory
    payload: Any  # JSON-safe; None when the tasks log has no readable record for it
    result: Any  # JSON-safe; the accepted DONE's result, None when it has none
    function: str | None = None  # a task by name's function (None: a payload task)
    after: tuple[int, ...] = ()  # the tasks it waits for (`enqueue(after=…)`)

    @property
    def exists(self) -> bool:
        """The tasks log has the id, or at least one claims record names it."""
        return bool(self.story.steps)

    @property
    def attempts(self) -> int:
        """Claims that won the task (takeovers included): how many times it was started."""
        return sum(1 for s in self.story.steps if s.kind == "CLAIM" and s.verdict in _WINS)

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.story.state,
            "attempts": self.attempts,
            "function": self.function,
            "after": list(self.after),
            "payload": self.payload,
            "result": self.result,
            "history": self.story.to_json()["records"],
        }


def read_task_history(location: str | Path, task: int) -> TaskHistory:
    """Raises LogError on a damaged log (the caller words it)."""
    results: dict[int, Any] = {}

    def claims() -> Iterator[tuple[int, ClaimsRecord]]:
        for position, record in read_claims(location):
            if isinstance(record, Done) and record.task == task:
                results[position] = record.result
            yield position, record

    task_record = read_task(location, task)
    now_us = time.time_ns() // 1000  # a lease that ran out by now reads as expired
    start = prefix_state(location)  # (compacted logs: the fold of what was removed)
    story = explain_task(task, task_record, claims(), now_us=now_us, start=start)
    accepted = [s.position for s in story.steps if s.kind == "DONE" and s.verdict == "done"]
    payload = task_record.payload if isinstance(task_record, TaskRecord) else None
    result = results.get(accepted[0]) if accepted else None
    if not isinstance(task_record, TaskRecord):
        return TaskHistory(story, None, json_value(result))
    function, after = task_record.function, task_record.after
    return TaskHistory(story, json_value(payload), json_value(result), function, after)
