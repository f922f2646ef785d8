"""Tasks by name, results that wait, tracebacks, inline mode and async tasks: unit tests of
the registry and the encoding, and real `qw up --app` runs on files and on Redis."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from queue_worker import Queue, RecordEncodeError, TaskFailed
from queue_worker.protocol.records import TaskRecord
from queue_worker.worker.handlers import NamedHandlers, TaskContext, run_task
from tests.helpers import running_redis_server

QW = [sys.executable, "-m", "supervisor.cli.app"]

APP = """
import asyncio
import os
import time

from queue_worker import Queue

queue = Queue(os.environ["QW_TEST_QUEUE"])


@queue.task
def add(a, b):
    return a + b


@queue.task(max_attempts=2)
def always_fails(x):
    raise ValueError(f"always fails: {x}")


@queue.task(max_attempts=1, timeout=0.5)
def sleeps(seconds):
    time.sleep(seconds)


@queue.task
def note(path):
    with open(path, "a") as out:
        out.write("ran\\n")
    with open(path) as done:
        return len(done.readlines())


@queue.task
def waits(path, *, ctx):
    try:
        ctx.sleep(600)
    except Exception:
        open(path, "w").close()  # it saw the cancellation
        raise


@queue.task(name="aadd")
async def add_later(a, b, *, pause=0.0):
    await asyncio.sleep(pause)
    return a + b
