"""`qw up --partitions P --rebalance`: member processes whose partitions follow membership.

Where `supervisor.partitioned` gives each of its workers one partition for life (the simple
case: one `qw up` owns the queue), this supervisor starts N member processes
(`queue_worker.member`) that take their partitions from the queue's members topic, so that
several `qw up --rebalance` — on one machine or many, on one log — share the partitions
among all their members, and rebalance when a member joins, dies or leaves.

What it does: enqueues the start tasks over the partitions; starts the members; restarts a
member that dies (after the restart policy's backoff; the new process is a new member);
follows every partition with a `Monitor` for the progress line and `--exit-when-drained`;
drains on the first stop request (SIGTERM to every member: each finishes what it holds and
leaves) and kills on the second. The exit code: 0 drained, 130 killed, 1 when every member
died and none will be restarted.
"""

from __future__ import annotations

import subprocess
import threading
import time
from typing import IO

from queue_worker.member import member_command
from queue_worker.partitions import Manifest, partition_location
from supervisor.model import Event, QueueView, SupervisorSnapshot
from supervisor.monitor import Monitor
from supervisor.partitioned import sum_queues
from supervisor.supervisor import (
    EXIT_FORCED,
    EXIT_NO_WORKERS,
    EXIT_OK,
    SupervisorOptions,
    demo_payloads,
)

#: how often the watcher looks at the members and the partitions
TICK_S = 0.2


class MemberSupervisor:
    """N member processes of a partitioned queue, watched (see the module docstring)."""

    def __init__(self, options: SupervisorOptions, manifest: Manifest) -> None:
        self.options = options
        self.manifest = manifest
        self.started_at = 0.0
        self.log_failure: str | None = None
        self.exit_code: int | None = None
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * options.workers
        self._restart_at: list[float | None] = [None] * options.workers
        self._monitors: list[Monitor] = []
        self._events: list[Event] = []
        self._stops = 0
        self._draining = False
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="qw-members", daemon=True)
        self._logs = options.run_dir / "logs"

    def start(self) -> None:
        from queue_worker.partitioned import PartitionedQueue

        self.started_at = time.time()
        count = self.manifest.count
        self._monitors = [
            Monitor(partition_location(self.options.location, k, count)) for k in range(count)
        ]
        self._logs.mkdir(parents=True, exist_ok=True)
        if self.options.tasks:
            with PartitionedQueue(self.options.location, self.manifest, self.options.fsync) as q:
                q.enqueue_many(demo_payloads(0, self.options.tasks))
        for slot in range(self.options.workers):
            self._spawn(slot)
        self._watcher.start()

    def _spawn(self, slot: int) -> None:
        config = self.options.worker_config(f"m{slot}", slot, self.options.workers)
        log: IO[bytes]
        with open(self._logs / f"m{slot}.log", "ab") as log:  # the child keeps its copy
            self._procs[slot] = subprocess.Popen(
                member_command(config), stdout=subprocess.DEVNULL, stderr=log
            )
        self._restart_at[slot] = None

    # -- stopping ------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Safe from a signal handler: the first request drains, the second kills."""
        self._stops += 1

    def stop_now(self) -> None:
        self._stops += 2

    def wait(self, timeout: float | None = None) -> bool:
        return self._finished.wait(timeout)

    # -- watching ------------------------------------------------------------------------------

    def _watch(self) -> None:
        try:
            while not self._finished.is_set():
                self._tick()
                self._finished.wait(TICK_S)
        finally:
            for monitor in self._monitors:
                monitor.close()

    def _tick(self) -> None:
        now = time.monotonic()
        for monitor in self._monitors:
            try:
                monitor.poll()
            except Exception as e:  # a partition out of reach: say so, keep watching
                self.log_failure = str(e)
        drained = all(m.is_drained() for m in self._monitors)
        if self._stops >= 2:
            self._signal_all(kill=True)
        elif (self._stops or (self.options.exit_when_drained and drained)) and not self._draining:
            self._draining = True
            why = "stop requested" if self._stops else "the queue is drained"
            self._event(f"draining ({why}): members finish their tasks and leave")
            self._signal_all(kill=False)
        for slot, proc in enumerate(self._procs):
            if proc is None or proc.poll() is None:
                continue
            if self._restart_at[slot] is None and not self._draining:
                self._event(f"member m{slot} (pid {proc.pid}) exited with {proc.returncode}")
                if self.options.restart.enabled:
                    self._restart_at[slot] = now + self.options.restart.backoff_s
            restart = self._restart_at[slot]
            if restart is not None and now >= restart and not self._draining:
                self._spawn(slot)
                self._event(f"member m{slot} restarted")
        alive = [p for p in self._procs if p is not None and p.poll() is None]
        if alive:
            return
        if self._draining:
            self.exit_code = EXIT_FORCED if self._stops >= 2 else EXIT_OK
            self._finished.set()
        elif not self.options.restart.enabled:
            self._event("every member is gone and none will be restarted")
            self.exit_code = EXIT_NO_WORKERS
            self._finished.set()

    def _signal_all(self, *, kill: bool) -> None:
        for proc in self._procs:
            if proc is not None and proc.poll() is None:
                proc.kill() if kill else proc.terminate()

    def _event(self, text: str) -> None:
        with self._lock:
            self._events.append(Event(time.time(), "info", text))

    # -- what the progress lines show ----------------------------------------------------------

    def events(self) -> list[Event]:
        with self._lock:
            events, self._events = self._events, []
        return events

    def partition_queues(self) -> list[QueueView]:
        return [m.queue_view() for m in self._monitors]

    def snapshot(self) -> SupervisorSnapshot:
        return SupervisorSnapshot(
            location=self.options.location,
            workers=[],
            queue=sum_queues(self.partition_queues()),
            events=[],
            draining=self._draining,
            started_at=self.started_at,
        )

    def status_note(self) -> str:
        alive = sum(1 for p in self._procs if p is not None and p.poll() is None)
        return f"members {alive}/{len(self._procs)}"


__all__ = ["MemberSupervisor"]
