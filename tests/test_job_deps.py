"""Dependencies: `f.enqueue(..., after=[h1, h2])` waits for them, and is dead if one of them
is (queue_worker.worker.dependencies): real `qw up --app` runs, the claims log read after."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from queue_worker import Queue, TaskFailed
from queue_worker.proof.log_reading import read_claims
from queue_worker.protocol.records import Claim, Done, Fail
from queue_worker.protocol.state import ClaimState, Verdict

QW = [sys.executable, "-m", "supervisor.cli.app"]

APP = """
import os
import time

from queue_worker import Queue

queue = Queue(os.environ["QW_TEST_QUEUE"])


@queue.task
def step(path, name, pause=0.0):
    time.sleep(pause)  # (long enough for an idle worker to look at the dependent)
    with open(path, "a") as out:
        out.write(name + "\\n")
    return name


@queue.task(max_attempts=1)
def breaks(path):
    raise ValueError("broken on purpose")


@queue.task
def hold(flag):
    while not os.path.exists(flag):  # (held until the test lets it go)
        time.sleep(0.01)
    return "let go"


queue.task(name="resize_every_thumbnail")(hold.function)
"""


def qw(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env, check=False
    )


def producer(location: str) -> tuple[Queue, Any, Any]:
    """A producer's queue with the app's names (the names matter, not the functions)."""
    queue = Queue(location)

    @queue.task
    def step(path: str, name: str, pause: float = 0.0) -> str:
        raise AssertionError("runs in a worker")

    @queue.task
    def breaks(path: str) -> None:
        raise AssertionError("runs in a worker")

    @queue.task
    def hold(flag: str) -> str:
        raise AssertionError("runs in a worker")

    return queue, step, breaks


def run_until_drained(app_dir: Path, workers: int = 3) -> None:
    env = {**os.environ, "QW_TEST_QUEUE": str(app_dir / ".qw")}
    up = qw("up", "--no-tui", "--app", "deps_app", "--workers", str(workers),
            "--exit-when-drained", "--dir", ".qw", cwd=app_dir, env=env)  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "deps_app.py").write_text(APP)
    return tmp_path


def verdicts(location: str) -> list[tuple[int, Any, Verdict]]:
    """Every claims record with its position and the fold's verdict, in log order."""
    state, out = ClaimState(), []
    for position, record in read_claims(location):
        out.append((position, record, state.apply(record, position).verdict))
    return out


def test_a_task_runs_only_after_all_its_dependencies_are_done(app_dir: Path) -> None:
    location, ran = str(app_dir / ".qw"), app_dir / "ran.txt"
    queue, step, _ = producer(location)
    with queue:
        first = step.enqueue(str(ran), "first", pause=0.3)
        second = step.enqueue(str(ran), "second", pause=0.3)
        # a handle and an id; three workers: the third is idle while the two run
        last = step.enqueue(str(ran), "last", after=[first, second.id])
        assert last.state() == "pending"
        shown = qw("task", str(last.id), "--dir", ".qw", cwd=app_dir)
        assert shown.stdout.startswith(
            "task 2 step: never claimed: it waits for tasks 0, 1 (no worker tries it before"
        ), shown.stdout
        run_until_drained(app_dir)
        assert last.result(timeout=10) == "last"
    assert ran.read_text().splitlines()[-1] == "last"
    records = verdicts(location)
    done_at = {r.task: p for p, r, v in records if isinstance(r, Done) and v is Verdict.DONE}
    claims = [p for p, r, _ in records if isinstance(r, Claim) and r.task == last.id]
    assert claims, "the dependent was claimed"
    # no CLAIM of it, won or lost, before both DONEs: a worker never even tried it early
    assert min(claims) > max(done_at[first.id], done_at[second.id])
    shown = qw("task", str(last.id), "--dir", ".qw", cwd=app_dir)
    assert shown.returncode == 0, shown.stderr
    assert "after tasks 0, 1" in shown.stdout
    report = qw("report", "--dir", ".qw", cwd=app_dir)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "dependencies: 1 task with them — 1 done after theirs, 0 dead, none run early" in (
        report.stdout
    )
    # a writer that ignores the rule: task 4 (after 3, never done) completed all the same
    from queue_worker.protocol.records import TaskRecord, encode
    from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC, open_topic

    with open_topic(location, TASKS_TOPIC) as log:
        log.append(encode(TaskRecord(None, 1, "step", ["p", "never"])), durable=True)
        log.append(encode(TaskRecord(None, 1, "step", ["p", "early"], after=(3,))), durable=True)
    with open_topic(location, CLAIMS_TOPIC) as log:
        claim = log.append(encode(Claim(4, "w9-1-abcd", 2, 10**12)), durable=True)
        done = log.append(encode(Done(4, "w9-1-abcd", 3, claim, None)), durable=True)
    report = qw("report", "--dir", ".qw", cwd=app_dir)
    assert report.returncode == 1, report.stdout + report.stderr
    assert (
        f"task 4 was completed under claim @{claim} (DONE @{done}), but its dependency 3 "
        "was never done"
    ) in " ".join(report.stdout.split())