"""


def qw(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env, check=False
    )


def producer(location: str) -> tuple[Queue, Any, Any, Any, Any, Any]:
    """A producer's own queue with the app's names (the names matter, not the module)."""
    queue = Queue(location)

    @queue.task
    def add(a: int, b: int) -> int:
        raise AssertionError("runs in a worker")

    @queue.task
    def always_fails(x: int) -> None:
        raise AssertionError("runs in a worker")

    @queue.task
    def aadd(a: int, b: int, *, pause: float = 0.0) -> int:
        raise AssertionError("runs in a worker")

    @queue.task
    def mystery() -> None:
        raise AssertionError("no worker has it")

    @queue.task
    def sleeps(seconds: float) -> None:
        raise AssertionError("runs in a worker")

    return queue, add, always_fails, aadd, mystery, sleeps


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "myjobs.py").write_text(APP)
    return tmp_path


def run_app(app_dir: Path, location: str) -> Iterator[subprocess.Popen[str]]:
    import os

    env = {**os.environ, "QW_TEST_QUEUE": location}
    with (app_dir / "up.out").open("w") as out:
        proc = subprocess.Popen(
            [*QW, "up", "--no-tui", "--app", "myjobs", "--workers", "2", "--backoff", "0.01",
             "--dir", str(app_dir / ".qw")] if not location.startswith("redis")
            else [*QW, "up", "--no-tui", "--app", "myjobs", "--workers", "2", "--backoff",
                  "0.01", "--log", location],
            cwd=app_dir, stdout=out, stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def check_app_run(app_dir: Path, location: str) -> None:
    queue, add, always_fails, aadd, mystery, sleeps = producer(location)
    with queue:
        for _ in run_app(app_dir, location):
            handle = add.enqueue(1, 2)
            assert handle.result(timeout=60) == 3
            assert handle.state() == "done"
            assert aadd.enqueue(2, 3, pause=0.01).result(timeout=60) == 5
            failing = always_fails.enqueue(7)
            with pytest.raises(TaskFailed) as failed:
                failing.result(timeout=60)
            assert failed.value.error == "ValueError: always fails: 7"
            assert failed.value.traceback is not None
            assert 'raise ValueError(f"always fails: {x}")' in failed.value.traceback
            assert failing.state() == "dead"
            with pytest.raises(TaskFailed, match="names function 'mystery', which this worker"):
                mystery.enqueue().result(timeout=60)
            # its own timeout and max_attempts: one attempt, ended by the watchdog
            with pytest.raises(TaskFailed, match=r"is dead: timed out after 0\.5 s$"):
                sleeps.enqueue(600).result(timeout=60)
            payload_task = queue.handle(queue.enqueue({"x": 1}))
            with pytest.raises(TaskFailed, match="is a payload task"):
                payload_task.result(timeout=60)


def test_qw_up_app_runs_the_tasks_by_name_and_results_wait(app_dir: Path) -> None:
    check_app_run(app_dir, str(app_dir / ".qw"))
    shown = qw("task", "2", "--dir", ".qw", cwd=app_dir)  # the dead one: its traceback
    assert shown.returncode == 0, shown.stderr
    assert "Traceback (most recent call last):" in shown.stdout
    assert "call always_fails(7)" in shown.stdout  # the task names its call
    why = qw("why", "2", "--dir", ".qw", cwd=app_dir)
    assert why.returncode == 0, why.stderr
    assert "the last failure's traceback:" in why.stdout


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_qw_up_app_on_redis(app_dir: Path, tmp_path: Path) -> None:
    binary = shutil.which("redis-server")
    assert binary is not None
    with running_redis_server(binary, tmp_path) as url:
        check_app_run(app_dir, f"{url}/0")


def test_result_times_out_while_no_worker_runs(tmp_path: Path) -> None:
    queue, add, *_ = producer(str(tmp_path / ".qw"))
    with queue:
        handle = add.enqueue(1, 2)
        assert handle.state() == "pending"
        with pytest.raises(TimeoutError, match=r"task 0 is still pending after 0\.2 s"):
            handle.result(timeout=0.2)


def test_qw_up_app_refuses_a_module_it_cannot_import(tmp_path: Path) -> None:
    done = qw("up", "--no-tui", "--app", "nosuchmodule", cwd=tmp_path)
    assert done.returncode == 2
    assert "importable from the current directory" in done.stderr
    assert not (tmp_path / ".qw").exists()
    (tmp_path / "empty.py").write_text("x = 1\n")
    done = qw("up", "--no-tui", "--app", "empty", cwd=tmp_path)
    assert done.returncode == 2
    assert "a module with one Queue (found none)" in done.stderr


# -- the registry and the encoding -------------------------------------------------------------


def test_a_name_is_registered_once(tmp_path: Path) -> None:
    queue = Queue(tmp_path / ".qw", immediate=True)

    @queue.task
    def add(a: int, b: int) -> int:
        return a + b

    assert add(1, 2) == 3  # called, it runs here
    assert list(queue.registered) == ["add"]
    with pytest.raises(ValueError, match="task name 'add' is registered already"):
        queue.task(name="add")(lambda: None)
    with pytest.raises(ValueError, match="max_attempts is 0; expected an integer >= 1"):
        queue.task(max_attempts=0)(lambda: None)


def test_arguments_msgpack_cannot_encode_are_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    queue, add, *_ = producer(str(tmp_path / ".qw"))
    with queue:
        end = queue.log.end()
        with pytest.raises(RecordEncodeError, match=r"call add\(1, b=\{1, 2\}\) cannot be"):
            add.enqueue(1, b={1, 2})
        assert queue.log.end() == end


def test_a_task_names_its_function_and_carries_its_arguments(tmp_path: Path) -> None:
    from queue_worker.protocol.records import decode_task

    queue, add, *_ = producer(str(tmp_path / ".qw"))
    with queue:
        add.enqueue(1, b=2)
        record = decode_task(queue.log.read(queue.log.start, 1)[0].data)
    assert isinstance(record, TaskRecord)
    assert record == TaskRecord(None, record.enqueued_at, "add", [1], {"b": 2})


def ctx(attempt: int = 1) -> TaskContext:
    return TaskContext(task_id=4, attempt=attempt, cancelled=threading.Event(), worker_id="w")


def test_run_task_passes_ctx_and_honours_the_task_s_max_attempts(tmp_path: Path) -> None:
    queue = Queue(tmp_path / ".qw", immediate=True)

    @queue.task(max_attempts=2)
    def which(n: int, *, ctx: TaskContext) -> int:
        if n < 0:
            raise ValueError("negative")
        return ctx.attempt * n

    handlers = NamedHandlers("app", queue.handlers("app"))
    call = TaskRecord(None, 0, "which", [5], {})
    assert run_task(handlers, call, ctx(attempt=2)).result == 10
    first = run_task(handlers, call._replace(args=[-1]), ctx(attempt=1))
    assert first.error == "ValueError: negative" and not first.permanent
    assert handlers.in_hand_max_attempts == 2
    assert run_task(handlers, call._replace(args=[-1]), ctx(attempt=2)).permanent
    used_up = run_task(handlers, call, ctx(attempt=3))  # two workers died running it
    assert used_up.permanent and used_up.error == "attempts used up: run 2 times (max_attempts 2)"


# -- inline mode -----------------------------------------------------------------------------


def test_immediate_mode_runs_at_enqueue_and_writes_nothing(tmp_path: Path) -> None:
    queue = Queue(tmp_path / ".qw", immediate=True)

    @queue.task
    def add(a: int, b: int) -> int:
        return a + b

    @queue.task
    def broken() -> None:
        raise KeyError("gone")

    @queue.task
    def unrecordable() -> object:
        return object()

    @queue.task
    async def aadd(a: int, b: int) -> int:
        return a + b

    handle = add.enqueue(1, 2)
    assert (handle.id, handle.state(), handle.result(timeout=1)) == (0, "done", 3)
    assert aadd.enqueue(2, 3).result() == 5
    failed = broken.enqueue()
    assert failed.state() == "dead"
    with pytest.raises(TaskFailed, match="task 2 is dead: KeyError: 'gone'") as info:
        failed.result()
    assert info.value.traceback is not None and 'raise KeyError("gone")' in info.value.traceback
    with pytest.raises(TaskFailed, match="result cannot be recorded: cannot encode as msgpack"):
        unrecordable.enqueue().result()
    with pytest.raises(RecordEncodeError, match="call add"):
        add.enqueue(object(), 1)
    assert not (tmp_path / ".qw").exists()


def test_an_async_task_is_cancelled_when_the_lease_is_lost() -> None:
    import asyncio

    from queue_worker.worker.async_tasks import run_coroutine
    from queue_worker.worker.handlers import TaskCancelled

    seen: list[str] = []

    async def waits_for_ever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    lost = ctx()
    lost.cancelled.set()  # the lease keeper's doing, from its thread
    with pytest.raises(TaskCancelled, match="task 4: the lease was lost"):
        run_coroutine(waits_for_ever(), lost)
    assert seen == ["cancelled"]


def test_a_result_removed_by_compaction_is_said_to_be(app_dir: Path) -> None:
    import os

    from queue_worker import ResultRemovedError

    location = str(app_dir / ".qw")
    queue, add, *_ = producer(location)
    with queue:
        handles = [add.enqueue(n, 1) for n in range(300)]
    env = {**os.environ, "QW_TEST_QUEUE": location}
    up = qw("up", "--no-tui", "--app", "myjobs", "--workers", "2", "--exit-when-drained",
            "--segment-bytes", "4096", cwd=app_dir, env=env)  # fmt: skip
    assert up.returncode == 0, up.stderr
    compact = qw("compact", "--retention", "0", cwd=app_dir)
    assert compact.returncode == 0, compact.stderr
    assert "segments removed" in compact.stdout
    with Queue(location) as later:  # a reader that comes after the compaction
        for n, handle in enumerate(handles):  # each result is there, or said to be removed
            try:
                assert later.handle(handle.id).result(timeout=10) == n + 1
            except ResultRemovedError as e:
                assert str(e).startswith(f"task {handle.id} is done, but its result was")
        first = later.handle(handles[0].id)  # (its DONE is in the first segment: removed)
        assert first.state() == "done"
        with pytest.raises(ResultRemovedError, match="task 0 is done, but its result was"):
            first.result(timeout=10)


# -- delays and priorities -------------------------------------------------------------------


def test_priorities_and_delays_choose_what_a_worker_tries(app_dir: Path) -> None:
    import os

    from queue_worker.proof.log_reading import read_claims
    from queue_worker.protocol.records import Claim, Done

    location = str(app_dir / ".qw")
    queue, add, *_ = producer(location)
    with queue:
        late = add.enqueue(100, 0, delay=1.0)
        assert late.state() == "scheduled"
        plain = [add.enqueue(n, 0).id for n in range(3)]
        urgent = add.enqueue(50, 0, priority=5).id
        last = add.enqueue(-1, 0, priority=-1).id
        env = {**os.environ, "QW_TEST_QUEUE": location}
        up = qw("up", "--no-tui", "--app", "myjobs", "--workers", "1", "--exit-when-drained",
                cwd=app_dir, env=env)  # fmt: skip
        assert up.returncode == 0, up.stderr
        assert late.result(timeout=10) == 100
    records = [r for _, r in read_claims(location)]
    done_order = [r.task for r in records if isinstance(r, Done) and r.task != late.id]
    # one worker: the higher priority first, the lower last; the delayed one once due (no
    # claim of it before its time, whenever the worker came to it)
    assert done_order == [urgent, *plain, last]
    not_before = late_not_before(location, late.id)
    claims = [r for r in records if isinstance(r, Claim) and r.task == late.id]
    assert claims and all(c.at >= not_before for c in claims)


def late_not_before(location: str, task: int) -> int:
    from queue_worker.proof.log_reading import read_task

    record = read_task(location, task)
    assert isinstance(record, TaskRecord) and record.not_before > 0
    return record.not_before


def test_bad_delays_and_priorities_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    from datetime import datetime

    queue, add, *_ = producer(str(tmp_path / ".qw"))
    with queue:
        end = queue.log.end()
        with pytest.raises(ValueError, match=r"delay is -1; expected a number of seconds >= 0"):
            add.enqueue(1, 2, delay=-1)
        with pytest.raises(ValueError, match="expected an aware datetime"):
            add.enqueue(1, 2, eta=datetime(2030, 1, 1))
        with pytest.raises(ValueError, match="priority is 'high'; expected an integer"):
            add.enqueue(1, 2, priority="high")
        with pytest.raises(ValueError, match=r"after= names task 7, which is not in the tasks"):
            add.enqueue(1, 2, after=[7])
        with pytest.raises(ValueError, match=r"after= holds 'x'; expected a handle"):
            add.enqueue(1, 2, after=["x"])
        with pytest.raises(ValueError, match="key is 5; expected a string"):
            add.enqueue(1, 2, key=5)
        assert queue.log.end() == end


def test_the_first_task_of_a_key_is_the_task_and_later_ones_resolve_to_it(app_dir: Path) -> None:
    import os

    from queue_worker.protocol.records import encode

    location = str(app_dir / ".qw")
    ran = app_dir / "ran.txt"
    queue = Queue(location)

    @queue.task
    def note(path: str) -> int:
        raise AssertionError("runs in a worker")

    with queue:
        first = note.enqueue(str(ran), key="tick-1")
        again = note.enqueue(str(ran), key="tick-1")  # a producer that retries
        assert again.id == first.id
        # another producer raced us: its record of the same key lands after ours
        raced = queue.enqueue_call("note", [str(ran)], key="tick-2")
        late = TaskRecord(None, 0, "note", [str(ran)], {}, key="tick-2")
        queue.log.append(encode(late), durable=True)
        later_id = raced.id + 1
        env = {**os.environ, "QW_TEST_QUEUE": location}
        up = qw("up", "--no-tui", "--app", "myjobs", "--workers", "2", "--exit-when-drained",
                cwd=app_dir, env=env)  # fmt: skip
        assert up.returncode == 0, up.stderr
        assert first.result(timeout=10) in (1, 2)
        assert raced.result(timeout=10) in (1, 2)
        # the later task of tick-2 is done without running: its result is the first's
        assert queue.handle(later_id).result(timeout=10) == raced.result(timeout=10)
    assert ran.read_text() == "ran\nran\n"  # two keys, two runs: never the duplicate


def test_qw_retry_enqueues_a_dead_task_again_linked_to_it(app_dir: Path) -> None:
    import os

    from queue_worker.proof.log_reading import read_task

    location = str(app_dir / ".qw")
    queue, add, always_fails, *_ = producer(location)
    with queue:
        done, failing = add.enqueue(1, 2), always_fails.enqueue(7)
    env = {**os.environ, "QW_TEST_QUEUE": location}
    up = ("up", "--no-tui", "--app", "myjobs", "--workers", "1", "--exit-when-drained",
          "--backoff", "0.01")  # fmt: skip
    assert qw(*up, cwd=app_dir, env=env).returncode == 0
    refused = qw("retry", str(done.id), cwd=app_dir)
    assert refused.returncode == 2
    assert refused.stderr.strip() == "qw: error: task 0 is done; expected a dead task"
    retried = qw("retry", "--dead", cwd=app_dir)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == f"task {failing.id} retried as task 2"
    record = read_task(location, 2)
    assert isinstance(record, TaskRecord)
    assert (record.function, record.args, record.retry_of) == ("always_fails", [7], failing.id)
    again = qw("retry", "--dead", cwd=app_dir)  # the retry is pending: nothing to retry
    assert again.stdout.strip() == "no dead task to retry"
    twice = qw("retry", str(failing.id), cwd=app_dir)  # never a second retry of one task
    assert (twice.returncode, twice.stdout) == (2, "")
    assert twice.stderr.strip() == (
        f"qw: error: task {failing.id} was retried already, by task 2; expected a dead task "
        "that no task retries yet"
    )


# -- periodic tasks --------------------------------------------------------------------------

PERIODIC_APP = """
from queue_worker import Queue

