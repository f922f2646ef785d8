"""The supervisor with real worker processes: signals, kill -9, restarts, the storm guard and
the dashboard's controls. Every wait is a condition with a deadline; no test sleeps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from queue_worker.proof.report import read_claims
from queue_worker.protocol.state import ClaimState, Verdict
from supervisor.run.model import WorkerView
from supervisor.run.supervisor import (
    EXIT_FORCED,
    EXIT_NO_WORKERS,
    EXIT_OK,
    RestartPolicy,
    Supervisor,
)
from tests.helpers import wait_until

QW = [sys.executable, "-m", "supervisor.cli.app"]
REPO = Path(__file__).resolve().parents[1]


def crash(payload: Any) -> None:
    """A handler that kills its worker process: every task it wins crashes the worker."""
    os._exit(3)


def start_up(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    with (tmp_path / "up.out").open("w") as out, (tmp_path / "up.err").open("w") as err:
        return subprocess.Popen(
            [*QW, "up", "--no-tui", "--dir", str(tmp_path / "qw"), *args],
            cwd=tmp_path,
            stdout=out,
            stderr=err,
            text=True,
        )


def gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def workers_of(pid: int) -> list[int]:
    """The worker processes of the supervisor `pid`: the children of its fork server."""
    try:
        helpers = psutil.Process(pid).children()  # the fork server
        return [p.pid for h in helpers for p in h.children() if not gone(p.pid)]
    except psutil.NoSuchProcess:
        return []


def holders(data_dir: Path) -> dict[int, str]:
    """task -> worker id, for every task held now (by the claims log's verdict)."""
    state = ClaimState()
    for position, record in read_claims(str(data_dir)):
        state.apply(record, position)
    return {task: lease.worker for task, lease in state.held_tasks()}


def finished_by(data_dir: Path) -> dict[int, str]:
    """task -> the worker whose DONE was accepted."""
    state = ClaimState()
    done: dict[int, str] = {}
    for position, record in read_claims(str(data_dir)):
        outcome = state.apply(record, position)
        if outcome.verdict is Verdict.DONE and outcome.task is not None and outcome.worker:
            done[outcome.task] = outcome.worker
    return done


# -- signals and kill -9, through the real `qw up` ----------------------------------------------


def test_kill_9_of_the_supervisor_leaves_no_worker(tmp_path: Path) -> None:
    up = start_up(tmp_path, "--workers", "3", "--work-ms", "100")
    try:
        wait_until(lambda: len(workers_of(up.pid)) == 3, 30, "three workers")
        pids = workers_of(up.pid)
    finally:
        up.kill()
        up.wait(30)
    wait_until(lambda: all(gone(pid) for pid in pids), 10, "every worker to exit")


def test_sigterm_lets_current_tasks_finish_then_exits_0(tmp_path: Path) -> None:
    up = start_up(tmp_path, "--workers", "2", "--tasks", "6", "--work-ms", "1500")
    data = tmp_path / "qw"
    try:
        wait_until(lambda: len(holders(data)) == 2, 30, "both workers to hold a task")
        held = holders(data)
        up.send_signal(signal.SIGTERM)
        assert up.wait(30) == EXIT_OK
    finally:
        if up.poll() is None:
            up.kill()
    assert holders(data) == {}  # nothing left held
    done = finished_by(data)
    for task, worker in held.items():
        assert done.get(task) == worker  # each task in hand was finished by its holder
    assert "draining (stop requested)" in (tmp_path / "up.out").read_text()


def test_a_second_signal_kills_the_workers_at_once(tmp_path: Path) -> None:
    up = start_up(tmp_path, "--workers", "2", "--tasks", "4", "--work-ms", "60000")
    data = tmp_path / "qw"
    try:
        wait_until(lambda: len(holders(data)) == 2, 30, "both workers to hold a task")
        pids = workers_of(up.pid)
        up.send_signal(signal.SIGINT)
        out = tmp_path / "up.out"
        wait_until(lambda: "draining (stop requested)" in out.read_text(), 30, "the drain")
        up.send_signal(signal.SIGINT)
        assert up.wait(30) == EXIT_FORCED
    finally:
        if up.poll() is None:
            up.kill()
    assert all(gone(pid) for pid in pids)
    assert len(holders(data)) == 2  # killed mid-task: their leases lapse for a survivor
    assert "qw: stopped: workers killed mid-task" in (tmp_path / "up.err").read_text()


# -- the Supervisor class in this process ----------------------------------------------------------


def slot_view(sup: Supervisor, slot: int) -> WorkerView:
    return sup.snapshot().workers[slot]


def test_storm_guard_gives_up_on_a_crash_looping_slot(
    make_supervisor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # the workers import the handler from this module
    policy = RestartPolicy(backoff_s=0.01, backoff_max_s=0.05, storm_limit=2, storm_window_s=60)
    sup = make_supervisor(workers=1, tasks=5, handler=f"{__name__}:crash", restart=policy)
    sup.start()
    assert sup.wait(60)
    assert sup.exit_code == EXIT_NO_WORKERS
    worker = slot_view(sup, 0)
    assert (worker.state, worker.restarts, worker.exit_code) == ("dead", 2, 3)
    texts = [e.text for e in sup.snapshot().events]
    assert "w0 restarted 2 times in 60 s: the slot stays dead" in texts
    assert sum("exited with code 3" in t for t in texts) == 3


def test_controls_pause_add_remove_kill_and_drain(make_supervisor: Any) -> None:
    sup = make_supervisor(workers=2, rate=20.0, work_ms=100)
    sup.start()
    assert sup.snapshot().demo_rate == 20.0  # what the dashboard labels as demo traffic
    wait_until(lambda: all(w.worker_id for w in sup.snapshot().workers), 30, "worker ids")

    # pause / resume: SIGSTOP / SIGCONT
    pid = slot_view(sup, 0).pid
    assert sup.toggle_pause(0) == f"w0·{pid} paused"
    process = psutil.Process(pid)
    wait_until(lambda: process.status() == psutil.STATUS_STOPPED, 10, "SIGSTOP")
    assert slot_view(sup, 0).state == "paused"
    assert sup.toggle_pause(0) == f"w0·{pid} resumed"
    wait_until(lambda: process.status() != psutil.STATUS_STOPPED, 10, "SIGCONT")

    # add a worker, then remove it: it drains and is not restarted
    added = sup.add_worker()
    assert added is not None and added.startswith("w2 added (pid ")
    wait_until(lambda: slot_view(sup, 2).worker_id, 30, "w2 to publish its stats")
    assert (
        sup.remove_worker()
        == f"w2 (pid {slot_view(sup, 2).pid}) removed: it finishes its task and exits"
    )
    wait_until(lambda: slot_view(sup, 2).state == "exited", 30, "w2 to exit")
    assert slot_view(sup, 2).restarts == 0

    # kill -9 a worker that holds a task: its slot restarts
    text = wait_until(sup.kill_a_holder, 30, "a worker holding a task")
    assert isinstance(text, str) and text.startswith("kill -9 w") and ", holding task " in text
    slot = int(text.split()[2].split("·")[0][1:])  # kill -9 w1·4711, holding task 17
    wait_until(lambda: slot_view(sup, slot).restarts == 1, 30, "the slot to restart")

    sup.select(1)
    assert sup.snapshot().selected == 1
    sup.drain()
    assert sup.wait(30)
    assert sup.exit_code == EXIT_OK
    assert {w.state for w in sup.snapshot().workers} == {"exited"}


def test_qw_status_says_why_a_supervisor_stops_on_a_log() -> None:
    from supervisor.cli.supervisor_lines import supervisor_lines

    status = {"pid": 7, "workers": [], "draining": True, "log_failure": "w0·8: bad\x1b[2J"}
    assert supervisor_lines([status])[2] == "    stopping on a log: w0·8: bad\ufffd[2J"