def test_a_task_whose_dependency_dies_is_dead_naming_it_and_never_runs(app_dir: Path) -> None:
    location, ran = str(app_dir / ".qw"), app_dir / "ran.txt"
    queue, step, breaks = producer(location)
    with queue:
        broken = breaks.enqueue(str(ran))  # 0: dead after its one attempt
        fine = step.enqueue(str(ran), "fine")  # 1
        doomed = step.enqueue(str(ran), "doomed", after=[broken, fine])  # 2
        chained = step.enqueue(str(ran), "chained", after=[doomed])  # 3: dead in turn
        cancelled = step.enqueue(str(ran), "cancelled")  # 4: cancelled before any worker
        queue.cancel(cancelled.id)
        orphaned = step.enqueue(str(ran), "orphaned", after=[cancelled])  # 5
        run_until_drained(app_dir)
        with pytest.raises(TaskFailed) as failed:
            doomed.result(timeout=10)
        assert failed.value.error == "dependency 0 is dead: ValueError: broken on purpose"
        with pytest.raises(TaskFailed, match=r"dependency 2 is dead: dependency 0 is dead: "):
            chained.result(timeout=10)
        with pytest.raises(TaskFailed, match=r"^task 5 is dead: dependency 4 is dead: cancel"):
            orphaned.result(timeout=10)
        assert (doomed.state(), chained.state(), orphaned.state()) == ("dead",) * 3
    assert ran.read_text() == "fine\n"  # none of the dependents ran
    # each death is a dead FAIL under a winning claim, in the log: every reader folds it
    dead = {
        r.task: r for _, r, v in verdicts(location) if isinstance(r, Fail) and v is Verdict.DEAD
    }
    assert dead[2].claim >= 0 and dead[3].claim >= 0 and dead[5].claim >= 0
    report = qw("report", "--dir", ".qw", cwd=app_dir)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "dependencies: 3 tasks with them — 0 done after theirs, 3 dead, none run early" in (
        report.stdout
    )
    why = qw("why", "2", "--dir", ".qw", cwd=app_dir)
    assert why.returncode == 0, why.stderr
    assert "after tasks 0, 1" in why.stdout
    assert "dead: dependency 0 is dead: ValueError: broken on purpose" in " ".join(
        why.stdout.split()
    )


def test_a_dependency_that_is_not_a_task_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    queue, step, _ = producer(str(tmp_path / ".qw"))
    with queue:
        first = step.enqueue("p", "first")
        end = queue.log.end()
        with pytest.raises(
            ValueError, match=r"^after= names task 1, which is not in the tasks log"
        ):
            step.enqueue("p", "x", after=[first, 1])
        with pytest.raises(ValueError, match=r"^after= holds True; expected a handle"):
            step.enqueue("p", "x", after=[True])
        with pytest.raises(ValueError, match=r"^after is 0; expected a list"):
            step.enqueue("p", "x", after=0)
        other = Queue(tmp_path / "other")
        with other, pytest.raises(ValueError, match=r"^after= holds <TaskHandle 0>"):
            step.enqueue("p", "x", after=[other.handle(other.enqueue(1))])
        assert queue.log.end() == end


