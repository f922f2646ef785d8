"""Server verdicts: the fold's rules run next to the claims stream, in a Lua script (Redis).

On Redis a worker settles its CLAIM by reading every record of the claims stream up to its
own, so the work per task grows with the number of workers. This module lets the server
answer instead: one script appends the record to the stream (the record of everything, as
before) and returns its verdict, computed by the rules of `ClaimState.apply`
(docs/protocol.md, "The verdict") over a small per-task state the script keeps beside the
stream, in the hash ``<claims key>:verdicts``:

    field <task id>  the task's state, a msgpack map: ``s`` "o" (open), "d" (done) or "x"
                     (dead); an open task's holder ``c`` (the winning CLAIM's entry id),
                     ``w`` (its worker), ``a`` (its time), ``e`` (its expiry), ``n`` (its
                     winning claims), ``r`` (retry_at after a FAIL) and ``l`` (the last
                     FAIL's error; a dead task's error)
    field ~through   the id of the last entry the script folded
    field ~below     every task below it is closed, and one without a field is done:
                     compaction drops done tasks' fields below the fold's watermark in the
                     step that trims the claims stream (`trim_claims`); dead ones stay

Times are the server's, as every reader's fold sees them on Redis (`topics.on_server_clock`):
a record's ``at`` is its entry's millisecond × 1000, a FAIL's retry_at keeps its distance
from the writer's ``at``. A fencing token is the CLAIM's entry id (``ms-seq``) as a string:
Lua's numbers are doubles, which hold times (< 2^53 µs until the year 2255) exactly, but not
packed positions (~2^60). The writer sends the record's fields beside its bytes; the bytes
are what every reader folds, and `queue_worker.proof.verdict_check` (run by ``qw report``)
re-folds them and compares every task's state with the server's: any difference is a bug,
reported loudly.

The client-side fold stays the definition: this is a second implementation of its rules,
tested against it record by record on generated histories (tests/test_server_verdicts.py).

The script folds only the records it appends itself. When the stream's last entry is not
the last one it folded (a writer appended without it), it refuses (`VerdictsBehindError`)
rather than give verdicts on a state that misses records: every writer of a queue that uses
server verdicts must use them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

import msgpack
from redis.commands.core import Script

from logstore import AppendError, IdentityError, LogError, RecordTooLargeError
from logstore.redis.log import (
    QUEUE_LUA,
    RedisLog,
    format_id,
    pack_id,
    parse_id,
    redis_key,
    unpack_position,
)
from logstore.redis.scripts import lua_file, lua_source
from queue_worker.errors import QwError
from queue_worker.protocol.records import Cancel, Claim, Done, Fail, Renew, encode
from queue_worker.protocol.state import ClaimState, Lease, Verdict
from queue_worker.topics import TASKS_TOPIC

#: the hash field that holds the id of the last entry the script folded (task fields are
#: decimal digits only)
THROUGH: Final = "~through"
#: the hash field below which every task is closed (and one without a field done)
BELOW: Final = "~below"
#: the largest lease or backoff distance the script adds exactly (its numbers are doubles:
#: a time, < 2^51 µs until the year 2041 and < 2^53 until 2255, plus this stays exact)
MAX_EXACT: Final = 2**52

# The fold's rules (lua/rules.lua) and the parked tasks a record may let go (lua/parked.lua),
# shared by every script that appends claims records (this module's and
# queue_worker.redis.server_claim's), after the identity check they call first; each
# script's own body follows them (lua/verdict.lua, lua/next_task.lua), and each file says
# what it takes and answers.
RULES_LUA: Final = QUEUE_LUA + lua_source("queue_worker.redis", "rules.lua", "parked.lua")
_VERDICT_LUA: Final = RULES_LUA + lua_file("queue_worker.redis", "verdict.lua")
_SNAPSHOT_LUA: Final = lua_file("queue_worker.redis", "snapshot.lua")


class VerdictsBehindError(IdentityError, AppendError, QwError):
    """The claims stream holds records the server's verdicts did not fold: a writer of the
    queue does not use them. An IdentityError (a log not the one expected), so a worker
    stops rather than retry an append that can never be made."""


class TaskView(NamedTuple):
    """One task's state as both implementations hold it, in one shape to compare."""

    status: str  # "open", "done" or "dead"
    holder: Lease | None = None
    attempts: int = 0
    retry_at: int | None = None
    error: str | None = None  # an open task's last FAIL error; a dead task's error


