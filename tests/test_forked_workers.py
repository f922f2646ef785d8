"""Workers forked from the fork server (supervisor.run.forked): a kill -9 is reported as SIGKILL,
nothing outlives a supervisor killed with kill -9 (fork server included), each worker
writes to its own log file, and `start_worker(..., fork=False)` still starts plain subprocesses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import pytest

from queue_worker.worker.config import WorkerConfig
from supervisor.run.forked import ExecWorker, ForkedWorker, start_worker, stop_server
from supervisor.run.supervisor import EXIT_OK, RestartPolicy
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[1]
QW = [sys.executable, "-m", "supervisor.cli.app"]


def shout(payload: Any) -> None:
    """A handler that says who ran it, on stdout and on stderr."""
    print(f"out from {os.getpid()}", flush=True)
    print(f"err from {os.getpid()}", file=sys.stderr, flush=True)


def share(payload: Any) -> None:
    """A handler that uses what multiprocessing's resource tracker tracks (shared memory)
    and says which tracker process it registered with."""
    from multiprocessing import resource_tracker, shared_memory

    block = shared_memory.SharedMemory(create=True, size=16)
    assert block.buf is not None
    block.buf[0] = 7
    block.close()
    block.unlink()
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    print(f"tracker {tracker} of {os.getpid()}", flush=True)


def exit_at_once(config_json: str, log_path: str) -> None:
    """A forked worker's entry that does nothing: the worker ends as soon as it is forked."""


def gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def supervisor(make_supervisor: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`make_supervisor` (conftest.py), run from the repository: the workers import
    handlers from this module."""
    monkeypatch.chdir(REPO)
    return make_supervisor


def test_a_forked_worker_killed_with_kill_9_is_reported_as_sigkill(supervisor: Any) -> None:
    sup = supervisor(workers=1, restart=RestartPolicy(enabled=False))
    sup.start()
    worker = wait_until(lambda: sup.snapshot().workers[0].worker_id, 30, "the worker's stats")
    pid = sup.snapshot().workers[0].pid
    assert isinstance(sup._slots[0].process, ForkedWorker)
    assert psutil.Process(pid).ppid() != os.getpid()  # the fork server's child, not ours
    os.kill(pid, signal.SIGKILL)
    assert sup.wait(30)
    view = sup.snapshot().workers[0]
    assert (view.state, view.exit_code) == ("dead", -signal.SIGKILL)
    label = f"w0·{str(worker).rsplit('-', 2)[1]}"
    assert f"{label} killed by SIGKILL" in [e.text for e in sup.snapshot().events]


def test_each_forked_worker_writes_to_its_own_log(supervisor: Any, tmp_path: Path) -> None:
    sup = supervisor(workers=2, tasks=40, handler=f"{__name__}:shout", exit_when_drained=True)
    sup.start()
    assert sup.wait(60)
    assert sup.exit_code == EXIT_OK
    logs = tmp_path / "qw" / "run" / "logs"
    for view in sup.snapshot().workers:
        lines = (logs / f"{view.name}.log").read_text().splitlines()
        if view.stats.finished == 0:
            continue  # the other worker took every task
        assert f"out from {view.pid}" in lines and f"err from {view.pid}" in lines
        assert all(line.endswith(f" {view.pid}") for line in lines), lines


def test_kill_9_of_the_supervisor_leaves_no_process_behind(tmp_path: Path) -> None:
    with (tmp_path / "up.out").open("w") as out:
        up = subprocess.Popen(
            [*QW, "up", "--no-tui", "--dir", str(tmp_path / "qw"), "--workers", "3"],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def tree() -> list[psutil.Process]:
            return list(psutil.Process(up.pid).children(recursive=True))

        def leaders() -> set[int]:
            return {p.pid for p in tree() if _sid(p.pid) == p.pid}

        # the fork server and the three workers under it (no resource tracker: see
        # supervisor.run.forked); a forked worker leads its own session from its first steps
        # (setsid), so wait for the fork server's session and the three workers' too
        wait_until(lambda: len(tree()) == 4 and len(leaders()) == 4, 30, "three workers forked")
        processes = tree()
        sessions = leaders()
        assert len(sessions) == 4
    finally:
        up.kill()
        up.wait(30)
    wait_until(lambda: all(gone(p.pid) for p in processes), 10, "every process to exit")
    # nothing else is left in the workers' sessions or the fork server's (zombies are dead:
    # a container's init may be slow to reap them)
    left = [p.pid for p in psutil.process_iter() if _sid(p.pid) in sessions and not gone(p.pid)]
    assert not left, left


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def test_a_forked_worker_starts_its_own_resource_tracker_when_it_needs_one(
    supervisor: Any, tmp_path: Path
) -> None:
    # The supervisor starts no tracker for the fork server (supervisor.run.forked): a handler
    # that needs one gets its own, as a `python -m` worker does, with no warning.
    sup = supervisor(workers=1, tasks=3, handler=f"{__name__}:share", exit_when_drained=True)
    sup.start()
    assert sup.wait(60)
    assert sup.exit_code == EXIT_OK
    assert sup.snapshot().workers[0].stats.finished == 3
    view = sup.snapshot().workers[0]
    text = (tmp_path / "qw" / "run" / "logs" / f"{view.name}.log").read_text()
    trackers = {line.split()[1] for line in text.splitlines() if line.startswith("tracker ")}
    assert len(trackers) == 1 and trackers != {"None"}, text  # one, its own, started once
    assert "resource_tracker" not in text and "Warning" not in text, text


def test_exec_start_runs_plain_subprocesses(
    supervisor: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from supervisor.run import supervisor as supervisor_module

    monkeypatch.setattr(supervisor_module, "start_worker", partial(start_worker, fork=False))
    sup = supervisor(workers=1, tasks=20, work_ms=0, exit_when_drained=True)
    sup.start()
    pid = sup.snapshot().workers[0].pid
    assert isinstance(sup._slots[0].process, ExecWorker)
    with contextlib.suppress(psutil.NoSuchProcess):  # it may have drained the queue already
        process = psutil.Process(pid)
        assert process.ppid() == os.getpid()
        # Its command line reads empty while it is inside execve, and once it has exited
        # (a zombie not yet reaped): wait for the one or the other.
        wait_until(
            lambda: process.status() == psutil.STATUS_ZOMBIE or bool(process.cmdline()),
            30,
            "the worker's exec to finish",
        )
        if process.status() != psutil.STATUS_ZOMBIE:
            assert "queue_worker.process" in process.cmdline()
    assert sup.wait(60)
    assert sup.exit_code == EXIT_OK
    assert sup.snapshot().workers[0].stats.finished == 20


def test_the_cli_names_the_supervisors_demo_handler() -> None:
    # supervisor.cli.app spells it out rather than import the supervisor for `qw --help`
    from supervisor.cli import app as cli
    from supervisor.run import supervisor

    assert cli.DEMO_HANDLER == supervisor.DEMO_HANDLER


#: rounds of the race below (each also restarts the fork server the round before stopped)
STOP_RACE_ROUNDS = 12
#: how many times a round's drained supervisor asks to stop the server, at most
STOP_REQUESTS = 50


def _fork_while_stopping(config: WorkerConfig, log_path: Path) -> tuple[int | None, str | None]:
    """One round: a thread forks a worker (and waits for its end) while another asks to
    stop the fork server until that fork is done; the worker's exit code, or what failed."""
    both_ready = threading.Barrier(2)
    forked = threading.Event()
    outcome: list[tuple[int | None, str | None]] = []

    def start_one() -> None:
        both_ready.wait()
        try:
            worker = ForkedWorker(config, log_path, entry=exit_at_once)
            outcome.append((worker.wait(60), None))
        except BaseException as e:  # (this thread's: the test reports it)
            outcome.append((None, repr(e)))
        finally:
            forked.set()

    def stop_while_starting() -> None:
        both_ready.wait()
        for _ in range(STOP_REQUESTS):
            if forked.is_set():
                break
            stop_server()

    threads = [threading.Thread(target=start_one), threading.Thread(target=stop_while_starting)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    return outcome[0]


def test_a_fork_server_stop_never_breaks_a_fork_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The supervisors of a partitioned queue share one fork server from threads of their
    # own: a partition that drained calls stop_server (it has no worker left) while the
    # next partition's worker is forked. That stop must wait for the fork, and the fork
    # must find the server whole: never EOF from a server killed under it, EBADF, a None
    # fd in sendfds, or "no pid".
    monkeypatch.chdir(REPO)  # the worker imports its entry from this module
    config = WorkerConfig(location=str(tmp_path / "qw"), run_dir=str(tmp_path / "run"), name="w0")
    try:
        outcomes = [
            _fork_while_stopping(config, tmp_path / "w0.log") for _ in range(STOP_RACE_ROUNDS)
        ]
    finally:
        stop_server()
    assert outcomes == [(0, None)] * STOP_RACE_ROUNDS
