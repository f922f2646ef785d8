"""WorkerConfig: everything one worker process needs, as a value that crosses a process
boundary as JSON (the supervisor starts ``python -m queue_worker.process '<json>'``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Final

from logstore.base import Durability
from logstore.location import is_redis_url

# The settings' choices and bounds live in queue_worker.worker.settings (the command line checks
# them without building WorkerConfig, a dataclass of 20 fields): re-exported here.
from queue_worker.worker.settings import (
    _NAME_PATTERN,
    DEFAULT_DRAIN_TIMEOUT_S,
    DEFAULT_LEASE_S,
    FSYNC_POLICIES,
    PICK_STRATEGIES,
    check_host,
    default_host,
)

__all__ = [
    "DEFAULT_DRAIN_TIMEOUT_S",
    "DEFAULT_LEASE_S",
    "FSYNC_POLICIES",
    "PICK_STRATEGIES",
    "WorkerConfig",
    "check_host",
    "default_host",
]


#: the largest clock offset a worker takes (`clock_offset_s`)
MAX_CLOCK_OFFSET_S: Final = 10 * 365 * 86400


@dataclass(frozen=True)
class WorkerConfig:
    """One worker's settings. Times are seconds unless the name says otherwise."""

    location: str  # the data directory, or a redis:// URL
    run_dir: str  # where the stats snapshot goes (the file log uses <data dir>/run)
    name: str = "w0"  # the label people read; the worker id adds pid and a random suffix
    handler: str = "queue_worker.worker.handlers:demo"  # "module:function"
    work_ms: int = 400  # how long the demo handler works (a payload may override it)
    lease_s: float = DEFAULT_LEASE_S  # renewed at half of it while the task runs
    # first | random | spread; None: spread, or the server's pick on a queue with server
    # verdicts, where asking for one is refused (queue_worker.worker.pick.Picker)
    pick: str | None = None
    slot: int = 0  # spread: this worker prefers task ids with id % slots == slot
    slots: int = 1
    fsync: str = "commit"  # none | commit | always (see logstore.Durability)
    max_attempts: int = 3  # winning claims per task before a failure makes it dead
    backoff_s: float = 1.0  # retry delay base: attempt n waits up to backoff_s * 2**(n-1)
    backoff_max_s: float = 60.0  # ... and never more than this
    idle_poll_s: float = 0.2  # the longest an idle worker sleeps before looking again
    # An attempt that runs longer fails and its worker process is ended (None: no limit;
    # a handler's own `@time_limit` wins). See queue_worker.worker.watchdog.
    task_timeout_s: float | None = None
    # After a drain (SIGTERM) begins, the task in hand gets this long at most, then ends as
    # a time-out does (None: wait for it however long it runs).
    drain_timeout_s: float | None = DEFAULT_DRAIN_TIMEOUT_S
    exit_when_drained: bool = False  # return once nothing is pending or held
    # The supervisor's pid: a worker whose parent is no longer this pid exits (no orphans).
    # None: take it from $QW_PARENT_PID, else the parent at start.
    parent_pid: int | None = None
    # The host the worker reports (stats) and, on a shared log, puts in its id
    # ("w0@box-4711-9f3a"). None: this machine's name (`default_host()`); set it to tell
    # apart several `qw up` on one machine, or machines whose names clash.
    host: str | None = None
    # A test and demo field: the worker reads a wall clock off by this many seconds (+ ahead,
    # - behind), as on a machine whose clock is wrong (tests/test_redis_hosts.py).
    clock_offset_s: float = 0.0

    def validate(self) -> None:
        """Raise ValueError with one line naming the bad value and what was expected."""
        if not self.location:
            raise ValueError("location is empty; expected a data directory or a redis:// URL")
        if not self.run_dir:
            raise ValueError("run_dir is empty; expected a directory for stats snapshots")
        if not _NAME_PATTERN.fullmatch(self.name):
            raise ValueError(
                f"name {self.name!r} is not a valid worker name; expected 1-64 letters, "
                "digits, '_', '.' or '-'"
            )
        module, sep, function = self.handler.partition(":")
        if not (sep and module and function):
            raise ValueError(f"handler {self.handler!r} is malformed; expected 'module:function'")
        _at_least("work_ms", self.work_ms, 0)
        _positive("lease_s", self.lease_s)
        if self.pick is not None and self.pick not in PICK_STRATEGIES:
            raise ValueError(
                f"pick {self.pick!r} is unknown; expected one of: {', '.join(PICK_STRATEGIES)}"
            )
        _at_least("slots", self.slots, 1)
        if not 0 <= self.slot < self.slots:
            raise ValueError(f"slot is {self.slot}; expected 0 <= slot < slots ({self.slots})")
        Durability.parse(self.fsync)  # its ValueError already names the value and choices
        _at_least("max_attempts", self.max_attempts, 1)
        _at_least("backoff_s", self.backoff_s, 0)
        _at_least("backoff_max_s", self.backoff_max_s, 0)
        _positive("idle_poll_s", self.idle_poll_s)
        if self.task_timeout_s is not None:
            _positive("task_timeout_s", self.task_timeout_s)
        if self.drain_timeout_s is not None:
            _positive("drain_timeout_s", self.drain_timeout_s)
        if self.parent_pid is not None:
            _at_least("parent_pid", self.parent_pid, 1)
        if self.host is not None:
            check_host(self.host)
        if not abs(self.clock_offset_s) <= MAX_CLOCK_OFFSET_S:  # written so that NaN fails too
            raise ValueError(
                f"clock_offset_s is {self.clock_offset_s}; expected a number of seconds "
                "within ten years"
            )

    @property
    def durability(self) -> Durability:
        return Durability.parse(self.fsync)

    @property
    def networked(self) -> bool:
        """Whether the queue's logs are on a server that several machines share (a Redis
        URL): a read is a round trip, a pid is unique only on its own machine, and
        compaction, not a worker, saves the fold checkpoint."""
        return is_redis_url(self.location)

    @property
    def lease_us(self) -> int:
        return round(self.lease_s * 1_000_000)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        """Parse and type-check a config (unknown keys are errors: a typo is not a default).
        Call `validate()` for the value ranges."""
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ValueError(f"worker config is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"worker config is {type(data).__name__}; expected a JSON object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"worker config has unknown key {unknown[0]!r}")
        for key in ("location", "run_dir"):
            if key not in data:
                raise ValueError(f"worker config lacks {key!r}")
        for key, value in data.items():
            _check_type(key, value, _FIELD_TYPES[key])
        return cls(**data)