class ServerVerdict(NamedTuple):
    """What the script answered for one record it appended."""

    position: int
    verdict: Verdict
    task: TaskView | None  # the task's state on the server after the record


class ServerState(NamedTuple):
    """The server's per-task state and the stream's end, read at one moment."""

    through: int | None  # the position of the last entry the script folded
    tail: int | None  # the position of the last entry ever added (None: none; a trim keeps it)
    tasks: dict[int, bytes]  # task id -> its packed state
    scheduled: dict[int, int]  # open task id -> when it may next be claimed (expiry or retry_at)
    below: int = 0  # every task below it is closed; one without a field is done

    def view(self, task: int) -> TaskView | None:
        """`task` as the server holds it (None: never claimed). ValueError for a state the
        script cannot have written."""
        packed = self.tasks.get(task)
        if packed is None:
            return TaskView("done") if 0 <= task < self.below else None
        return server_view(packed)


class TaskViews:
    """Some tasks' states as the server holds them (`ServerVerdicts.views`): what a worker
    with server verdicts asks of a task's dependencies (`worker.dependencies.refusal`)."""

    __slots__ = ("_views",)

    def __init__(self, views: Mapping[int, TaskView | None]) -> None:
        self._views = views

    def is_closed(self, task: int) -> bool:
        view = self._views.get(task)
        return view is not None and view.status != "open"

    def is_dead(self, task: int) -> bool:
        view = self._views.get(task)
        return view is not None and view.status == "dead"

    def dead_error(self, task: int) -> str | None:
        view = self._views.get(task)
        return view.error if view is not None and view.status == "dead" else None


def state_key(log: RedisLog) -> str:
    """The hash the script keeps beside `log`'s stream (same prefix: same cluster slot)."""
    return redis_key(log.prefix, log.topic, "verdicts")


def index_key(log: RedisLog) -> str:
    """The sorted set of open tasks by when they may next be claimed, beside `log`'s stream."""
    return redis_key(log.prefix, log.topic, "verdicts", "open")


def parked_keys(log: RedisLog) -> list[str]:
    """The tasks the claiming script's cursor passed over without handing them out, beside
    `log`'s stream: those due (by priority, then id), those whose delay is not over (by its
    end) and those waiting for a dependency (by it): lua/parked.lua."""
    parts = ("ready", "waiting", "after")
    return [redis_key(log.prefix, log.topic, "verdicts", w) for w in parts]


def state_keys(log: RedisLog) -> list[str]:
    """The per-task state and the index of open tasks, beside `log`'s stream."""
    return [state_key(log), index_key(log)]


def folding_keys(log: RedisLog) -> list[str]:
    """KEYS[3..8] of every script that folds claims records (after the stream's two): the
    state, the open tasks, the tasks stream and the parked tasks (a record that closes a
    task may let the tasks waiting for it go: lua/parked.lua)."""
    return [*state_keys(log), redis_key(log.prefix, TASKS_TOPIC), *parked_keys(log)]


def fold_view(state: ClaimState, task: int) -> TaskView | None:
    """`task` as the fold holds it (None: never claimed)."""
    if state.is_dead(task):
        return TaskView("dead", error=state.dead_error(task))
    if state.is_closed(task):
        return TaskView("done")
    st = state.task_state(task)
    if st is None:
        return None
    return TaskView("open", st.holder, st.attempts, st.retry_at, st.last_error)


def server_view(packed: bytes) -> TaskView:
    """A task's state as the script keeps it. Raises ValueError for one it cannot have
    written."""
    try:
        fields = msgpack.unpackb(packed, raw=False)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise ValueError(f"not msgpack: {e}") from e
    if not isinstance(fields, dict):
        raise ValueError(f"not a map: {fields!r:.80}")
    status = {"o": "open", "d": "done", "x": "dead"}.get(fields.get("s"))  # type: ignore[arg-type]
    error = _optional(fields, "l", str)
    if status == "done":
        return TaskView("done")
    if status == "dead":
        return TaskView("dead", error=error)
    if status is None:
        raise ValueError(f"status {fields.get('s')!r}; expected o, d or x")
    holder = None
    if "c" in fields:
        claim = _optional(fields, "c", str)
        assert claim is not None
        holder = Lease(
            pack_id(*parse_id(claim)),
            _required(fields, "w", str),
            _required(fields, "a", int),
            _required(fields, "e", int),
        )
    return TaskView("open", holder, _required(fields, "n", int), _optional(fields, "r", int), error)


