"""The records of the two topics, and their msgpack encoding.

tasks topic   TASK   a unit of work: its payload (any msgpack value) and when it was enqueued;
                     or, for a task by name, the function's name and its arguments
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
    CANCEL [1, "V", task, by, at, error]     (a dead FAIL from no holder: `qw cancel`)
    TASK   [1, "T", payload, enqueued_at]
    TASK   [1, "N", enqueued_at, function, args, kwargs]     (a task by name)
    TASK   [1, "S", enqueued_at, function, args, kwargs, options]
    TASK   [1, "A", enqueued_at, function, args, kwargs, options]   (with "after" in options)

A FAIL's error is one line, "Type: message"; when the handler raised, a newline and its
traceback (the last lines, at most MAX_TRACEBACK_CHARS) follow (`Fail.message`,
`Fail.traceback`): in the error field, so that every reader, of any version, folds the FAIL
alike. A task by name (its own type code: a reader that does not know it refuses the task
as of an unknown type, rather than run it as a payload) carries its function's registered
name (`Queue.task`), its positional arguments (an array) and its keyword arguments (a map
keyed by strings); a worker runs it only if that name is one it registered. A task by name
with options is of a third type ("S"), `options` a map of those it has (a key this version
does not know is ignored): "not_before" (µs, the producer's clock) and "priority" (an
integer, higher first) choose what a worker tries (`queue_worker.worker.pick`), never who
wins; "key" (a string): of the tasks with one key, the first in the tasks topic is the task,
and a later one resolves to it (its worker records it done without running it);
"retry_of" (a task id): the dead task this one retries (`qw retry`). A task by name with
dependencies ("after": the ids of earlier tasks, `enqueue(after=…)`) is of a fourth type
("A", the layout of "S"): a reader that does not know dependencies leaves it alone (a record
of unknown type) rather than run it before them (`queue_worker.worker.dependencies`).

Times are integer microseconds since the Unix epoch (the writer's wall clock). `claim` is the
log position of the CLAIM that the record acts under: the fencing token. A task id is an
index in the tasks log: an integer from 0 to `MAX_TASK_ID`. A claims record naming any other
task (−1, 2^64 − 1) is malformed: it decodes as an error, so every reader skips it as it
skips any malformed record (the fold never sees it, and no task can be held by it). The encoder
writes such an id as given (tools and tests write hostile records with it). Times and
leases are not range-checked: the fold only compares and adds them, and readers show an
absurd one as such (`queue_worker.times`).

Forward compatibility: a later schema may append fields (they are ignored here) or add
types (decoded as `Unknown` and skipped by the fold). Decoding bytes read from a log is
decoding untrusted input: anything malformed raises `RecordDecodeError`, and nothing else.
"""

from __future__ import annotations

import operator
import reprlib
import traceback as _traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any, Final, NamedTuple, cast

import msgpack

from queue_worker.errors import QwError

SCHEMA: Final = 1

TASK: Final = "T"
CLAIM: Final = "C"
RENEW: Final = "R"
DONE: Final = "D"
FAIL: Final = "F"
TASK_BY_NAME: Final = "N"
TASK_SCHEDULED: Final = "S"
TASK_AFTER: Final = "A"
CANCEL: Final = "V"


#: the largest task id: a tasks log of 2^63 records is beyond any disk, and every id up to
#: here fits msgpack's signed 64-bit integers
MAX_TASK_ID: Final = 2**63 - 1


class RecordDecodeError(ValueError, QwError):
    """Bytes from a log that are not a valid qw record."""


class TaskIdRangeError(RecordDecodeError):
    """A claims record naming a task id outside 0..MAX_TASK_ID: malformed."""


class RecordEncodeError(ValueError, QwError):
    """A value (a payload or a result) that msgpack cannot encode."""


#: the keyword arguments of a task that has none (read-only: shared by every such record)
NO_KWARGS: Final[Mapping[str, Any]] = MappingProxyType({})


