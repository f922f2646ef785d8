"""Writing the ops topic (queue_worker.ops): one named method per thing done to a worker.

The supervisor, `qw kill` and the demos call these in one line where they act. Recording is
a side note about the run: a failure to write it (a full disk, a Redis that is gone) must
never stop a kill or a restart, so it is remembered in `last_error` and not raised.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from logstore import Log, LogError
from queue_worker.ops import (
    BY_OPERATOR,
    BY_SUPERVISOR,
    DEATH,
    KILL,
    PAUSE,
    RESTART,
    RESUME,
    SKEW,
    OpRecord,
    encode_op,
)
from queue_worker.protocol.records import RecordEncodeError
from queue_worker.topics import open_ops


class Process(Protocol):
    """What a recorder needs to know of a worker process (a Slot has it)."""

    @property
    def name(self) -> str: ...
    @property
    def worker_id(self) -> str | None: ...
    @property
    def pid(self) -> int | None: ...


@dataclass(frozen=True)
class ProcessRef:
    """A worker process named by hand (a demo's, `qw kill`'s target)."""

    name: str
    worker_id: str | None
    pid: int | None


def now_us() -> int:
    return time.time_ns() // 1000


class OpsRecorder:
    """Appends ops records to the ops topic at `location` (opened on the first record;
    `create=False`: of a queue that exists, never creating one: a supervisor's, whose
    queue vanishing under it is a reset, not a queue to make anew)."""

    def __init__(self, location: str | Path, by: str = BY_OPERATOR, *, create: bool = True) -> None:
        self.location = location
        self.by = by
        self._create = create
        self.last_error: str | None = None
        self._log: Log | None = None
        self._lock = threading.Lock()  # the dashboard's keys and the watcher both record

    def record(self, op: OpRecord) -> None:
        try:
            data = encode_op(op)
            with self._lock:
                if self._log is None:
                    self._log = open_ops(self.location, create=self._create)
                self._log.append(data)
        except (LogError, OSError, RecordEncodeError) as e:
            self.last_error = f"cannot record {op.kind} in the ops log: {e}"

    def _op(
        self,
        kind: str,
        p: Process,
        task: int | None,
        by: str,
        detail: str = "",
        at: int | None = None,
    ) -> None:
        when = now_us() if at is None else at
        self.record(OpRecord(kind, when, p.name, p.worker_id, p.pid, task, by, detail))

    # -- what is done to a process (`task`: the task it held then, when known) ----------------

    def killed(self, p: Process, task: int | None, at: int | None = None) -> None:
        """SIGKILL sent at `at` (default: now)."""
        self._op(KILL, p, task, self.by, "kill SIGKILL", at)

    def paused(self, p: Process, task: int | None) -> None:
        self._op(PAUSE, p, task, self.by, "SIGSTOP")

    def resumed(self, p: Process, task: int | None) -> None:
        self._op(RESUME, p, task, self.by, "SIGCONT")

    def died(self, p: Process, task: int | None, how: str) -> None:
        """The process ended unasked (`how`: "killed by SIGKILL", "exited with code 1")."""
        self._op(DEATH, p, task, BY_SUPERVISOR, how)

    def skewed(self, p: Process, detail: str) -> None:
        self._op(SKEW, p, None, self.by, detail)

    def restarted(self, p: Process, was: str) -> None:
        """Restarted as a new process; `was`: the process it replaced, as people name it."""
        self._op(RESTART, p, None, BY_SUPERVISOR, f"was {was}")

    def close(self) -> None:
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None


def record_kill(location: str | Path, name: str, worker_id: str | None, pid: int, at: int) -> None:
    """`qw kill`'s one record: the operator sent SIGKILL to this process at `at` (taken
    before the signal: the supervisor may record the death before this is appended)."""
    recorder = OpsRecorder(location, by=BY_OPERATOR)
    recorder.killed(ProcessRef(name, worker_id, pid), None, at)
    recorder.close()
