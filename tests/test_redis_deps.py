"""Dependencies (`f.enqueue(..., after=[h1, h2])`) on a Redis queue: with server verdicts the
server's pick keeps a dependent waiting (queue_worker/redis/lua/parked.lua) and the worker
that wins a doomed one writes its dead FAIL from the server's state; with client verdicts
each worker's own pick does, as on the file log. Real redis-server, real `qw up` processes;
`qw report` proves the dependency rule and re-folds the server's every verdict."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from queue_worker import TaskFailed
from queue_worker.protocol.records import Claim, Done, Fail
from queue_worker.protocol.state import Verdict
from tests.helpers import wait_until
from tests.test_job_deps import APP, QW, producer, qw, verdicts

pytestmark = pytest.mark.redis

# the app of test_job_deps, and a task whose first attempt hangs until its worker is killed
REDIS_APP = (
    APP
    + """

@queue.task
def stuck_once(pid_file):
    if not os.path.exists(pid_file):  # the first attempt: say who we are, then hang
        with open(pid_file + ".new", "w") as out:
            out.write(str(os.getpid()))
        os.rename(pid_file + ".new", pid_file)
        while True:
            time.sleep(0.01)
    return "taken over"
"""
)

MODES = pytest.mark.parametrize("mode", ["", "?verdicts=client"], ids=["server", "client"])


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "deps_app.py").write_text(REDIS_APP)
    return tmp_path


def up_args(location: str, workers: int, *more: str) -> list[str]:
    return ["up", "--no-tui", "--app", "deps_app", "--workers", str(workers), "--log", location,
            *more]  # fmt: skip


def run_until_drained(app_dir: Path, location: str, workers: int = 3) -> None:
    env = {**os.environ, "QW_TEST_QUEUE": location}
    up = qw(*up_args(location, workers, "--exit-when-drained"), cwd=app_dir, env=env)
    assert up.returncode == 0, up.stdout + up.stderr


def report_lines(app_dir: Path, location: str) -> str:
    report = qw("report", "--log", location, cwd=app_dir)
    assert report.returncode == 0, report.stdout + report.stderr
    return report.stdout


def claims_of(records: list[tuple[int, Any, Verdict]], task: int) -> list[int]:
    return [p for p, r, _ in records if isinstance(r, Claim) and r.task == task]


def done_at(records: list[tuple[int, Any, Verdict]]) -> dict[int, int]:
    return {r.task: p for p, r, v in records if isinstance(r, Done) and v is Verdict.DONE}


@MODES
def test_a_task_runs_only_after_its_dependencies_are_done(
    app_dir: Path, redis_url: str, mode: str
) -> None:
    location, ran = redis_url + mode, app_dir / "ran.txt"
    queue, step, _ = producer(location)
    with queue:
        first = step.enqueue(str(ran), "first", pause=0.3)
        second = step.enqueue(str(ran), "second", pause=0.3)
        # three workers: the third is idle while the two run, and asks for a task
        last = step.enqueue(str(ran), "last", after=[first, second.id])
        after_last = step.enqueue(str(ran), "after last", after=[last])  # a chain
        plain = step.enqueue(str(ran), "plain")  # behind them: not held up by them
        assert last.state() == "pending"
        run_until_drained(app_dir, location)
        assert last.result(timeout=10) == "last"
        assert after_last.result(timeout=10) == "after last"
        assert plain.result(timeout=10) == "plain"
    assert ran.read_text().splitlines()[-2:] == ["last", "after last"]
    records = verdicts(location)
    finished = done_at(records)
    # no CLAIM of a dependent, won or lost, before its dependencies' DONEs
    assert min(claims_of(records, last.id)) > max(finished[first.id], finished[second.id])
    assert min(claims_of(records, after_last.id)) > finished[last.id]
    assert min(claims_of(records, plain.id)) < finished[first.id]  # it did not wait
    assert "dependencies: 2 tasks with them — 2 done after theirs, 0 dead, none run early" in (
        report_lines(app_dir, location)
    )


@pytest.mark.parametrize(
    "mode",
    ["", pytest.param("?verdicts=client", marks=pytest.mark.slow)],  # (the file log's path)
    ids=["server", "client"],
)
def test_a_dead_dependency_makes_its_dependents_dead_naming_it(
    app_dir: Path, redis_url: str, mode: str
) -> None:
    location, ran = redis_url + mode, app_dir / "ran.txt"
    queue, step, breaks = producer(location)
    with queue:
        broken = breaks.enqueue(str(ran))  # 0: dead after its one attempt
        fine = step.enqueue(str(ran), "fine", pause=0.3)  # 1
        doomed = step.enqueue(str(ran), "doomed", after=[fine, broken])  # 2
        chained = step.enqueue(str(ran), "chained", after=[doomed])  # 3: dead in turn
        cancelled = step.enqueue(str(ran), "cancelled")  # 4: cancelled before any worker
        queue.cancel(cancelled.id)
        orphaned = step.enqueue(str(ran), "orphaned", after=[cancelled])  # 5
        run_until_drained(app_dir, location)
        with pytest.raises(TaskFailed) as failed:
            doomed.result(timeout=10)
        assert failed.value.error == "dependency 0 is dead: ValueError: broken on purpose"
        with pytest.raises(TaskFailed, match=r"dependency 2 is dead: dependency 0 is dead: "):
            chained.result(timeout=10)
        with pytest.raises(TaskFailed, match=r"^task 5 is dead: dependency 4 is dead: cancel"):
            orphaned.result(timeout=10)
        assert fine.result(timeout=10) == "fine"
    assert ran.read_text() == "fine\n"  # none of the dependents ran
    # each death is a dead FAIL under a winning claim, in the log: every reader folds it
    records = verdicts(location)
    dead = {r.task: r for _, r, v in records if isinstance(r, Fail) and v is Verdict.DEAD}
    assert {2, 3, 5} <= set(dead) and all(dead[t].claim >= 0 for t in (2, 3, 5))
    assert "dependencies: 3 tasks with them — 0 done after theirs, 3 dead, none run early" in (
        report_lines(app_dir, location)
    )


def test_a_dependency_whose_worker_is_killed_is_taken_over_then_its_dependent_runs(
    app_dir: Path, redis_url: str
) -> None:
    location, ran, pid_file = redis_url, app_dir / "ran.txt", app_dir / "pid"
    queue, step, _ = producer(location)

    @queue.task
    def stuck_once(pid_file: str) -> str:
        raise AssertionError("runs in a worker")

    env = {**os.environ, "QW_TEST_QUEUE": location}
    with (app_dir / "up.out").open("w") as out:
        up = subprocess.Popen(
            [*QW, *up_args(location, 2, "--lease", "1")],
            cwd=app_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        with queue:
            held = stuck_once.enqueue(str(pid_file))
            dependent = step.enqueue(str(ran), "dependent", after=[held])
            wait_until(pid_file.exists, 60, "the dependency held by a worker")
            assert dependent.state() == "pending"  # the other worker idles: it waits
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
            assert held.result(timeout=60) == "taken over"
            assert dependent.result(timeout=60) == "dependent"
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)
    records = verdicts(location)
    claimed = [(r.worker, v) for _, r, v in records if isinstance(r, Claim) and r.task == held.id]
    assert claimed[-1][1] is Verdict.TAKEOVER
    slot = claimed[0][0].split("-")[0]  # (w0-6975-4ede: slot, pid, suffix)
    assert claimed[-1][0].split("-")[0] != slot  # a survivor's: the heir leaves it to them
    assert min(claims_of(records, dependent.id)) > done_at(records)[held.id]
    assert "dependencies: 1 task with them — 1 done after theirs, 0 dead, none run early" in (
        report_lines(app_dir, location)
    )


def test_a_dependency_that_is_not_a_task_is_refused_and_nothing_is_written(
    redis_url: str,
) -> None:
    queue, step, _ = producer(redis_url)
    with queue:
        first = step.enqueue("p", "first")
        end = queue.log.end()
        with pytest.raises(ValueError, match=r"^after= names task 1, which is not in the tasks"):
            step.enqueue("p", "x", after=[first, 1])
        assert queue.log.end() == end
