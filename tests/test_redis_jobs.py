"""Delays, priorities, keys, cancel, retry and periodic tasks on a Redis queue with server
verdicts (the default): the server's pick honours them (queue_worker/redis/lua/next_task.lua),
a producer's key is checked in the script that appends (queue_worker.redis.task_options),
and a CANCEL is folded by the server's rules. Real redis-server, real `qw up` processes;
`qw report` re-folds the claims stream and checks the server's every verdict."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from queue_worker import Queue, TaskFailed
from queue_worker.protocol.records import Claim, Done, TaskRecord, decode_task
from queue_worker.worker.handlers import TaskContext
from tests.helpers import wait_until
from tests.test_jobs import QW, app_dir, is_held, late_not_before, producer, qw, run_app

__all__ = ["app_dir"]  # (a fixture: used by name)

pytestmark = pytest.mark.redis


def up_env(location: str) -> dict[str, str]:
    return {**os.environ, "QW_TEST_QUEUE": location}


def tasks_of(location: str) -> list[TaskRecord]:
    from queue_worker.topics import TASKS_TOPIC, open_topic

    with open_topic(location, TASKS_TOPIC, read_only=True) as log:
        records = [decode_task(entry.data) for entry in log.iter_from(log.start)]
    assert all(isinstance(r, TaskRecord) for r in records)
    return records  # type: ignore[return-value]


def report_passes(location: str, cwd: Path) -> None:
    report = qw("report", "--log", location, cwd=cwd)
    assert report.returncode == 0, report.stdout + report.stderr


@pytest.mark.parametrize("mode", ["", "?verdicts=client"], ids=["server", "client"])
def test_the_server_picks_by_priority_and_never_before_a_delay_s_end(
    app_dir: Path, redis_url: str, mode: str
) -> None:
    """With server verdicts the server's pick; with client verdicts each worker's own (the
    file log's pick rules, reading the options from the records)."""
    from queue_worker.proof.log_reading import read_claims

    redis_url += mode
    queue, add, *_ = producer(redis_url)
    with queue:
        late = add.enqueue(100, 0, delay=1.0)
        assert late.state() == "scheduled"
        plain = [add.enqueue(n, 0).id for n in range(3)]
        urgent = add.enqueue(50, 0, priority=5).id
        more_urgent = add.enqueue(60, 0, priority=9).id
        last = add.enqueue(-1, 0, priority=-1).id
        up = qw("up", "--no-tui", "--app", "myjobs", "--workers", "1", "--exit-when-drained",
                "--log", redis_url, cwd=app_dir, env=up_env(redis_url))  # fmt: skip
        assert up.returncode == 0, up.stdout + up.stderr
        assert late.result(timeout=10) == 100
        assert queue.handle(more_urgent).result(timeout=10) == 60
    records = [r for _, r in read_claims(redis_url)]
    done_order = [r.task for r in records if isinstance(r, Done) and r.task != late.id]
    # one worker: the highest priority first, the lowest (below 0) last, the rest in order
    assert done_order == [more_urgent, urgent, *plain, last]
    # the delayed task: no claim of it before its time, on the stream's (server's) clock
    not_before = late_not_before(redis_url, late.id)
    claims = [r for r in records if isinstance(r, Claim) and r.task == late.id]
    assert claims and all(c.at >= not_before for c in claims)
    report_passes(redis_url, app_dir)


RACER = """
import json, sys
from queue_worker import Queue

queue = Queue(sys.argv[1])

@queue.task
def note(path):
    raise AssertionError("runs in a worker")

sys.stdin.readline()  # every racer started: go
ids = [note.enqueue(sys.argv[2], key=f"k{n}").id for n in range(20)]
print(json.dumps(ids))
"""


def test_producers_racing_with_one_key_make_one_task(app_dir: Path, redis_url: str) -> None:
    (app_dir / "racer.py").write_text(RACER)
    ran = app_dir / "ran.txt"
    racers = [
        subprocess.Popen(
            [sys.executable, "racer.py", redis_url, str(ran)],
            cwd=app_dir,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for racer in racers:  # (each reads its line once it has imported and opened the queue)
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    answers = []
    for racer in racers:
        out, _ = racer.communicate(timeout=120)
        assert racer.returncode == 0
        answers.append(json.loads(out))
    assert all(answer == answers[0] for answer in answers)  # one task per key, for all
    records = tasks_of(redis_url)
    assert sorted(r.key for r in records if r.key) == sorted(f"k{n}" for n in range(20))
    assert {records[task].key for task in answers[0]} == {f"k{n}" for n in range(20)}
    assert [records[task].key for task in answers[0]] == [f"k{n}" for n in range(20)]
    up = qw("up", "--no-tui", "--app", "myjobs", "--workers", "2", "--exit-when-drained",
            "--log", redis_url, cwd=app_dir, env=up_env(redis_url))  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    assert len(ran.read_text().splitlines()) == 20  # each key's task ran once
    with Queue(redis_url) as queue:  # a producer that retries: the first's handle, no append

        @queue.task
        def note(path: str) -> int:
            raise AssertionError("runs in a worker")

        again = note.enqueue(str(ran), key="k3")
        assert again.id == answers[0][3]
        assert again.result(timeout=10) in range(1, 21)
    assert len(tasks_of(redis_url)) == 20
    report_passes(redis_url, app_dir)


def test_cancel_on_redis_of_a_pending_and_a_held_task(app_dir: Path, redis_url: str) -> None:
    queue = Queue(redis_url)

    @queue.task
    def waits(path: str, *, ctx: TaskContext) -> None:
        raise AssertionError("runs in a worker")

    @queue.task
    def add(a: int, b: int) -> int:
        raise AssertionError("runs in a worker")

    stopped = app_dir / "stopped"
    with queue:
        pending = add.enqueue(1, 2)  # no worker yet: pending, never to run
        queue.cancel(pending.id)
        assert pending.state() == "cancelled"
        with pytest.raises(TaskFailed, match=r"task 0 is dead: cancelled by qw-cancel@"):
            pending.result(timeout=10)
        with pytest.raises(ValueError, match="task 0 is cancelled; expected a pending or held"):
            queue.cancel(pending.id)
        for _ in run_app(app_dir, redis_url):
            held = waits.enqueue(str(stopped))
            wait_until(partial(is_held, held), 60, "the task held")
            done = qw("cancel", str(held.id), "--log", redis_url, cwd=app_dir)
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == f"task {held.id} cancelled"
            with pytest.raises(TaskFailed, match="cancelled by"):
                held.result(timeout=60)
            wait_until(stopped.exists, 60, "the handler to see ctx.cancelled")
            assert add.enqueue(2, 3).result(timeout=60) == 5  # the workers go on
    from queue_worker.proof.log_reading import read_claims

    claimed = {r.task for _, r in read_claims(redis_url) if isinstance(r, Claim)}
    assert pending.id not in claimed  # the pending one never ran
    shown = qw("task", "0", "--log", redis_url, cwd=app_dir).stdout
    assert "cancelled: cancelled by qw-cancel@" in shown
    report_passes(redis_url, app_dir)


def test_qw_retry_on_redis(app_dir: Path, redis_url: str) -> None:
    queue, _, always_fails, *_ = producer(redis_url)
    with queue:
        failing = always_fails.enqueue(7)
        urgent = queue.enqueue_call("always_fails", [8], priority=3)
    up = ("up", "--no-tui", "--app", "myjobs", "--workers", "1", "--exit-when-drained",
          "--backoff", "0.01", "--log", redis_url)  # fmt: skip
    assert qw(*up, cwd=app_dir, env=up_env(redis_url)).returncode == 0
    retried = qw("retry", "--dead", "--log", redis_url, cwd=app_dir)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.splitlines() == [
        f"task {failing.id} retried as task 2",
        f"task {urgent.id} retried as task 3",
    ]
    records = tasks_of(redis_url)
    assert (records[3].function, records[3].args, records[3].priority) == ("always_fails", [8], 3)
    assert (records[2].retry_of, records[3].retry_of) == (failing.id, urgent.id)
    assert qw(*up, cwd=app_dir, env=up_env(redis_url)).returncode == 0  # the retries ran
    with Queue(redis_url) as queue:
        assert queue.state(2) == queue.state(3) == "dead"
    report_passes(redis_url, app_dir)


PERIODIC_APP = """
import os

from queue_worker import Queue

queue = Queue(os.environ["QW_TEST_QUEUE"])


@queue.periodic(every=0.2)
def tick():
    with open("ticks.txt", "a") as out:
        out.write("t\\n")
"""


def test_two_supervisors_on_one_redis_queue_enqueue_each_tick_once(
    tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "pjobs.py").write_text(PERIODIC_APP)
    ticks = tmp_path / "ticks.txt"
    ups = [
        subprocess.Popen(
            [*QW, "up", "--no-tui", "--app", "pjobs", "--workers", "1", "--log", redis_url],
            cwd=tmp_path,
            env=up_env(redis_url),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    try:
        wait_until(lambda: ticks.exists() and len(ticks.read_text().splitlines()) >= 5, 60,
                   "five ticks run")  # fmt: skip
    finally:
        for up in ups:
            up.send_signal(signal.SIGINT)
        for up in ups:
            up.wait(60)
    records = tasks_of(redis_url)
    keys = [r.key for r in records]
    assert all(k is not None and k.startswith("periodic:tick:") for k in keys)
    assert len(keys) == len(set(keys))  # each tick enqueued once, by one of the two
    from queue_worker.proof.log_reading import read_claims

    done = [r.task for _, r in read_claims(redis_url) if isinstance(r, Done)]
    assert len(done) == len(set(done)) == len(ticks.read_text().splitlines())
    report_passes(redis_url, tmp_path)
