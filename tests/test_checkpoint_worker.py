"""The worker and the fold checkpoint: who saves it, when, and that a start uses it.

(The checkpoint itself — format, validation, restore equal to a replay — is tested in
test_checkpoint.py.) Real file logs in tmp_path; workers driven in this process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import queue_worker.worker.loop as worker_module
from logstore import open_log
from queue_worker.history.checkpoint import CHECKPOINT_NAME
from queue_worker.producer import Queue
from queue_worker.proof.report import load_report
from queue_worker.topics import CLAIMS_TOPIC
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.loop import StepKind, Worker


def config(data: Path, slot: int = 0, slots: int = 1) -> WorkerConfig:
    return WorkerConfig(
        str(data),
        str(data.parent / "run"),
        name=f"w{slot}",
        slot=slot,
        slots=slots,
        exit_when_drained=True,
        fsync="none",
    )


def enqueue(data: Path, count: int) -> None:
    with Queue(data, fsync="none") as queue:
        queue.enqueue_many(list(range(count)))


def claims_end(data: Path) -> int:
    with open_log(data, CLAIMS_TOPIC) as log:
        return log.end()


def echo(payload: Any) -> Any:
    return payload


def test_slot_0_saves_at_exit_and_the_next_worker_starts_from_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    enqueue(data, 5)
    with Worker(config(data), handler=echo) as first:
        assert first.run() == "queue drained"
    assert (data / CHECKPOINT_NAME).is_file()

    enqueue(data, 2)
    with Worker(config(data), handler=echo) as second:
        # Before any catch-up, the fold already stands at the end of the claims log.
        assert second.claims.next_position == claims_end(data)
        assert second.claims.state.done_count == 5
        assert second.tasks.known == 5
        assert second.stats.last_error is None
        assert second.run() == "queue drained"
        assert second.stats.finished == 2
    report = load_report(data)
    assert report.ok and report.completions_accepted == 7


def test_a_worker_in_another_slot_saves_none(tmp_path: Path) -> None:
    data = tmp_path / "data"
    enqueue(data, 3)
    with Worker(config(data, slot=1, slots=2), handler=echo) as worker:
        assert worker.run() == "queue drained"
    assert not (data / CHECKPOINT_NAME).exists()


def test_slot_0_saves_as_it_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "CHECKPOINT_EVERY_BYTES", 1)
    data = tmp_path / "data"
    enqueue(data, 3)
    with Worker(config(data), handler=echo) as worker:
        assert worker.step().kind is StepKind.DONE
        worker._save_checkpoint()
        assert (data / CHECKPOINT_NAME).is_file()
        saved_at = claims_end(data)
    with Worker(config(data), handler=echo) as restarted:
        assert restarted.claims.next_position == saved_at


def test_a_bad_checkpoint_is_replaced_and_the_queue_still_drains(tmp_path: Path) -> None:
    data = tmp_path / "data"
    enqueue(data, 4)
    (data / CHECKPOINT_NAME).write_bytes(b"not a checkpoint")
    with Worker(config(data), handler=echo) as worker:
        assert worker.claims.next_position == worker.claims_log.start  # a full replay
        assert "fold checkpoint not used" in (worker.stats.last_error or "")
        assert worker.run() == "queue drained"
    assert (data / CHECKPOINT_NAME).read_bytes() != b"not a checkpoint"
    with Worker(config(data), handler=echo) as next_one:
        assert next_one.claims.state.done_count == 4
    assert load_report(data).ok


def test_a_checkpoint_of_other_logs_is_not_used(tmp_path: Path) -> None:
    one, other = tmp_path / "one" / "data", tmp_path / "other" / "data"
    for data, count in ((one, 3), (other, 3)):
        enqueue(data, count)
        with Worker(config(data), handler=echo) as worker:
            worker.run()
    # `other`'s logs hold different worker ids: its checkpoint does not describe `one`'s.
    (one / CHECKPOINT_NAME).write_bytes((other / CHECKPOINT_NAME).read_bytes())
    with Worker(config(one), handler=echo) as worker:
        assert worker.claims.next_position == worker.claims_log.start
        assert "fold checkpoint not used" in (worker.stats.last_error or "")
