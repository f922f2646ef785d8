"""Compaction: only settled history goes, the checkpoint keeps the fold of it (with a digest
chain of what went), and a kill -9 at every step of `qw compact` loses nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest

from logstore import Log, PositionCompactedError
from logstore.file.log import FileLog
from logstore.file.segments import list_bases
from queue_worker.compaction.files import STEPS, CompactionError, compact
from queue_worker.compaction.settled import Retention
from queue_worker.history.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointError,
    CheckpointRefused,
    Removed,
    chain_of,
    checkpoint_lock,
    restore_checkpoint,
    save_checkpoint,
)
from queue_worker.proof.report import Report, ReportInputError, load_report
from queue_worker.protocol.records import Claim, Done, Fail, TaskRecord, encode
from queue_worker.protocol.state import ClaimSnapshot
from queue_worker.topics import ClaimsFollower, TaskIndex, open_topics
from tests.helpers import wait_until

SMALL = 4096
QW = [sys.executable, "-m", "supervisor.cli.app"]
#: qw with the tests' patches (tests/qw_run.py)
QW_RUN = [sys.executable, "-m", "tests.qw_run"]
NOW_US = 1_700_000_000_000_000
LEASE = 30_000_000
EVERYTHING = Retention(seconds=0, bytes=0)


def logs(directory: Path) -> tuple[Log, Log]:
    return open_topics(directory)


def make_queue(directory: Path, done: int, pending: int = 20, held: int | None = None) -> None:
    """`done` tasks claimed and done in order, then `pending` never claimed; `held`: one
    task (an id below `done`) claimed but never finished instead (a live lease), `failing`
    one backing off. Small segments on both logs."""
    tasks_log, claims_log = logs(directory)
    for log in (tasks_log, claims_log):
        log.close()
        FileLog.open(log.name, segment_bytes=SMALL).close()  # the logs' segment size
    tasks_log, claims_log = logs(directory)
    try:
        for t in range(done + pending):
            tasks_log.append(encode(TaskRecord({"n": t, "pad": "x" * 40}, NOW_US + t)))
        for t in range(done):
            at = NOW_US + 1000 * t
            claim = claims_log.append(encode(Claim(t, "w0-1-aaaa", at, LEASE)))
            if t == held:
                continue
            if t % 10 == 3:  # one failed attempt first, then done on the retry
                claims_log.append(encode(Fail(t, "w0-1-aaaa", at + 1, claim, "boom", at + 2)))
                claim = claims_log.append(encode(Claim(t, "w0-1-aaaa", at + 3, LEASE)))
            claims_log.append(encode(Done(t, "w0-1-aaaa", at + 4, claim, {"r": t})))
    finally:
        tasks_log.close()
        claims_log.close()


def fold(directory: Path) -> tuple[ClaimSnapshot, int, int, int]:
    """The fold a starting worker reaches: the checkpoint (if any) and the rest of the logs
    (a full replay without one). The claims state, tasks known, and where each stopped."""
    tasks_log, claims_log = logs(directory)
    try:
        try:
            tasks, claims = restore_checkpoint(directory, tasks_log, claims_log)
        except CheckpointRefused:
            assert tasks_log.start == tasks_log.origin
            tasks, claims = TaskIndex(tasks_log.start), ClaimsFollower(claims_log.start)
        tasks.catch_up(tasks_log)
        claims.catch_up(claims_log)
        snap = claims.state.snapshot()
        # (the same fold, whatever order a restore lists its open and closed tasks in)
        same = snap._replace(
            closed_above=tuple(sorted(snap.closed_above)),
            dead=tuple(sorted(snap.dead)),
            open=tuple(sorted(snap.open)),
        )
        return same, tasks.known, tasks.next_position, claims.next_position
    finally:
        tasks_log.close()
        claims_log.close()


def body(directory: Path) -> dict[str, Any]:
    outer = msgpack.unpackb((directory / CHECKPOINT_NAME).read_bytes())
    inner: dict[str, Any] = msgpack.unpackb(outer["body"])
    return inner


def starts(directory: Path) -> tuple[int, int]:
    tasks_log, claims_log = logs(directory)
    with tasks_log, claims_log:
        return tasks_log.start, claims_log.start


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Path]:
    make_queue(tmp_path, done=300)
    yield tmp_path


def test_settled_history_goes_and_the_fold_stays(queue: Path) -> None:
    before = fold(queue)
    segments_before = len(list_bases(str(queue / "claims.log")))
    done = compact(queue, EVERYTHING)
    assert done.removed["claims"] and done.removed["tasks"]
    assert done.freed_bytes > 0
    assert fold(queue) == before  # from the checkpoint and what is left: the same fold
    assert len(list_bases(str(queue / "claims.log"))) < segments_before
    tasks_start, claims_start = starts(queue)
    assert claims_start == done.removed["claims"][-1].end > 48
    assert tasks_start == done.removed["tasks"][-1].end > 48
    # the checkpoint lists what went, in order, with its digest chain
    saved = body(queue)["claims"]["log"]
    removed = [Removed(*r) for r in saved["compacted"]]
    assert removed == done.removed["claims"] and saved["chain"] == chain_of(removed)
    # the pending tasks' records stay: a segment with a task not done is kept
    tasks_log, _ = logs(queue)
    with tasks_log:
        payloads = [msgpack.unpackb(e.data)[2]["n"] for e in tasks_log.iter_from(tasks_start)]
    assert payloads[-20:] == list(range(300, 320)) and payloads[0] > 0
    # a second run finds nothing more to remove, and the fold is still the same
    again = compact(queue, EVERYTHING)
    assert not any(again.removed.values())
    assert fold(queue) == before


def test_the_checkpoint_compaction_writes_does_not_grow_with_history(tmp_path: Path) -> None:
    """The task index it saves keeps the live tasks only (a retention run of millions of
    tasks had a checkpoint of 8 bytes for every task ever published)."""
    make_queue(tmp_path, done=5000, pending=20)  # (the index drops 4,096 tasks or more at once)
    before = fold(tmp_path)
    compact(tmp_path, EVERYTHING)
    tasks = body(tmp_path)["tasks"]
    assert tasks["settled"] == 5000  # every task below the fold's watermark: forgotten
    assert len(tasks["positions"]) == 8 * 20  # an int64 position for each pending task
    assert fold(tmp_path) == before


def test_a_live_lease_keeps_its_segment_and_every_later_one(tmp_path: Path) -> None:
    make_queue(tmp_path, done=300, held=40)
    before = fold(tmp_path)
    tasks_log, claims_log = logs(tmp_path)
    with tasks_log, claims_log:
        held_at = next(
            e.position
            for e in claims_log.iter_from(claims_log.start)
            if b"w0-1-aaaa" in e.data and msgpack.unpackb(e.data)[2] == 40
        )
    done = compact(tmp_path, EVERYTHING)
    _, claims_start = starts(tmp_path)
    assert claims_start <= held_at  # the held task's CLAIM is still there
    assert all(r.end <= held_at for r in done.removed["claims"])
    assert fold(tmp_path) == before


def test_retention_keeps_recent_history(queue: Path) -> None:
    nothing = compact(queue, Retention(seconds=3600, bytes=1 << 30))
    assert not any(nothing.removed.values())
    assert starts(queue) == (48, 48)
    # over the size budget: the oldest settled segments go until it fits (or cannot)
    by_size = compact(queue, Retention(seconds=3600, bytes=2 * SMALL))
    assert by_size.removed["claims"]


def test_a_worker_save_after_compaction_keeps_the_chain(queue: Path) -> None:
    compact(queue, EVERYTHING)
    chain = body(queue)["claims"]["log"]["chain"]
    tasks_log, claims_log = logs(queue)
    with tasks_log, claims_log:
        tasks, claims = restore_checkpoint(queue, tasks_log, claims_log)
        claims_log.append(encode(Claim(305, "w1-2-bbbb", NOW_US, LEASE)))
        claims.catch_up(claims_log)
        save_checkpoint(queue, tasks, tasks_log, claims, claims_log)
    assert body(queue)["claims"]["log"]["chain"] == chain
    assert fold(queue)[0].open[-1].task == 305


def test_without_the_checkpoint_a_compacted_queue_is_refused_loudly(queue: Path) -> None:
    compact(queue, EVERYTHING)
    (queue / CHECKPOINT_NAME).unlink()
    with pytest.raises(CompactionError) as refused:
        compact(queue, EVERYTHING)
    assert "the logs were compacted and no usable checkpoint covers" in str(refused.value)
    result = subprocess.run(
        [*QW, "compact", "--dir", str(queue), "--retention", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("qw: error: ") and result.stderr.count("\n") == 1
    # a reader of a removed position gets the typed error, never a partial replay
    tasks_log, claims_log = logs(queue)
    with tasks_log, claims_log, pytest.raises(PositionCompactedError):
        claims_log.read(claims_log.origin)


def test_a_tampered_chain_is_refused(queue: Path) -> None:
    compact(queue, EVERYTHING)
    outer = msgpack.unpackb((queue / CHECKPOINT_NAME).read_bytes())
    inner = msgpack.unpackb(outer["body"])
    inner["claims"]["log"]["compacted"][0][2] ^= 1  # a removed segment's digest changed
    packed = msgpack.packb(inner)
    outer.update(body=packed, crc32=zlib.crc32(packed))
    (queue / CHECKPOINT_NAME).write_bytes(msgpack.packb(outer))
    tasks_log, claims_log = logs(queue)
    with tasks_log, claims_log, pytest.raises(CheckpointRefused) as refused:
        restore_checkpoint(queue, tasks_log, claims_log)
    assert "digest chain" in str(refused.value) and "tampered" in str(refused.value)


@pytest.mark.parametrize("step", STEPS)
def test_kill_9_at_every_step_of_qw_compact_loses_nothing(queue: Path, step: str) -> None:
    before = fold(queue)
    killed = subprocess.run(
        [
            *QW_RUN,
            "--kill-compaction-at",
            step,
            "--",
            "compact",
            "--dir",
            str(queue),
            "--retention",
            "0",
            "--retention-bytes",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr
    assert fold(queue) == before  # the logs open, and fold to the same state
    finished = subprocess.run(
        [*QW, "compact", "--dir", str(queue), "--retention", "0", "--retention-bytes", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr
    assert fold(queue) == before
    assert starts(queue)[1] > 48  # the compaction the kill interrupted got done


def totals(report: Report) -> dict[str, Any]:
    names = (
        "tasks_published",
        "tasks_done",
        "tasks_dead",
        "tasks_held",
        "tasks_won",
        "attempts",
        "wins",
        "completions",
        "completions_accepted",
        "fails_accepted",
        "claims_records",
    )
    return {name: getattr(report, name) for name in names} | {"ok": report.ok}


def test_the_report_adds_up_across_the_compacted_prefix(tmp_path: Path) -> None:
    make_queue(tmp_path, done=300, held=250)
    before = load_report(tmp_path)
    assert before.prefix is None and before.ok
    done = compact(tmp_path, EVERYTHING)
    after = load_report(tmp_path)
    assert totals(after) == totals(before)
    assert after.checks.ok == before.checks.ok and after.checks.lost == before.checks.lost
    prefix = after.prefix
    assert prefix is not None
    assert prefix.position == done.removed["claims"][-1].end
    assert after.compacted_segments == sum(len(r) for r in done.removed.values())
    shown = subprocess.run(
        [*QW, "report", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert f"the claims records before position {prefix.position}" in shown.stdout
    # more work after the compaction: still the same proof, on the retained records
    tasks_log, claims_log = logs(tmp_path)
    with tasks_log, claims_log:
        claim = claims_log.append(encode(Claim(310, "w1-2-bbbb", NOW_US, LEASE)))
        claims_log.append(encode(Done(310, "w1-2-bbbb", NOW_US + 5, claim, None)))
    again = load_report(tmp_path)
    assert again.ok and again.tasks_done == before.tasks_done + 1


def test_compaction_after_a_worker_forgot_the_settled_tasks(tmp_path: Path) -> None:
    """A worker's checkpoint holds a task index that forgot the positions of settled tasks
    (memory independent of history): compaction still finds which tasks each segment holds
    (it counts them), and the report still adds up."""
    make_queue(tmp_path, done=300, pending=0)
    before = load_report(tmp_path)
    tasks_log, claims_log = logs(tmp_path)
    with tasks_log, claims_log:
        tasks, claims = TaskIndex(tasks_log.start), ClaimsFollower(claims_log.start)
        tasks.catch_up(tasks_log)
        claims.catch_up(claims_log)
        tasks.settle_below(claims.state.watermark)  # as a worker's catch-up does
        assert tasks.indexed == 0 and tasks.known == 300
        save_checkpoint(tmp_path, tasks, tasks_log, claims, claims_log)
    done = compact(tmp_path, EVERYTHING)
    assert done.removed["tasks"] and done.removed["claims"]
    after = load_report(tmp_path)
    assert after.ok and totals(after) == totals(before)
    prefix = after.prefix
    assert prefix is not None
    # the tasks before the first kept tasks record, counted from the removed segments
    tasks_log, claims_log = logs(tmp_path)
    with tasks_log:
        kept = sum(1 for _ in tasks_log.iter_from(tasks_log.start))
    assert prefix.tasks + kept == 300


def test_a_report_of_lost_history_says_so(tmp_path: Path) -> None:
    queue = tmp_path
    make_queue(queue, done=300, held=250)  # (the held task keeps segments after it)
    compact(queue, EVERYTHING)
    # the oldest segment still retained disappears, with no entry in the digest chain
    log = FileLog.open(queue / "claims.log", read_only=True)
    base, _ = log.sealed_segments()[0]
    log.close()
    os.unlink(queue / f"claims.{base:020d}.seg")
    with pytest.raises(ReportInputError) as refused:
        load_report(queue)
    assert "cannot be accounted for (lost or tampered)" in str(refused.value)
    assert "lost history" in str(refused.value)


SUPERVISOR = """
import os
import sys
from pathlib import Path

