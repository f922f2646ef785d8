"""A real worker process's task index does not grow with history (issue 14, item 4).

One worker process drains 100k no-op tasks, then 100k more. At both points it publishes how
many task positions its index holds (`indexed_tasks`, 8 bytes each): with the watermark
pruning, only the live tasks (none once drained) plus at most the compaction's minimum;
without it, every task ever published (100k, then 200k). Its clean exit saves the fold
checkpoint, whose task positions are the same compact form.
"""

from __future__ import annotations

import signal
from pathlib import Path

import msgpack
import pytest

from queue_worker.fleet import WorkerProcesses
from queue_worker.history.checkpoint import CHECKPOINT_NAME
from queue_worker.producer import Queue
from queue_worker.topics import COMPACT_MIN_TASKS
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.snapshot import WorkerSnapshot, WorkerState, parse_snapshot, read_snapshots
from supervisor.http_api import worker_json
from supervisor.run.model import SlotState, WorkerView
from tests.helpers import wait_until

BATCH = 100_000


def drained_to(run_dir: Path, total: int) -> WorkerSnapshot | None:
    """The worker's snapshot once it is idle with `total` tasks known and done."""
    for snap in read_snapshots(run_dir):
        if (snap.known_tasks, snap.done_tasks, snap.state) == (total, total, WorkerState.IDLE):
            return snap
    return None


@pytest.mark.slow  # a long history, by design
def test_a_worker_index_holds_the_live_tasks_not_the_history(tmp_path: Path) -> None:
    data, run_dir = tmp_path / "data", tmp_path / "run"
    config = WorkerConfig(
        str(data), str(run_dir), name="w0", handler="bench.noop:noop", fsync="none"
    )
    indexed: list[int] = []
    with Queue(data, fsync="none") as queue, WorkerProcesses(tmp_path / "logs") as fleet:
        proc = fleet.start(config)
        for total in (BATCH, 2 * BATCH):
            queue.enqueue_many([None] * BATCH)
            snap = wait_until(
                lambda total=total: drained_to(run_dir, total),  # type: ignore[misc]
                timeout=600,
                what=f"the worker to drain {total} tasks ({fleet.stderr_tail(proc)})",
            )
            assert isinstance(snap, WorkerSnapshot)
            indexed.append(snap.indexed_tasks)
        proc.send_signal(signal.SIGTERM)  # a clean exit saves the checkpoint
        assert proc.wait(60) == 0, fleet.stderr_tail(proc)
    # Unpruned, the index would hold 100k then 200k positions.
    assert all(n <= COMPACT_MIN_TASKS for n in indexed), indexed
    body = msgpack.unpackb(msgpack.unpackb((data / CHECKPOINT_NAME).read_bytes())["body"])
    saved = body["tasks"]
    assert saved["base"] + len(saved["positions"]) // 8 == 2 * BATCH
    assert len(saved["positions"]) // 8 <= COMPACT_MIN_TASKS


def test_the_index_size_is_served_over_http() -> None:
    stats = parse_snapshot({"indexed_tasks": 7, "known_tasks": 9})
    view = WorkerView(0, "w0", None, None, SlotState.IDLE, stats)
    assert (worker_json(view)["indexedTasks"], worker_json(view)["knownTasks"]) == (7, 9)
