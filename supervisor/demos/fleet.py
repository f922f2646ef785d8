"""What the demos share: a handful of real worker processes, and a reader of the claims log.

`Fleet` starts workers as plain subprocesses (the command line that
`queue_worker.process.worker_command` builds; the supervisor forks its own) but keeps no
restart policy and no dashboard: a demo decides when a worker is killed, paused or
resumed, and every process it started is ended on the way out (the `with` block), whatever
happens. `ClaimsTail` folds the claims log as it grows with the same fold the workers run,
keeping each record's verdict so a demo can wait for one (a takeover, a completion) and
narrate it with its log position.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

from logstore import Log, open_log
from queue_worker.ops import BY_DEMO
from queue_worker.process import worker_command
from queue_worker.protocol.records import ClaimsRecord
from queue_worker.protocol.state import Outcome, Verdict
from queue_worker.topics import CLAIMS_TOPIC, ClaimsFollower
from queue_worker.waiting import WaitTimeout, wait_until
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.snapshot import WorkerState, read_snapshots
from supervisor.run.ops_recorder import OpsRecorder, ProcessRef
from supervisor.run.pausing import stop_outside_appends

#: how long a worker that was asked to drain (SIGTERM) may take before it is killed
STOP_GRACE_S: Final = 5.0
#: how often a wait looks at its condition again
POLL_S: Final = 0.02
#: how long `Fleet.pause` may keep trying to stop a worker outside its appends
PAUSE_PATIENCE_S: Final = 20.0

T = TypeVar("T")


class DemoFailed(Exception):
    """The demo could not show what it claims; the message says why."""


def wait_for(condition: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll `condition` until it returns something truthy; DemoFailed after `timeout` s."""
    try:
        return wait_until(condition, timeout, what, first_poll=POLL_S, max_poll=POLL_S)
    except WaitTimeout as e:
        raise DemoFailed(str(e)) from None


