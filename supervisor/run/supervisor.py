"""The Supervisor: starts the worker processes, watches them, restarts the dead, drains.

Each worker is forked from a fork server that has already imported the worker code
(`supervisor.run.forked`: a few milliseconds, not a fresh interpreter), in a session of its
own (so a Ctrl-C in the terminal reaches the supervisor only, which then drains the
workers in order). A worker dies with the fork server, which dies with the supervisor, so
`kill -9` of the supervisor leaves no orphan behind.

Threads:
  the caller's   `start()`, `snapshot()`, the dashboard's controls, `wait()`
  the watcher    every TICK_S: reaps exits, restarts due slots, acts on stop requests,
                 decides when the run is over; every REFRESH_S: reads the workers' stats
                 snapshots and folds the logs (`Monitor`); every SAMPLE_S: samples CPU and
                 memory, writes the status file `qw status` reads
  the publisher  optional: the demo tasks (`DemoPublisher`)

Signal handlers only call `request_stop()`, which bumps a counter and takes no lock (a
handler runs on the main thread, which may hold the lock at that moment); the watcher acts
on it within one tick: the first request drains, the second kills every worker at once.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_for_any
from pathlib import Path
from typing import Final

from logstore import LogError
from logstore.location import is_redis_url
from queue_worker.compaction.settled import Retention
from queue_worker.names import worker_label
from queue_worker.process import EXIT_CONFIG as WORKER_EXIT_CONFIG
from queue_worker.process import EXIT_LOG_UNUSABLE as WORKER_EXIT_LOG_UNUSABLE
from queue_worker.protocol.state import Lease
from queue_worker.worker.config import DEFAULT_DRAIN_TIMEOUT_S, DEFAULT_LEASE_S, WorkerConfig
from queue_worker.worker.snapshot import WorkerSnapshot, read_snapshot_file
from supervisor.run.compactor import COMPACT_EVERY_S, Compactor, start_compactor
from supervisor.run.demo_traffic import demo_payloads as demo_payloads  # (also qw enqueue's)
from supervisor.run.forked import start_worker, stop_server
from supervisor.run.model import Event, QueueView, SupervisorSnapshot
from supervisor.run.monitor import MICROS, Monitor, TaskInfo
from supervisor.run.ops_recorder import OpsRecorder, now_us
from supervisor.run.orphans import OrphanBook
from supervisor.run.pausing import stop_outside_appends
from supervisor.run.run_files import is_running_worker, read_status_files
from supervisor.run.slots import RestartPolicy, Slot, code_is_time_limit, describe_exit, last_line
from supervisor.run.status_file import remove_status, status_path, write_status

#: exit codes of `qw up`
EXIT_OK: Final = 0  # drained: every worker finished what it held and exited
EXIT_NO_WORKERS: Final = 1  # every worker died and none will be restarted
EXIT_FORCED: Final = 130  # stopped by a second signal: workers were killed mid-task
EXIT_LOG_ERROR: Final = 3  # a log could not be read on (damaged, or not this queue's)

DEMO_HANDLER: Final = "queue_worker.worker.handlers:demo"
#: how often the watcher thread acts on requests (a worker's end wakes it at once)
TICK_S: Final = 0.1
#: how often it reads the workers' stats files and the logs (the dashboard draws 4 a second)
REFRESH_S: Final = 0.25
#: …and with exit_when_drained, how often it looks whether the queue is drained
DRAINED_CHECK_S: Final = 0.02
#: …and how often an idle worker looks again (a DONE by another does not wake it)
DRAINED_IDLE_POLL_S: Final = 0.05
#: how often CPU% and RSS are sampled, and the status file rewritten
SAMPLE_S: Final = 1.0
#: events kept for the feed
EVENTS_KEPT: Final = 200
#: how long `p` may take to catch a worker outside its appends before it gives up
PAUSE_PATIENCE_S: Final = 1.0


@dataclass(frozen=True)
class SupervisorOptions:
    """Everything `qw up` decides; `worker_config` turns it into one worker's config."""

    data_dir: Path  # holds run/ (stats, status files, worker logs) and, by default, the logs
    location: str  # the logs: the data directory, or a redis:// URL
    workers: int = 4
    handler: str = DEMO_HANDLER
    work_ms: int = 400
    lease_s: float = DEFAULT_LEASE_S
    pick: str | None = None  # None: the default (WorkerConfig.pick)
    fsync: str = "commit"
    max_attempts: int = 3  # winning claims a task gets before a failure makes it dead
    backoff_s: float = 1.0  # the first retry's backoff; doubles per attempt, with jitter
    task_timeout_s: float | None = None  # an attempt that runs longer fails; its worker ends
    drain_timeout_s: float | None = DEFAULT_DRAIN_TIMEOUT_S  # a drain waits this long at most
    tasks: int = 0  # demo tasks enqueued at start
    rate: float = 0.0  # demo tasks per second from a publisher thread (0: none)
    exit_when_drained: bool = False
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    host: str | None = None  # the host the workers report (None: this machine's name)
    # the file log's segment size from now on (None: the size the logs have)
    segment_bytes: int | None = None
    # how long settled history is kept: compacted as the run goes (None: never compacted)
    retention: Retention | None = field(default_factory=Retention)
    compact_every_s: float = COMPACT_EVERY_S

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "run"

    def worker_config(self, name: str, slot: int, slots: int) -> WorkerConfig:
        return WorkerConfig(
            location=self.location,
            run_dir=str(self.run_dir),
            name=name,
            handler=self.handler,
            work_ms=self.work_ms,
            lease_s=self.lease_s,
            pick=self.pick,
            slot=slot,
            slots=slots,
            fsync=self.fsync,
            max_attempts=self.max_attempts,
            backoff_s=self.backoff_s,
            task_timeout_s=self.task_timeout_s,
            drain_timeout_s=self.drain_timeout_s,
            parent_pid=os.getpid(),
            host=self.host,
            # Workers exit as soon as they see the queue drained, and an idle one looks
            # again within DRAINED_IDLE_POLL_S (not idle_poll_s): the run ends promptly.
            exit_when_drained=self.exit_when_drained,
            **({"idle_poll_s": DRAINED_IDLE_POLL_S} if self.exit_when_drained else {}),
        )