# Records are NamedTuples, not frozen dataclasses: every reader builds one per record it
# reads (each worker reads every record), and a frozen dataclass builds itself through
# object.__setattr__, about 4x slower (measured).
class TaskRecord(NamedTuple):
    payload: Any
    enqueued_at: int
    function: str | None = None  # a task by name: the function's registered name
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = NO_KWARGS
    not_before: int = 0  # µs: a worker tries it no earlier (0: at once)
    priority: int = 0  # higher first
    key: str | None = None  # the first task with a key is the task; later ones resolve to it
    retry_of: int | None = None  # the dead task this one retries (`qw retry`)
    after: tuple[int, ...] = ()  # the earlier tasks it waits for (their ids, ascending)
    #: not on the wire: the earlier task of the same key this one resolves to, as the
    #: worker's task index found it (`TaskIndex.load`)
    resolves_to: int | None = None


class Claim(NamedTuple):
    task: int
    worker: str
    at: int
    lease: int


class Renew(NamedTuple):
    task: int
    worker: str
    at: int
    claim: int
    lease: int


class Done(NamedTuple):
    task: int
    worker: str
    at: int
    claim: int
    result: Any = None


class Fail(NamedTuple):
    task: int
    worker: str
    at: int
    claim: int
    error: str
    retry_at: int | None  # None: the task is dead

    @property
    def message(self) -> str:
        """The error's first line: "Type: message" (what is shown where one line goes)."""
        return self.error.partition("\n")[0]

    @property
    def traceback(self) -> str | None:
        """The handler's traceback, when the error carries one (after its first line)."""
        return error_traceback(self.error)

    @property
    def dead(self) -> bool:
        return self.retry_at is None


class Cancel(Fail):
    """CANCEL: task t is cancelled (`qw cancel`): a FAIL that makes it dead whoever holds it
    (`worker` is who cancelled it; `claim` is -1 and `retry_at` None). Every reader that
    reads it as a FAIL reads a dead one; the fold accepts it from anyone while the task is
    open (protocol rule 6), and then refuses its holder's RENEW, DONE and FAIL."""

    __slots__ = ()


class Unknown(NamedTuple):
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


#: the longest error text a FAIL record carries
MAX_ERROR_CHARS: Final = 1000


def error_field(text: str) -> str:
    """`text` as a FAIL's error: one line, at most MAX_ERROR_CHARS, and always encodable
    (a lone surrogate, which UTF-8 cannot carry, is written as its escape)."""
    text = " ".join(text.split())
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1] + "…"
    return text


def error_text(exc: BaseException) -> str:
    """ "Type: message" of an exception, as a FAIL's error (`error_field`). Never raises: an
    exception whose str() raises (a handler's own class) is named with what str() raised."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception as e:  # its __str__ is the handler's code
        message = f"(its message cannot be read: str() raised {type(e).__name__})"
    return error_field(f"{name}: {message}" if message else name)


#: the longest traceback a FAIL record carries: its last lines (the frames nearest the error)
MAX_TRACEBACK_CHARS: Final = 2000


def traceback_text(exc: BaseException, tb: TracebackType | None) -> str:
    """The traceback of `exc` from frame `tb` on, as a FAIL carries it: its last lines, at
    most MAX_TRACEBACK_CHARS, encodable (as `error_field`). Never raises."""
    try:
        lines = _traceback.format_exception(type(exc), exc, tb)
    except Exception as e:  # an exception's own __str__ may raise
        return f"(the traceback cannot be formatted: {type(e).__name__})"
    text = "".join(lines).rstrip("\n")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_TRACEBACK_CHARS:
        cut = text[len(text) - MAX_TRACEBACK_CHARS + 2 :]
        newline = cut.find("\n")
        text = "…\n" + (cut[newline + 1 :] if newline >= 0 else cut)
    return text


def with_traceback(error: str, traceback: str | None) -> str:
    """A FAIL's error field: `error` (one line) and, when there is one, the traceback."""
    return error if not traceback else f"{error}\n{traceback}"


def error_traceback(error: str) -> str | None:
    """The traceback a FAIL's error field carries after its first line, or None."""
    _, newline, rest = error.partition("\n")
    return rest if newline else None


