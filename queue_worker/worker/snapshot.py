"""WorkerSnapshot: a worker's published stats as every reader sees them, typed.

The writer is `queue_worker.worker.stats.WorkerStats` (its `to_dict()` is the JSON file); every
reader (the supervisor, the dashboard, HTTP, the demos, the benches) goes through
`parse_snapshot`, which reads each field as `queue_worker.worker.stats_file.parse_stats` does (`qw
status` uses that alone, without this dataclass) and trusts no type: the file is another
process's, maybe of another version, maybe damaged. A value of the wrong type reads as
missing (None) or as 0 for a counter, never as a crash. The JSON field names are the
attribute names, so a field renamed on one side is caught by tests/test_snapshot.py instead
of reading as zeros.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from queue_worker.worker.stats_file import as_float, as_int, as_str, parse_stats


class WorkerState(str, Enum):
    """What a worker says it is doing (the JSON on disk holds the value; show `.value`)."""

    STARTING = "starting"
    IDLE = "idle"
    CLAIMING = "claiming"
    WORKING = "working"
    DRAINING = "draining"
    EXITED = "exited"


@dataclass(frozen=True)
class ClaimLatency:
    """Claim round trips over the worker's recent window, in microseconds."""

    p50: int = 0
    p90: int = 0
    p99: int = 0
    samples: int = 0


@dataclass(frozen=True)
class WorkerSnapshot:
    """One worker's published stats (see `WorkerStats` for what each field counts)."""

    worker: str | None = None  # the unique worker id
    name: str | None = None  # w0, w1, …
    pid: int | None = None
    host: str | None = None
    started_at: float | None = None  # wall clock, seconds
    state: WorkerState | None = None  # None: missing, or a state this version does not know
    attempts: int = 0
    won: int = 0
    takeovers: int = 0
    lost: Mapping[str, int] = field(default_factory=dict)  # by verdict: "lost: held", …
    finished: int = 0
    stale: int = 0
    failed: int = 0
    timeouts: int = 0
    renewals: int = 0
    leases_lost: int = 0
    leases_lapsed: int = 0
    cancelled: int = 0
    current_task: int | None = None
    current_since: float | None = None
    current_claim: int | None = None
    current_function: str | None = None  # a task by name's function
    lease_expiry: float | None = None
    known_tasks: int = 0
    indexed_tasks: int = 0
    consumed_up_to: int = 0
    tasks_position: int = 0
    done_tasks: int = 0
    held_by_anyone: int = 0
    last_error: str | None = None
    log_error: str | None = None  # the log failing under this worker now
    updated_at: float | None = None
    exit_reason: str | None = None
    latency_samples: int = 0
    lost_total: int = 0
    claim_latency_micros: ClaimLatency = ClaimLatency()

    def to_dict(self) -> dict[str, Any]:
        """The JSON the worker wrote (for a snapshot it wrote, the same keys and values)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["state"] = None if self.state is None else self.state.value
        data["lost"] = dict(self.lost)
        latency = self.claim_latency_micros
        data["claim_latency_micros"] = {f.name: getattr(latency, f.name) for f in fields(latency)}
        return data


# -- reading (trust no type: queue_worker.worker.stats_file, the one definition) -------------------


def parse_snapshot(data: object) -> WorkerSnapshot:
    """A snapshot from decoded JSON: a missing or wrongly-typed field gets its default
    (None, or 0 for a counter); anything but an object gives an empty snapshot."""
    values = parse_stats(data)
    state = values["state"]
    values["state"] = None if state is None else WorkerState(state)
    values["claim_latency_micros"] = ClaimLatency(**values["claim_latency_micros"])
    return WorkerSnapshot(**values)


def read_snapshot_file(path: Path) -> WorkerSnapshot | None:
    """A published snapshot, or None if it is missing or unreadable (being replaced)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return parse_snapshot(data) if isinstance(data, dict) else None


def read_snapshots(run_dir: Path) -> list[WorkerSnapshot]:
    """Every worker snapshot in a run directory, oldest worker first."""
    if not run_dir.is_dir():
        return []
    found = (read_snapshot_file(p) for p in run_dir.glob("*.json"))
    snaps = [s for s in found if s is not None]
    snaps.sort(key=lambda s: (s.started_at or 0.0, s.worker or ""))
    return snaps


__all__ = [
    "ClaimLatency",
    "WorkerSnapshot",
    "WorkerState",
    "as_float",
    "as_int",
    "as_str",
    "parse_snapshot",
    "read_snapshot_file",
    "read_snapshots",
]
