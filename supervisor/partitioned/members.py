"""`qw up --partitions P --rebalance`: member processes whose partitions follow membership.

Where `supervisor.partitioned.run` gives each of its workers one partition for life (the simple
case: one `qw up` owns the queue), this supervisor starts N member processes
(`queue_worker.partitions.member`) that take their partitions from the queue's members topic, so
that
several `qw up --rebalance` — on one machine or many, on one log — share the partitions
among all their members, and rebalance when a member joins, dies or leaves.

What it does: enqueues the start tasks over the partitions; starts the members; restarts a
member that dies (after the restart policy's backoff; the new process is a new member);
follows every partition with a `Monitor` for the progress line and `--exit-when-drained`;
compacts each partition as `qw up` compacts a queue (`supervisor.run.compactor`);
drains on the first stop request (SIGTERM to every member: each finishes what it holds and
leaves) and kills on the second. The exit code: 0 drained, 130 killed, 1 when every member
died and none will be restarted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO

from logstore.location import shown
from queue_worker.partition_layout import Manifest, partition_location
from queue_worker.partitions.member import member_command
from queue_worker.worker.snapshot import WorkerSnapshot, WorkerState, read_snapshots
from supervisor.partitioned.names import tagged
from supervisor.run.compactor import Compactor, start_compactors
from supervisor.run.model import (
    Event,
    Orphan,
    QueueView,
    SlotState,
    SupervisorSnapshot,
    WorkerView,
    sum_queues,
)
from supervisor.run.monitor import Monitor
from supervisor.run.orphans import OrphanBook
from supervisor.run.status_file import remove_status, status_path, write_status
from supervisor.run.supervisor import (
    EVENTS_KEPT,
    EXIT_FORCED,
    EXIT_NO_WORKERS,
    EXIT_OK,
    SupervisorOptions,
    demo_payloads,
    describe_exit,
)

MICROS = 1_000_000

#: how often the watcher looks at the members and the partitions
TICK_S = 0.2
#: how often the status file is rewritten (what `qw status` reads)
STATUS_EVERY_S = 1.0
#: how long a kill waits for the watcher to read what the killed member held
KILL_READ_S = 2.0
#: deaths whose held tasks are kept for a kill to read
DEATHS_KEPT = 64


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
        self._compactors: list[Compactor] = []
        self._events: list[Event] = []
        #: the events kept for the dashboard (`events` hands each out once, to the lines)
        self.recent: deque[Event] = deque(maxlen=EVENTS_KEPT)
        #: each partition's orphans: the tasks a dead member's workers held there
        self.books: list[OrphanBook] = []
        self._mourned: set[int] = set()  # the pids of members whose death was recorded
        self._stops = 0
        self._draining = False
        self._lock = threading.Lock()
        #: member pid → the tasks (k:id) it held when it died, for the kill that waits for it
        self._deaths: dict[int, list[str]] = {}
        self._death_read = threading.Condition(self._lock)
        self._finished = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="qw-members", daemon=True)
        self._logs = options.run_dir / "logs"
        #: where the stats are served (`qw up --http`), for the status file
        self.http_address: str | None = None
        self._status_path = status_path(options.run_dir)
        self._next_status = 0.0

    def start(self) -> None:
        from queue_worker.partitions.queue import PartitionedQueue

        self.started_at = time.time()
        count = self.manifest.count
        self._monitors = [
            Monitor(partition_location(self.options.location, k, count)) for k in range(count)
        ]
        self.books = [OrphanBook() for _ in range(count)]
        opts = self.options
        self._compactors = start_compactors(  # each partition's settled history removed
            opts.location,
            count,
            opts.retention,
            lambda k, text: self._event(f"p{k} {text}"),
            segment_bytes=opts.segment_bytes,
            every_s=opts.compact_every_s,
        )
        self._logs.mkdir(parents=True, exist_ok=True)
        if self.options.tasks:
            with PartitionedQueue(self.options.location, self.manifest, self.options.fsync) as q:
                q.enqueue_many(demo_payloads(0, self.options.tasks))
        for slot in range(self.options.workers):
            self._spawn(slot)
        self._write_status()
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
            remove_status(self._status_path)
            for compactor in self._compactors:
                compactor.stop()
            for monitor in self._monitors:
                monitor.close()

    def _tick(self) -> None:
        now = time.monotonic()
        if now >= self._next_status:
            self._write_status()
            self._next_status = now + STATUS_EVERY_S
        for k, monitor in enumerate(self._monitors):
            try:
                for event in monitor.poll():  # takeovers, lost leases: tagged p<k>
                    self._remember(dataclasses.replace(event, text=tagged(event.text, k)))
            except Exception as e:  # a partition out of reach: say so, keep watching
                self.log_failure = str(e)
        with self._lock:
            for k, book in enumerate(self.books):
                book.update(self._monitors[k].takeover_of, now=time.time())
        drained = all(m.is_drained() for m in self._monitors)
        if self._stops >= 2:
            # (both stop requests may come before a tick: stopping, never restarting)
            self._draining = True
            self._signal_all(kill=True)
        elif (self._stops or (self.options.exit_when_drained and drained)) and not self._draining:
            self._draining = True
            why = "stop requested" if self._stops else "the queue is drained"
            self._event(f"draining ({why}): members finish their tasks and leave")
            self._signal_all(kill=False)
        for slot, proc in enumerate(self._procs):
            if proc is None or proc.poll() is None:
                continue
            if proc.pid not in self._mourned:
                self._mourned.add(proc.pid)
                self._died(slot, proc)
            restartable = self._restart_at[slot] is None and not self._draining
            if restartable and self.options.restart.enabled:
                self._restart_at[slot] = now + self.options.restart.backoff_s
            restart = self._restart_at[slot]
            if restart is not None and now >= restart and not self._draining:
                self._spawn(slot)
                new = self._procs[slot]
                again = _member_label(slot, new.pid) if new is not None else f"m{slot}"
                was = _member_label(slot, proc.pid)
                self._event(f"m{slot} restarted as {again} (was {was})", "restart")
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

    def _write_status(self) -> None:
        """What `qw status` says of this `qw up --rebalance` (`supervisor.cli.supervisor_lines`):
        its member processes are its workers."""
        members = [
            {
                "slot": slot,
                "name": f"m{slot}",
                "pid": None if proc is None else proc.pid,
                "alive": proc is not None and proc.poll() is None,
                "exit_code": None if proc is None else proc.returncode,
            }
            for slot, proc in enumerate(self._procs)
        ]
        status = {
            "pid": os.getpid(),
            "started_at": self.started_at,
            "updated_at": time.time(),
            "location": shown(self.options.location),
            "http": self.http_address,
            "draining": self._draining,
            "rebalance": True,
            "workers": members,
        }
        write_status(self._status_path, status)

    def _died(self, slot: int, proc: subprocess.Popen[bytes]) -> None:
        """A member has exited: the tasks its workers held go to the orphans (read once,
        after the fold has read everything the member wrote), and the death is an event."""
        code = proc.returncode
        views = [v for v in self.member_rows(slot, proc.pid) if v.worker_id]
        held: list[str] = []
        for view in views:
            k = view.partition
            if k is None:
                continue
            monitor = self._monitors[k]
            for event in monitor.catch_up():
                self._remember(dataclasses.replace(event, text=tagged(event.text, k)))
            tasks = monitor.tasks_held_by(view.worker_id or "")
            held += [f"{k}:{task}" for task, _ in tasks]
            dead = dataclasses.replace(view, state=SlotState.DEAD, exit_code=code)
            dead.died_at = time.time()
            with self._lock:
                self.books[k].died(
                    dead, [(t, lease.expiry / MICROS) for t, lease in tasks], now=time.time()
                )
        with self._death_read:
            self._deaths[proc.pid] = held
            while len(self._deaths) > DEATHS_KEPT:  # (those no kill asked for)
                del self._deaths[next(iter(self._deaths))]
            self._death_read.notify_all()
        holding = f" while {_holding(held)}" if held else ""
        kind = "death" if code else "info"
        # as a worker's death reads (w3·4711 killed by SIGKILL while holding task 5),
        # short enough for an 80-column feed to show the tasks
        self._event(f"{_member_label(slot, proc.pid)} {describe_exit(code)}{holding}", kind)

    def member_rows(self, slot: int, pid: int) -> list[WorkerView]:
        """The workers of member `slot` (process `pid`), one per partition it works, from
        the stats they publish (a member's workers are named m<slot>.p<k>)."""
        rows = []
        for snap in read_snapshots(self._run_dir):
            if snap.pid != pid or snap.state == WorkerState.EXITED:
                continue
            k = _partition_of(snap)
            if k is None:
                continue
            state = SlotState(snap.state.value) if snap.state is not None else SlotState.STARTING
            rows.append(
                WorkerView(slot, f"m{slot}.p{k}", snap.worker, pid, state, snap, partition=k)
            )
        return sorted(rows, key=lambda v: v.partition or 0)

    @property
    def _run_dir(self) -> Path:
        return self.options.run_dir

    def member_pids(self) -> list[int | None]:
        """Each member slot's process id now (None: not started, or gone)."""
        return [
            None if proc is None or proc.poll() is not None else proc.pid for proc in self._procs
        ]

    def kill_member(self, slot: int) -> str | None:
        """kill -9 member `slot`; what it did, or None when it does not run."""
        proc = self._procs[slot] if 0 <= slot < len(self._procs) else None
        if proc is None or proc.poll() is not None:
            return None
        at = time.time()  # the kill's time is the signal's: its line comes before the death's
        proc.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2.0)
        # What it held is read by the watcher once the process is gone and the partitions'
        # folds have read all it wrote (`_died`): the kill names the tasks the death does.
        with self._death_read:
            self._death_read.wait_for(lambda: proc.pid in self._deaths, KILL_READ_S)
            held = self._deaths.pop(proc.pid, [])
        text = f"kill -9 {_member_label(slot, proc.pid)}" + (f", {_holding(held)}" if held else "")
        self._remember(Event(at, "info", text))
        return text

    def monitors(self) -> list[Monitor]:
        return list(self._monitors)

    def board(self, pids: list[int | None]) -> tuple[list[Orphan], list[WorkerView], list[Event]]:
        """For the dashboard: every partition's orphans (named k:id), the dead members'
        rows still shown (less those of a process in `pids`), and the recent events."""
        with self._lock:
            orphans = [
                dataclasses.replace(o, partition=k)
                for k, book in enumerate(self.books)
                for o in book.orphans()
            ]
            departed = [d for book in self.books for d in book.departed(pids)]
            return orphans, departed, list(self.recent)

    def _signal_all(self, *, kill: bool) -> None:
        for proc in self._procs:
            if proc is not None and proc.poll() is None:
                proc.kill() if kill else proc.terminate()

    def _event(self, text: str, kind: str = "info") -> None:
        self._remember(Event(time.time(), kind, text))

    def _remember(self, event: Event) -> None:
        """Keep `event` in time order (a kill's line, said once its death was read, goes
        before that death's)."""
        with self._lock:
            for events in (self._events, self.recent):
                at = len(events)
                while at and events[at - 1].at > event.at:
                    at -= 1
                if isinstance(events, deque) and len(events) == events.maxlen:
                    if at == 0:
                        continue  # older than everything kept
                    events.popleft()
                    at -= 1
                events.insert(at, event)

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


def _member_label(slot: int, pid: int) -> str:
    """A member process as people see it: m1·6200 (its workers' rows are m1.p2·6200)."""
    return f"m{slot}·{pid}"


def _holding(held: list[str]) -> str:
    return f"holding task{'s' * (len(held) > 1)} {', '.join(held)}"


def _partition_of(snap: WorkerSnapshot) -> int | None:
    name = snap.name or ""
    head, sep, k = name.rpartition(".p")
    return int(k) if sep and head and k.isdigit() else None


__all__ = ["MemberSupervisor"]