def _pack(items: list[Any], *, free_form: bool, scalars: bool = False) -> bytes:
    """`scalars`: every item is of a `_SCALARS` type (the shared Packer may pack them)."""
    try:
        if scalars:
            data: bytes = _PACKER.pack(items)
        else:
            data = msgpack.packb(items, use_bin_type=True)
    except Exception as e:  # a free-form value's own methods (a dict's items()) may raise
        raise RecordEncodeError(f"cannot encode as msgpack: {error_text(e)}") from e
    # msgpack packs some values that no reader can decode (a map keyed by a tuple comes
    # back keyed by an unhashable list): written to a log, such a record would stop every
    # reader. A record with a free-form value (a payload, a result) is decoded once here to
    # refuse that; the fixed fields of the others were type-checked before packing, which
    # costs far less on the claim path.
    if free_form:
        try:
            decode(data)
        except TaskIdRangeError:
            pass  # written as given, as in a record without a free-form value (see above)
        except RecordDecodeError as e:
            raise RecordEncodeError(f"encodes to bytes that do not decode: {e}") from e
    return data


#: values that msgpack always packs into something that decodes (no check needed)
_SCALARS: Final = frozenset({type(None), bool, int, float, str, bytes})

#: one Packer for every record made of `_SCALARS` only (a CLAIM, a DONE of a no-op): packb
#: builds a Packer a call, half of a small record's packing. Safe to share between threads:
#: packing those types runs no Python code, so a call runs whole under the GIL; a failed
#: call (an int out of range) empties its buffer.
_PACKER: Final = msgpack.Packer(use_bin_type=True)


def _fields(*checks: tuple[Any, str, type]) -> None:
    """Refuse a fixed field of the wrong type (a bool where an integer goes, …)."""
    for value, name, kind in checks:
        if type(value) is not kind:
            raise RecordEncodeError(f"field {name!r} is {_quote(value)}; expected {kind.__name__}")


# A CLAIM or a DONE of a no-op (None) built from bytes: msgpack packs an array as its header
# then each item's own bytes, so the constant items' bytes are packed once, and an integer
# is written as msgpack writes it (the shortest form). The Packer call it saves was half of
# a no-op task's encoding; the generic path stays for anything else, and the tests hold the
# two to the same bytes.

#: [SCHEMA, code] of a CLAIM (6 items) and of a DONE (7), and a nil (a DONE's None)
_CLAIM_HEAD: Final[bytes] = bytes((0x90 | 6,)) + msgpack.packb(SCHEMA) + msgpack.packb(CLAIM)
_DONE_HEAD: Final[bytes] = bytes((0x90 | 7,)) + msgpack.packb(SCHEMA) + msgpack.packb(DONE)
_NIL: Final[bytes] = msgpack.packb(None)

#: the integers `_uint` packs: 0 up to here (a larger one, or a negative one, is packed by
#: msgpack: only a hostile record has one)
_UINT_MAX: Final = (1 << 62) - 1
_FIXINTS: Final = tuple(bytes((i,)) for i in range(0x80))  # positive fixint: the byte itself


def _uint(value: int) -> bytes:
    """msgpack's bytes of `value`, 0 <= value <= _UINT_MAX (the caller checks): the first
    of positive fixint, uint 8, 16, 32 and 64 that holds it, as msgpack packs it."""
    if value < 0x80:
        return _FIXINTS[value]
    if value <= 0xFF:
        return (0xCC00 | value).to_bytes(2, "big")
    if value <= 0xFFFF:
        return (0xCD_0000 | value).to_bytes(3, "big")
    if value <= 0xFFFF_FFFF:
        return (0xCE_0000_0000 | value).to_bytes(5, "big")
    return b"\xcf%b" % value.to_bytes(8, "big")


def _claim_bytes(task: int, worker: str, at: int, lease: int) -> bytes | None:
    """A CLAIM's bytes, or None when a field is out of `_uint`'s range."""
    if 0 <= task <= _UINT_MAX and 0 <= at <= _UINT_MAX and 0 <= lease <= _UINT_MAX:
        packed = _packed_str(worker)
        return b"%b%b%b%b%b" % (_CLAIM_HEAD, _uint(task), packed, _uint(at), _uint(lease))
    return None


def _done_bytes(task: int, worker: str, at: int, claim: int) -> bytes | None:
    """The bytes of a DONE with a None result, or None when a field is out of range."""
    if 0 <= task <= _UINT_MAX and 0 <= at <= _UINT_MAX and 0 <= claim <= _UINT_MAX:
        packed = _packed_str(worker)
        return b"%b%b%b%b%b%b" % (_DONE_HEAD, _uint(task), packed, _uint(at), _uint(claim), _NIL)
    return None


