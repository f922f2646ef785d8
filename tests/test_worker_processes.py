"""Real worker processes (``python -m queue_worker.process``) on the file log: draining a
queue together, redistribution after kill -9, dying with the supervisor, SIGTERM."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from logstore import open_log
from queue_worker.fleet import WorkerProcesses as Fleet
from queue_worker.process import EXIT_OK, EXIT_ORPHANED, EXIT_TERMINATED
from queue_worker.producer import Queue
from queue_worker.protocol.records import Claim, Done
from queue_worker.protocol.state import ClaimState, Verdict
from queue_worker.topics import CLAIMS_TOPIC, ClaimsFollower
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.stats import read_all
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path, env=ENV, cwd=tmp_path) as f:
        yield f


def config_for(data_dir: Path, run_dir: Path, name: str, **settings: Any) -> WorkerConfig:
    return WorkerConfig(str(data_dir), str(run_dir), name=name, **settings)


def fold_claims(data_dir: Path) -> tuple[ClaimState, list[tuple[Any, Verdict]]]:
    with open_log(data_dir, CLAIMS_TOPIC) as log:
        follower = ClaimsFollower(log.start)
        folded = [follower.apply(e) for e in log.iter_from(log.start)]
    return follower.state, [(record, outcome.verdict) for outcome, record in folded]


def snapshot_of(run_dir: Path, pid: int) -> dict[str, Any] | None:
    for snapshot in read_all(run_dir):
        if snapshot.get("pid") == pid:
            return snapshot
    return None


def wait_for_task_in_hand(run_dir: Path, pids: list[int], task: int) -> int:
    """The pid of the worker that reports `task` in hand."""

    def holder() -> int | None:
        for pid in pids:
            snap = snapshot_of(run_dir, pid)
            if snap is not None and snap.get("current_task") == task:
                return pid
        return None

    return int(str(wait_until(holder, 60, f"a worker to report task {task} in hand")))


def gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def test_four_workers_drain_200_tasks_each_done_exactly_once(
    fleet: Fleet, data_dir: Path, tmp_path: Path
) -> None:
    with Queue(data_dir) as queue:
        queue.enqueue_many([{"n": n} for n in range(200)])
    run_dir = tmp_path / "run"
    procs = [
        fleet.start(
            config_for(
                data_dir, run_dir, f"w{n}", slot=n, slots=4, work_ms=2, exit_when_drained=True
            )
        )
        for n in range(4)
    ]
    for n, proc in enumerate(procs):
        assert proc.wait(180) == EXIT_OK, fleet.stderr(f"w{n}")
    state, records = fold_claims(data_dir)
    done = Counter(r.task for r, v in records if isinstance(r, Done) and v is Verdict.DONE)
    assert sorted(done) == list(range(200))
    assert set(done.values()) == {1}
    assert not [v for _, v in records if v is Verdict.STALE_DONE]
    assert state.done_count == 200 and state.held_count == 0
    snapshots = read_all(run_dir)
    assert len(snapshots) == 4
    assert sum(s["finished"] for s in snapshots) == 200
    assert {s["exit_reason"] for s in snapshots} == {"queue drained"}


def test_a_task_held_by_a_killed_worker_is_taken_over_and_finished(
    fleet: Fleet, data_dir: Path, tmp_path: Path
) -> None:
    with Queue(data_dir) as queue:
        queue.enqueue({"work_ms": 1500})
    run_dir = tmp_path / "run"
    procs = {
        proc.pid: proc
        for proc in (
            fleet.start(config_for(data_dir, run_dir, f"w{n}", lease_s=1.0, exit_when_drained=True))
            for n in range(2)
        )
    }
    victim = wait_for_task_in_hand(run_dir, list(procs), 0)
    os.kill(victim, signal.SIGKILL)
    (survivor,) = set(procs) - {victim}
    assert procs[survivor].wait(60) == EXIT_OK
    state, records = fold_claims(data_dir)
    assert state.is_done(0)
    takeovers = [r for r, v in records if v is Verdict.TAKEOVER]
    dones = [r for r, v in records if v is Verdict.DONE]
    assert len(takeovers) == 1 and len(dones) == 1
    assert isinstance(takeovers[0], Claim)
    assert takeovers[0].worker == dones[0].worker
    assert takeovers[0].worker.split("-")[1] == str(survivor)


PARENT_SCRIPT = """
import os, subprocess, sys, time
from queue_worker.worker.config import WorkerConfig
data_dir, run_dir = sys.argv[1], sys.argv[2]
for n in range(2):
    config = WorkerConfig(data_dir, run_dir, name=f"child{n}", parent_pid=os.getpid())
    command = [sys.executable, "-m", "queue_worker.process", config.to_json()]
    child = subprocess.Popen(command)
    print(child.pid, flush=True)