queue = Queue(".qw")


@queue.periodic(every=0.2)
def tick():
    with open("ticks.txt", "a") as out:
        out.write("t\\n")
"""


# covered in make test by test_job_deps's two supervisors, whose report proves each tick ran at
# most once
@pytest.mark.slow
def test_two_supervisors_on_one_queue_run_each_tick_once(tmp_path: Path) -> None:
    from queue_worker.proof.log_reading import read_claims
    from queue_worker.protocol.records import Done, decode_task
    from queue_worker.protocol.state import ClaimState, Verdict
    from queue_worker.topics import TASKS_TOPIC, open_topic
    from queue_worker.worker.handlers import RESOLVED_TO
    from tests.helpers import wait_until

    (tmp_path / "pjobs.py").write_text(PERIODIC_APP)
    ticks = tmp_path / "ticks.txt"
    ups = [
        subprocess.Popen(
            [*QW, "up", "--no-tui", "--app", "pjobs", "--workers", "1"],
            cwd=tmp_path,
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
    keys: dict[int, str] = {}
    with open_topic(str(tmp_path / ".qw"), TASKS_TOPIC, read_only=True) as log:
        for task, entry in enumerate(log.iter_from(log.start)):
            task_record = decode_task(entry.data)
            assert isinstance(task_record, TaskRecord) and task_record.key is not None
            keys[task] = task_record.key
    state, ran = ClaimState(), list[str]()
    for position, record in read_claims(str(tmp_path / ".qw")):
        outcome = state.apply(record, position)
        if isinstance(record, Done) and outcome.verdict is Verdict.DONE:
            resolved = isinstance(record.result, dict) and RESOLVED_TO in record.result
            if not resolved:
                ran.append(keys[record.task])
    assert len(ran) == len(set(ran))  # no tick ran twice
    assert len(ran) == len(ticks.read_text().splitlines())


def test_a_periodic_task_s_schedule_is_checked_when_it_is_registered(tmp_path: Path) -> None:
    pytest.importorskip("croniter")
    from datetime import datetime, timezone

    from queue_worker.periodic import Schedule

    queue = Queue(tmp_path / ".qw", immediate=True)
    with pytest.raises(ValueError, match=r"cron is 'every minute'; expected a cron expression"):
        queue.periodic(cron="every minute")(lambda: None)
    with pytest.raises(ValueError, match="expected every= or cron=, one of them"):
        queue.periodic(every=5, cron="* * * * *")(lambda: None)
    with pytest.raises(ValueError, match="every is 0; expected a number of seconds > 0"):
        queue.periodic(every=0)(lambda: None)
    assert queue.registered == {} and queue.schedules == []
    at = datetime(2026, 12, 2, 6, 3, 20, tzinfo=timezone.utc)
    at_us = int(at.timestamp()) * 1_000_000
    five = Schedule("t", cron="*/5 * * * *").next_after(at_us)
    assert datetime.fromtimestamp(five / 1_000_000, timezone.utc) == at.replace(minute=5, second=0)
    assert Schedule("t", every_s=60).next_after(at_us) == (at_us // 60_000_000 + 1) * 60_000_000


# -- cancel ----------------------------------------------------------------------------------


def is_held(handle: Any) -> bool:
    return bool(handle.state() == "held")


def test_cancel_makes_a_pending_or_a_held_task_dead(app_dir: Path) -> None:
    from tests.helpers import wait_until

    location = str(app_dir / ".qw")
    queue = Queue(location)

    @queue.task
    def waits(path: str, *, ctx: TaskContext) -> None:
        raise AssertionError("runs in a worker")

    stopped = app_dir / "stopped"
    with queue:
        later = waits.enqueue(str(stopped), delay=600)  # pending: no worker tries it yet
        queue.cancel(later.id)
        assert later.state() == "cancelled"
        with pytest.raises(TaskFailed, match=r"task 0 is dead: cancelled by qw-cancel@"):
            later.result(timeout=10)
        with pytest.raises(ValueError, match="task 0 is cancelled; expected a pending or held"):
            queue.cancel(later.id)
        for _ in run_app(app_dir, location):
            held = waits.enqueue(str(stopped))
            wait_until(partial(is_held, held), 60, "the task held")
            done = qw("cancel", str(held.id), cwd=app_dir)
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == f"task {held.id} cancelled"
            with pytest.raises(TaskFailed, match="cancelled by"):
                held.result(timeout=60)
            wait_until(stopped.exists, 60, "the handler to see ctx.cancelled")
    assert "cancelled: cancelled by qw-cancel@" in qw("task", "0", cwd=app_dir).stdout
    gone = qw("cancel", "99", cwd=app_dir)
    assert gone.returncode == 2
    assert gone.stderr.strip() == "qw: error: task 99 is not in the tasks log; expected a task id"
