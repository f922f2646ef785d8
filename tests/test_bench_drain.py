"""The benchmarks' drain (bench.queue_bench.qw_drain, bench.common.run_fleet) both ways of
starting its workers: forked from the preloaded fork server as `qw up` forks them (the
default), or each a fresh interpreter (Popen). A tiny drain each way, checked exactly-once;
the forked workers really are the fork server's children, and the server is gone after."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bench.common import STARTS, BenchError, Start, fleet_configs, fold_claims, run_fleet
from bench.queue_bench import qw_drain
from queue_worker.producer import Queue

TASKS = 300


def note_parent(payload: Any) -> None:
    """A handler that says which process is its worker's parent (on the worker's stdout)."""
    print(f"parent {os.getppid()}", flush=True)


@pytest.mark.parametrize("start", STARTS)
def test_a_tiny_drain_is_done_exactly_once_either_way(tmp_path: Path, start: Start) -> None:
    run = qw_drain(tmp_path, 2, TASKS, start=start)  # folds and checks exactly-once itself
    assert run.start == start
    assert run.claims >= TASKS and run.span_s > 0
    assert sorted(str(s.name) for s in run.snapshots) == ["w0", "w1"]
    assert sum(s.finished for s in run.snapshots) == TASKS
    assert run.cpu_s > 0  # the workers were waited for: their CPU is this process's children's
    assert (run.server_cpu_s > 0) == (start == "fork")


def test_forked_workers_are_the_fork_servers_children(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Queue(data, fsync="none") as queue:
        queue.enqueue_many([None] * 20)
    configs = fleet_configs(data, tmp_path / "run", 2, handler="tests.test_bench_drain:note_parent")
    run = run_fleet(configs, tmp_path / "logs", start="fork")
    assert run.start == "fork" and run.server_pid is not None
    assert run.server_pid != os.getpid()
    parents = {
        line
        for config in configs
        for line in (tmp_path / "logs" / f"{config.name}.log").read_text().splitlines()
        if line.startswith("parent ")
    }
    assert parents == {f"parent {run.server_pid}"}  # not this process: forked by the server
    fold_claims(data).check_exactly_once(20)
    with pytest.raises(ProcessLookupError):  # stopped and reaped: nothing left behind
        os.kill(run.server_pid, 0)


def test_a_forked_worker_that_fails_fails_the_run_with_its_last_words(tmp_path: Path) -> None:
    data = tmp_path / "data"
    Queue(data, fsync="none").close()
    configs = fleet_configs(data, tmp_path / "run", 1, handler="qw_no_such_module:handler")
    with pytest.raises(
        BenchError, match=r"worker w0 \(pid \d+\) exited with 2: .*qw_no_such_module"
    ):
        run_fleet(configs, tmp_path / "logs", start="fork")
