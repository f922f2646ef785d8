"""`--exit-when-drained`: an idle worker ends its run at another worker's last DONE.

A worker that was idle but for a task another held waited on the tasks log, which that
DONE does not touch, and saw the queue drained only at its next poll: every `qw up
--exit-when-drained` with two workers or more ended up to a poll late. Real file logs in
tmp_path; the idle worker is a process of its own, the holder runs in this one (so that
the test decides when its task ends).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from queue_worker.fleet import WorkerProcesses
from queue_worker.producer import Queue
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.loop import Worker
from queue_worker.worker.snapshot import WorkerState, read_snapshots
from tests.helpers import wait_until

# Long enough that a worker waiting for its poll or for the holder's lease would outlast
# the test's deadline: only the DONE itself can end the idle worker's run in time.
NEVER_S = 3600.0


def test_an_idle_worker_ends_its_run_at_the_holders_done_not_at_its_poll(tmp_path: Path) -> None:
    data, run = tmp_path / "data", tmp_path / "run"
    with Queue(data, fsync="none") as queue:
        queue.enqueue("the last task")
    holding = threading.Event()
    release = threading.Event()

    def holds(payload: Any) -> Any:
        holding.set()
        release.wait(60)
        return payload

    def config(slot: int) -> WorkerConfig:
        return WorkerConfig(
            str(data),
            str(run),
            name=f"w{slot}",
            slot=slot,
            slots=2,
            exit_when_drained=True,
            fsync="none",
            idle_poll_s=NEVER_S,
            lease_s=NEVER_S,
        )

    ended: list[str] = []
    with Worker(config(0), handler=holds) as holder, WorkerProcesses(tmp_path / "logs") as fleet:
        thread = threading.Thread(target=lambda: ended.append(holder.run()), daemon=True)
        thread.start()
        assert holding.wait(30), "the holder never started the task"
        idle = fleet.start(config(1))
        wait_until(
            lambda: any(
                s.name == "w1" and s.state is WorkerState.IDLE for s in read_snapshots(run)
            ),
            what="the second worker idle",
        )
        release.set()
        thread.join(30)
        assert ended == ["queue drained"]
        assert idle.wait(timeout=30) == 0, fleet.stderr_tail(idle)