def default_demo_rate(workers: int, work_ms: int) -> float:
    """Tasks per second that `workers` demo workers keep up with: 80% of their capacity."""
    return round(min(workers * 1000 / max(work_ms, 5) * 0.8, 500.0), 1)


class DemoPublisher(threading.Thread):
    """Enqueues demo tasks at a steady rate until stopped."""

    def __init__(
        self,
        location: str,
        fsync: str,
        rate: float,
        on_error: Callable[[str], None],
        first_number: int = 0,
    ) -> None:
        super().__init__(name="qw-demo-publisher", daemon=True)
        self.location, self.fsync, self.rate = location, fsync, rate
        self.first_number = first_number  # payloads go on counting after the start tasks
        self.sent = 0
        self.first_id: int | None = None  # the id of the first task it enqueued
        self._on_error = on_error
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        from queue_worker.producer import Queue

        interval = min(1.0, max(0.05, 1.0 / self.rate))
        began = time.monotonic()
        try:
            with Queue(self.location, self.fsync) as queue:
                while not self._stop_event.wait(interval):
                    due = int(self.rate * (time.monotonic() - began)) - self.sent
                    if due > 0:
                        ids = queue.enqueue_many(demo_payloads(self.first_number + self.sent, due))
                        if self.first_id is None:
                            self.first_id = ids[0]
                        self.sent += due
        except Exception as e:  # the demo stops; the workers and the dashboard go on
            self._on_error(f"the demo publisher stopped: {type(e).__name__}: {e}")