def test_immediate_mode_keeps_the_dependency_rule(tmp_path: Path) -> None:
    queue = Queue(tmp_path / ".qw", immediate=True)

    @queue.task
    def add(a: int, b: int) -> int:
        return a + b

    @queue.task
    def broken() -> None:
        raise KeyError("gone")

    three = add.enqueue(1, 2)
    assert add.enqueue(3, 4, after=[three]).result() == 7
    dead = broken.enqueue()
    with pytest.raises(TaskFailed, match=r"^task 3 is dead: dependency 2 is dead: KeyError"):
        add.enqueue(1, 1, after=[three, dead]).result()
    assert not (tmp_path / ".qw").exists()


def test_the_task_index_keeps_dependencies_through_a_checkpoint(tmp_path: Path) -> None:
    from queue_worker.history.checkpoint import _tasks_from, _tasks_plain
    from queue_worker.protocol.records import TaskRecord, encode
    from queue_worker.topics import TASKS_TOPIC, TaskIndex, open_topic

    with open_topic(str(tmp_path / ".qw"), TASKS_TOPIC) as log:
        for record in (
            TaskRecord(None, 1, "step"),
            TaskRecord(None, 1, "step", after=(0,)),
            TaskRecord(None, 1, "step", after=(2,)),  # (hostile: itself, a wait for ever)
        ):
            log.append(encode(record))
        index = TaskIndex(log.start)
        index.catch_up(log)
    assert index.after == {1: (0,)}
    assert index.unreadable[2].endswith("depends on task 2, which is not an earlier task")
    again = TaskIndex.restore(_tasks_from(_tasks_plain(index.snapshot(), {})))
    assert again.after == {1: (0,)}
    again.settle_below(2)
    assert again.after == {}


