"""WorkerSnapshot: a worker's published stats as every reader sees them, typed.

The writer is `queue_worker.stats.WorkerStats` (its `to_dict()` is the JSON file); every
reader (the supervisor, the dashboard, HTTP, `qw status`, the demos, the benches) goes
through `parse_snapshot`, which trusts no type: the file is another process's, maybe of
another version, maybe damaged. A value of the wrong type reads as missing (None) or as 0
for a counter, never as a crash. The JSON field names are the attribute names, so a field
renamed on one side is caught by tests/test_snapshot.py instead of reading as zeros.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any


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


# -- reading (trust no type) -----------------------------------------------------------------


def as_int(value: object) -> int | None:
    """An int, or None: bool is an int subclass, and True is not a task id."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_float(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def as_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _state(value: object) -> WorkerState | None:
    try:
        return WorkerState(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _lost(value: object) -> dict[str, int]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): n for k, v in value.items() if (n := as_int(v)) is not None}


def _latency(value: object) -> ClaimLatency:
    if not isinstance(value, Mapping):
        return ClaimLatency()
    return ClaimLatency(**{f.name: as_int(value.get(f.name)) or 0 for f in fields(ClaimLatency)})


#: how each field is read from JSON, by its type in WorkerSnapshot (the rest are counters)
_OPTIONAL_STR = ("worker", "name", "host", "last_error", "log_error", "exit_reason")
_OPTIONAL_INT = ("pid", "current_task", "current_claim")
_OPTIONAL_FLOAT = ("started_at", "current_since", "lease_expiry", "updated_at")
_SPECIAL = ("state", "lost", "lost_total", "claim_latency_micros")
_COUNTERS = tuple(
    f.name
    for f in fields(WorkerSnapshot)
    if f.name not in (*_OPTIONAL_STR, *_OPTIONAL_INT, *_OPTIONAL_FLOAT, *_SPECIAL)
)


def parse_snapshot(data: object) -> WorkerSnapshot:
    """A snapshot from decoded JSON: a missing or wrongly-typed field gets its default
    (None, or 0 for a counter); anything but an object gives an empty snapshot."""
    if not isinstance(data, Mapping):
        return WorkerSnapshot()
    values: dict[str, Any] = {}
    values.update({k: as_str(data.get(k)) for k in _OPTIONAL_STR})
    values.update({k: as_int(data.get(k)) for k in _OPTIONAL_INT})
    values.update({k: as_float(data.get(k)) for k in _OPTIONAL_FLOAT})
    values.update({k: as_int(data.get(k)) or 0 for k in _COUNTERS})
    lost = _lost(data.get("lost"))
    total = as_int(data.get("lost_total"))
    return WorkerSnapshot(
        **values,
        state=_state(data.get("state")),
        lost=lost,
        # an older file without the total: the sum of the verdicts
        lost_total=sum(lost.values()) if total is None else total,
        claim_latency_micros=_latency(data.get("claim_latency_micros")),
    )


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