class Supervisor:
    """Runs `options.workers` worker processes on one location until drained or stopped."""

    def __init__(self, options: SupervisorOptions) -> None:
        self.options = options
        self.location = options.location
        self.started_at = 0.0
        self.http_address: str | None = None  # set by whoever serves the stats (status file)
        self._slots = [Slot(i, f"w{i}") for i in range(options.workers)]
        self._events: deque[Event] = deque(maxlen=EVENTS_KEPT)
        self._events_total = 0
        self._queue = QueueView()
        self._monitor: Monitor | None = None
        self._orphans = OrphanBook()
        # pid → the tasks a worker held when `kill` killed it, read once (see `_held_at_death`)
        self._killed_holding: dict[int, list[tuple[int, float]]] = {}
        self._publisher: DemoPublisher | None = None
        self._compactor: Compactor | None = None
        self._selected: int | None = None
        self._draining = False
        self._drain_requested = False
        self._stop_requests = 0  # bumped by signal handlers: no lock
        self._forced = False
        self._exit_code: int | None = None
        self._finished = threading.Event()
        #: why the run stopped on a log it could not read (the file and byte offset), if so
        self.log_failure: str | None = None
        self._lock = threading.RLock()
        self._watcher = threading.Thread(target=self._watch, name="qw-watcher", daemon=True)
        self._next_sample = 0.0
        self._next_refresh = 0.0  # when the logs are read next
        self._next_view = 0.0  # when the counts and stats files are refreshed next
        self._status_path = status_path(options.run_dir)
        # the first id of this run's own start tasks; what lies below it an earlier run left
        # (said once the watcher has read the logs: `_say_resumed`)
        self._own_first: int | None = None
        self._resume_said = False
        self._logs_dir = options.run_dir / "logs"
        # kills, pauses, deaths: the ops topic of the queue `start` opens (never a new one)
        self._ops = OpsRecorder(options.location, create=False)

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Enqueue the start tasks, start every worker, and begin watching."""
        from queue_worker.producer import Queue

        opts = self.options
        self.started_at = time.time()
        # The logs first: a data location that cannot be used is named by the LogError.
        self._monitor = Monitor(opts.location)
        for directory in (opts.run_dir, self._status_path.parent, self._logs_dir):
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                self._monitor.close()
                raise LogError(f"{directory}: cannot create it: {e.strerror or e}") from e
        # Before anything appends: every record of both logs whole and valid, and a claims
        # log that closes no task the tasks log lacks. Writing past damage would bury it.
        try:
            self._monitor.check_start(count_all=False)  # the watcher counts the rest
        except BaseException:
            self._monitor.close()
            raise
        self._start_segments()
        if opts.tasks:
            with Queue(opts.location, opts.fsync) as queue:
                ids = queue.enqueue_many(demo_payloads(0, opts.tasks))
            self._own_first = ids[0]
            self._event("info", f"enqueued {len(ids)} demo tasks ({ids[0]}–{ids[-1]})")
        with self._lock:
            # Slot 0 last: it saves the fold checkpoint at its exit, with filelock, which the
            # fork server imports only once its first worker is forked (forkserver_init).
            for slot in [*self._slots[1:], *self._slots[:1]]:
                self._spawn(slot)
        if opts.rate > 0:
            self._publisher = DemoPublisher(
                opts.location,
                opts.fsync,
                opts.rate,
                lambda text: self._event("info", text),
                first_number=opts.tasks,
            )
            self._publisher.start()
            self._event("info", f"publishing {opts.rate:g} demo tasks/s")
        elif not opts.tasks:  # say why an empty queue stays empty
            qw = qw_command()
            self._event(
                "info", f"no demo tasks: {qw} enqueue adds yours ({qw} up --demo adds some)"
            )
        self._write_status()
        self._watcher.start()

    def _start_segments(self) -> None:
        """A file log's segment size (kept by the logs for every writer) and the compactor
        (settled history removed as the run goes, file segments or Redis stream entries:
        see supervisor/run/compactor.py)."""
        opts = self.options
        self._compactor = start_compactor(
            opts.location,
            opts.retention,
            lambda text: self._event("info", text),
            segment_bytes=opts.segment_bytes,
            every_s=opts.compact_every_s,
        )

    def request_stop(self) -> None:
        """Safe from a signal handler: the first request drains, the second kills."""
        self._stop_requests += 1

    def stop_now(self) -> None:
        """Kill every worker at once (what a second stop request does)."""
        self._stop_requests += 2

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the supervisor has finished (or `timeout`); True if finished."""
        return self._finished.wait(timeout)

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    @property
    def exit_code(self) -> int | None:
        return self._exit_code

    # -- the watcher ---------------------------------------------------------------------------

    def _watch(self) -> None:
        last_error = ""
        while not (self._finished.wait(TICK_S) if last_error else self._wait_for_tick()):
            try:
                self._tick()
                last_error = ""
            except Exception as e:  # the watcher must outlive any one bad tick
                text = f"supervisor error: {type(e).__name__}: {e}"
                if text != last_error:  # once, not ten times a second
                    self._event("info", text)
                last_error = text

    def _wait_for_tick(self) -> bool:
        """Wait TICK_S, or less: until a worker ends (reaped at once, and restarted as soon
        as it is due), a restart is due, or the next refresh; True once finished."""
        with self._lock:
            processes = [slot.process for slot in self._slots if slot.process is not None]
            due = [slot.restart_due for slot in self._slots if slot.restart_due is not None]
        timeout = min([TICK_S, *(d - time.monotonic() for d in due)])
        if self.options.exit_when_drained:  # the queue is looked at more often: see _tick
            timeout = min(timeout, self._next_refresh - time.monotonic())
        sentinels = [p.sentinel for p in processes if p.sentinel is not None]
        if sentinels:
            wait_for_any(sentinels, max(0.0, timeout))
        else:
            self._finished.wait(max(0.0, timeout))
        return self._finished.is_set()

    def _tick(self) -> None:
        now = time.monotonic()
        monitor = self._monitor
        assert monitor is not None
        # Processes are polled every tick (cheap); files only as often as anyone looks.
        poll = now >= self._next_refresh
        # The counts and the workers' stats files every REFRESH_S; with --exit-when-drained
        # the logs are read, and the queue looked at, every DRAINED_CHECK_S besides (the
        # supervisor exits as soon as it sees the queue drained; the view and the stats files
        # are not needed as often, and cost as much as the rest of the look).
        refresh = poll and now >= self._next_view
        if poll:
            self._next_refresh = now + (
                DRAINED_CHECK_S if self.options.exit_when_drained else REFRESH_S
            )
            try:
                events = monitor.poll()  # outside the lock: catching up may take a while
            except LogError as e:  # damage, a reset server: the run stops (_log_failed)
                self._log_failed(str(e))
                events = []
        if refresh:
            self._next_view = now + REFRESH_S
            queue = monitor.queue_view()
        with self._lock:
            if poll:
                for event in events:
                    self._add_event(event)
                self._orphans.update(monitor.takeover_of, now=time.time())
                if not self._resume_said and monitor.caught_up:
                    self._say_resumed(monitor)
            if refresh:
                self._queue = queue
            if self._stop_requests >= 2 and not self._forced:
                self._kill_all_now()
            elif (self._stop_requests or self._drain_requested) and not self._draining:
                self._begin_drain("stop requested" if self._stop_requests else "drain requested")
            elif self.options.exit_when_drained and not self._draining and monitor.is_drained():
                self._begin_drain("the queue is drained")
            for slot in self._slots:
                self._reap(slot, now)
            if not self._draining:
                for slot in self._slots:
                    if slot.restart_due is not None and now >= slot.restart_due:
                        self._restart(slot, now)
            if refresh:
                self._refresh_stats()
            if now >= self._next_sample:
                self._next_sample = now + SAMPLE_S
                self._sample_processes()
                self._write_status()
            self._check_finished()

    def _log_failed(self, error: str) -> None:
        """The monitor cannot read the logs on (damage, a reset server), or a worker ended
        on a log it cannot use: stop the run. The workers meet the same log; the drain
        restarts none of them, and the run ends with EXIT_LOG_ERROR once they are gone
        (`_check_finished`); a second stop request still kills them at once, as in any
        drain."""
        with self._lock:
            if self.log_failure is None:
                self.log_failure = error
                self._event("info", f"stopping: {error}")
                if not self._draining:
                    self._begin_drain("a log cannot be read")

    def _check_finished(self) -> None:
        if any(slot.alive for slot in self._slots):
            return
        if self.log_failure is not None:
            self._finish(EXIT_LOG_ERROR)
        elif self._draining:
            self._finish(EXIT_FORCED if self._forced else EXIT_OK)
        elif any(s.lost for s in self._slots) and all(s.restart_due is None for s in self._slots):
            self._event("info", "every worker is gone and none will be restarted")
            self._finish(EXIT_NO_WORKERS)

    def _finish(self, code: int) -> None:
        try:
            if self._publisher is not None:
                self._publisher.stop()
            if self._compactor is not None:
                self._compactor.stop()
            self._exit_code = code
            for slot in self._slots:
                self._read_stats(slot)  # the last figures a drained worker published
            if self.log_failure is None and (failing := self._failing_log()) is not None:
                self.log_failure, self._exit_code = failing, EXIT_LOG_ERROR
            if self._monitor is not None:
                try:
                    for event in self._monitor.poll():  # the last completions, for the counts
                        self._add_event(event)
                except LogError as e:  # a damaged log: the counts stay as last read
                    if self.log_failure is None:
                        self.log_failure = str(e)
                        self._exit_code = EXIT_LOG_ERROR
                self._queue = self._monitor.queue_view()
                self._monitor.close()  # its fold stays readable (task_info) for a last request
            remove_status(self._status_path)
            self._ops.close()
            stop_server()  # every worker has exited: the fork server goes with us
        finally:
            self._finished.set()  # whatever failed above, the run is over: wait() returns

    # -- processes -------------------------------------------------------------------------------

    def _spawn(self, slot: Slot) -> None:
        # Forked from the fork server (supervisor.run.forked), which dies with us; a worker dies
        # with the fork server. The config travels in a pipe: a password stays off `ps`.
        config = self.options.worker_config(slot.name, slot.index, len(self._slots))
        process = start_worker(config, self._logs_dir / f"{slot.name}.log")
        slot.process, slot.pid = process, process.pid
        slot.worker_id, slot.stats, slot.stats_mtime = None, WorkerSnapshot(), 0
        slot.exit_code, slot.died_at, slot.paused = None, None, False
        slot.launched_at = time.monotonic()
        slot.restart_due = None
        slot.cpu_percent, slot.rss_bytes = 0.0, 0
        import psutil  # here: after the first fork, not before it (~20-30 ms of CPU)

        try:
            slot.ps = psutil.Process(process.pid)
            slot.ps.cpu_percent(None)  # the first call only starts the measurement
        except psutil.Error:
            slot.ps = None

    def _reap(self, slot: Slot, now: float) -> None:
        process = slot.process
        if process is None:
            return
        code = process.poll()
        if code is None:
            return
        self._read_stats(slot)
        slot.process, slot.ps, slot.paused = None, None, False
        slot.exit_code, slot.died_at = code, time.time()
        if slot.worker_id is not None and self._monitor is not None:
            self._monitor.worker_died(slot.worker_id, slot.died_at)
        stopping = self._draining or slot.retiring
        # SIGTERM before the worker installed its handler (it was still starting) kills it:
        # that is a clean stop too, it had no task yet.
        slot.clean_exit = code == 0 or (stopping and code == -signal.SIGTERM)
        if stopping and slot.clean_exit:
            return
        if code == 0 and self.options.exit_when_drained:
            # It saw the queue drained and exited at once, as we are about to (a SIGTERM
            # would find it idle in a wait of up to idle_poll_s). Should the queue not be
            # drained after all (a task enqueued meanwhile), it is started again.
            slot.restart_due = now + REFRESH_S
            return
        held = self._held_at_death(slot)
        if not slot.clean_exit:
            self._ops.died(slot, held[0][0] if held else None, describe_exit(code))
        self._orphans.died(slot.view(self._draining), held, now=time.time())
        self._event("death", self._death_text(slot, code, held), held[0][0] if held else None)
        if stopping or self.log_failure is not None:  # (the logs failed as it died: no restart)
            return
        if code == WORKER_EXIT_CONFIG:
            slot.lost = True  # a config the worker rejects would be rejected again
            return
        if code == WORKER_EXIT_LOG_UNUSABLE:  # damage, another queue's log: so would a
            # restart; the run stops, as when the monitor meets it (section 8)
            last = last_line(self._logs_dir / f"{slot.name}.log")  # (it names the worker)
            self._log_failed(last or f"{_label(slot)} {describe_exit(code)}")
            return
        self._plan_restart(slot, now)

    def _held_at_death(self, slot: Slot) -> list[tuple[int, float]]:
        """The tasks a dead worker held, read once: (task, lease expiry in wall seconds).

        `kill` reads them itself (after the process is gone and the fold has caught up) and
        leaves them here, so the kill message, the death message and the orphans panel
        name the same tasks; any other death is read the same way, when it is reaped.
        """
        if slot.pid is not None and slot.pid in self._killed_holding:
            return self._killed_holding.pop(slot.pid)
        monitor = self._monitor
        if monitor is None or slot.worker_id is None:
            return []
        try:
            events = monitor.catch_up()  # everything the dead process wrote
        except LogError as e:  # what it died of, perhaps (a reset server): the run stops
            self._log_failed(str(e))
            return []
        for event in events:
            self._add_event(event)
        return [(t, lease.expiry / MICROS) for t, lease in monitor.tasks_held_by(slot.worker_id)]

    def _death_text(self, slot: Slot, code: int, held: list[tuple[int, float]]) -> str:
        text = f"{_label(slot)} {describe_exit(code)}"
        if held:
            text += f" while {_holding(held)}"
        if code > 0:
            last = last_line(self._logs_dir / f"{slot.name}.log")
            if last:
                text += f": {last}"
        return text

    def _plan_restart(self, slot: Slot, now: float) -> None:
        policy = self.options.restart
        if not policy.enabled:
            slot.lost = True
            return
        if code_is_time_limit(slot.exit_code):
            slot.restart_due = now  # it ended itself on purpose, its task's FAIL written
            return
        while slot.restart_times and now - slot.restart_times[0] > policy.storm_window_s:
            slot.restart_times.popleft()
        if len(slot.restart_times) >= policy.storm_limit:
            slot.lost = True
            self._event(
                "death",
                f"{slot.name} restarted {len(slot.restart_times)} times in "
                f"{policy.storm_window_s:g} s: the slot stays dead",
            )
            return
        lived = now - slot.launched_at
        slot.young_deaths = 1 if lived >= policy.healthy_after_s else slot.young_deaths + 1
        slot.restart_due = now + policy.delay(slot.young_deaths)

    def _restart(self, slot: Slot, now: float) -> None:
        if not (code_is_time_limit(slot.exit_code) or slot.clean_exit):  # not a crash: the
            # storm guard skips it
            slot.restart_times.append(now)
        slot.restarts += 1
        old = _label(slot)
        self._spawn(slot)
        self._ops.restarted(slot, old)
        self._event("restart", f"{slot.name} restarted as {_label(slot)} (was {old})")

    def _stop(self, slot: Slot) -> bool:
        """SIGSTOP a live worker, never inside an append (`supervisor.run.pausing`: stopped
        holding a log's lock, it would stall every other worker until resumed)."""
        if slot.process is None or slot.process.poll() is not None:
            return False
        try:
            if stop_outside_appends(slot.process.pid, self.location, PAUSE_PATIENCE_S):
                return True
        except ProcessLookupError:
            return False
        self._event("pause", f"{slot.name} (pid {slot.pid}) not paused: it kept a log locked")
        return False

    def _signal(self, slot: Slot, signum: int) -> bool:
        """Send `signum` to a live worker; False if it is already gone."""
        if slot.process is None or slot.process.poll() is not None:
            return False  # not reaped yet means the pid is still ours; reaped means gone
        try:
            if signum == signal.SIGKILL:
                try:
                    os.killpg(slot.process.pid, signum)  # the handler's own children too
                except ProcessLookupError:  # forked a moment ago: not in its own group yet
                    os.kill(slot.process.pid, signum)
            else:
                os.kill(slot.process.pid, signum)
        except ProcessLookupError:
            return False
        return True

    def _begin_drain(self, why: str) -> None:
        self._draining = True
        if self._publisher is not None:
            self._publisher.stop()
        for slot in self._slots:
            slot.restart_due = None
            if slot.paused:
                self._signal(slot, signal.SIGCONT)  # a stopped process cannot drain
                slot.paused = False
            self._signal(slot, signal.SIGTERM)
        self._event("info", f"draining ({why}): workers finish their tasks and exit")

    def _kill_all_now(self) -> None:
        self._forced = True
        self._draining = True
        if self._publisher is not None:
            self._publisher.stop()
        for slot in self._slots:
            slot.restart_due = None
            self._signal(slot, signal.SIGKILL)
        self._event("info", "stopping now: every worker killed")

    # -- what the workers publish ------------------------------------------------------------------

    def _read_stats(self, slot: Slot) -> None:
        if slot.pid is None:
            return
        run_dir = self.options.run_dir
        if slot.worker_id is None:
            # The worker id is "<name>-<pid>-<random>", or "<name>@<host>-<pid>-<random>" on a
            # shared log: find this process's snapshot.
            patterns = (f"{slot.name}-{slot.pid}-*.json", f"{slot.name}@*-{slot.pid}-*.json")
            found = next((p for pattern in patterns for p in run_dir.glob(pattern)), None)
            if found is None:
                return
            slot.worker_id = found.stem
        path = run_dir / f"{slot.worker_id}.json"
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return  # being replaced: the next refresh reads it
        if mtime == slot.stats_mtime:
            return  # unchanged since the last read: a stat is cheaper than a parse
        snapshot = read_snapshot_file(path)
        if snapshot is not None:
            self._log_error_news(slot, slot.stats.log_error, snapshot.log_error)
            slot.stats, slot.stats_mtime = snapshot, mtime

    def _log_error_news(self, slot: Slot, was: str | None, now: str | None) -> None:
        """A worker's log began to fail under it, or answers again: the feed says so. (A
        full disk or a log that no longer answers stops the work without a death: this is
        the dashboard's only word of it; /health and `qw status` show the error itself.)"""
        if (was is None) == (now is None):
            return  # (the text may change at every retry: not an event each time)
        if now is not None:
            self._event("log-error", f"{_label(slot)}: {now}")
        else:
            self._event("info", f"{_label(slot)}: the log answers again")

    def _failing_log(self) -> str | None:
        """The first worker whose last snapshot still has its log failing, as the run's end
        names it: a run that ended so is no clean end (EXIT_LOG_ERROR)."""
        return next(
            (f"{_label(s)}: {s.stats.log_error}" for s in self._slots if s.stats.log_error),
            None,
        )

    def _say_resumed(self, monitor: Monitor) -> None:
        """Say, once, that the queue holds tasks an earlier run left unfinished: the next
        `qw up` works them without being asked, and the first screen should say so."""
        self._resume_said = True
        first = monitor.published
        for own in (self._own_first, self._publisher.first_id if self._publisher else None):
            if own is not None:
                first = min(first, own)
        pending, held = monitor.open_below(first)
        if pending + held:
            held_text = f", {held} held" if held else ""
            fresh = (  # (--fresh removes a data directory's queue: not a server's)
                ""
                if is_redis_url(self.options.location)
                else f" ({qw_command()} up --fresh starts on an empty queue)"
            )
            self._event(
                "info",
                f"resuming {pending} pending{held_text} tasks from {self.location}, left by an "
                f"earlier run{fresh}",
            )

    def _refresh_stats(self) -> None:
        for slot in self._slots:
            if slot.alive:
                self._read_stats(slot)

    def _sample_processes(self) -> None:
        import psutil  # (imported by the first `_spawn`)

        for slot in self._slots:
            if slot.ps is None:
                continue
            try:
                with slot.ps.oneshot():
                    slot.cpu_percent = slot.ps.cpu_percent(None)
                    slot.rss_bytes = slot.ps.memory_info().rss
            except psutil.Error:
                slot.ps = None  # it exited; the next reap notices

    # -- events and views --------------------------------------------------------------------------

    def _event(self, kind: str, text: str, task: int | None = None) -> None:
        with self._lock:
            self._add_event(Event(time.time(), kind, text, task))

    def _add_event(self, event: Event) -> None:
        self._events.append(event)
        self._events_total += 1

    def events_since(self, seen: int) -> tuple[list[Event], int]:
        """The events after the first `seen` ones (as many as are kept), and the new total."""
        with self._lock:
            new = min(self._events_total - seen, len(self._events))
            return list(self._events)[len(self._events) - new :], self._events_total

    def snapshot(self) -> SupervisorSnapshot:
        """What the dashboard draws; cheap (it copies what the watcher thread gathered)."""
        with self._lock:
            return SupervisorSnapshot(
                location=self.location,
                workers=[slot.view(self._draining) for slot in self._slots],
                queue=self._queue,
                events=list(self._events),
                draining=self._draining,
                selected=self._selected,
                started_at=self.started_at,
                orphans=self._orphans.orphans(),
                departed=self._orphans.departed([slot.pid for slot in self._slots]),
                enqueue_hint=enqueue_hint(self.options.data_dir, self.location),
                demo_rate=self.options.rate,
            )

    def task_info(self, task: int) -> TaskInfo | None:
        return None if self._monitor is None else self._monitor.task_info(task)

    def held_leases(self) -> list[tuple[int, Lease, float | None]]:
        """The published tasks held now (Monitor.held_leases): after the end, what is left."""
        return [] if self._monitor is None else self._monitor.held_leases()

    # -- the controls (supervisor.run.model.Controls) ----------------------------------------------

    def kill_a_holder(self) -> str | None:
        holdings = self._monitor.holdings() if self._monitor else {}
        with self._lock:
            # The log says who holds what; a worker's own stats may be a moment behind.
            holders = [s for s in self._slots if s.alive and s.worker_id in holdings]
            if not holders:
                return None
            return self.kill(random.choice(holders).index)

    def kill(self, slot: int) -> str | None:
        with self._lock:
            target = self._slot(slot)
            process = target.process if target is not None else None
            if target is None or process is None or target.pid is None:
                return None
            self._read_stats(target)  # its worker id, if not known yet
            at = now_us()  # the kill's time is the signal's, not when its effect was read
            if not self._signal(target, signal.SIGKILL):
                return None
            # What it held is read once the process can write no more (and the fold has
            # read all it wrote): read at the kill, a claim made in the last 0.25 s would
            # be missed, and the death would name another task than the kill.
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=2.0)
            held = self._held_at_death(target)
            self._killed_holding[target.pid] = held
            self._ops.killed(target, held[0][0] if held else None, at)
            text = f"kill -9 {_label(target)}" + (f", {_holding(held)}" if held else "")
            self._event("info", text, held[0][0] if held else None)
            return text

    def toggle_pause(self, slot: int) -> str | None:
        with self._lock:
            target = self._slot(slot)
            if target is None or self._draining:
                return None
            if target.paused:
                if not self._signal(target, signal.SIGCONT):
                    return None
            elif not self._stop(target):
                return None
            target.paused = not target.paused
            task = self._holdings().get(target.worker_id or "")
            (self._ops.paused if target.paused else self._ops.resumed)(target, task)
            verb = "paused" if target.paused else "resumed"
            text = f"{_label(target)} {verb}"
            self._event("pause", text)
            return text

    def add_worker(self) -> str | None:
        with self._lock:
            if self._draining:
                return None
            slot = next((s for s in self._slots if s.retiring and not s.alive), None)
            if slot is None:
                slot = Slot(len(self._slots), f"w{len(self._slots)}")
                self._slots.append(slot)
            slot.retiring = slot.lost = False
            slot.restart_times.clear()
            slot.young_deaths = 0
            self._spawn(slot)
            text = f"{slot.name} added (pid {slot.pid})"
            self._event("info", text)
            return text

    def remove_worker(self) -> str | None:
        with self._lock:
            live = [s for s in self._slots if s.alive and not s.retiring]
            if self._draining or not live:
                return None
            slot = live[-1]
            slot.retiring = True
            if slot.paused:
                self._signal(slot, signal.SIGCONT)
                slot.paused = False
            self._signal(slot, signal.SIGTERM)
            text = f"{slot.name} (pid {slot.pid}) removed: it finishes its task and exits"
            self._event("info", text)
            return text

    def drain(self) -> None:
        self._drain_requested = True

    def select(self, slot: int | None) -> None:
        with self._lock:
            self._selected = slot

    def _holdings(self) -> dict[str, int]:
        return self._monitor.holdings() if self._monitor else {}

    def _slot(self, index: int) -> Slot | None:
        return self._slots[index] if 0 <= index < len(self._slots) else None

    # -- the status file (what `qw status` reads) ------------------------------------------------

    def _write_status(self) -> None:
        status = {
            "pid": os.getpid(),
            "started_at": self.started_at,
            "updated_at": time.time(),
            "location": self.location,
            "http": self.http_address,
            "draining": self._draining,
            "log_failure": self.log_failure,  # why it stops, if a log cannot be used
            "workers": [
                {
                    "slot": s.index,
                    "name": s.name,
                    "pid": s.pid,
                    "worker_id": s.worker_id,
                    "alive": s.alive,
                    "restarts": s.restarts,
                    "exit_code": s.exit_code,
                }
                for s in self._slots
            ],
        }
        write_status(self._status_path, status)


