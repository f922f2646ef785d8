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
are what every reader folds, and `queue_worker.redis.verdict_check` (run by ``qw report``)
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
from queue_worker.errors import QwError
from queue_worker.protocol.records import Claim, Done, Fail, Renew, encode
from queue_worker.protocol.state import ClaimState, Lease, Verdict

#: the hash field that holds the id of the last entry the script folded (task fields are
#: decimal digits only)
THROUGH: Final = "~through"
#: the hash field below which every task is closed (and one without a field done)
BELOW: Final = "~below"
#: the largest lease or backoff distance the script adds exactly (its numbers are doubles:
#: a time, < 2^51 µs until the year 2041 and < 2^53 until 2255, plus this stays exact)
MAX_EXACT: Final = 2**52

# The rules, shared by every script that appends claims records (this module's and
# queue_worker.redis.server_claim's). KEYS[1] the claims stream, KEYS[2] this handle's last-append
# record, KEYS[3] the per-task state, KEYS[4] the index of open tasks (a sorted set: an open
# task's score is when it may next be claimed, its holder's expiry or its retry_at).
# ARGV[1] the call number, ARGV[2] the last-append record's ttl (ms), ARGV[3] the seq limit;
# after the script's own, the queue identity and the count of entries qw removed from the
# stream are the last two KEYS, the queue id the last ARGV (RedisLog.call_appending_script).
RULES_LUA: Final = (
    QUEUE_LUA
    + r"""
local QUEUE_KEY, REMOVED_KEY, QUEUE_ID = KEYS[#KEYS - 1], KEYS[#KEYS], ARGV[#ARGV]

-- What a call has read of the state, and what it writes at its end (`flush`): one HMGET
-- of the fields of the whole queue, one HGET per task, one HSET for everything (every
-- redis.call costs the server a few µs: this script is run once per record or task).
local meta = nil   -- {through, tasks (cursor), next (task id), below}
local cache = {}   -- task -> its state (a table), or false: no field
local written = {} -- task -> its state packed, to write
local order = {}   -- the tasks in `written`, in order
-- the tasks whose state the call will read (a list): fetched by the same HMGET as the
-- queue's fields (a redis.call is ~5 us of the server's CPU however small its work, measured)
local prefetch = nil

local function get_meta()
  if not meta then
    local fields = {'~through', '~tasks', '~next', '~below'}
    for _, t in ipairs(prefetch or {}) do fields[#fields + 1] = t end
    local m = redis.call('HMGET', KEYS[3], unpack(fields))
    for i = 5, #fields do
      if m[i] then cache[fields[i]] = cmsgpack.unpack(m[i]) else cache[fields[i]] = false end
    end
    meta = {through = m[1] or '0-0', tasks = m[2] or nil,
            next = tonumber(m[3] or '0'), below = tonumber(m[4] or '0'),
            folded = false, moved = false}
  end
  return meta
end

-- a task's state (nil: none). A task below `~below` with no field is done: compaction
-- drops the fields of done tasks below the fold's watermark (and keeps dead ones).
local function load(task)
  local st = cache[task]
  if st == nil then
    local raw = redis.call('HGET', KEYS[3], task)
    if raw then st = cmsgpack.unpack(raw) else st = false end
    cache[task] = st
  end
  if st then return st end
  if tonumber(task) < get_meta().below then return {s = 'd'} end
  return nil
end

local function flush()
  if not meta then return end
  local args = {}
  for _, t in ipairs(order) do
    args[#args + 1] = t
    args[#args + 1] = written[t]
  end
  if meta.folded then
    args[#args + 1] = '~through'
    args[#args + 1] = meta.through
  end
  if meta.moved then
    args[#args + 1] = '~tasks'
    args[#args + 1] = meta.tasks
    args[#args + 1] = '~next'
    args[#args + 1] = string.format('%d', meta.next)
  end
  if #args > 0 then redis.call('HSET', KEYS[3], unpack(args)) end
end

-- the id of the last entry ever added to a stream ('0-0': none), which a trim of its
-- front (compaction's XTRIM MINID) does not change, as it changes the last entry left
local function last_added(key)
  local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  if last[1] then return last[1][1] end
  -- empty: never written, or trimmed to nothing
  if redis.call('EXISTS', key) == 0 then return '0-0' end
  local info = redis.call('XINFO', 'STREAM', key)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then return info[i + 1] end
  end
  return '0-0'
end

-- nil, nil to go on; else a retried call's first reply (packed), or an error to give:
-- first of all, a queue identity that is not the handle's (a reset server: nothing of
-- its state or its streams is this queue's)
local function prelude()
  local refused = queue_refused(QUEUE_KEY, QUEUE_ID)
  if refused then return nil, refused end
  local mine = ARGV[1] .. ' '
  local last = redis.call('GET', KEYS[2])
  if last and string.sub(last, 1, #mine) == mine then
    return string.sub(last, #mine + 1), nil
  end
  local through = get_meta().through
  local tail_id = last_added(KEYS[1])
  if tail_id ~= through then
    return nil, redis.error_reply('QWBEHIND ' .. tail_id .. ' ' .. through)
  end
  return nil, nil
end

-- write what the call changed, keep the reply (packed) for a retry of this call (a lost
-- reply), and return it packed
local function save(reply)
  flush()
  local packed = cmsgpack.pack(reply)
  redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. packed, 'PX', ARGV[2])
  return packed
end

-- Append one record and fold it: {entry id, verdict, the task's state after it (the
-- table itself, packed once with the whole reply; false for none)}, or an error reply.
-- `task_entry`: a winning CLAIM's task's entry id in the tasks stream, kept in its state
-- (the claiming script reads the payload with it).
local function fold_in(data, kind, task, worker, lease, claim, delta, err, task_entry)
  if kind ~= 'C' and kind ~= 'R' and kind ~= 'D' and kind ~= 'F' then
    flush()
    return redis.error_reply('QWTYPE ' .. kind)
  end
  local id = redis.call('XADD', KEYS[1], '*', 'd', data)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if tonumber(seq) >= tonumber(ARGV[3]) then
    redis.call('XDEL', KEYS[1], id)
    redis.call('INCRBY', REMOVED_KEY, 1)
    flush()
    return redis.error_reply('QWSEQ entry id ' .. id .. ' has a sequence number of '
      .. ARGV[3] .. ' or more within one millisecond')
  end
  local at = tonumber(ms) * 1000
  local st = load(task)
  -- Rule 2: the holder is a claim (its entry id) and its worker
  local function holds()
    return st ~= nil and st.s == 'o' and st.c == claim and st.w == worker
  end
  local verdict, changed = nil, true
  if kind == 'C' then  -- Rule 1
    if st and st.s == 'd' then verdict, changed = 'lost: done', false
    elseif st and st.s == 'x' then verdict, changed = 'lost: dead', false
    elseif st and st.c and at < st.e then verdict, changed = 'lost: held', false
    elseif st and st.r and at < st.r then verdict, changed = 'lost: backoff', false
    else
      if st and st.c then verdict = 'takeover' else verdict = 'won' end
      if st then  -- a copy: a reply may hold the table as an earlier record left it
        local old = st
        st = {}
        for k, v in pairs(old) do st[k] = v end
      else st = {s = 'o', n = 0} end
      st.c, st.w, st.a, st.e = id, worker, at, at + tonumber(lease)
      st.n = st.n + 1
      st.r = nil
      if task_entry then st.t = task_entry end
    end
  elseif kind == 'R' then  -- Rule 3
    if holds() then st.e = at + tonumber(lease); verdict = 'renewed'
    else verdict, changed = 'lease lost', false end
  elseif kind == 'D' then  -- Rule 4
    if holds() then st = {s = 'd'}; verdict = 'done'
    else verdict, changed = 'stale done', false end
  else  -- FAIL, Rule 5
    if not holds() then verdict, changed = 'stale fail', false
    elseif delta == '' then st = {s = 'x', l = err}; verdict = 'dead'
    else
      st.c, st.w, st.a, st.e = nil, nil, nil, nil
      st.r = at + tonumber(delta)
      st.l = err
      verdict = 'released'
    end
  end
  local m = get_meta()
  m.through, m.folded = id, true
  if changed then
    cache[task] = st
    if not written[task] then order[#order + 1] = task end
    written[task] = cmsgpack.pack(st)
    if st.s ~= 'o' then redis.call('ZREM', KEYS[4], task)
    elseif st.c then redis.call('ZADD', KEYS[4], st.e, task)
    else redis.call('ZADD', KEYS[4], st.r, task) end
  end
  return {id, verdict, st or false}
end
"""
)