@dataclass
class WorkerProcess:
    name: str
    config: WorkerConfig
    process: subprocess.Popen[bytes]
    paused: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class Fleet:
    """Worker processes on one data directory; `with Fleet(...) as fleet:` ends them all."""

    location: Path
    defaults: dict[str, Any] = field(default_factory=dict)  # WorkerConfig fields for all
    workers: list[WorkerProcess] = field(default_factory=list)
    ops: OpsRecorder = field(init=False)  # what the demo does to its workers: the ops topic

    def __post_init__(self) -> None:
        self.ops = OpsRecorder(self.location, by=BY_DEMO)

    def ref(self, worker: WorkerProcess) -> ProcessRef:
        """The worker as the ops topic names it (its id, once it has published one)."""
        ids = {pid: worker_id for worker_id, pid in self.worker_ids().items()}
        return ProcessRef(worker.name, ids.get(worker.pid), worker.pid)

    @property
    def run_dir(self) -> Path:
        return self.location / "run"

    def start(self, name: str, **overrides: Any) -> WorkerProcess:
        """Start one worker process (the fields of WorkerConfig as keyword arguments)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = WorkerConfig(
            location=str(self.location),
            run_dir=str(self.run_dir),
            name=name,
            parent_pid=os.getpid(),
            **{**self.defaults, **overrides},
        )
        config.validate()
        output = (self.run_dir / f"{name}.out").open("ab")
        try:
            command, env = worker_command(config)  # as the supervisor's fallback starts one
            process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        finally:
            output.close()  # the child has its own copy
        worker = WorkerProcess(name, config, process)
        self.workers.append(worker)
        return worker

    def worker_ids(self) -> dict[str, int]:
        """worker id -> pid, from the stats snapshots the workers publish."""
        snaps = read_snapshots(self.run_dir)
        return {str(s.worker): s.pid for s in snaps if s.pid is not None}

    def process_of(self, worker_id: str) -> WorkerProcess | None:
        pid = self.worker_ids().get(worker_id)
        return next((w for w in self.workers if w.pid == pid), None)

    def started(self) -> bool:
        """Has every worker published a snapshot in which it is past starting up?

        DemoFailed at once for a worker that exited before it did, with the last line it
        wrote: a wait for it would only run out and say less."""
        states = {s.pid: s.state for s in read_snapshots(self.run_dir) if s.pid is not None}
        waiting = [w for w in self.workers if states.get(w.pid) in (None, WorkerState.STARTING)]
        for worker in waiting:
            if not worker.alive:
                raise DemoFailed(
                    f"worker {worker.name} (pid {worker.pid}) exited with code "
                    f"{worker.process.returncode} before it started: {self._last_line(worker)}"
                )
        return not waiting

    def _last_line(self, worker: WorkerProcess) -> str:
        """The last line the worker wrote (its stdout and stderr), or "(no output)"."""
        try:
            lines = (self.run_dir / f"{worker.name}.out").read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        return lines[-1].strip() if lines else "(no output)"

    def kill(self, worker: WorkerProcess) -> None:
        """kill -9: no goodbye, no DONE, no release; its lease must run out."""
        self.ops.killed(self.ref(worker), None)
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait()

    def pause(self, worker: WorkerProcess) -> None:
        """SIGSTOP, never inside an append (`supervisor.run.pausing`: a worker stopped holding a
        log's lock would stall every other writer, and nobody could take its task over)."""
        self.ops.paused(self.ref(worker), None)
        if not stop_outside_appends(worker.pid, self.location, PAUSE_PATIENCE_S):
            raise DemoFailed(
                f"could not stop {worker.name} outside an append in {PAUSE_PATIENCE_S:g} s"
            )
        worker.paused = True

    def resume(self, worker: WorkerProcess) -> None:
        self.ops.resumed(self.ref(worker), None)
        worker.process.send_signal(signal.SIGCONT)
        worker.paused = False

    def stop(self) -> None:
        """End every worker this fleet started: drain (SIGTERM), then kill what lingers."""
        for w in self.workers:
            if w.alive:
                with contextlib.suppress(ProcessLookupError):
                    if w.paused:
                        w.process.send_signal(signal.SIGCONT)  # a stopped process cannot drain
                    w.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for w in self.workers:
            try:
                w.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.process.kill()
                w.process.wait()
        self.ops.close()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass(frozen=True, slots=True)
class Seen:
    """One claims record as the fold judged it."""

    record: ClaimsRecord
    outcome: Outcome

    @property
    def position(self) -> int:
        return self.outcome.position

    @property
    def verdict(self) -> Verdict:
        return self.outcome.verdict


class ClaimsTail:
    """The claims log folded as it grows, every verdict kept (demos are short)."""

    def __init__(self, location: str | Path) -> None:
        self.log: Log = open_log(location, CLAIMS_TOPIC)
        self.follower = ClaimsFollower(self.log.start)
        self.seen: list[Seen] = []

    def poll(self) -> list[Seen]:
        """Fold what was appended since the last poll; return it."""
        new: list[Seen] = []
        while entries := self.log.read(self.follower.next_position):
            for entry in entries:
                outcome, record = self.follower.apply(entry)
                new.append(Seen(record, outcome))
        self.seen += new
        return new

    def find(self, match: Callable[[Seen], bool]) -> Seen | None:
        """The first record so far (after polling) that matches."""
        self.poll()
        return next((s for s in self.seen if match(s)), None)

    def wait_for_takeover(self, won: Seen, timeout: float, what: str) -> Seen:
        """Wait for the CLAIM that takes over the lease `won` won (a TAKEOVER naming it)."""

        def of_that_lease(s: Seen) -> bool:
            previous = s.outcome.previous
            return (
                s.verdict is Verdict.TAKEOVER
                and previous is not None
                and (previous.claim == won.position)
            )

        return wait_for(lambda: self.find(of_that_lease), timeout, what)

    def close(self) -> None:
        self.log.close()

    def __enter__(self) -> ClaimsTail:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