def _label(slot: Slot) -> str:
    """The slot's current (or last) process as people see it: w6·6975."""
    if slot.worker_id:
        return worker_label(slot.worker_id)
    return f"{slot.name}·{slot.pid}" if slot.pid is not None else slot.name


def _holding(held: list[tuple[int, float]]) -> str:
    tasks = [task for task, _ in held]
    return f"holding task{'s' * (len(tasks) > 1)} {', '.join(map(str, tasks))}"


def qw_command() -> str:
    """How to call the qw that runs now: `qw` when that is the one on PATH (or qw runs as
    `python -m`, which has no script to name), else the script's path (`.venv/bin/qw` after
    `make up`), relative to the current directory when under it."""
    script = Path(sys.argv[0])
    if script.name != "qw":
        return "qw"
    on_path = shutil.which("qw")
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "qw"
    script = script.absolute()
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def enqueue_hint(data_dir: Path, location: str) -> str:
    """The command that puts work on this queue, as the first screen suggests it."""
    command = f"{qw_command()} enqueue --count 100"
    if location != str(data_dir):  # a redis:// log (as shown: no password)
        return f"{command} --log {location}"
    if Path(data_dir).resolve() == Path(".qw").resolve():
        return command
    return f"{command} --dir {data_dir}"


__all__ = [
    "DEMO_HANDLER",
    "EXIT_FORCED",
    "EXIT_NO_WORKERS",
    "EXIT_OK",
    "RestartPolicy",
    "Supervisor",
    "SupervisorOptions",
    "default_demo_rate",
    "demo_payloads",
    "describe_exit",
    "is_running_worker",
    "read_status_files",
]
