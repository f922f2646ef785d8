"""A worker's published stats file read as plain JSON values: the one definition of how
each field is read (trusting no type), without a class to hold them.

`queue_worker.worker.snapshot.parse_snapshot` builds its typed `WorkerSnapshot` from
`parse_stats`; `qw status` prints and serves the dict itself, which is what
`WorkerSnapshot.to_dict()` gives for the same file: the dataclass (with `dataclasses`, which
imports `inspect`, `ast`, `dis` and `tokenize`) was ~20 ms of the command's CPU.

A value of the wrong type reads as missing (None) or as 0 for a counter, never as a crash.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final


def as_int(value: object) -> int | None:
    """An int, or None: bool is an int subclass, and True is not a task id."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def as_float(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def as_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: object) -> int:
    return as_int(value) or 0


#: the words of `queue_worker.worker.snapshot.WorkerState` (tests/test_stats_file.py keeps them
# equal)
STATES: Final = frozenset({"starting", "idle", "claiming", "working", "draining", "exited"})


def _state(value: object) -> str | None:
    """The state's word, or None: missing, or a state this version does not know."""
    return value if isinstance(value, str) and value in STATES else None


def _lost(value: object) -> dict[str, int]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): n for k, v in value.items() if (n := as_int(v)) is not None}


LATENCY_FIELDS: Final = ("p50", "p90", "p99", "samples")


def _latency(value: object) -> dict[str, int]:
    if not isinstance(value, Mapping):
        return dict.fromkeys(LATENCY_FIELDS, 0)
    return {name: as_int(value.get(name)) or 0 for name in LATENCY_FIELDS}


#: every field, in `WorkerSnapshot`'s order, with how it is read (lost_total: below)
FIELDS: Final[dict[str, Callable[[object], Any]]] = {
    "worker": as_str,  # the unique worker id
    "name": as_str,  # w0, w1, …
    "pid": as_int,
    "host": as_str,
    "started_at": as_float,
    "state": _state,
    "attempts": _count,
    "won": _count,
    "takeovers": _count,
    "lost": _lost,
    "finished": _count,
    "stale": _count,
    "failed": _count,
    "timeouts": _count,
    "renewals": _count,
    "leases_lost": _count,
    "leases_lapsed": _count,
    "cancelled": _count,
    "current_task": as_int,
    "current_since": as_float,
    "current_claim": as_int,
    "current_function": as_str,
    "lease_expiry": as_float,
    "known_tasks": _count,
    "indexed_tasks": _count,
    "consumed_up_to": _count,
    "tasks_position": _count,
    "done_tasks": _count,
    "held_by_anyone": _count,
    "last_error": as_str,
    "log_error": as_str,
    "updated_at": as_float,
    "exit_reason": as_str,
    "latency_samples": _count,
    "lost_total": as_int,
    "claim_latency_micros": _latency,
}


def parse_stats(data: object) -> dict[str, Any]:
    """The stats as plain values, every field present: a missing or wrongly-typed field gets
    its default (None, or 0 for a counter); anything but an object reads as empty."""
    source: Mapping[Any, Any] = data if isinstance(data, Mapping) else {}
    values = {name: read(source.get(name)) for name, read in FIELDS.items()}
    if values["lost_total"] is None:  # an older file without the total: the verdicts' sum
        values["lost_total"] = sum(values["lost"].values())
    return values


def read_stats_file(path: Path) -> dict[str, Any] | None:
    """A published stats file, or None if it is missing or unreadable (being replaced)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return parse_stats(data) if isinstance(data, dict) else None


def read_stats(run_dir: Path) -> list[dict[str, Any]]:
    """Every worker's stats in a run directory, oldest worker first."""
    if not run_dir.is_dir():
        return []
    found = (read_stats_file(p) for p in run_dir.glob("*.json"))
    stats = [s for s in found if s is not None]
    stats.sort(key=lambda s: (s["started_at"] or 0.0, s["worker"] or ""))
    return stats


__all__ = [
    "FIELDS",
    "STATES",
    "as_float",
    "as_int",
    "as_str",
    "parse_stats",
    "read_stats",
    "read_stats_file",
]