def _optional(fields: dict[Any, Any], key: str, kind: type) -> Any:
    value = fields.get(key)
    if value is not None and type(value) is not kind:
        raise ValueError(f"field {key!r} is {value!r:.80}; expected {kind.__name__}")
    return value


def _required(fields: dict[Any, Any], key: str, kind: type) -> Any:
    value = _optional(fields, key, kind)
    if value is None:
        raise ValueError(f"field {key!r} is missing")
    return value


def _exact(value: int, name: str) -> int:
    if not -MAX_EXACT <= value <= MAX_EXACT:
        raise ValueError(f"{name} {value} is beyond what the server's script adds exactly")
    return value


def record_args(record: Claim | Renew | Done | Fail) -> list[bytes | int | str]:
    """A record's fields as `fold_in` takes them (after its bytes)."""
    if type(record) is Cancel:  # (a FAIL from no holder: no claim, no retry)
        return ["V", record.task, record.worker, "", "", "", record.message]
    claim = "" if isinstance(record, Claim) else format_id(*unpack_position(record.claim))
    lease: int | str = ""
    retry: int | str = ""
    error = ""
    if isinstance(record, Claim):
        kind, lease = "C", _exact(record.lease, "lease")
    elif isinstance(record, Renew):
        kind, lease = "R", _exact(record.lease, "lease")
    elif isinstance(record, Done):
        kind = "D"
    else:
        kind, error = "F", record.message
        if record.retry_at is not None:
            retry = _exact(record.retry_at - record.at, "backoff")
    return [kind, record.task, record.worker, lease, claim, retry, error]


#: a verdict by its word as the script answers it (enum's own lookup by value, with the
#: decode, is ~1.3 us a call: twice a task on a worker's hot path)
_VERDICTS: Final = {member.value.encode(): member for member in Verdict}


def verdict_of(word: bytes) -> Verdict:
    """The verdict the script named; ValueError for a word that is none."""
    found = _VERDICTS.get(word)
    return found if found is not None else Verdict(word.decode())


def unpack_reply(log: RedisLog, raw: object, size: int, step: int = 0) -> list[Any]:
    """A folding script's reply: `size` items (with `step`, `size` and any number of groups
    of `step` more), packed as one msgpack array (one string to read instead of a nested
    reply, which redis-py parses item by item)."""
    try:
        items = msgpack.unpackb(raw, raw=True) if isinstance(raw, bytes) else None
    except Exception:  # msgpack raises several unrelated types on garbage
        items = None
    if not isinstance(items, list) or not _sized(len(items), size, step):
        raise LogError(f"{log.name}: unexpected reply from redis: {raw!r:.200}")
    return items


def _sized(length: int, size: int, step: int) -> bool:
    if step == 0:
        return length == size
    return length >= size and (length - size) % step == 0


#: a done task's view: the same every time
_DONE: Final = TaskView("done")


def reply_verdict(log: RedisLog, entry_id: object, word: object, st: object) -> ServerVerdict:
    """One record's verdict as a folding script's reply gives it: its entry id, the verdict's
    word and the task's state after it (the script's own table, unpacked with the reply:
    a map with byte keys, or false for none). LogError for a reply the script cannot have
    given.

    On a worker's hot path (twice a task): the state is read straight from the map, where
    `server_view` (for a state read from the hash, whose every field it checks) unpacks a
    nested string and checks it field by field: ~3x the CPU, measured."""
    try:
        if not isinstance(entry_id, bytes) or not isinstance(word, bytes):
            raise ValueError("an entry id and a verdict are strings")
        position = pack_id(*parse_id(entry_id))
        verdict = verdict_of(word)
        task = None if not st else _view(st, entry_id, position)
    except (LogError, KeyError, AttributeError, ValueError, TypeError) as e:
        raise LogError(
            f"{log.name}: unexpected reply from redis ({e}): "
            f"{entry_id!r:.60} {word!r:.40} {st!r:.200}"
        ) from e
    return ServerVerdict(position, verdict, task)


def _view(st: object, entry_id: bytes, position: int) -> TaskView:
    """A task's state as a folding script's reply holds it (see `reply_verdict`), after the
    record `entry_id` at `position` (a CLAIM that won holds the task: its id is parsed once)."""
    if not isinstance(st, dict):
        raise ValueError("a state is a map")
    status = st[b"s"]
    if status == b"d":
        return _DONE
    error = st.get(b"l")
    if error is not None:
        error = error.decode("utf-8", "replace")
    if status == b"x":
        return TaskView("dead", error=error)
    if status != b"o":
        raise ValueError(f"status {status!r}")
    holder = None
    claim = st.get(b"c")
    if claim is not None:
        held = position if claim == entry_id else pack_id(*parse_id(claim))
        holder = Lease(held, st[b"w"].decode(), _int(st[b"a"]), _int(st[b"e"]))
    retry_at = st.get(b"r")
    return TaskView(
        "open", holder, _int(st[b"n"]), None if retry_at is None else _int(retry_at), error
    )


