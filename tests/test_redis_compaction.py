"""Retention on Redis: settled history trimmed from the front of the streams (XTRIM MINID),
the checkpoint in a key beside them first, readers of a trimmed position told so, a kill -9
at every step of `qw compact --log redis://…` losing nothing, and the report adding up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

from logstore import Log, PositionCompactedError
from logstore.redis.log import RedisLog
from queue_worker.compaction.files import STEPS, CompactionError
from queue_worker.compaction.redis_streams import compact_redis
from queue_worker.compaction.settled import Retention
from queue_worker.history.checkpoint import CheckpointRefused, Removed, chain_of, restore_checkpoint
from queue_worker.opening import open_worker
from queue_worker.producer import Queue
from queue_worker.proof.report import Report, ReportInputError, load_report
from queue_worker.protocol.records import Claim, Done, Fail, TaskRecord, encode
from queue_worker.protocol.state import ClaimSnapshot
from queue_worker.topics import ClaimsFollower, TaskIndex, open_topics
from queue_worker.worker.config import WorkerConfig
from tests.helpers import wait_until
from tests.test_compaction import _ours

QW = [sys.executable, "-m", "supervisor.cli.app"]
QW_RUN = [sys.executable, "-m", "tests.qw_run"]  # (tests/qw_run.py)
NOW_US = 1_700_000_000_000_000
LEASE = 30_000_000
EVERYTHING = Retention(seconds=0, bytes=0)
CHECKPOINT_KEY = "qw:fold.checkpoint"


def make_queue(url: str, done: int, pending: int = 20, held: int | None = None) -> None:
    """`done` tasks claimed and done in order (every tenth dead instead), then `pending`
    never claimed; `held`: one task (an id below `done`) claimed, never finished."""
    tasks_log, claims_log = open_topics(url)
    try:
        tasks_log.append_many(
            [
                encode(TaskRecord({"n": t, "pad": "x" * 40}, NOW_US + t))
                for t in range(done + pending)
            ]
        )
        for t in range(done):
            at = NOW_US + 1000 * t
            claim = claims_log.append(encode(Claim(t, "w0-1-aaaa", at, LEASE)))
            if t == held:
                continue
            if t % 10 == 3:  # dead at its first failure (a backoff is judged by the
                # server's clock on Redis: a retry appended at once would lose)
                claims_log.append(encode(Fail(t, "w0-1-aaaa", at + 1, claim, "boom", None)))
                continue
            claims_log.append(encode(Done(t, "w0-1-aaaa", at + 4, claim, {"r": t})))
    finally:
        tasks_log.close()
        claims_log.close()


def fold(url: str) -> tuple[ClaimSnapshot, int]:
    """The fold a starting worker reaches (the checkpoint, if there is one, and the rest; a
    full replay without one): the claims state, in a canonical order, and the tasks known."""
    tasks_log, claims_log = open_topics(url)
    try:
        try:  # (a checkpoint written before a kill, trims not made yet, loads as well)
            tasks, claims = restore_checkpoint(url, tasks_log, claims_log)
        except CheckpointRefused:
            assert tasks_log.start == 0 and claims_log.start == 0
            tasks, claims = TaskIndex(0), ClaimsFollower(0)
        tasks.catch_up(tasks_log)
        claims.catch_up(claims_log)
        snap = claims.state.snapshot()
        same = snap._replace(
            closed_above=tuple(sorted(snap.closed_above)),
            dead=tuple(sorted(snap.dead)),
            open=tuple(sorted(snap.open)),
        )
        return same, tasks.known
    finally:
        tasks_log.close()
        claims_log.close()


def starts(url: str) -> tuple[int, int]:
    tasks_log, claims_log = open_topics(url)
    with tasks_log, claims_log:
        return tasks_log.start, claims_log.start


def body(url: str) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    try:
        raw = client.get(CHECKPOINT_KEY)
    finally:
        client.close()
    assert isinstance(raw, bytes)
    inner: dict[str, Any] = msgpack.unpackb(msgpack.unpackb(raw)["body"])
    return inner


def payloads(log: Log) -> list[int]:
    return [msgpack.unpackb(e.data)[2]["n"] for e in log.iter_from(log.start)]


def qw(*args: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """`qw`; with `kill_at`, killed with SIGKILL when its compaction reaches that step."""
    command = QW if kill_at is None else [*QW_RUN, "--kill-compaction-at", kill_at, "--"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def queue(redis_url: str) -> Iterator[str]:
    make_queue(redis_url, done=300)
    yield redis_url


def test_settled_history_is_trimmed_and_the_fold_stays(queue: str) -> None:
    before = fold(queue)
    tasks_log, claims_log = open_topics(queue)
    with tasks_log, claims_log:
        digest = claims_log.checksum(0, claims_log.end())  # (every claims entry will go)
    done = compact_redis(queue, EVERYTHING)
    assert done.removed["claims"][0].crc == digest
    assert len(done.removed["claims"]) == 1 and len(done.removed["tasks"]) == 1
    assert fold(queue) == before  # the checkpoint and what is left: the same fold
    tasks_start, claims_start = starts(queue)
    assert claims_start == done.removed["claims"][0].end > 0
    assert tasks_start == done.removed["tasks"][0].end > 0
    tasks_log, claims_log = open_topics(queue)
    with tasks_log, claims_log:
        # every task done is gone from the tasks stream, every pending one stays
        assert payloads(tasks_log) == list(range(300, 320))
        assert list(claims_log.iter_from(claims_log.start)) == []  # all settled: all went
        # a reader of a trimmed position gets the typed error, never the records after it
        with pytest.raises(PositionCompactedError) as compacted:
            claims_log.read(0)
        assert compacted.value.start == claims_start
        with pytest.raises(PositionCompactedError):
            tasks_log.read(tasks_log.origin, 10)
        assert tasks_log.read(tasks_start, 1)  # from the start: the first pending task
    # the checkpoint lists the trims with their digest chain
    saved = body(queue)["claims"]["log"]
    removed = [Removed(*r) for r in saved["compacted"]]
    assert removed == done.removed["claims"] and saved["chain"] == chain_of(removed)
    again = compact_redis(queue, EVERYTHING)  # nothing more settled: nothing trimmed
    assert not any(again.removed.values())
    assert fold(queue) == before


def test_a_live_lease_keeps_its_claim_and_every_later_entry(redis_url: str) -> None:
    make_queue(redis_url, done=300, held=40)
    before = fold(redis_url)
    tasks_log, claims_log = open_topics(redis_url)
    with tasks_log, claims_log:
        held_at = next(
            e.position
            for e in claims_log.iter_from(0)
            if msgpack.unpackb(e.data)[2] == 40  # (its CLAIM, the first record naming it)
        )
    done = compact_redis(redis_url, EVERYTHING)
    assert starts(redis_url)[1] == held_at  # trimmed up to the held task's CLAIM, exactly
    assert done.removed["claims"][0].end == held_at
    tasks_log, _ = open_topics(redis_url)
    with tasks_log:
        assert payloads(tasks_log)[0] == 40  # the held task's record and every later one
    assert fold(redis_url) == before


def test_retention_by_time_and_by_size(queue: str) -> None:
    day = Retention(seconds=3600, bytes=1 << 30)
    nothing = compact_redis(queue, day)
    assert not any(nothing.removed.values()) and starts(queue) == (0, 0)
    # the entries' ids are the server's clock: two hours later they are old enough
    later = compact_redis(queue, day, now=time.time() + 7200)
    assert later.removed["claims"] and later.removed["tasks"]


def test_retention_by_size(queue: str) -> None:
    tasks_log, claims_log = open_topics(queue)
    with tasks_log, claims_log:
        assert isinstance(claims_log, RedisLog)
        client = claims_log._client
        used = client.memory_usage(claims_log.key)
        entries = client.xlen(claims_log.key)
    assert isinstance(used, int) and entries == 600
    # a budget of half the stream's estimated bytes: about half its entries go
    half = compact_redis(queue, Retention(seconds=3600, bytes=used // 2))
    assert half.removed["claims"]
    tasks_log, claims_log = open_topics(queue)
    with tasks_log, claims_log:
        left = sum(1 for _ in claims_log.iter_from(claims_log.start))
    assert 0 < left < entries


def test_without_the_checkpoint_a_trimmed_queue_is_refused_loudly(queue: str) -> None:
    compact_redis(queue, EVERYTHING)
    redis.Redis.from_url(queue).delete(CHECKPOINT_KEY)
    with pytest.raises(CompactionError) as refused:
        compact_redis(queue, EVERYTHING)
    assert "no usable checkpoint covers what was removed" in str(refused.value)
    result = qw("compact", "--log", queue, "--retention", "0")
    assert result.returncode == 1
    assert result.stderr.startswith("qw: error: ") and result.stderr.count("\n") == 1
    with pytest.raises(ReportInputError) as lost:
        load_report(queue)
    assert "cannot be accounted for (lost or tampered)" in str(lost.value)


def test_a_tampered_chain_is_refused(queue: str) -> None:
    compact_redis(queue, EVERYTHING)
    client = redis.Redis.from_url(queue)
    outer = msgpack.unpackb(client.get(CHECKPOINT_KEY))
    inner = msgpack.unpackb(outer["body"])
    inner["claims"]["log"]["compacted"][0][2] ^= 1  # the trimmed entries' digest changed
    packed = msgpack.packb(inner)
    outer.update(body=packed, crc32=zlib.crc32(packed))
    client.set(CHECKPOINT_KEY, msgpack.packb(outer))
    client.close()
    tasks_log, claims_log = open_topics(queue)
    with tasks_log, claims_log, pytest.raises(CheckpointRefused) as refused:
        restore_checkpoint(queue, tasks_log, claims_log)
    assert "digest chain" in str(refused.value) and "tampered" in str(refused.value)
    shown = qw("report", "--log", queue)
    assert shown.returncode == 2
    assert "cannot be accounted for (lost or tampered)" in shown.stderr


@pytest.mark.parametrize("step", STEPS)
def test_kill_9_at_every_step_of_qw_compact_loses_nothing(queue: str, step: str) -> None:
    before = fold(queue)
    args = ("compact", "--log", queue, "--retention", "0", "--retention-bytes", "0")
    killed = qw(*args, kill_at=step)
    assert killed.returncode == -9, killed.stderr
    assert fold(queue) == before  # the streams open, and fold to the same state
    finished = qw(*args)  # (the lock the killed one held is taken over: its pid is gone)
    assert finished.returncode == 0, finished.stderr
    # what the killed one had not trimmed yet, this one did (and says so)
    assert "tasks: trimmed" in finished.stdout, finished.stdout
    assert ("claims: trimmed" in finished.stdout) == (step != "dropped"), finished.stdout
    assert fold(queue) == before
    assert all(start > 0 for start in starts(queue))  # the interrupted trims got made


def totals(report: Report) -> dict[str, Any]:
    names = (
        "tasks_published",
        "tasks_done",
        "tasks_dead",
        "tasks_held",
        "attempts",
        "wins",
        "completions",
        "completions_accepted",
        "fails_accepted",
        "claims_records",
    )
    return {name: getattr(report, name) for name in names} | {"ok": report.ok}


def test_the_report_adds_up_across_the_trimmed_prefix(redis_url: str) -> None:
    make_queue(redis_url, done=300, held=250)
    before = load_report(redis_url)
    assert before.prefix is None and before.ok
    done = compact_redis(redis_url, EVERYTHING)
    after = load_report(redis_url)
    assert totals(after) == totals(before)
    prefix = after.prefix
    assert prefix is not None and prefix.position == done.removed["claims"][0].end
    shown = qw("report", "--log", redis_url)
    assert shown.returncode == 0, shown.stderr
    assert f"the claims records before position {prefix.position}" in shown.stdout
    # more work after the trim: the same proof, on the retained records
    tasks_log, claims_log = open_topics(redis_url)
    with tasks_log, claims_log:
        claim = claims_log.append(encode(Claim(310, "w1-2-bbbb", NOW_US, LEASE)))
        claims_log.append(encode(Done(310, "w1-2-bbbb", NOW_US + 5, claim, None)))
    again = load_report(redis_url)
    assert again.ok and again.tasks_done == before.tasks_done + 1


def test_qw_task_after_a_trim(redis_url: str) -> None:
    make_queue(redis_url, done=300, held=250)
    compact_redis(redis_url, EVERYTHING)

    def task(number: int) -> str:
        shown = qw("task", "--log", redis_url, str(number))
        assert shown.returncode == 0, shown.stderr
        return shown.stdout

    assert task(4).startswith("task 4: done (its records were removed by compaction")
    dead = task(3)
    assert dead.startswith("task 3: dead: boom") and "removed by compaction" in dead
    kept = task(299)
    assert kept.startswith("task 299: done (@") and '{"r": 299}' in kept
    assert task(250).startswith("task 250: held by")


def test_a_worker_behind_a_trim_restarts_from_the_checkpoint(
    redis_url: str, tmp_path: Path
) -> None:
    """A real worker that has read part of the queue when the streams are trimmed past its
    position: its next catch-up meets PositionCompactedError, it restarts from the
    checkpoint, and it works the rest — each task exactly once."""
    with Queue(redis_url) as queue:
        queue.enqueue_many(list(range(30)))
    config = WorkerConfig(redis_url, str(tmp_path / "run"), name="w0", exit_when_drained=True)
    with open_worker(config, handler=lambda payload: payload) as behind:
        behind.catch_up()  # it knows the 30 tasks, and no claim yet
        with open_worker(config, handler=lambda payload: payload) as other:
            for _ in range(20):
                other.step()  # 20 tasks done by another worker
        done = compact_redis(redis_url, EVERYTHING)
        assert done.removed["claims"] and done.removed["tasks"]
        with pytest.raises(PositionCompactedError):
            behind.claims_log.read(behind.claims.next_position)
        assert behind.run() == "queue drained"  # after a restart from the checkpoint
        assert behind.stats.finished == 10  # the 10 left, none of the 20 again
    report = load_report(redis_url)
    assert report.ok and report.tasks_done == 30 and report.completions == 30


def test_qw_why_after_a_trim(redis_url: str) -> None:
    make_queue(redis_url, done=300, held=250)
    compact_redis(redis_url, EVERYTHING)
    shown = qw("why", "--log", redis_url, "4")
    assert shown.returncode == 0, shown.stderr
    assert "removed by compaction" in shown.stdout, shown.stdout


def _writer(url: str, first: int, count: int) -> None:
    """Tasks published, claimed and done, one after another (each settled at once)."""
    tasks_log, claims_log = open_topics(url)
    with tasks_log, claims_log:
        for t in range(first, first + count):
            tasks_log.append(encode(TaskRecord({"n": t}, NOW_US + t)))
            claim = claims_log.append(encode(Claim(t, "w0-1-aaaa", NOW_US + t, LEASE)))
            claims_log.append(encode(Done(t, "w0-1-aaaa", NOW_US + t + 1, claim, None)))


def _reader(url: str, stop: Any, out: Any, back: bool) -> None:
    """Follow the claims stream from its start; on PositionCompactedError go on from the
    new start. Anything else is a failure, reported. `back`: now and then start again from
    the origin (a reader left behind by a trim)."""
    claims_log = RedisLog.open(url, "claims")
    position, seen, compacted = claims_log.start, 0, 0
    try:
        while True:
            # (every read in the try: a reader sent back to the origin just before the stop
            # meets the typed error there too, and goes on from the new start)
            try:
                entries = claims_log.read(position, 256)
            except PositionCompactedError as e:
                compacted += 1
                position = e.start
                continue
            if not entries and stop.is_set():
                break
            for entry in entries:
                assert entry.position >= position
                msgpack.unpackb(entry.data)
                position = entry.next
                seen += 1
            if back and seen % 7 == 0 and not stop.is_set():
                position = claims_log.origin
            if not entries:
                claims_log.wait(position, 0.05)
        out.put(("ok", seen, compacted, position))
    except Exception as e:  # the test fails on it, naming it
        out.put(("error", repr(e), compacted, position))
    finally:
        claims_log.close()


def test_readers_and_a_writer_during_trims_see_only_the_typed_error(redis_url: str) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    make_queue(redis_url, done=50, pending=0)
    stop, out = ctx.Event(), ctx.Queue()
    readers = [
        ctx.Process(target=_reader, args=(redis_url, stop, out, back)) for back in (False, True)
    ]
    writer = ctx.Process(target=_writer, args=(redis_url, 50, 1500))
    for proc in (*readers, writer):
        proc.start()
    trims = 0
    while writer.is_alive():
        trims += len(compact_redis(redis_url, EVERYTHING).removed["claims"])
    writer.join(60)
    assert writer.exitcode == 0
    trims += len(compact_redis(redis_url, EVERYTHING).removed["claims"])
    stop.set()
    results = [out.get(timeout=60) for _ in readers]
    for proc in readers:
        proc.join(60)
    assert trims > 3  # trims ran while they read and wrote
    assert all(kind == "ok" for kind, *_ in results), results
    assert sum(compacted for _, _, compacted, _ in results) > 0  # the typed error was met
    _, claims_log = open_topics(redis_url)
    with claims_log:
        end = claims_log.end()
    assert all(position == end for *_, position in results)  # each read to the end
    assert fold(redis_url)[0].done_count == 1550 - 5  # (every tenth of the first 50: dead)


SUPERVISOR = """
import sys
from pathlib import Path