from queue_worker.compaction.settled import Retention
from queue_worker.waiting import wait_until
from supervisor.run.supervisor import Supervisor, SupervisorOptions
from tests.qw_run import kill_compaction_at

data, step = Path(sys.argv[1]), sys.argv[2]
options = SupervisorOptions(
    data_dir=data,
    location=str(data),
    workers=2,
    work_ms=10,  # ~2 s of work: rounds after the kill point is armed still seal and drop
    tasks=400,
    segment_bytes=4096,
    retention=Retention(seconds=0, bytes=0),
    compact_every_s=0.2,
)
supervisor = Supervisor(options)
supervisor.start()
# The kill point is armed once tasks are done, while most are still to run: a compaction
# round may come before the first DONE (the tasks log's sealed segments let one fold and
# checkpoint), and the kill must fall in one that has settled history to keep, with more
# segments sealed (and dropped) after it.
wait_until(lambda: supervisor.snapshot().queue.done >= 20, 60, "tasks done")
kill_compaction_at(step)  # met by the compactor's thread at its next kill point
supervisor.wait(120)
"""


def _ours(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("QW_TEST_TAG") == tag:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.parametrize("step", ["checkpointed", "dropped"])
def test_kill_9_of_the_supervisor_while_it_compacts(tmp_path: Path, step: str) -> None:
    """`qw up` compacts in its supervisor; the supervisor killed in the middle of it (its
    workers die with it) leaves logs that open, fold as they did, and compact later."""
    data = tmp_path / "qw"
    tag = str(tmp_path)
    killed = subprocess.run(
        [sys.executable, "-c", SUPERVISOR, str(data), step],
        env={**os.environ, "QW_TEST_TAG": tag},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert killed.returncode == -9, killed.stderr
    wait_until(lambda: not _ours(tag), 60, "the workers to die with their supervisor")
    before = fold(data)
    assert before[0].done_count > 0
    finished = subprocess.run(
        [*QW, "compact", "--dir", str(data), "--retention", "0", "--retention-bytes", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr
    assert fold(data) == before
    report = load_report(data)
    assert report.ok and report.tasks_done == before[0].done_count


def test_a_worker_save_does_not_wait_for_a_compaction(queue: Path) -> None:
    tasks_log, claims_log = logs(queue)
    with tasks_log, claims_log:
        tasks, claims = TaskIndex(tasks_log.start), ClaimsFollower(claims_log.start)
        tasks.catch_up(tasks_log)
        claims.catch_up(claims_log)
        with checkpoint_lock(queue):  # what a compaction holds while it works
            with pytest.raises(CheckpointError) as skipped:
                save_checkpoint(queue, tasks, tasks_log, claims, claims_log)
            assert "a compaction under way" in str(skipped.value)
        save_checkpoint(queue, tasks, tasks_log, claims, claims_log)  # later: saved
    assert fold(queue)[0].done_count == 300


def test_qw_task_after_compaction(tmp_path: Path) -> None:
    """A task whose records were removed is done (said so); one whose DONE is retained
    still shows its result; ids stay the ids they were."""
    make_queue(tmp_path, done=300, held=250)
    compact(tmp_path, EVERYTHING)

    def task(number: int) -> str:
        shown = subprocess.run(
            [*QW, "task", "--dir", str(tmp_path), str(number)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        return shown.stdout

    assert task(3).startswith("task 3: done (its records were removed by compaction")
    kept = task(299)
    assert kept.startswith("task 299: done (@") and '{"r": 299}' in kept
    assert '{"n": 299' in kept  # its own payload: the id still names the same task
    assert task(250).startswith("task 250: held by")


def _writer(directory: str, first: int, count: int) -> None:
    """Tasks published, claimed and done, one after another (each settled at once)."""
    tasks_log, claims_log = logs(Path(directory))
    with tasks_log, claims_log:
        for t in range(first, first + count):
            tasks_log.append(encode(TaskRecord({"n": t, "pad": "x" * 40}, NOW_US + t)))
            claim = claims_log.append(encode(Claim(t, "w0-1-aaaa", NOW_US + t, LEASE)))
            claims_log.append(encode(Done(t, "w0-1-aaaa", NOW_US + t + 1, claim, None)))


def _reader(directory: str, stop: Any, out: Any, back: bool) -> None:
    """Follow the claims log from its start; on PositionCompactedError go on from the new
    start. Anything else is a failure, reported. `back`: after each read, start again from
    the log's origin now and then (a reader left behind by compaction)."""
    claims_log = FileLog.open(Path(directory) / "claims.log", read_only=True)
    position, seen, compacted = claims_log.start, 0, 0
    try:
        while True:
            stopping = stop.is_set()  # (before the read: what the read finds then is all)
            try:
                entries = claims_log.read(position, 256)
            except PositionCompactedError as e:
                compacted += 1
                position = e.start
                continue
            if stopping and not entries:
                break
            for entry in entries:
                assert entry.position >= position
                msgpack.unpackb(entry.data)  # whole records only
                position = entry.next
                seen += 1
            if back and seen % 7 == 0 and not stop.is_set():
                position = claims_log.origin
            if not entries:
                claims_log.wait(position, 0.05)
        out.put(("ok", seen, compacted, position))
    except Exception as e:  # the test fails on it, naming it
        out.put(("error", repr(e), compacted, position))