def _int(value: object) -> int:
    if type(value) is not int:
        raise ValueError(f"{value!r:.40} is not an integer")
    return value


def call_folding_script(
    log: RedisLog, script: Script, keys: list[str], args: list[bytes | int | str]
) -> object:
    """Run a script built on RULES_LUA (KEYS: the stream, the last-append record, then
    `keys`: `folding_keys(log)` and the script's own, built once by the caller), turning its
    refusals into errors that say why."""
    try:
        return log.call_appending_script(script, keys, args)
    except AppendError as e:
        text = str(e)
        if "QWBEHIND" in text:
            tail, through = text.split("QWBEHIND ", 1)[1].split()[:2]
            raise VerdictsBehindError(
                f"{log.name}: the stream's last entry is {tail}, but the server's "
                f"verdicts folded through {through}: a writer appended without them "
                "(every writer of a queue with server verdicts must use them); "
                "nothing was appended"
            ) from e
        if "QWSEQ" in text:
            raise AppendError(
                f"{log.name}: cannot append: the stream's last id has its most entries in "
                "one millisecond already (has the server's clock stood still?)"
            ) from e
        raise


class ServerVerdicts:
    """Appends claims records through the verdict script of one claims stream."""

    def __init__(self, log: RedisLog) -> None:
        self.log = log
        self.key = state_key(log)
        self._keys = folding_keys(log)
        self._append = log.register_script(_VERDICT_LUA)
        self._snapshot = log.register_script(_SNAPSHOT_LUA)

    def append(
        self, record: Claim | Renew | Done | Fail, data: bytes | None = None
    ) -> ServerVerdict:
        """Append `record` (encoded as `data`, or by `encode`) and return the server's verdict
        on it. Raises VerdictsBehindError when the stream has records the script did not fold."""
        data = encode(record) if data is None else data
        if len(data) > self.log.max_record:
            raise RecordTooLargeError(len(data), self.log.max_record)
        args = [data, *record_args(record)]
        raw = call_folding_script(self.log, self._append, self._keys, args)
        return reply_verdict(self.log, *unpack_reply(self.log, raw, 3))

    def views(self, tasks: Sequence[int]) -> TaskViews:
        """The states of `tasks` on the server now (one HMGET). Done and dead are final,
        so a view read after a CLAIM tells what the pick that made it went by."""
        fields = [BELOW, *(str(task) for task in tasks)]
        log, key = self.log, self.key
        raw = log._call("read from", lambda: log._client.hmget(key, fields))
        packed = {t: v for t, v in zip(tasks, raw[1:], strict=True) if isinstance(v, bytes)}
        state = ServerState(None, None, packed, {}, int(raw[0] or 0))
        try:
            return TaskViews({task: state.view(task) for task in tasks})
        except ValueError as e:
            raise LogError(f"{log.name}: unexpected state in {key}: {e}") from e

    def state(self) -> ServerState | None:
        """The server's per-task state with the stream's end, read at one moment; None when
        the script has never folded a record here."""
        raw = self.log.call_script(self._snapshot, state_keys(self.log), [])
        if not isinstance(raw, list) or len(raw) != 3 or not isinstance(raw[1], list):
            raise LogError(f"{self.log.name}: unexpected reply from redis: {raw!r:.200}")
        tail_id, flat, scored = raw
        tail = pack_id(*parse_id(tail_id)) if tail_id else None
        through: int | None = None
        below = 0
        tasks: dict[int, bytes] = {}
        for field, value in zip(flat[::2], flat[1::2], strict=True):
            name = field.decode("ascii", "replace")
            if name == THROUGH:
                through = pack_id(*parse_id(value))
            elif name == BELOW:
                below = int(value)
            elif name.isdigit():
                tasks[int(name)] = value
        if through is None and not tasks:
            return None
        # scores are doubles, exact for times (< 2^53 µs): "1764500000000000"
        index = {
            int(task): int(float(score))
            for task, score in zip(scored[::2], scored[1::2], strict=True)
        }
        return ServerState(through, tail, tasks, index, below)