#: msgpack's bytes of the strings `_packed_str` was asked for (worker ids: a worker packs
#: its own again and again), a few at most
_PACKED_STRS: Final[dict[str, bytes]] = {}


def _packed_str(value: str) -> bytes:
    packed = _PACKED_STRS.get(value)
    if packed is None:
        if len(_PACKED_STRS) >= 16:
            _PACKED_STRS.clear()
        packed = _PACKED_STRS[value] = _PACKER.pack(value)
    return packed


def encode(record: Record) -> bytes:
    """The wire bytes of a record (raises RecordEncodeError for an unencodable payload, or
    for fields that would not decode back)."""
    if isinstance(record, Claim):
        # A worker's own CLAIM (and DONE below), well formed: from bytes (see _claim_bytes)
        task, worker, at, lease = cast("tuple[Any, Any, Any, Any]", record)
        if type(task) is int and type(worker) is str and type(at) is int and type(lease) is int:
            fast = _claim_bytes(task, worker, at, lease)
            if fast is not None:
                return fast
        c: Any = record
        _fields((c.task, "task", int), (c.worker, "worker", str), (c.at, "at", int))
        _fields((c.lease, "lease", int))
        items = [SCHEMA, CLAIM, c.task, c.worker, c.at, c.lease]
        return _pack(items, free_form=False, scalars=True)  # (the fields checked above)
    if isinstance(record, Renew):
        r: Any = record
        _fields((r.task, "task", int), (r.worker, "worker", str), (r.at, "at", int))
        _fields((r.claim, "claim", int), (r.lease, "lease", int))
        items = [SCHEMA, RENEW, r.task, r.worker, r.at, r.claim, r.lease]
        return _pack(items, free_form=False, scalars=True)
    if isinstance(record, Done):
        task, worker, at, claim, result = cast("tuple[Any, Any, Any, Any, Any]", record)
        well_formed = type(task) is int and type(worker) is str and type(at) is int
        if result is None and well_formed and type(claim) is int:
            fast = _done_bytes(task, worker, at, claim)
            if fast is not None:
                return fast
        d: Any = record
        items = [SCHEMA, DONE, d.task, d.worker, d.at, d.claim, d.result]
        # (its fixed fields are not checked: only looked at, for the shared Packer)
        scalars = (
            type(d.task) is int
            and type(d.worker) is str
            and type(d.at) is int
            and type(d.claim) is int
            and type(d.result) in _SCALARS
        )
        return _pack(items, free_form=type(d.result) not in _SCALARS, scalars=scalars)
    if type(record) is Cancel:
        x: Any = record
        _fields((x.task, "task", int), (x.worker, "worker", str), (x.at, "at", int))
        _fields((x.error, "error", str))
        items = [SCHEMA, CANCEL, x.task, x.worker, x.at, x.error]
        return _pack(items, free_form=False, scalars=True)
    if isinstance(record, Fail):
        f: Any = record
        _fields((f.task, "task", int), (f.worker, "worker", str), (f.at, "at", int))
        _fields((f.claim, "claim", int), (f.error, "error", str))
        if f.retry_at is not None:
            _fields((f.retry_at, "retry_at", int))
        items = [SCHEMA, FAIL, f.task, f.worker, f.at, f.claim, f.error, f.retry_at]
        return _pack(items, free_form=False, scalars=True)
    if isinstance(record, TaskRecord):
        t: Any = record
        payload = t.payload
        if t.function is None:
            items = [SCHEMA, TASK, payload, t.enqueued_at]
            return _pack(items, free_form=type(payload) not in _SCALARS)
        _fields((t.enqueued_at, "enqueued_at", int), (t.function, "function", str))
        if not isinstance(t.args, Sequence) or isinstance(t.args, str | bytes):
            raise RecordEncodeError(f"args are {_quote(t.args)}; expected a sequence")
        if not isinstance(t.kwargs, Mapping) or not all(type(k) is str for k in t.kwargs):
            raise RecordEncodeError(f"kwargs are {_quote(t.kwargs)}; expected a map keyed by str")
        items = [SCHEMA, TASK_BY_NAME, t.enqueued_at, t.function, list(t.args), dict(t.kwargs)]
        options: dict[str, Any] = {}
        if t.not_before:
            _fields((t.not_before, "not_before", int))
            options["not_before"] = t.not_before
        if t.priority:
            _fields((t.priority, "priority", int))
            options["priority"] = t.priority
        if t.key is not None:
            _fields((t.key, "key", str))
            options["key"] = t.key
        if t.retry_of is not None:
            _fields((t.retry_of, "retry_of", int))
            options["retry_of"] = t.retry_of
        if t.after:
            after = list(t.after)
            if not all(type(d) is int for d in after):
                raise RecordEncodeError(f"after is {_quote(t.after)}; expected task ids")
            options["after"] = after
        if options:
            items[1] = TASK_AFTER if t.after else TASK_SCHEDULED
            items.append(options)
        return _pack(items, free_form=True)
    raise TypeError(f"cannot encode {_quote(record)}: not a qw record")


