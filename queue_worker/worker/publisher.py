"""Publishing a worker's stats snapshot without slowing the worker down.

The worker calls `publish()` at every state change (several times a task); the snapshot
file is written by a daemon thread, at most once every STATE_GAP_S when the state has
changed since the last write, and otherwise once every PUBLISH_PERIOD_S while changes keep
coming. A worker that has ended BUSY_TASKS tasks or more since the last write is cycling
through its states faster than any reader can follow (a drain: thousands a second), so its
state changes wait the ordinary period too: a write (the snapshot, its latency percentiles,
a file and a rename) costs more than a no-op task.

`publish()` itself only sets a flag and, at most once per write, an `Event`: the worker's
own thread never writes the file nor takes a lock to publish (docs/speed.md, "Publishing
the stats").

The snapshot is taken when it is written, so it is always the latest state; a change that
comes and goes between two writes (a task shorter than the gap) is seen in the counters,
not in `state`. `publish(force=True)` writes at once from the caller's thread (at exit).
An idle worker's thread blocks on an event: no CPU.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Final

from queue_worker.worker.stats import WorkerStats, write_snapshot

#: snapshots: at most one every PUBLISH_PERIOD_S, but a state change only needs STATE_GAP_S
PUBLISH_PERIOD_S: Final = 0.25
STATE_GAP_S: Final = 0.05
#: ... unless the worker ended at least this many tasks since the last write
BUSY_TASKS: Final = 2


class SnapshotPublisher:
    """Writes `stats` to `path` (nothing when `path` is None); see the module docstring."""

    def __init__(self, stats: WorkerStats, path: Path | None, lock: threading.Lock) -> None:
        self.stats = stats
        self.path = path
        self.lock = lock  # the worker's stats lock: held while a snapshot is taken
        self._last = float("-inf")  # monotonic time of the last write
        self._last_state: str | None = None
        self._last_ended = 0  # tasks the worker had ended at the last write
        #: a write is coming (wakes the thread); `_requested` says the same without a call:
        #: set before the event, cleared after it, so that it never says a write is coming
        #: when none is (the thread clears both before it takes the snapshot)
        self._pending = threading.Event()
        self._requested = False
        self._daemon: threading.Thread | None = None
        self._file_lock = threading.Lock()  # one snapshot taken and written at a time

    def publish(self, *, force: bool = False) -> None:
        if self.path is None:
            return
        if force:
            self._write_latest()
            return
        if self._requested:  # a write is already coming: it will see this change
            return
        self._requested = True
        self._pending.set()
        if self._daemon is None:
            self._daemon = threading.Thread(target=self._run, name="qw-stats", daemon=True)
            self._daemon.start()

    def _take(self) -> dict[str, Any]:
        """The snapshot to write (under the stats lock; the file is written after it)."""
        self.stats.updated_at = time.time()
        self._last = time.monotonic()
        self._last_state = self.stats.state
        self._last_ended = self._ended()
        return self.stats.to_dict()

    def _ended(self) -> int:
        s = self.stats
        return s.finished + s.failed + s.stale + s.cancelled

    def _write_latest(self) -> None:
        """Take the snapshot and write it, both under the file lock: the writer thread and
        a forced write at exit then cannot cross, so the last file written is the last
        snapshot taken (the worker's "exited" is never overwritten by an older one)."""
        assert self.path is not None
        with self._file_lock:
            with self.lock:
                data = self._take()
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_snapshot(self.path, data)
            except OSError as e:  # a full disk must not stop the work; say so in the stats
                with self.lock:
                    self.stats.last_error = f"cannot write stats to {self.path}: {e}"

    def _due(self) -> float:
        """Seconds until the pending change may be written (<= 0: now)."""
        changed = self.stats.state != self._last_state
        busy = self._ended() - self._last_ended >= BUSY_TASKS
        gap = STATE_GAP_S if changed and not busy else PUBLISH_PERIOD_S
        return self._last + gap - time.monotonic()

    def _run(self) -> None:
        while True:
            self._pending.wait()
            # Rate limit: wait out the gap, looking again every STATE_GAP_S in case the
            # state changes meanwhile (which shortens the gap).
            while (wait := self._due()) > 0:
                time.sleep(min(wait, STATE_GAP_S))
            # Cleared before the snapshot is taken: a change after this point sets it again.
            # (The event first: a publish() that finds `_requested` cleared sets the event
            # again after this clear, and the next wait sees it.)
            self._pending.clear()
            self._requested = False
            self._write_latest()