# The JSON type of each field: str, int, float (an int is accepted), bool, or with "?" that or
# null; "str*": a string, or null for the default (a field whose null says nothing to a user).
_FIELD_TYPES: Final[dict[str, str]] = {
    "location": "str",
    "run_dir": "str",
    "name": "str",
    "handler": "str",
    "work_ms": "int",
    "lease_s": "float",
    "pick": "str*",
    "slot": "int",
    "slots": "int",
    "fsync": "str",
    "max_attempts": "int",
    "backoff_s": "float",
    "backoff_max_s": "float",
    "idle_poll_s": "float",
    "task_timeout_s": "float?",
    "drain_timeout_s": "float?",
    "exit_when_drained": "bool",
    "parent_pid": "int?",
    "host": "str?",
    "clock_offset_s": "float",
}


def _check_type(key: str, value: Any, kind: str) -> None:
    if kind in ("int?", "str?", "float?", "str*") and value is None:
        return
    ok = {
        "str": isinstance(value, str),
        "str?": isinstance(value, str),
        "str*": isinstance(value, str),
        "bool": isinstance(value, bool),
        # bool is an int subclass in Python, but true is not a number of milliseconds
        "int": type(value) is int,
        "int?": type(value) is int,
        "float": type(value) in (int, float),
        "float?": type(value) in (int, float),
    }[kind]
    if not ok:
        expected = {
            "str": "a string",
            "bool": "true or false",
            "int": "an integer",
            "int?": "an integer or null",
            "str?": "a string or null",
            "str*": "a string",
            "float": "a number",
            "float?": "a number or null",
        }[kind]
        raise ValueError(f"worker config {key!r} is {value!r}; expected {expected}")


def _at_least(key: str, value: float, low: float) -> None:
    if not value >= low:  # written so that NaN fails too
        raise ValueError(f"{key} is {value}; expected a number >= {low}")


def _positive(key: str, value: float) -> None:
    if not value > 0:  # written so that NaN fails too
        raise ValueError(f"{key} is {value}; expected a number > 0")
