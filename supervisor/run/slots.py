"""A worker slot (w0, w1, …): the process that fills it now, what it last published, and when
it may be restarted.

`RestartPolicy` says when a dead worker is started again; `Slot.view()` is the slot as the
dashboard sees it (`supervisor.run.model.WorkerView`). The Supervisor owns the slots and changes
them under its lock; nothing here starts or signals a process.
"""

from __future__ import annotations

import os
import signal
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from queue_worker.process import EXIT_TIME_LIMIT
from queue_worker.worker.snapshot import WorkerSnapshot, WorkerState
from supervisor.run.model import SlotState, WorkerView

if TYPE_CHECKING:
    import psutil

    from supervisor.run.forked import WorkerHandle


@dataclass(frozen=True)
class RestartPolicy:
    """When a dead worker is started again: after a backoff that doubles while workers
    keep dying young, and not at all once a slot restarts too often (a crash loop)."""

    enabled: bool = True
    backoff_s: float = 0.5  # the first restart's delay
    backoff_max_s: float = 10.0
    healthy_after_s: float = 10.0  # a worker that lived this long resets the backoff
    storm_limit: int = 5  # restarts of one slot within storm_window_s before it stays dead
    storm_window_s: float = 30.0

    def delay(self, young_deaths: int) -> float:
        """The delay before a restart, after `young_deaths` deaths in a row (≥ 1)."""
        return float(min(self.backoff_max_s, self.backoff_s * 2 ** max(0, young_deaths - 1)))


def code_is_time_limit(code: int | None) -> bool:
    """Did the worker end itself because its task ran past its time limit? Such an exit is
    not a crash: the worker wrote its task's FAIL first, and the restart neither waits for a
    backoff nor counts toward the storm guard (the task's max_attempts bounds them)."""
    return code == EXIT_TIME_LIMIT


def describe_exit(code: int) -> str:
    """How a process ended, as the feed says it: "killed by SIGKILL", "exited with code 1"
    (a negative code is the signal that ended it, from `WorkerHandle.poll`)."""
    if code_is_time_limit(code):
        return f"ended by a task's time limit (code {code})"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


@dataclass
class Slot:
    """One worker position (w0, w1, …) and the process that currently fills it."""

    index: int
    name: str
    process: WorkerHandle | None = None  # forked (supervisor.run.forked), or a subprocess
    pid: int | None = None
    worker_id: str | None = None
    launched_at: float = 0.0  # monotonic
    stats: WorkerSnapshot = field(default_factory=WorkerSnapshot)
    stats_mtime: int = 0  # of the snapshot file last read (ns)
    ps: psutil.Process | None = None
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    paused: bool = False
    exit_code: int | None = None
    died_at: float | None = None  # wall clock
    restarts: int = 0
    restart_times: deque[float] = field(default_factory=deque)  # monotonic
    young_deaths: int = 0
    restart_due: float | None = None  # monotonic
    retiring: bool = False  # removed by the user: drain it, never restart it
    lost: bool = False  # died and will not be restarted (no restart policy, or a storm)
    clean_exit: bool = False  # the last process exited as asked (drained or removed)

    @property
    def alive(self) -> bool:
        return self.process is not None

    def view(self, draining: bool) -> WorkerView:
        """The slot for the dashboard: the worker's own state while it runs, unless paused or
        being drained; after it ends, "exited" when it was asked to, else "dead"."""
        if self.alive:
            state = SlotState((self.stats.state or WorkerState.STARTING).value)
            if self.paused:
                state = SlotState.PAUSED
            elif (draining or self.retiring) and state is not SlotState.EXITED:
                state = SlotState.DRAINING
        elif self.exit_code is None:
            state = SlotState.STARTING
        else:
            state = SlotState.EXITED if self.clean_exit else SlotState.DEAD
        return WorkerView(
            slot=self.index,
            name=self.name,
            worker_id=self.worker_id,
            pid=self.pid,
            state=state,
            stats=self.stats,
            cpu_percent=self.cpu_percent if self.alive else 0.0,
            rss_bytes=self.rss_bytes,
            exit_code=self.exit_code,
            died_at=self.died_at,
            restarts=self.restarts,
        )


def last_line(path: Path, tail_bytes: int = 4096) -> str | None:
    """The last non-empty line of a worker's log (why it exited, usually)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return next((line.strip() for line in reversed(lines) if line.strip()), None)