time.sleep(3600)
"""


def test_workers_die_with_their_parent(data_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_SCRIPT, str(data_dir), str(run_dir)],
        stdout=subprocess.PIPE,
        env=ENV,
        text=True,
    )
    try:
        assert parent.stdout is not None
        children = [int(parent.stdout.readline()) for _ in range(2)]
        for pid in children:
            wait_until(functools.partial(snapshot_of, run_dir, pid), 60, f"worker {pid} to start")
        parent.kill()
        parent.wait(30)
        for pid in children:
            wait_until(functools.partial(gone, pid), 10, f"worker {pid} to exit with its parent")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)


def test_a_worker_whose_parent_is_already_gone_exits(
    fleet: Fleet, data_dir: Path, tmp_path: Path
) -> None:
    ghost = subprocess.Popen([sys.executable, "-c", "pass"])
    ghost.wait(30)
    proc = fleet.start(config_for(data_dir, tmp_path / "run", "w0", parent_pid=ghost.pid))
    assert proc.wait(60) == EXIT_ORPHANED


def test_sigterm_finishes_the_task_in_hand_and_exits_cleanly(
    fleet: Fleet, data_dir: Path, tmp_path: Path
) -> None:
    with Queue(data_dir) as queue:
        queue.enqueue_many([{"work_ms": 1000}, {"work_ms": 1000}, {"work_ms": 1000}])
    run_dir = tmp_path / "run"
    proc = fleet.start(config_for(data_dir, run_dir, "w0", pick="first"))
    wait_for_task_in_hand(run_dir, [proc.pid], 0)
    proc.send_signal(signal.SIGINT)  # ignored: the supervisor owns Ctrl-C
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == EXIT_OK, fleet.stderr("w0")
    state, records = fold_claims(data_dir)
    assert state.is_done(0)
    assert state.held_count == 0
    assert [type(r).__name__ for r, _ in records] == ["Claim", "Done"]  # no new claims
    snapshot = snapshot_of(run_dir, proc.pid)
    assert snapshot is not None
    assert (snapshot["state"], snapshot["exit_reason"]) == ("exited", "drained")


def test_a_second_sigterm_exits_at_once(fleet: Fleet, data_dir: Path, tmp_path: Path) -> None:
    with Queue(data_dir) as queue:
        queue.enqueue({"work_ms": 600_000})
    run_dir = tmp_path / "run"
    proc = fleet.start(config_for(data_dir, run_dir, "w0"))
    wait_for_task_in_hand(run_dir, [proc.pid], 0)
    proc.send_signal(signal.SIGTERM)
    wait_until(
        lambda: (snapshot_of(run_dir, proc.pid) or {}).get("state") == "draining",
        30,
        "the worker to report draining",
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == EXIT_TERMINATED
    state, records = fold_claims(data_dir)
    assert not state.is_done(0)
    assert [type(r).__name__ for r, _ in records] == ["Claim"]


def test_a_bad_config_exits_with_one_line_on_stderr(fleet: Fleet, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "queue_worker.process",
            '{"location": "x", "run_dir": "y", "pick": 1}',
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr == "qw worker: invalid config: worker config 'pick' is 1; expected a string\n"
    )
