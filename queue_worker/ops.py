"""The ops topic: what operators and the supervisor did to worker processes during a run.

Kills, pauses, resumes, restarts and deaths are facts about the run, not about ownership:
they go to a topic of their own (``ops.log`` in the data directory, a stream on Redis),
never to the claims log, so the fold never sees them. `qw why` cites them and `qw timeline`
draws them; nothing else reads them.

A record on the wire is one msgpack array, version first, then a one-letter type code::

    OP  [1, "O", kind, at, name, worker, pid, task, by, detail]

kind    what happened: kill | pause | resume | restart | death | skew (a later version may
        add kinds: an unknown kind decodes as it is and is drawn as a plain mark)
at      when, µs since the epoch (the writer's wall clock)
name    the slot the process ran in (w6), or "" when the writer does not know it
worker  the worker id (w6-6975-4ede), or None when the process had not yet said its id
pid     the process id, or None
task    the task the worker held at that moment (as the writer's view of the log saw it)
by      who did it: "operator" (a key, `qw kill`), "supervisor" (a restart, a reaped death),
        "demo" (a `qw demo` scenario)
detail  words for people: "exit 1", "killed by SIGKILL", "+3 s"

Decoding reads untrusted bytes: anything malformed raises `RecordDecodeError` (the one
decode error of this package) and nothing else.
"""

from pathlib import Path
from typing import Any, Final, NamedTuple

import msgpack

from logstore import is_redis_url
from queue_worker.protocol.records import RecordDecodeError, RecordEncodeError
from queue_worker.topics import OPS_TOPIC, open_ops

SCHEMA: Final = 1
OP: Final = "O"

KILL: Final = "kill"
PAUSE: Final = "pause"
RESUME: Final = "resume"
RESTART: Final = "restart"
DEATH: Final = "death"
SKEW: Final = "skew"
KINDS: Final = (KILL, PAUSE, RESUME, RESTART, DEATH, SKEW)

BY_OPERATOR: Final = "operator"
BY_SUPERVISOR: Final = "supervisor"
BY_DEMO: Final = "demo"

_FIELDS: Final = 10


class OpRecord(NamedTuple):
    """One thing done to (or seen of) a worker process."""

    kind: str
    at: int
    name: str
    worker: str | None
    pid: int | None
    task: int | None
    by: str
    detail: str = ""


def worker_pid(worker_id: str) -> int | None:
    """The pid inside a worker id (w6-6975-4ede → 6975), when it has that shape: how an op
    recorded before the worker said its id is matched to the worker."""
    head, _, _ = worker_id.rpartition("-")
    _, _, pid = head.rpartition("-")
    return int(pid) if pid.isdigit() else None


def held_by(op: OpRecord, worker_id: str) -> bool:
    """Is `op` about the process whose id is `worker_id`?"""
    if op.worker is not None:
        return op.worker == worker_id
    return op.pid is not None and op.pid == worker_pid(worker_id)


def encode_op(record: OpRecord) -> bytes:
    """The wire bytes of an ops record; RecordEncodeError for a field of the wrong type."""
    r = record
    checks: tuple[tuple[Any, str, tuple[type, ...]], ...] = (
        (r.kind, "kind", (str,)),
        (r.at, "at", (int,)),
        (r.name, "name", (str,)),
        (r.worker, "worker", (str, type(None))),
        (r.pid, "pid", (int, type(None))),
        (r.task, "task", (int, type(None))),
        (r.by, "by", (str,)),
        (r.detail, "detail", (str,)),
    )
    for value, name, kinds in checks:
        if type(value) not in kinds:
            raise RecordEncodeError(f"ops field {name!r} is {value!r:.40}; expected {kinds}")
    items = [SCHEMA, OP, r.kind, r.at, r.name, r.worker, r.pid, r.task, r.by, r.detail]
    data: bytes = msgpack.packb(items, use_bin_type=True)
    return data


def _field(items: list[Any], index: int, name: str, kinds: tuple[type, ...]) -> Any:
    value = items[index]
    if type(value) not in kinds:  # bool is not an int here: a pid of True is malformed
        shown = repr(value)[:40]
        raise RecordDecodeError(f"ops field {name!r} is {shown}; expected {kinds[0].__name__}")
    return value


def decode_op(data: bytes) -> OpRecord:
    """Decode wire bytes of the ops topic; raises only RecordDecodeError."""
    try:
        items = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise RecordDecodeError(f"not msgpack: {type(e).__name__}: {e}") from e
    if type(items) is not list or len(items) < 2:
        raise RecordDecodeError(f"expected a [schema, type, ...] array, got {repr(items)[:40]}")
    if type(items[0]) is not int or items[0] < 1:
        raise RecordDecodeError(f"schema version is {repr(items[0])[:40]}; expected >= 1")
    if items[1] != OP:
        raise RecordDecodeError(f"record type is {repr(items[1])[:40]}; expected {OP!r}")
    if len(items) < _FIELDS:
        raise RecordDecodeError(f"ops record has {len(items)} items; expected {_FIELDS}")
    none = type(None)
    return OpRecord(
        _field(items, 2, "kind", (str,)),
        _field(items, 3, "at", (int,)),
        _field(items, 4, "name", (str,)),
        _field(items, 5, "worker", (str, none)),
        _field(items, 6, "pid", (int, none)),
        _field(items, 7, "task", (int, none)),
        _field(items, 8, "by", (str,)),
        _field(items, 9, "detail", (str,)),
    )


def read_ops(location: str | Path) -> tuple[list[OpRecord], int]:
    """Every ops record at `location` in log order, and how many were malformed (skipped).
    A data directory without an ops log has none (nothing is created)."""
    text = str(location)
    if not is_redis_url(text) and not (Path(text) / f"{OPS_TOPIC}.log").is_file():
        return [], 0
    records: list[OpRecord] = []
    malformed = 0
    with open_ops(location, read_only=True) as log:
        for entry in log.iter_from(log.start):
            try:
                records.append(decode_op(entry.data))
            except RecordDecodeError:
                malformed += 1
    return records, malformed
