"""WorkerStats: what one worker has done, as a snapshot the supervisor and HTTP endpoint read.

A worker publishes its snapshot to a small JSON file (`<run dir>/<worker id>.json`, written
to a temporary name and renamed, so a reader never sees half a file). Files outlive their
worker: a dead worker's last figures stay visible, and `qw status` in another terminal sees
every worker on the directory.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import deque
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from queue_worker.percentile import nearest_rank

#: how many recent claim latencies the percentiles are computed over
LATENCY_WINDOW = 2048


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    return nearest_rank(sorted_values, q) if sorted_values else 0


@dataclass
class WorkerStats:
    """Counters of one worker process. Field names are the JSON keys."""

    worker: str  # the unique worker id (a restarted worker is a new id)
    name: str  # the label people read (w0, w1, …)
    pid: int
    host: str
    started_at: float  # wall clock, seconds
    state: str = "starting"  # starting | idle | claiming | working | draining | exited
    attempts: int = 0
    won: int = 0
    takeovers: int = 0  # wins over an expired holder (redistribution)
    lost: dict[str, int] = field(default_factory=dict)  # by verdict: "lost: held", …
    finished: int = 0  # DONE records accepted
    stale: int = 0  # DONE records written but rejected (the lease had been lost)
    failed: int = 0  # FAIL records accepted (retry or dead)
    timeouts: int = 0  # the original's name: leases that lapsed under this worker
    renewals: int = 0
    leases_lost: int = 0
    leases_lapsed: int = 0  # of leases_lost: our clock passed the expiry (paused, stalled)
    cancelled: int = 0  # handlers cancelled after a lost lease
    current_task: int | None = None
    current_since: float | None = None  # wall clock, seconds
    current_claim: int | None = None
    current_function: str | None = None  # the task's function (a task by name), once loaded
    lease_expiry: float | None = None  # wall clock, seconds
    known_tasks: int = 0
    indexed_tasks: int = 0  # task positions the worker's index holds (live tasks: its memory)
    consumed_up_to: int = 0  # claims-log position folded so far
    tasks_position: int = 0
    done_tasks: int = 0  # as this worker's fold sees the queue
    held_by_anyone: int = 0
    last_error: str | None = None
    #: the log failing under this worker now (a full disk, a server out of reach): the
    #: error, naming the file or URL; None once an append lands again
    log_error: str | None = None
    updated_at: float = 0.0
    exit_reason: str | None = None
    _latencies: deque[int] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    latency_samples: int = 0

    def record_latency(self, micros: int) -> None:
        self._latencies.append(micros)
        self.latency_samples += 1

    def count_lost(self, reason: str) -> None:
        self.lost[reason] = self.lost.get(reason, 0) + 1

    @property
    def lost_total(self) -> int:
        return sum(self.lost.values())

    def latency(self) -> dict[str, int]:
        values = sorted(self._latencies)
        return {
            "p50": percentile(values, 0.50),
            "p90": percentile(values, 0.90),
            "p99": percentile(values, 0.99),
            "samples": self.latency_samples,
        }

    def to_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it deep-copies the 2,048 latencies only for us to drop them
        # (about 1 ms a call, measured), and snapshots are taken several times a second.
        data = {name: getattr(self, name) for name in _SNAPSHOT_FIELDS}
        data["lost"] = dict(self.lost)
        data["lost_total"] = self.lost_total
        data["claim_latency_micros"] = self.latency()
        return data

    def publish(self, path: Path) -> None:
        """Write the snapshot atomically (tmp file + rename)."""
        write_snapshot(path, self.to_dict())


def write_snapshot(path: Path, data: dict[str, Any]) -> None:
    """Write a snapshot atomically: a tmp file, then a rename, so no reader sees half.

    When the tmp file cannot be written (a full disk: the very moment the snapshot has a
    log error to tell), the last snapshot's file is overwritten in place instead, padded
    with spaces to its old length: that needs no new blocks on most file systems, so the
    supervisor, `qw status` and ``/health`` still learn which file failed and why. A
    reader may then meet a half-written file: it reads as unreadable, and the next read
    gets it whole."""
    text = json.dumps(data, separators=(",", ":")).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(text)
        os.replace(tmp, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            tmp.unlink()
        try:
            with open(path, "r+b") as f:  # the old file, with its blocks (none: the error)
                f.write(text.ljust(os.fstat(f.fileno()).st_size))
        except OSError:
            raise error from None


#: the fields a snapshot carries (the raw latency window stays in the worker)
_SNAPSHOT_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(WorkerStats) if not f.name.startswith("_")
)


def read_snapshot(path: Path) -> dict[str, Any] | None:
    """A published snapshot, or None if it is missing or unreadable (being replaced)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_all(run_dir: Path) -> list[dict[str, Any]]:
    """Every worker snapshot in a run directory, oldest worker first."""
    if not run_dir.is_dir():
        return []
    snaps = [s for p in run_dir.glob("*.json") if (s := read_snapshot(p)) is not None]
    snaps.sort(key=lambda s: (s.get("started_at", 0.0), s.get("worker", "")))
    return snaps