def _int(value: Any, field: str) -> int:
    # bool is an int subclass; a record with True as a task id is malformed, not task 1
    if type(value) is not int:
        raise RecordDecodeError(f"field {field!r} is {_quote(value)}; expected an integer")
    return value


def _task(value: Any) -> int:
    task = _int(value, "task")
    if not 0 <= task <= MAX_TASK_ID:
        raise TaskIdRangeError(f"field 'task' is {task}; expected a task id from 0 to 2^63-1")
    return task


def _str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise RecordDecodeError(f"field {field!r} is {_quote(value)}; expected a string")
    return value


_FIELD_COUNTS: Final = {
    CLAIM: 6,
    CANCEL: 6,
    RENEW: 7,
    DONE: 7,
    FAIL: 8,
    TASK: 4,
    TASK_BY_NAME: 6,
    TASK_SCHEDULED: 7,
    TASK_AFTER: 7,
}


def _unpack(data: bytes) -> Any:
    """msgpack → Python values (arrays as lists, str as str, maps with any hashable key)."""
    try:
        # The defaults first: passing options costs more than the decoding of a small
        # record (0.29 vs 0.52 µs, measured). Their one difference from what we want is
        # strict_map_key, which refuses maps with non-str keys: those are decoded again.
        return _UNPACKB(data)
    except Exception:  # msgpack raises several unrelated types on garbage
        pass
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
    except Exception as e:
        raise RecordDecodeError(f"not msgpack: {type(e).__name__}: {e}") from e


_UNPACKB: Final = msgpack.unpackb


def decode(data: bytes) -> Record:
    """Decode wire bytes; raises only RecordDecodeError on malformed input."""
    items = _unpack(data)
    # The claims log's common records, well formed, first: every worker decodes every one.
    if type(items) is list and len(items) >= 6:
        version, code, task, worker, at, fifth = items[:6]
        if (
            type(version) is int
            and version >= 1
            and type(task) is int
            and 0 <= task <= MAX_TASK_ID
            and type(worker) is str
            and type(at) is int
            and type(fifth) is int
        ):
            # tuple.__new__ rather than the NamedTuple's own __new__ (a Python function
            # that only forwards its arguments): 0.15 vs 0.34 µs a record, measured.
            if code == CLAIM:
                return _NEW(Claim, (task, worker, at, fifth))
            if code == DONE and len(items) >= 7:
                return _NEW(Done, (task, worker, at, fifth, items[6]))
    return _decode_checked(items)


_NEW: Final = tuple.__new__


