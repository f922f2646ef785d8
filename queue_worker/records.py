"""The records of the two topics, and their msgpack encoding.

tasks topic   TASK   a unit of work: its payload (any msgpack value) and when it was enqueued
claims topic  CLAIM  worker w asks for task t at time `at`, for `lease` microseconds
              RENEW  the holder of claim c extends its lease to `at` + `lease`
              DONE   the holder of claim c finished task t; `result` is the handler's value
              FAIL   the holder of claim c gives task t up: retry no earlier than `retry_at`,
                     or (retry_at is None) the task is dead, attempts used up

A record on the wire is one msgpack array whose first two items are the schema version and
a one-letter type code; the rest are the type's fields in the order of the dataclass::

    CLAIM  [1, "C", task, worker, at, lease]
    RENEW  [1, "R", task, worker, at, claim, lease]
    DONE   [1, "D", task, worker, at, claim, result]
    FAIL   [1, "F", task, worker, at, claim, error, retry_at]
    TASK   [1, "T", payload, enqueued_at]

Times are integer microseconds since the Unix epoch (the writer's wall clock). `claim` is the
log position of the CLAIM that the record acts under: the fencing token.

Forward compatibility: a later schema may append fields (they are ignored here) or add
types (decoded as `Unknown` and skipped by the fold). Decoding bytes read from a log is
decoding untrusted input: anything malformed raises `RecordDecodeError`, and nothing else.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any, Final

import msgpack

SCHEMA: Final = 1

TASK: Final = "T"
CLAIM: Final = "C"
RENEW: Final = "R"
DONE: Final = "D"
FAIL: Final = "F"


class RecordDecodeError(ValueError):
    """Bytes from a log that are not a valid qw record."""


class RecordEncodeError(ValueError):
    """A value (a payload or a result) that msgpack cannot encode."""


@dataclass(frozen=True, slots=True)
class TaskRecord:
    payload: Any
    enqueued_at: int


@dataclass(frozen=True, slots=True)
class Claim:
    task: int
    worker: str
    at: int
    lease: int


@dataclass(frozen=True, slots=True)
class Renew:
    task: int
    worker: str
    at: int
    claim: int
    lease: int


@dataclass(frozen=True, slots=True)
class Done:
    task: int
    worker: str
    at: int
    claim: int
    result: Any = None


@dataclass(frozen=True, slots=True)
class Fail:
    task: int
    worker: str
    at: int
    claim: int
    error: str
    retry_at: int | None  # None: the task is dead

    @property
    def dead(self) -> bool:
        return self.retry_at is None


@dataclass(frozen=True, slots=True)
class Unknown:
    """A record of a type this version does not know: skipped, counted, never an error."""

    code: str


ClaimsRecord = Claim | Renew | Done | Fail | Unknown
Record = TaskRecord | ClaimsRecord


# Error messages quote the offending value. It is untrusted and may be huge or nested a
# thousand levels deep (the builtin repr would raise RecursionError), so quote it bounded.
_QUOTE = reprlib.Repr()
_QUOTE.maxlevel = 3
_QUOTE.maxstring = 40
_QUOTE.maxother = 40


def _quote(value: Any) -> str:
    return _QUOTE.repr(value)


def _pack(items: list[Any]) -> bytes:
    try:
        data: bytes = msgpack.packb(items, use_bin_type=True)
    except (TypeError, ValueError, OverflowError, BufferError) as e:
        raise RecordEncodeError(f"cannot encode as msgpack: {e}") from e
    # msgpack packs some values that no reader can decode (a map keyed by a tuple comes
    # back keyed by an unhashable list; a bool where an integer field goes): written to a
    # log, such a record would stop every reader. Refuse it here instead.
    try:
        decode(data)
    except RecordDecodeError as e:
        raise RecordEncodeError(f"encodes to bytes that do not decode: {e}") from e
    return data


def encode(record: Record) -> bytes:
    """The wire bytes of a record (raises RecordEncodeError for an unencodable payload, or
    for fields that would not decode back)."""
    if isinstance(record, Claim):
        return _pack([SCHEMA, CLAIM, record.task, record.worker, record.at, record.lease])
    if isinstance(record, Renew):
        r = record
        return _pack([SCHEMA, RENEW, r.task, r.worker, r.at, r.claim, r.lease])
    if isinstance(record, Done):
        r2 = record
        return _pack([SCHEMA, DONE, r2.task, r2.worker, r2.at, r2.claim, r2.result])
    if isinstance(record, Fail):
        f = record
        return _pack([SCHEMA, FAIL, f.task, f.worker, f.at, f.claim, f.error, f.retry_at])
    if isinstance(record, TaskRecord):
        return _pack([SCHEMA, TASK, record.payload, record.enqueued_at])
    raise TypeError(f"cannot encode {_quote(record)}: not a qw record")


def _int(value: Any, field: str) -> int:
    # bool is an int subclass; a record with True as a task id is malformed, not task 1
    if type(value) is not int:
        raise RecordDecodeError(f"field {field!r} is {_quote(value)}; expected an integer")
    return value


def _str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise RecordDecodeError(f"field {field!r} is {_quote(value)}; expected a string")
    return value


_FIELD_COUNTS: Final = {CLAIM: 6, RENEW: 7, DONE: 7, FAIL: 8, TASK: 4}


def decode(data: bytes) -> Record:
    """Decode wire bytes; raises only RecordDecodeError on malformed input."""
    try:
        items = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise RecordDecodeError(f"not msgpack: {type(e).__name__}: {e}") from e
    if not isinstance(items, list) or len(items) < 2:
        raise RecordDecodeError(f"expected a [schema, type, ...] array, got {_quote(items)}")
    version, code = items[0], items[1]
    if type(version) is not int or version < 1:
        raise RecordDecodeError(f"schema version is {_quote(version)}; expected an integer >= 1")
    if not isinstance(code, str):
        raise RecordDecodeError(f"record type is {_quote(code)}; expected a string")
    need = _FIELD_COUNTS.get(code)
    if need is None:
        return Unknown(code)
    if len(items) < need:
        raise RecordDecodeError(f"{code} record has {len(items)} items; expected {need}")
    if code == CLAIM:
        return Claim(
            _int(items[2], "task"),
            _str(items[3], "worker"),
            _int(items[4], "at"),
            _int(items[5], "lease"),
        )
    if code == RENEW:
        return Renew(
            _int(items[2], "task"),
            _str(items[3], "worker"),
            _int(items[4], "at"),
            _int(items[5], "claim"),
            _int(items[6], "lease"),
        )
    if code == DONE:
        return Done(
            _int(items[2], "task"),
            _str(items[3], "worker"),
            _int(items[4], "at"),
            _int(items[5], "claim"),
            items[6],
        )
    if code == FAIL:
        retry_at = items[7]
        return Fail(
            _int(items[2], "task"),
            _str(items[3], "worker"),
            _int(items[4], "at"),
            _int(items[5], "claim"),
            _str(items[6], "error"),
            None if retry_at is None else _int(retry_at, "retry_at"),
        )
    return TaskRecord(items[2], _int(items[3], "enqueued_at"))


def decode_claims(data: bytes) -> ClaimsRecord:
    """Decode a record read from the claims topic (a TASK there is malformed)."""
    record = decode(data)
    if isinstance(record, TaskRecord):
        raise RecordDecodeError("a TASK record in the claims topic")
    return record


def decode_task(data: bytes) -> TaskRecord | Unknown:
    """Decode a record read from the tasks topic (a claims record there is malformed)."""
    record = decode(data)
    if not isinstance(record, TaskRecord | Unknown):
        raise RecordDecodeError(f"a {type(record).__name__} record in the tasks topic")
    return record
