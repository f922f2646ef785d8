"""The job API on a partitioned queue: the same program (`@queue.task`, `f.enqueue(...)`,
`result()`, `cancel`, `retry`, keys, `after=`, `@queue.periodic`) on a queue of 2
partitions, run by `qw up --app` — real files, real processes, a real kill -9."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from queue_worker import Queue, TaskFailed, TaskFunction
from queue_worker.partition_layout import partition_location, read_manifest
from queue_worker.partitions.jobs import PartitionedJobs
from queue_worker.partitions.queue import resolve_partitions
from queue_worker.proof.log_reading import read_claims, read_task
from queue_worker.protocol.records import Done, TaskRecord
from queue_worker.protocol.state import ClaimState, Verdict
from tests.helpers import log_end, wait_until
from tests.test_jobs import QW, qw

APP = """
import os
import time

from queue_worker import Queue

queue = Queue(os.environ["QW_TEST_QUEUE"])


@queue.task
def add(a, b):
    return a + b


@queue.task
def slow_double(n):
    time.sleep(1)
    return 2 * n


@queue.task(max_attempts=1)
def always_fails(x):
    raise ValueError(f"always fails: {x}")
"""

PERIODIC_APP = """
from queue_worker import Queue

queue = Queue(".qw")


@queue.periodic(every=0.2)
def tick():
    with open("ticks.txt", "a") as out:
        out.write("t\\n")
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "myjobs.py").write_text(APP)
    return tmp_path


def up_app(app_dir: Path, *args: str, url: str | None = None) -> Iterator[subprocess.Popen[str]]:
    """`qw up --app myjobs …` on app_dir/.qw (or `url`) while the test runs; drained after."""
    location = url or str(app_dir / ".qw")
    where = ["--log", location] if url else ["--dir", location]
    with (app_dir / "up.out").open("w") as out:
        proc = subprocess.Popen(
            [*QW, "up", "--no-tui", "--app", "myjobs", *where, "--backoff", "0.01", *args],
            cwd=app_dir, stdout=out, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "QW_TEST_QUEUE": location},
        )  # fmt: skip
    try:
        wait_until(lambda: read_manifest(location), 60, "qw up to create the partitions")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


Task = TaskFunction[Any, Any]


def producer(location: str) -> tuple[PartitionedJobs, Task, Task, Task]:
    """The program's own queue with the app's names (the names matter, not the module)."""
    queue = Queue(location)
    assert isinstance(queue, PartitionedJobs)  # what Queue() is on a partitioned queue

    @queue.task
    def add(a: int, b: int) -> int:
        raise AssertionError("runs in a worker")

    @queue.task
    def slow_double(n: int) -> int:
        raise AssertionError("runs in a worker")

    @queue.task
    def always_fails(x: int) -> None:
        raise AssertionError("runs in a worker")

    return queue, add, slow_double, always_fails