def test_the_function_is_named_beside_the_task_in_stats_task_json_task_why_and_timeline(
    app_dir: Path,
) -> None:
    import json
    import signal
    import urllib.request

    from supervisor.timeline.load import load_model
    from supervisor.timeline.svg import render_lanes
    from supervisor.timeline.view import select
    from tests.helpers import free_port, wait_until

    location, flag = str(app_dir / ".qw"), app_dir / "flag"
    port = free_port()
    queue, *_ = producer(location)

    def get(path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return json.loads(answer.read())

    def holding() -> bool:
        try:
            workers = get("/stats")["workers"]
        except OSError:
            return False  # (not serving yet)
        return any(w["current"] == 0 and w["currentFunction"] == "hold" for w in workers)

    env = {**os.environ, "QW_TEST_QUEUE": location}
    up = subprocess.Popen(
        [*QW, "up", "--no-tui", "--app", "deps_app", "--workers", "1", "--dir", ".qw",
         "--http", f"127.0.0.1:{port}"],
        cwd=app_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with queue:
            held = queue.enqueue_call("hold", [str(flag)])
            wait_until(holding, 60, "/stats to name the function of the task in hand")
            flag.touch()
            assert held.result(timeout=60) == "let go"
            wait_until(lambda: get("/task/0")["done"], 60, "the supervisor's fold to see it")
            task = get("/task/0")
            assert (task["function"], task["after"]) == ("hold", [])
            payload = queue.handle(queue.enqueue({"n": 1}))  # a payload task has none
            assert get(f"/task/{payload.id}")["function"] is None
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(60)
    shown = qw("task", "0", "--dir", ".qw", cwd=app_dir)
    assert shown.stdout.splitlines()[0].startswith("task 0 hold: done"), shown.stdout
    why = qw("why", "0", "--dir", ".qw", cwd=app_dir, env={**os.environ, "COLUMNS": "80"})
    assert "task 0 hold: done" in why.stdout, why.stdout
    assert all(len(line) <= 80 for line in why.stdout.splitlines()), why.stdout
    assert "CLAIM @" in render_lanes(select(load_model(location)))
    assert " · task 0 hold" in render_lanes(select(load_model(location)))


# -- periodic ticks: what `qw report` proves ---------------------------------------------------

PERIODIC_APP = """
from queue_worker import Queue

queue = Queue(".qw")


@queue.periodic(every=0.2)
def tick():
    with open("ticks.txt", "a") as out:
        out.write("t\\n")
"""


def test_qw_report_proves_each_tick_of_two_supervisors_ran_at_most_once(tmp_path: Path) -> None:
    import signal

    from queue_worker.protocol.records import TaskRecord, decode_task, encode
    from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC, open_topic
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
        wait_until(lambda: ticks.exists() and len(ticks.read_text().splitlines()) >= 4, 60,
                   "four ticks run")  # fmt: skip
    finally:
        for up in ups:
            up.send_signal(signal.SIGINT)
        for up in ups:
            up.wait(60)
    location = str(tmp_path / ".qw")
    keys: list[str] = []
    with open_topic(location, TASKS_TOPIC, read_only=True) as log:
        for entry in log.iter_from(log.start):
            record = decode_task(entry.data)
            assert isinstance(record, TaskRecord) and record.key is not None
            keys.append(record.key)
    distinct = len(set(keys))
    report = qw("report", "--dir", ".qw", cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    line = f"periodic: tick — {distinct} ticks, each enqueued once and completed at most once"
    assert line in report.stdout

    # A writer that ignores the key: a later task of the first tick's key, run on its own
    first_key = keys[0]
    with open_topic(location, TASKS_TOPIC) as log:
        log.append(encode(TaskRecord(None, 1, "tick", [], {}, key=first_key)), durable=True)
    rogue = len(keys)
    with open_topic(location, CLAIMS_TOPIC) as log:
        claim = log.append(encode(Claim(rogue, "w9-1-abcd", 2, 10**12)), durable=True)
        done = log.append(encode(Done(rogue, "w9-1-abcd", 3, claim, None)), durable=True)
    report = qw("report", "--dir", ".qw", cwd=tmp_path)
    assert report.returncode == 1, report.stdout + report.stderr
    text = " ".join(report.stdout.split())
    assert f"(key {first_key}): tasks 0 and {rogue} hold its key as distinct tasks" in text
    assert f"(task {rogue} ran: DONE @{done})" in text
    assert "completed 2 times (DONE @" in text and f", @{done})" in text
    assert "1 against the rule" not in text  # two lines: distinct, and completed twice
    assert f"periodic: tick — {distinct} ticks, 2 against the rule" in text


def test_a_tick_run_again_by_a_takeover_s_loser_is_completed_twice() -> None:
    from queue_worker.proof.periodic_proof import Completion, check_ticks

    key = "periodic:tick:1764000000000000"
    keyed = [(3, key), (4, key)]  # 4: the other supervisor's, resolved to 3
    resolved = {3: Completion(90), 4: Completion(95, resolved_to=3)}
    (once,) = check_ticks(keyed, resolved, {})
    assert (once.ok, once.ticks) == (True, 1)
    (twice,) = check_ticks(keyed, resolved, {3: [80]})  # a stale DONE of a claim that won
    assert len(twice.problems) == 1
    assert twice.problems[0].endswith(f"(key {key}): completed 2 times (DONE @80, @90)")
    (wrong,) = check_ticks(keyed, {3: Completion(90), 4: Completion(95, resolved_to=1)}, {})
    assert "task 4 resolved to task 1, not to the key's first, task 3" in wrong.problems[0]


def test_the_dashboard_names_each_task_s_function_at_80x24(app_dir: Path) -> None:
    import re

    from tests.helpers import wait_until
    from tests.test_tui_tmux import QW as QW_SCRIPT
    from tests.test_tui_tmux import Tmux, worker_rows

    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    location, flag = str(app_dir / ".qw"), app_dir / "flag"
    term = Tmux(app_dir / "tmux.sock", 80, 24)
    try:
        term.start(app_dir)
        term.type_line(
            f"QW_TEST_QUEUE={location} {QW_SCRIPT} up --app deps_app --workers 2 --dir .qw"
        )
        queue, *_ = producer(location)
        with queue:
            queue.enqueue_call("hold", [str(flag)])
            queue.enqueue_call("resize_every_thumbnail", [str(flag)])

            def tasks_shown() -> set[str]:
                rows = worker_rows(term.screen()).values()
                return {m[0] for row in rows for m in re.finditer(r"#\d+ \S+", row)}

            wait_until(lambda: len(tasks_shown()) == 2, 60, "both tasks with their functions")
            assert tasks_shown() == {"#0 hold", "#1 resize_ever…"}, term.screen()
            screen = term.screen()
            assert all(len(line) <= 80 for line in screen.splitlines()), screen
            flag.touch()
    finally:
        term.kill_server()
