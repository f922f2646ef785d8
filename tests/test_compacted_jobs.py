"""Cancelled tasks, keys and retries after `qw compact`, on files and on Redis: the report of
the compacted queue counts as the one before it did, a key whose first task compaction
removed still resolves to that task (protocol §2, "key"), and a dead task whose retry
compaction removed is not retried again (protocol §2, "retry_of"). Real `qw up` workers,
real compactions, a real redis-server."""

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


# covered in make test by test_the_report_counts_a_compacted_file_queue_as_before (the prefix is
# one for both logs)
@pytest.mark.slow
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


def _small_segments(location: str) -> None:
    """Small segments (what `qw up` sets) from the first record on: some go at compaction."""
    if not location.startswith("redis"):
        for topic in (TASKS_TOPIC, CLAIMS_TOPIC):
            open_log(location, topic, family=TOPICS, segment_bytes=SEGMENT_BYTES).close()


def test_a_checkpoint_saved_before_the_retries_still_loads(tmp_path: Path) -> None:
    """The task index keeps each dead task's first retry, and so does its checkpoint
    ("retried"); one an older qw saved lacks it (the checkpoint's version is the same): it
    loads with no retries; a damaged one is refused."""
    from queue_worker.history.checkpoint import CheckpointRefused, _tasks_from, _tasks_plain
    from queue_worker.protocol.records import TaskRecord, encode
    from queue_worker.topics import TaskIndex

    with open_log(str(tmp_path / ".qw"), TASKS_TOPIC, family=TOPICS) as log:
        for retry_of in (None, 0, 0, None):  # (task 2 retries task 0 too: 1 is its retry)
            log.append(encode(TaskRecord(None, 0, "f", [], {}, retry_of=retry_of)))
        index = TaskIndex(log.start)
        index.catch_up(log)
    snap = index.snapshot()
    assert snap.retried == ((0, 1),)
    plain = _tasks_plain(snap, {})
    assert _tasks_from(plain) == snap and TaskIndex.restore(snap).retried == {0: 1}
    older = {k: v for k, v in plain.items() if k != "retried"}
    assert _tasks_from(older) == snap._replace(retried=())
    with pytest.raises(CheckpointRefused):
        _tasks_from(plain | {"retried": [[0, "1"]]})


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
    _small_segments(location)
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


# -- retries ---------------------------------------------------------------------------------

#: a task that dies (one attempt) while its file exists, and is done once it is gone
FAILS_WHILE = """

@queue.task(max_attempts=1)
def fails_while(path):
    if os.path.exists(path):
        raise ValueError(f"{path} exists")
"""


def _retried_dead_tasks(app_dir: Path, location: str, flag: Path) -> dict[int, int]:
    """Three tasks that die (while `flag` exists), then `qw retry --dead`: the retries, by
    the dead task each retries (pending: `flag` is gone)."""
    with (app_dir / "myjobs.py").open("a") as app:
        app.write(FAILS_WHILE)
    flag.touch()
    queue, *_ = producer(location)
    with queue:
        dead = [queue.enqueue_call("fails_while", [str(flag)]).id for _ in range(3)]
    _up(app_dir, location)
    flag.unlink()
    retried = qw("retry", "--dead", *_place(location), cwd=app_dir)
    assert retried.returncode == 0, retried.stderr
    lines = [line.split() for line in retried.stdout.splitlines()]
    retries = {int(words[1]): int(words[-1]) for words in lines}
    assert sorted(retries) == dead, retried.stdout
    return retries


def _nothing_retried_again(app_dir: Path, location: str, retries: dict[int, int]) -> None:
    """`qw retry --dead` finds no dead task to retry, and `qw retry ID` of one already
    retried says by which task; neither appends anything."""
    with Queue(location) as queue:
        end = queue.log.end()
    again = qw("retry", "--dead", *_place(location), cwd=app_dir)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "no dead task to retry"
    dead, retry = min(retries.items())
    refused = qw("retry", str(dead), *_place(location), cwd=app_dir)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"qw: error: task {dead} was retried already, by task {retry}; "
        "expected a dead task that no task retries yet"
    )
    with Queue(location) as queue:
        assert queue.log.end() == end


def _a_retried_task_is_not_retried_after_compaction(app_dir: Path, location: str) -> None:
    _small_segments(location)
    retries = _retried_dead_tasks(app_dir, location, app_dir / "fail")
    queue, add, *_ = producer(location)
    with queue:
        for n in range(150):  # (more segments: the retries' go)
            add.enqueue(n, 1)
    _up(app_dir, location)  # the retries run, and are done
    _compact(app_dir, location)
    compacted = _report(app_dir, location)
    assert compacted["ok"], compacted["verdict"]
    assert compacted["prefix"]["tasks"] > max(retries.values())  # their records were removed
    with Queue(location) as later:
        assert {later.state(t) for t in retries} == {"dead"}
        assert {later.state(t) for t in retries.values()} == {"done"}
    _nothing_retried_again(app_dir, location, retries)


def test_a_dead_task_retried_is_not_retried_again_after_compaction_on_files(
    app_dir: Path,
) -> None:
    _a_retried_task_is_not_retried_after_compaction(app_dir, str(app_dir / ".qw"))


# covered in make test by test_a_dead_task_retried_is_not_retried_again_after_compaction_on_files
# (the producer's links_counted is one for both logs)
@pytest.mark.slow
@pytest.mark.redis
def test_a_dead_task_retried_is_not_retried_again_after_compaction_on_redis(
    app_dir: Path, redis_url: str
) -> None:
    _a_retried_task_is_not_retried_after_compaction(app_dir, redis_url)


def test_a_retry_before_the_checkpoint_s_end_is_not_forgotten(app_dir: Path) -> None:
    """A producer on a long tasks log counts on from the checkpoint's end, reading none of
    the records before: the retries among those come from the checkpoint's index, so a
    dead task retried is not retried a second time."""
    from queue_worker.compaction.files import fold_logs
    from queue_worker.history.checkpoint import save_checkpoint
    from queue_worker.producer import COUNT_FROM_START_BYTES
    from queue_worker.topics import open_topics

    location = str(app_dir / ".qw")
    retries = _retried_dead_tasks(app_dir, location, app_dir / "fail")
    queue, add, *_ = producer(location)
    with queue:
        add.enqueue("x" * COUNT_FROM_START_BYTES, "")  # (one record makes the log long)
    tasks_log, claims_log = open_topics(location)
    with tasks_log, claims_log:
        tasks, claims = fold_logs(location, tasks_log, claims_log)
        save_checkpoint(location, tasks, tasks_log, claims, claims_log)
        end = tasks_log.end()
    with Queue(location) as later:
        assert later._count_from()[1] == end  # (it counts from the checkpoint's end)
    _nothing_retried_again(app_dir, location, retries)