def test_readers_and_a_writer_during_compactions_see_only_the_typed_error(
    tmp_path: Path,
) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    make_queue(tmp_path, done=50, pending=0)
    stop, out = ctx.Event(), ctx.Queue()
    readers = [
        ctx.Process(target=_reader, args=(str(tmp_path), stop, out, back)) for back in (False, True)
    ]
    writer = ctx.Process(target=_writer, args=(str(tmp_path), 50, 3000))
    for proc in (*readers, writer):
        proc.start()
    removed = 0
    while writer.is_alive():
        removed += sum(len(r) for r in compact(tmp_path, EVERYTHING).removed.values())
    writer.join(60)
    assert writer.exitcode == 0
    removed += sum(len(r) for r in compact(tmp_path, EVERYTHING).removed.values())
    stop.set()
    results = [out.get(timeout=60) for _ in readers]
    for proc in readers:
        proc.join(60)
    assert removed > 10  # compactions ran while they read and wrote
    assert all(kind == "ok" for kind, *_ in results), results
    assert sum(compacted for _, _, compacted, _ in results) > 0  # the typed error was met
    _, claims_log = logs(tmp_path)
    with claims_log:
        end = claims_log.end()
    assert all(position == end for *_, position in results)  # each read to the end
    assert fold(tmp_path)[0].done_count == 3050


def test_ids_of_tasks_enqueued_after_compaction_go_on(queue: Path) -> None:
    """A task's id is its index in the topic, removed segments included: a producer counts
    on from the checkpoint's count of the tasks compaction removed."""
    from queue_worker.producer import Queue

    compact(queue, EVERYTHING)
    with Queue(queue, fsync="none") as producer:
        assert producer.enqueue_many(["a", "b"]) == [320, 321]
    assert load_report(queue).tasks_published == 322
