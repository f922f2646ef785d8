"""Cancelled tasks and keys after `qw compact`, on files and on Redis: the report of the
compacted queue counts as the one before it did, and a key whose first task compaction
removed still resolves to that task (protocol §2, "key"). Real `qw up` workers, real
compactions, a real redis-server."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from logstore import open_log
from queue_worker import Queue, ResultRemovedError
from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC, TOPICS
from tests.test_jobs import app_dir, producer, qw

__all__ = ["app_dir"]  # (a fixture: used by name)

SEGMENT_BYTES = 4096  # (small: a run of a few hundred tasks fills a few segments)
#: the report's fields that hold only the retained records (compacted_segments: what went)
RETAINED_ONLY = ("compacted_segments", "claims_position")


def _place(location: str) -> list[str]:
    return ["--log", location] if location.startswith("redis") else ["--dir", location]


def _up(app_dir: Path, location: str) -> None:
    env = {**os.environ, "QW_TEST_QUEUE": location}
    up = qw("up", "--no-tui", "--app", "myjobs", "--workers", "2", "--exit-when-drained",
            "--backoff", "0.01", "--segment-bytes", str(SEGMENT_BYTES), *_place(location),
            cwd=app_dir, env=env)  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr


def _compact(app_dir: Path, location: str) -> None:
    done = qw("compact", "--retention", "0", *_place(location), cwd=app_dir)
    assert done.returncode == 0, done.stdout + done.stderr


def _report(app_dir: Path, location: str) -> dict[str, Any]:
    shown = qw("report", "--json", *_place(location), cwd=app_dir)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    report: dict[str, Any] = json.loads(shown.stdout)
    return report


def _counts(report: dict[str, Any]) -> dict[str, Any]:
    """Every count of the report, its verdict and its accounting."""
    counts = {
        name: value
        for name, value in report.items()
        if type(value) is int and name not in RETAINED_ONLY
    }
    return counts | {
        name: report[name] for name in ("lost_by_reason", "verdict", "ok", "accounting_errors")
    }


def _counts_survive_compaction(app_dir: Path, location: str) -> None:
    queue, add, always_fails, *_ = producer(location)
    with queue:
        cancelled = [add.enqueue(n, 0).id for n in range(10)]
        for task in cancelled:  # before any worker runs: dead, never claimed
            queue.cancel(task)
        for n in range(150):
            add.enqueue(n, 1)
        for n in range(5):
            always_fails.enqueue(n)  # (max_attempts=2: dead after two claims won)
    _up(app_dir, location)
    before = _report(app_dir, location)
    assert before["ok"], before["verdict"]
    assert before["cancelled_unclaimed"] == 10 and before["tasks_dead"] == 15
    assert before["tasks_done"] == 150 and before["tasks_won"] == 155
    _compact(app_dir, location)
    after = _report(app_dir, location)
    prefix = after["prefix"]
    assert prefix is not None and prefix["cancelled_unclaimed"] == 10  # (they were removed)
    assert _counts(after) == _counts(before)


def test_the_report_counts_a_compacted_file_queue_as_before(app_dir: Path) -> None:
    _counts_survive_compaction(app_dir, str(app_dir / ".qw"))


@pytest.mark.redis
def test_the_report_counts_a_compacted_redis_queue_as_before(app_dir: Path, redis_url: str) -> None:
    _counts_survive_compaction(app_dir, redis_url)


def test_a_prefix_saved_before_the_cancelled_count_still_loads() -> None:
    """A compacted prefix an older qw saved lacks `cancelled_unclaimed` and `lost_by_reason`
    (the checkpoint's version is the same): it loads with none of them; a damaged one is
    refused."""
    from queue_worker.history.checkpoint import CheckpointRefused
    from queue_worker.history.prefix import ADDED_LATER, Prefix
    from queue_worker.protocol.state import ClaimState

    prefix = Prefix(100, 3, ClaimState().snapshot(), cancelled_unclaimed=2,
                    lost_by_reason=(("lost: held", 4),))  # fmt: skip
    assert Prefix.from_plain(prefix.to_plain()) == prefix
    older = {k: v for k, v in prefix.to_plain().items() if k not in ADDED_LATER}
    assert Prefix.from_plain(older) == Prefix(100, 3, prefix.state)
    with pytest.raises(CheckpointRefused, match="the prefix's lost claims by reason"):
        Prefix.from_plain(prefix.to_plain() | {"lost_by_reason": {"lost: held": -1}})


# -- keys ------------------------------------------------------------------------------------


def _noting(location: str) -> tuple[Queue, Any, Any]:
    """A producer with the app's `note` (it appends a line to a file: each run shows)."""
    queue, add, *_ = producer(location)

    @queue.task
    def note(path: str) -> int:
        raise AssertionError("runs in a worker")

    return queue, note, add


def _a_key_is_its_first_task_for_ever(app_dir: Path, location: str) -> None:
    ran = app_dir / "ran.txt"
    if not location.startswith("redis"):  # small segments (what `qw up` sets): some go
        for topic in (TASKS_TOPIC, CLAIMS_TOPIC):
            open_log(location, topic, family=TOPICS, segment_bytes=SEGMENT_BYTES).close()
    queue, note, add = _noting(location)
    with queue:
        first = note.enqueue(str(ran), key="tick-1")
        for n in range(150):  # (more segments: the first's go)
            add.enqueue(n, 1)
    _up(app_dir, location)
    assert ran.read_text() == "ran\n"
    _compact(app_dir, location)
    compacted = _report(app_dir, location)
    assert compacted["prefix"]["tasks"] > first.id  # its record was removed
    later, note, _ = _noting(location)
    with later:  # a producer that comes after the compaction
        end = later.log.end()
        again = note.enqueue(str(ran), key="tick-1")
        assert again.id == first.id and again.state() == "done"
        assert later.log.end() == end  # nothing appended: nothing to run again
        with pytest.raises(ResultRemovedError, match=f"task {first.id} is done, but its result"):
            again.result(timeout=10)
        fresh = note.enqueue(str(ran), key="tick-2")  # (ids go on from the compacted count)
        assert fresh.id == compacted["tasks_published"]
        assert note.enqueue(str(ran), key="tick-2").id == fresh.id


def test_a_key_compaction_removed_the_first_task_of_is_that_task_on_files(
    app_dir: Path,
) -> None:
    _a_key_is_its_first_task_for_ever(app_dir, str(app_dir / ".qw"))


@pytest.mark.redis
def test_a_key_compaction_removed_the_first_task_of_is_that_task_on_redis(
    app_dir: Path, redis_url: str
) -> None:
    _a_key_is_its_first_task_for_ever(app_dir, redis_url)


def test_a_key_before_the_checkpoint_s_end_is_not_forgotten(app_dir: Path) -> None:
    """A producer on a long tasks log counts on from the checkpoint's end
    (`COUNT_FROM_START_BYTES`), reading none of the records before: the keys of those
    come from the checkpoint's index, so the key's task is not appended a second time."""
    from queue_worker.compaction.files import fold_logs
    from queue_worker.history.checkpoint import save_checkpoint
    from queue_worker.producer import COUNT_FROM_START_BYTES
    from queue_worker.topics import open_topics

    location = str(app_dir / ".qw")
    queue, note, add = _noting(location)
    with queue:
        first = note.enqueue("unused", key="tick-1")
        add.enqueue("x" * COUNT_FROM_START_BYTES, "")  # (one record makes the log long)
    tasks_log, claims_log = open_topics(location)
    with tasks_log, claims_log:
        tasks, claims = fold_logs(location, tasks_log, claims_log)
        save_checkpoint(location, tasks, tasks_log, claims, claims_log)
        end = tasks_log.end()
    later, note, _ = _noting(location)
    with later:
        assert later._count_from()[1] == end  # (it counts from the checkpoint's end)
        assert note.enqueue("unused", key="tick-1").id == first.id
        assert later.log.end() == end  # nothing appended