def _decode_checked(items: Any) -> Record:
    """Decode unpacked values, checking every field and naming what is wrong."""
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
    # Each branch checks the field types inline first (the common, well-formed case) and
    # falls back to the per-field checks only to name what is wrong.
    if code == CLAIM:
        task, worker, at, lease = items[2], items[3], items[4], items[5]
        if (
            type(task) is int
            and 0 <= task <= MAX_TASK_ID
            and type(worker) is str
            and type(at) is int
            and type(lease) is int
        ):
            return Claim(task, worker, at, lease)
        return Claim(_task(task), _str(worker, "worker"), _int(at, "at"), _int(lease, "lease"))
    if code == DONE:
        task, worker, at, claim = items[2], items[3], items[4], items[5]
        if (
            type(task) is int
            and 0 <= task <= MAX_TASK_ID
            and type(worker) is str
            and type(at) is int
            and type(claim) is int
        ):
            return Done(task, worker, at, claim, items[6])
        return Done(
            _task(task),
            _str(worker, "worker"),
            _int(at, "at"),
            _int(claim, "claim"),
            items[6],
        )
    if code == RENEW:
        return Renew(
            _task(items[2]),
            _str(items[3], "worker"),
            _int(items[4], "at"),
            _int(items[5], "claim"),
            _int(items[6], "lease"),
        )
    if code == CANCEL:
        task, by, at = _task(items[2]), _str(items[3], "worker"), _int(items[4], "at")
        return Cancel(task, by, at, -1, _str(items[5], "error"), None)
    if code == FAIL:
        retry_at = items[7]
        return Fail(
            _task(items[2]),
            _str(items[3], "worker"),
            _int(items[4], "at"),
            _int(items[5], "claim"),
            _str(items[6], "error"),
            None if retry_at is None else _int(retry_at, "retry_at"),
        )
    if code in (TASK_BY_NAME, TASK_SCHEDULED, TASK_AFTER):
        return _task_by_name(items)
    enqueued_at = _int(items[3], "enqueued_at")
    return _NEW(
        TaskRecord, (items[2], enqueued_at, None, (), NO_KWARGS, 0, 0, None, None, (), None)
    )


def _task_by_name(items: list[Any]) -> TaskRecord:
    """A task by name's fields, checked."""
    enqueued_at, function = _int(items[2], "enqueued_at"), _str(items[3], "function")
    args, kwargs = items[4], items[5]
    if type(args) is not list:
        raise RecordDecodeError(f"field 'args' is {_quote(args)}; expected an array")
    if type(kwargs) is not dict or not all(type(k) is str for k in kwargs):
        raise RecordDecodeError(f"field 'kwargs' is {_quote(kwargs)}; expected a map keyed by str")
    if items[1] != TASK_BY_NAME:
        options = items[6]
        if type(options) is not dict:
            raise RecordDecodeError(f"field 'options' is {_quote(options)}; expected a map")
        not_before = _int(options.get("not_before", 0), "not_before")
        priority = _int(options.get("priority", 0), "priority")
        key = options.get("key")
        key = None if key is None else _str(key, "key")
        retry_of = options.get("retry_of")
        retry_of = None if retry_of is None else _int(retry_of, "retry_of")
        after = _after(options.get("after")) if items[1] == TASK_AFTER else ()
        call = (None, enqueued_at, function, args, kwargs)
        return _NEW(TaskRecord, (*call, not_before, priority, key, retry_of, after, None))
    plain = (None, enqueued_at, function, args, kwargs, 0, 0, None, None, (), None)
    return _NEW(TaskRecord, plain)


def _after(value: Any) -> tuple[int, ...]:
    """A task's dependencies (type "A"): a non-empty array of task ids."""
    if type(value) is not list or not value:
        raise RecordDecodeError(f"field 'after' is {_quote(value)}; expected an array of task ids")
    return tuple(_task(d) for d in value)


def decode_claims(data: bytes) -> ClaimsRecord:
    """Decode a record read from the claims topic (a TASK there is malformed)."""
    record = decode(data)
    if isinstance(record, TaskRecord):
        raise RecordDecodeError("a TASK record in the claims topic")
    return record


def decode_claims_all(datas: Iterable[bytes]) -> list[ClaimsRecord | None]:
    """`decode_claims` of each record read from the claims topic, in one loop; None for a
    malformed one (`decode_claims` of it alone raises RecordDecodeError naming why).

    Every worker decodes every claims record: a loop over a read's records costs less than
    a call each (the function calls, the lookups). In C when built (`queue_worker.protocol.cdecode`:
    the common records, well formed, built as `decode` builds them, anything else handed to
    `_claims_or_none`); else `decode_claims_py`, this loop's definition.
    """
    module = _C_LOADED[0] if _C_LOADED else _c_module()
    if module is not None:
        decoded: list[ClaimsRecord | None] = module.decode_claims_all(
            datas, Claim, Done, _claims_or_none
        )
        return decoded
    return decode_claims_py(datas)


