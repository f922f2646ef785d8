"""queue_worker — the claims protocol: records, the pure verdict, the worker loop, the report.

The package's face, for code that enqueues tasks or writes handlers::

    from queue_worker import Queue, TaskFailed

    queue = Queue(".qw")

    @queue.task
    def add(a, b):
        return a + b

    add.enqueue(1, 2).result(timeout=10)   # 3, once `qw up --app myjobs` runs

On a queue created with partitions, `Queue(location)` is the same (queue_worker.partitions.jobs):
each task goes into one partition, and is named ``K:ID``.

`TaskFailed` is what `result()` raises for a dead or cancelled task, with its error and
traceback; `ResultRemovedError`, for a result compaction removed.

Every error the package raises on purpose is a `QwError` (those that are also a
`logstore.LogError` or a `ValueError` keep that base too).

The names are loaded when first used (PEP 562), so that importing one module of the
package (`queue_worker.protocol.state`, say, for the fold alone) loads only what that module needs:
never the producer, nor the worker.

The package's layers, lowest first, are drawn in docs/architecture.md and held by
tests/test_layers.py; it imports nothing of `supervisor`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

from queue_worker.errors import QwError

if TYPE_CHECKING:
    from queue_worker.history.checkpoint import CheckpointError, CheckpointRefused
    from queue_worker.partitions.jobs import Queue
    from queue_worker.proof.report import ReportInputError
    from queue_worker.protocol.records import RecordDecodeError, RecordEncodeError, TaskIdRangeError
    from queue_worker.results import ResultRemovedError as ResultRemovedError
    from queue_worker.results import TaskFailed as TaskFailed
    from queue_worker.results import TaskHandle
    from queue_worker.tasks import TaskFunction
    from queue_worker.topics import SettleError
    from queue_worker.worker.handlers import (
        HandlerLoadError,
        TaskCancelled,
        TaskContext,
        time_limit,
    )

__all__ = [
    # enqueueing, and waiting for results
    "Queue",
    "TaskFunction",
    "TaskHandle",
    # writing a handler
    "TaskContext",
    "time_limit",
    "TaskCancelled",
    # waiting for a result: a dead or cancelled task, a result compaction removed
    "TaskFailed",
    "ResultRemovedError",
    # errors: the root, and every error under it
    "QwError",
    "RecordDecodeError",
    "TaskIdRangeError",
    "RecordEncodeError",
    "CheckpointError",
    "CheckpointRefused",
    "SettleError",
    "HandlerLoadError",
    "ReportInputError",
]

#: where each name of the face is defined (loaded on first use)
_HOMES: Final = {
    "Queue": "queue_worker.partitions.jobs",  # (producer.Queue, on partitions too)
    "TaskFunction": "queue_worker.tasks",
    "TaskHandle": "queue_worker.results",
    "TaskFailed": "queue_worker.results",
    "ResultRemovedError": "queue_worker.results",
    "TaskContext": "queue_worker.worker.handlers",
    "time_limit": "queue_worker.worker.handlers",
    "TaskCancelled": "queue_worker.worker.handlers",
    "HandlerLoadError": "queue_worker.worker.handlers",
    "ReportInputError": "queue_worker.proof.report",
    "RecordDecodeError": "queue_worker.protocol.records",
    "TaskIdRangeError": "queue_worker.protocol.records",
    "RecordEncodeError": "queue_worker.protocol.records",
    "CheckpointError": "queue_worker.history.checkpoint",
    "CheckpointRefused": "queue_worker.history.checkpoint",
    "SettleError": "queue_worker.topics",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