# ARGV[4] the record's bytes, ARGV[5] its type (C R D F), ARGV[6] the task, ARGV[7] the
# worker, ARGV[8] the lease (C, R), ARGV[9] the claim's entry id (R, D, F), ARGV[10]
# retry_at - at (F; '' for a dead task), ARGV[11] the error (F). Returns {entry id, verdict,
# the task's state after it ('' for none)}, packed as one msgpack array (`unpack_reply`).
_VERDICT_LUA: Final = (
    RULES_LUA
    + r"""
prefetch = {ARGV[6]}
local saved, refused = prelude()
if refused then return refused end
if saved then return saved end
local reply = fold_in(ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11])
if reply.err then return reply end
return save(reply)
"""
)

# KEYS[1] the claims stream, KEYS[2] the state, KEYS[3] the index of open tasks. Returns
# {the id of the last entry ever added to the stream ('' for none: a trim of the front
# leaves it as it was), every field and value of the state, every task and score of the
# index}: all at one moment.
_SNAPSHOT_LUA: Final = r"""
local tail_id = ''
if redis.call('EXISTS', KEYS[1]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[1])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' and info[i + 1] ~= '0-0' then tail_id = info[i + 1] end
  end
end
return {tail_id, redis.call('HGETALL', KEYS[2]),
        redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')}
"""


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


def state_key(log: RedisLog) -> str:
    """The hash the script keeps beside `log`'s stream (same prefix: same cluster slot)."""
    return redis_key(log.prefix, log.topic, "verdicts")


def index_key(log: RedisLog) -> str:
    """The sorted set of open tasks by when they may next be claimed, beside `log`'s stream."""
    return redis_key(log.prefix, log.topic, "verdicts", "open")


def state_keys(log: RedisLog) -> list[str]:
    """KEYS[3..4] of every script that folds claims records (after the stream's two)."""
    return [state_key(log), index_key(log)]


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
    `keys`: `state_keys(log)` and the script's own, built once by the caller), turning its
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
        self._keys = state_keys(log)
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