from queue_worker.compaction.settled import Retention
from supervisor.run.supervisor import Supervisor, SupervisorOptions
from tests.qw_run import kill_compaction_at

if len(sys.argv) > 3:
    kill_compaction_at(sys.argv[3])
options = SupervisorOptions(
    data_dir=Path(sys.argv[1]),
    location=sys.argv[2],
    workers=2,
    work_ms=5,  # (a drain of a second or so: several compactions on the way)
    tasks=400,
    retention=Retention(seconds=0, bytes=0),
    compact_every_s=0.2,
    exit_when_drained={exit},
)
supervisor = Supervisor(options)
supervisor.start()
supervisor.wait(120)
print(supervisor.log_failure or "")
sys.exit(supervisor.exit_code)
"""


# make test trims on Redis through test_a_worker_behind_a_trim_restarts_from_the_checkpoint
@pytest.mark.slow
@pytest.mark.parametrize("verdicts", ["", "?verdicts=server"])
def test_qw_up_trims_as_it_runs(redis_url: str, tmp_path: Path, verdicts: str) -> None:
    """The supervisor's compactor trims a Redis queue while its workers drain it (folding
    the claims themselves, or claiming through the server's verdicts); the report still
    adds up to every task, each done once."""
    location = redis_url + verdicts
    ran = subprocess.run(
        [sys.executable, "-c", SUPERVISOR.format(exit=True), str(tmp_path / "run"), location],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr  # (its monitor never lost its way)
    assert starts(redis_url)[1] > 0  # trimmed while it ran
    report = load_report(location)
    assert report.ok and report.tasks_done == 400 and report.prefix is not None
    checked = qw("report", "--log", location)  # (with server verdicts: their cross-check too)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Everything settled goes (the claims stream is left empty); a next run appends to it as
    # to any stream, and the report's cross-check still agrees.
    compact_redis(redis_url, EVERYTHING)
    again = subprocess.run(
        [sys.executable, "-c", SUPERVISOR.format(exit=True), str(tmp_path / "run2"), location],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    checked = qw("report", "--log", location)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "(800 done)" in checked.stdout


@pytest.mark.parametrize("step", ["checkpointed", "dropped"])
def test_kill_9_of_the_supervisor_while_it_trims(redis_url: str, tmp_path: Path, step: str) -> None:
    """`qw up` trims in its supervisor; the supervisor killed in the middle of it (its
    workers die with it) leaves streams that fold as they did, and trim later."""
    tag = str(tmp_path)
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            SUPERVISOR.format(exit=False),
            str(tmp_path / "run"),
            redis_url,
            step,
        ],
        env={**os.environ, "QW_TEST_TAG": tag},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert killed.returncode == -9, killed.stderr
    wait_until(lambda: not _ours(tag), 60, "the workers to die with their supervisor")
    before = fold(redis_url)
    assert before[0].done_count > 0
    finished = qw("compact", "--log", redis_url, "--retention", "0", "--retention-bytes", "0")
    assert finished.returncode == 0, finished.stderr
    report = load_report(redis_url)
    assert report.ok and report.tasks_done == before[0].done_count


def test_ids_of_tasks_enqueued_after_a_trim_go_on(queue: str) -> None:
    """A task's id is its index in the topic: a producer opened after the trim, and one
    opened before it, both count on from the tasks the checkpoint says were removed."""
    with Queue(queue) as before_the_trim:  # it has counted nothing: it stands at 0
        compact_redis(queue, EVERYTHING)
        assert before_the_trim.enqueue("a") == 320  # (position 0 was trimmed: recounted)
        assert before_the_trim.enqueue("b") == 321
    with Queue(queue) as after_the_trim:
        assert after_the_trim.enqueue_many(["c", "d"]) == [322, 323]
    report = load_report(queue)
    assert report.tasks_published == 324


def test_every_read_path_refuses_a_trimmed_position(queue: str) -> None:
    """The read script, the append that reads in the same call, and XRANGE (where a server
    refuses scripts) all refuse to read on from before the start."""
    compact_redis(queue, EVERYTHING)
    claims_log = RedisLog.open(queue, "claims")
    with claims_log:
        record = encode(Claim(310, "w1-2-bbbb", NOW_US, LEASE))
        positions, entries = claims_log.append_and_read([record], 0, max_records=10)
        assert entries == []  # not the entries after the trimmed ones: nothing
        assert claims_log.read(claims_log.start)[0].position == positions[0]
        claims_log._script_reads = False  # as after a server refused EVALSHA
        with pytest.raises(PositionCompactedError):
            claims_log.read(0, 10)
        assert [e.position for e in claims_log.read(claims_log.start)] == positions


def test_qw_compact_on_an_empty_database_says_so(redis_url: str) -> None:
    result = qw("compact", "--log", redis_url)
    assert result.returncode == 2
    assert result.stderr == (
        f"qw: error: {redis_url}: no qw logs there (expected streams qw:tasks and qw:claims)\n"
    )


def test_the_lock_on_redis_keeps_a_second_saver_out_and_is_renewed(
    queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from queue_worker.history import redis_checkpoint
    from queue_worker.history.checkpoint import CheckpointError, checkpoint_lock, save_checkpoint

    monkeypatch.setattr(redis_checkpoint, "LOCK_TTL_MS", 600)  # renewed every 0.2 s
    client = redis.Redis.from_url(queue)
    tasks_log, claims_log = open_topics(queue)
    with tasks_log, claims_log, checkpoint_lock(queue):
        tasks, claims = TaskIndex(0), ClaimsFollower(0)
        with pytest.raises(CheckpointError) as skipped:
            save_checkpoint(queue, tasks, tasks_log, claims, claims_log)
        assert "a compaction under way" in str(skipped.value)
        assert f"pid {os.getpid()}" in str(skipped.value)
        lowest = [600]

        def renewed() -> bool:  # its time to live went down, then back up
            ttl = client.pttl("qw:fold.checkpoint:lock")
            lowest[0] = min(lowest[0], ttl)
            return ttl > lowest[0] + 100

        wait_until(renewed, 30, "the lock to be renewed")
    assert client.get("qw:fold.checkpoint:lock") is None  # released
    client.close()


def test_the_supervisors_monitor_behind_a_trim_goes_on_from_the_checkpoint(queue: str) -> None:
    """The supervisor's own fold (its monitor) reads a batch at a time; a trim past where it
    stands is not a failed log (which would stop the run): it restores the checkpoint."""
    from supervisor.run.monitor import Monitor

    monitor = Monitor(queue, batch=50, read_only=True)
    try:
        monitor.poll()  # 50 records of each stream: far behind
        compact_redis(queue, EVERYTHING)
        wait_until(lambda: not monitor.poll() and monitor.queue_view().done == 270, 60, "done")
        view = monitor.queue_view()
        assert (view.published, view.pending, view.dead) == (320, 20, 30)
    finally:
        monitor.close()


def test_a_stream_trimmed_to_its_end_compacts_again_after_new_entries(queue: str) -> None:
    """A stream's ids have gaps: once a compaction has trimmed every claims entry, the start
    it recorded is one past the last id removed, and the next entry appended has a later id.
    While that entry is live (nothing more to trim), a compaction still saves the checkpoint
    of what it folded, which begins at the first entry at or after that start (it looked
    for an entry exactly there and refused: "compaction skipped" at every round until the
    live task closed)."""
    compact_redis(queue, EVERYTHING)
    _, claims_start = starts(queue)
    tasks_log, claims_log = open_topics(queue)
    with tasks_log, claims_log:
        assert claims_log.end() == claims_start  # trimmed to its end
        claims_log.append(encode(Claim(309, "w0-1-aaaa", NOW_US + 309_000, LEASE)))  # held
        for t in range(300, 309):  # then the tasks before it claimed and done
            at = NOW_US + 1000 * t
            claim = claims_log.append(encode(Claim(t, "w0-1-aaaa", at, LEASE)))
            claims_log.append(encode(Done(t, "w0-1-aaaa", at + 4, claim, {"r": t})))
        assert claims_log.read(claims_start, 1)[0].position > claims_start  # the gap
    before = fold(queue)
    # The held claim keeps every claims entry after it; tasks 300-308 are settled, so the
    # tasks stream is trimmed, and the checkpoint that covers it is saved first.
    again = compact_redis(queue, EVERYTHING)
    assert not again.removed["claims"] and again.removed["tasks"]
    assert fold(queue) == before  # from the checkpoint this compaction saved
    assert body(queue)["claims"]["next_position"] == claims_log_end(queue)
    report = load_report(queue)  # 270 done of the first 300 (every tenth dead), 9 more
    assert report.ok and report.tasks_done == 279


def claims_log_end(url: str) -> int:
    tasks_log, claims_log = open_topics(url)
    with tasks_log, claims_log:
        return claims_log.end()