def report(location: str, cwd: Path) -> dict[str, object]:
    result = qw("report", "--json", "--dir", location, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    body: dict[str, object] = json.loads(result.stdout)
    return body


def test_an_app_s_calls_spread_over_two_partitions_and_every_result_comes_back(
    app_dir: Path,
) -> None:
    location = str(app_dir / ".qw")
    for _ in up_app(app_dir, "--partitions", "2", "--workers", "2"):  # a new queue: created
        queue, add, _, always_fails = producer(location)
        with queue:
            handles = [add.enqueue(n, 10 * n) for n in range(20)]
            assert [h.result(timeout=60) for h in handles] == [11 * n for n in range(20)]
            assert Counter(h.partition for h in handles) == {0: 10, 1: 10}
            assert all(re.fullmatch(rf"{h.partition}:\d+", h.id) for h in handles)
            assert queue.handle(handles[3].id).result(timeout=1) == 33
            # a key: one task, in the partition of its hash, however often it is enqueued
            keyed = add.enqueue(1, 2, key="once")
            again = add.enqueue(5, 5, key="once")
            assert again.id == keyed.id and again.result(timeout=60) == 3
            # a dependent goes to its dependency's partition, and waits for it
            after = add.enqueue(2, 2, after=[handles[5]])
            assert after.partition == handles[5].partition and after.result(timeout=60) == 4
            # cancel of a pending task: never runs, and its result says so under its name
            later = add.enqueue(7, 7, delay=600)
            queue.cancel(later.id)
            with pytest.raises(TaskFailed, match=f"^task {later.id} is dead: cancelled by"):
                later.result(timeout=60)
            assert later.state() == "cancelled"
            # retry of a dead task: a new task in its partition
            dead = always_fails.enqueue(3)
            with pytest.raises(TaskFailed, match="always fails: 3") as failed:
                dead.result(timeout=60)
            assert failed.value.task_id == dead.id
            retried = queue.retry(dead.id)
            assert retried.partition == dead.partition and retried.id != dead.id
            with pytest.raises(TaskFailed, match="always fails: 3"):
                retried.result(timeout=60)
    body = report(location, app_dir)
    assert body["ok"] and body["tasks_published"] == 20 + 1 + 1 + 1 + 2  # the key's once
    partition, task = map(int, keyed.id.split(":"))
    record = read_task(partition_location(location, partition, 2), task)
    assert isinstance(record, TaskRecord) and record.key == "once"


def test_refused_task_names_and_dependencies_write_nothing(tmp_path: Path) -> None:
    location = str(tmp_path / ".qw")
    resolve_partitions(location, 2)
    queue, add, *_ = producer(location)
    with queue:
        first = [add.enqueue(n, n) for n in range(2)]
        assert {h.partition for h in first} == {0, 1}
        logs = sorted(Path(location).glob("p*/*.log"))
        ends = [log_end(p) for p in logs]
        for call, says in (
            (lambda: queue.cancel("5:0"), "partition 5 does not exist: the queue has 2 (0–1)"),
            (lambda: queue.cancel(0), "task 0; expected a task of this partitioned queue"),
            (lambda: queue.cancel("0:9"), "task 0:9 is not in the tasks log"),
            (lambda: add.enqueue(1, 1, after=first),
             "after= names tasks of partitions 0, 1; expected tasks of one partition"),
            (lambda: add.enqueue(1, 1, after=["1:7"]),
             "after= names task 1:7, which is not in the tasks log"),
        ):  # fmt: skip
            with pytest.raises(ValueError) as refused:
                call()
            assert says in str(refused.value) and "\n" not in str(refused.value)
        other = next(k for k in range(100) if queue.partitions.partition_for(f"k{k}") == 1)
        with pytest.raises(ValueError, match=f"key 'k{other}' belongs to partition 1, but"):
            add.enqueue(1, 1, key=f"k{other}", after=["0:0"])
        bad = qw("cancel", "5:0", "--dir", location, cwd=tmp_path)
        assert bad.returncode == 2
        assert bad.stderr.splitlines() == [
            "qw: error: partition 5 does not exist: the queue has 2 (0–1)"
        ]
        assert [log_end(p) for p in logs] == ends  # nothing written anywhere
        done = qw("cancel", first[1].id, "--dir", location, cwd=tmp_path)
        assert done.stdout.strip() == f"task {first[1].id} cancelled", done.stderr
        assert first[1].state() == "cancelled"


def test_qw_up_refuses_an_app_it_cannot_find_before_it_creates_the_partitions(
    app_dir: Path,
) -> None:
    for args, says in (
        (["--app", "nosuch"], "got 'nosuch'; expected a module importable from the current"),
        (["--app", "myjobs", "--workers", "1"], "--workers 1: 1 workers for 2 partitions"),
    ):
        refused = qw("up", "--no-tui", "--partitions", "2", *args, cwd=app_dir)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
        assert len(refused.stderr.splitlines()) == 1
        assert not (app_dir / ".qw").exists()


def _held(location: str) -> tuple[int, int] | None:
    """A task held now in the partition at `location`, and its holder's pid."""
    state = ClaimState()
    for position, record in read_claims(location):
        state.apply(record, position)
    for task, lease in state.held_tasks():
        return task, int(lease.worker.split("-")[-2])
    return None


@pytest.mark.slow  # (takeover on a partition: test_partitions; results: the test above)
def test_a_killed_member_worker_s_task_is_taken_over_and_its_result_arrives(
    app_dir: Path,
) -> None:
    location = str(app_dir / ".qw")
    resolve_partitions(location, 2)
    queue, _, slow_double, _ = producer(location)
    with queue:
        handles = [slow_double.enqueue(n) for n in range(8)]
        for _ in up_app(app_dir, "--workers", "4", "--lease", "2", "--no-restart"):
            held = wait_until(
                lambda: _held(partition_location(location, 1, 2)), 60,
                "a worker of partition 1 to hold a task",
            )  # fmt: skip
            assert isinstance(held, tuple)
            task, pid = held
            os.kill(pid, signal.SIGKILL)
            name = f"1:{task}"
            n = next(i for i, h in enumerate(handles) if h.id == name)
            assert queue.handle(name).result(timeout=60) == 2 * n
            assert [h.result(timeout=60) for h in handles] == [2 * n for n in range(8)]
    assert not psutil.pid_exists(pid)
    part = report(location, app_dir)["per_partition"]
    assert isinstance(part, list)
    takeover = next(t for t in part[1]["takeovers"] if t["task"] == task)
    assert f"-{pid}-" in takeover["victim"] and f"-{pid}-" not in takeover["new_holder"]


def test_an_app_s_periodic_ticks_run_once_each_over_the_partitions(tmp_path: Path) -> None:
    (tmp_path / "pjobs.py").write_text(PERIODIC_APP)
    location = tmp_path / ".qw"
    ticks = tmp_path / "ticks.txt"
    up = subprocess.Popen(
        [*QW, "up", "--no-tui", "--app", "pjobs", "--partitions", "2", "--workers", "2"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_until(lambda: ticks.exists() and len(ticks.read_text().splitlines()) >= 6, 60,
                   "six ticks run")  # fmt: skip
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
    ran: list[tuple[int, str]] = []
    for k in range(2):
        where = partition_location(location, k, 2)
        state = ClaimState()
        for position, record in read_claims(where):
            verdict = state.apply(record, position).verdict
            if isinstance(record, Done) and verdict is Verdict.DONE:
                task = read_task(where, record.task)
                assert isinstance(task, TaskRecord) and task.key is not None
                ran.append((k, task.key))
    assert len(ran) == len({key for _, key in ran})  # no tick ran twice
    assert len(ran) == len(ticks.read_text().splitlines())
    assert {k for k, _ in ran} == {0, 1}  # the ticks' keys hash over both partitions


@pytest.mark.redis
def test_an_app_on_a_partitioned_redis_queue_gets_its_results(
    app_dir: Path, redis_url: str
) -> None:
    for _ in up_app(app_dir, "--partitions", "2", "--workers", "2", url=redis_url):
        queue, add, *_ = producer(redis_url)
        with queue:
            handles = [add.enqueue(n, 1, priority=n % 3) for n in range(8)]
            assert [h.result(timeout=60) for h in handles] == [n + 1 for n in range(8)]
            assert {h.partition for h in handles} == {0, 1}
            keyed = add.enqueue(1, 2, key="once")  # (the key's first task, found by the server)
            assert add.enqueue(5, 5, key="once").id == keyed.id and keyed.result(timeout=60) == 3
            later = add.enqueue(7, 7, delay=600)
            queue.cancel(later.id)
            with pytest.raises(TaskFailed, match=f"^task {later.id} is dead: cancelled by"):
                later.result(timeout=60)
    result = qw("report", "--log", redis_url, cwd=app_dir)
    assert result.returncode == 0, result.stdout + result.stderr