def decode_claims_py(datas: Iterable[bytes]) -> list[ClaimsRecord | None]:
    """`decode_claims_all` in Python: the common records, well formed, are built here as
    `decode` builds them. Anything else is decoded by `decode_claims`."""
    records: list[ClaimsRecord | None] = []
    keep = records.append
    unpackb = _UNPACKB
    new = _NEW
    for data in datas:
        try:
            items = unpackb(data)
        except Exception:  # not msgpack with the defaults: decode_claims decides
            items = None
        if type(items) is list and len(items) >= 6:
            version, code, task, worker, at, fifth = items[:6]
            if (
                type(version) is int
                and version >= 1
                and type(task) is int
                and 0 <= task <= MAX_TASK_ID
                and type(worker) is str
                and type(at) is int
                and type(fifth) is int
            ):
                if code == CLAIM:
                    keep(new(Claim, (task, worker, at, fifth)))
                    continue
                if code == DONE and len(items) >= 7:
                    keep(new(Done, (task, worker, at, fifth, items[6])))
                    continue
        try:
            keep(decode_claims(data))
        except RecordDecodeError:
            keep(None)
    return records


#: a log entry's fields (logstore.Entry: position, next, data, server_time_us)
EntryFields = tuple[int, int, bytes, "int | None"]
_POSITION: Final = operator.itemgetter(0)
_DATA: Final = operator.itemgetter(2)
_SERVER_TIME: Final = operator.itemgetter(3)


def decode_claims_entries(
    entries: Sequence[EntryFields],
) -> tuple[list[ClaimsRecord | None], list[int], bool]:
    """`decode_claims_all` of a read's entries, with their positions, and whether any of them
    carries a server time: what a follower folds, in one pass over the entries (in C when
    built, for a list; else `decode_claims_entries_py`, its definition)."""
    module = _C_LOADED[0] if _C_LOADED else _c_module()
    if module is not None and type(entries) is list:
        decoded: tuple[list[ClaimsRecord | None], list[int], bool] = module.decode_claims_entries(
            entries, Claim, Done, _claims_or_none
        )
        return decoded
    return decode_claims_entries_py(entries)


def decode_claims_entries_py(
    entries: Sequence[EntryFields],
) -> tuple[list[ClaimsRecord | None], list[int], bool]:
    records = decode_claims_py(map(_DATA, entries))
    times = list(map(_SERVER_TIME, entries))
    return records, list(map(_POSITION, entries)), times.count(None) != len(times)


def decode_task(data: bytes) -> TaskRecord | Unknown:
    """Decode a record read from the tasks topic (a claims record there is malformed)."""
    items = _unpack(data)
    # A TASK, well formed, first: a worker decodes one a task it runs (`decode` would try
    # the claims records' shapes first, then check every field by name)
    if type(items) is list and len(items) >= 4 and items[1] == TASK:
        version, enqueued_at = items[0], items[3]
        if type(version) is int and version >= 1 and type(enqueued_at) is int:
            return _NEW(
                TaskRecord,
                (items[2], enqueued_at, None, (), NO_KWARGS, 0, 0, None, None, (), None),
            )
    record = _decode_checked(items)
    if not isinstance(record, TaskRecord) and not isinstance(record, Unknown):
        raise RecordDecodeError(f"a {type(record).__name__} record in the tasks topic")
    return record


def _claims_or_none(data: bytes) -> ClaimsRecord | None:
    """What `decode_claims_all` keeps for one payload the C decoder does not know."""
    try:
        return decode_claims(data)
    except RecordDecodeError:
        return None


#: the C decoder's signature: (payloads, the Claim type, the Done type, the fallback)
ClaimsDecoder = Callable[
    [Iterable[bytes], type, type, Callable[[bytes], "ClaimsRecord | None"]],
    list[ClaimsRecord | None],
]


#: and of `decode_claims_entries`'s: (entries, the Claim type, the Done type, the fallback)
EntriesDecoder = Callable[
    [
        Sequence[EntryFields],
        type,
        type,
        Callable[[bytes], "ClaimsRecord | None"],
    ],
    tuple[list[ClaimsRecord | None], list[int], bool],
]


#: the C decoders' module (or None), once loaded: at the first decode of claims records, not
#: at import (a command that never folds, `qw enqueue`, need not load it)
_C_LOADED: Final[list[Any]] = []


def _c_module() -> Any:
    """The C decoders' module when built (queue_worker.protocol.cdecode), or None."""
    if not _C_LOADED:
        from queue_worker.protocol import cdecode

        _C_LOADED.append(cdecode.load())
    return _C_LOADED[0]
