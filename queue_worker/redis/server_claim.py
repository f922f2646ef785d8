"""Claiming on the server (a Redis queue with server verdicts, the default mode recorded in
the queue: `logstore.redis.verdict_mode`): the next task in one call.

With server verdicts (`queue_worker.redis.server_verdicts`) the server holds every task's state,
so it can also choose the task: one script call finishes the previous task (its DONE or
FAIL, folded by the same rules) and claims the next one for the worker, returning the task,
its payload and the CLAIM's verdict. A worker then never reads the claims stream on its hot
path: the work per task no longer grows with the number of workers.

What the script picks (the pick rules of `queue_worker.worker.pick` as far as they apply):

1. an orphan first: the open task that has been claimable longest, its holder's lease
   lapsed (a worker killed with -9) or its backoff over, by the index of open tasks beside
   the state (`server_verdicts.index_key`: scored by expiry or retry_at), judged on the
   stream's clock: the entry time of the DONE or FAIL the call appended first, else the
   server's clock (`TIME`, to the millisecond below); either way the CLAIM's own time,
   its entry's millisecond, is at or past it: the claim wins;
   but not by the heir: a lapsed task whose holder has the caller's name and host (the
   worker it replaced) is left to the others for one lease after its lapse, as
   `queue_worker.worker.pick` does (when the caller says it has siblings: `heirs`);
2. else the next task of the tasks stream that no claim has touched (a cursor beside the
   state: ``~tasks``, the last tasks entry handed out, and ``~next``, its id + 1; a task id
   is its index in the tasks stream, as everywhere).

The CLAIM is appended and folded by the same rules as any record (`RULES_LUA`): the pick
chooses what to try, the rules decide what wins (always the claim, by the argument above;
the verdict is still returned and obeyed). The CLAIM's bytes are built on the server
(``[1, "C", task, worker, at, lease]``, `at` the worker's clock as sent) since only the
server knows the task. With nothing to claim the reply says when the earliest lease or
backoff runs out (server clock), whether nothing is open at all, and how far the tasks
stream was read (a worker waits for a new task from there).

Everything else keeps the worker's contract: its renewals, a timed-out attempt's FAIL and
a lost reply's recovery append through the verdict script too (`ServerVerdictLog`), a
worker killed with -9 leaves a lease that lapses and a survivor's next call takes the task
over, and `qw report` re-folds the stream and checks the server's state.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Final, NamedTuple

from logstore import Entry, Log, RecordTooLargeError
from logstore.redis.log import RedisLog, pack_id, parse_id
from queue_worker.protocol.records import Claim, Done, Fail, Renew, decode_claims, encode
from queue_worker.redis.claim_batch import ClaimBatch
from queue_worker.redis.server_verdicts import (
    RULES_LUA,
    ServerVerdict,
    ServerVerdicts,
    call_folding_script,
    record_args,
    reply_verdict,
    state_keys,
    unpack_reply,
)

# KEYS[5] the tasks stream. ARGV[4..11] the previous task's DONE or FAIL (as the verdict
# script takes a record; ARGV[4] '' for none), ARGV[12] the worker, ARGV[13] its lease,
# ARGV[14] its clock, ARGV[15] '1' to claim, ARGV[16] '1' to leave a predecessor's lapsed
# tasks to the others for one lease (the worker has siblings), ARGV[17] how many tasks to
# claim at most, ARGV[18] how many earlier DONEs or FAILs follow (the worker's batch,
# `ClaimBatch`), 8 arguments each from ARGV[19], appended and folded in order before the
# one of ARGV[4..11]. Returns, packed as one msgpack array (`unpack_reply`): {the finish's
# id, verdict and state (the state a map, `reply_verdict`; '' each for none), the first
# CLAIM's id, verdict and state, its task, the task's payload record ('' each for none);
# when nothing was claimed, the last tasks entry read, the earliest time an open task
# becomes claimable ('' for none), '1' when no task is open, and the time the pick went by
# ('' for none)}, then the id, verdict and state of each earlier finish, then the id,
# verdict, state, task and payload of each CLAIM after the first.
_NEXT_LUA: Final = (
    RULES_LUA
    + r"""
local wanted = tonumber(ARGV[17])
local earlier = tonumber(ARGV[18])
local finishes = {}  -- the first argument of each record to fold before the pick, in order
for j = 0, earlier - 1 do finishes[#finishes + 1] = 19 + 8 * j end
if ARGV[4] ~= '' then finishes[#finishes + 1] = 4 end
if #finishes > 0 then  -- the finishes' tasks, read with the queue's fields
  prefetch = {}
  for _, b in ipairs(finishes) do prefetch[#prefetch + 1] = ARGV[b + 2] end
end
local saved, refused = prelude()
if refused then return refused end
if saved then return saved end
local reply = {'', '', '', '', '', '', '', '', '', '', '', ''}
local more = {}  -- the earlier finishes' answers, then the CLAIMs after the first
local finished_ms = nil
for _, b in ipairs(finishes) do
  local f = fold_in(ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5],
                    ARGV[b + 6], ARGV[b + 7])
  if f.err then return f end
  if b == 4 then reply[1], reply[2], reply[3] = f[1], f[2], f[3]
  else
    local n = #more
    more[n + 1], more[n + 2], more[n + 3] = f[1], f[2], f[3]
  end
  finished_ms = tonumber(string.match(f[1], '^(%d+)-'))
end
local function payload_of(entry)
  local fields = entry[2]
  for j = 1, #fields, 2 do
    if fields[j] == 'd' then return fields[j + 1] end
  end
  return ''
end
local now, withheld = nil, nil
local function lineage(w) return string.match(w, '^(.*)%-[^-]*%-[^-]*$') or w end
local mine = lineage(ARGV[12])
local taken = {}  -- the tasks this call claimed (not picked twice)
-- the untouched tasks, read `fetch` at a time: twice the tasks wanted when several are,
-- and the backlog is deep when the first read finds that many (only then are several
-- claimed: with few tasks left, each goes to a worker of its own)
local fetch = 1
if wanted > 1 then fetch = 2 * wanted end
local fresh, fresh_at, fetched, deep = {}, 1, false, false
local function fill()
  local m = get_meta()
  local start = '-'
  if m.tasks then start = '(' .. m.tasks end
  fresh, fresh_at = redis.call('XRANGE', KEYS[5], start, '+', 'COUNT', fetch), 1
  if not fetched then deep = #fresh == fetch end
  fetched = true
end
local orphans = true  -- false once a look at the index found none due: none will be
-- the pick: an orphan (lease lapsed, backoff over) first, else the next untouched task
local function pick()
  local task, task_entry, payload = nil, nil, nil
  if orphans then
    orphans = false
    -- not by the heir: a lapsed task of our predecessor (its name and host, another
    -- process) is left to the others for one lease after its lapse
    local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 16)
    for _, t in ipairs(due) do
      if not taken[t] then
        local st = load(t)
        local until_us = nil
        if ARGV[16] == '1' and st and st.c and st.w ~= ARGV[12] and lineage(st.w) == mine then
          until_us = st.e + tonumber(ARGV[13])
        end
        if until_us and now < until_us then
          if not withheld or until_us < withheld then withheld = until_us end
        else
          task, task_entry = t, st and st.t
          orphans = true  -- there may be more
          break
        end
      end
    end
  end
  if task then
    if task_entry then
      local e = redis.call('XRANGE', KEYS[5], task_entry, task_entry)
      if e[1] then payload = payload_of(e[1]) end
    end
    return task, task_entry, payload
  end
  local m = get_meta()
  while true do
    if fresh_at > #fresh then
      if fetched and #fresh < fetch then return nil end  -- the stream's end, read already
      fill()
      if not fresh[1] then return nil end
    end
    local e = fresh[fresh_at]
    fresh_at = fresh_at + 1
    local id = string.format('%d', m.next)
    m.tasks, m.next, m.moved = e[1], m.next + 1, true
    -- a task some CLAIM of another path has touched is the index's, or closed
    if not load(id) then return id, e[1], payload_of(e) end
  end
end
local claimed = 0
if ARGV[15] == '1' then
  -- now, on the stream's clock: the last finish's entry time when there is one (our
  -- CLAIMs come at or after it), else the server's clock to the millisecond below
  if finished_ms then now = finished_ms * 1000
  else
    local t = redis.call('TIME')
    now = (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) * 1000
  end
  while claimed < wanted do
    if claimed > 0 then  -- more than one only from a deep backlog
      if not fetched then fill() end
      if not deep then break end
    end
    local task, task_entry, payload = pick()
    if not task then break end
    taken[task] = true
    local data = cmsgpack.pack({1, 'C', tonumber(task), ARGV[12], tonumber(ARGV[14]),
                                tonumber(ARGV[13])})
    local c = fold_in(data, 'C', task, ARGV[12], ARGV[13], '', '', '', task_entry)
    if c.err then return c end
    if claimed == 0 then
      reply[4], reply[5], reply[6], reply[7], reply[8] = c[1], c[2], c[3], task, payload or ''
    else
      local n = #more
      more[n + 1], more[n + 2], more[n + 3], more[n + 4], more[n + 5] =
        c[1], c[2], c[3], task, payload or ''
    end
    claimed = claimed + 1
  end
end
if claimed == 0 then  -- nothing claimed: how far the tasks were read, and when to look again
  reply[9] = get_meta().tasks or ''
  local soonest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  if soonest[1] then
    local change = tonumber(soonest[2])
    if withheld then  -- the first lapse not yet due, or the end of the heir's wait
      local later = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. string.format('%d', now),
                               '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      change = withheld
      if later[1] and tonumber(later[2]) < change then change = tonumber(later[2]) end
    end
    reply[10] = string.format('%d', change)
  else reply[11] = '1' end
  if now then reply[12] = string.format('%d', now) end
end
for _, v in ipairs(more) do reply[#reply + 1] = v end
return save(reply)
"""
)


class MoreClaim(NamedTuple):
    """A CLAIM a call made after its first (`ServerClaims.next` with `want` > 1)."""

    claimed: ServerVerdict  # its verdict and the task's state after it
    claim: Claim  # as the fold sees it: on the server's clock
    payload: bytes | None  # the task's record in the tasks stream (None: not found)


class NextTask(NamedTuple):
    """What one call of the claiming script answered."""

    finished: ServerVerdict | None  # the previous task's DONE or FAIL, as folded
    claimed: ServerVerdict | None  # our CLAIM (None: nothing to claim now)
    claim: Claim | None  # that CLAIM as the fold sees it: on the server's clock
    payload: bytes | None  # the claimed task's record in the tasks stream (None: not found)
    tasks_read: int | None  # nothing claimed: the position after the last tasks entry read
    next_change: int | None  # nothing claimed: when an open task becomes claimable (µs)
    nothing_open: bool  # nothing claimed, and no task is open (held, or waiting to retry)
    #: nothing claimed: the server's time the pick went by (µs; None: no pick was made).
    #: A worker that has made no CLAIM yet learns its clock's offset from it, to wait for
    #: `next_change` on the server's clock (a fast clock would otherwise not wait at all).
    server_now: int | None = None
    #: the verdicts of the `earlier` finishes sent with the call, in order
    earlier: tuple[ServerVerdict, ...] = ()
    #: the CLAIMs after the first (`want` > 1), in the order they were made
    more: tuple[MoreClaim, ...] = ()


class ServerClaims:
    """The claiming script of one queue on Redis (its claims and tasks streams)."""

    def __init__(self, claims_log: RedisLog, tasks_log: RedisLog) -> None:
        self.log = claims_log
        self.tasks_key = tasks_log.key
        self._keys = [*state_keys(claims_log), self.tasks_key]  # (after the log's own two)
        self._next = claims_log.register_script(_NEXT_LUA)
        #: a worker's tasks claimed ahead and DONEs not sent yet (queue_worker.redis.claim_batch)
        self.batch = ClaimBatch()
        #: the claims log for everything else the worker appends (renewals, a time-out's
        #: FAIL, a recovery): through the verdict script as well, the batch's DONEs first
        self.verdict_log = ServerVerdictLog(claims_log, self.batch)

    def next(
        self,
        worker: str,
        lease_us: int,
        now: int,
        *,
        finish: Done | Fail | None = None,
        finish_data: bytes | None = None,
        claim: bool = True,
        heirs: bool = False,
        want: int = 1,
        earlier: Sequence[tuple[Done | Fail, bytes]] = (),
    ) -> NextTask:
        """Append `earlier` (records and their bytes), then `finish` (when given) and, with
        `claim`, claim up to `want` tasks for `worker` with a lease of `lease_us` (its clock
        reads `now`), in one call. `heirs`: leave a predecessor's lapsed tasks to the others
        for one lease (module docstring)."""
        if finish is None:
            head: list[bytes | int | str] = ["", "", "", "", "", "", "", ""]
        else:
            data = encode(finish) if finish_data is None else finish_data
            if len(data) > self.log.max_record:
                raise RecordTooLargeError(len(data), self.log.max_record)
            head = [data, *record_args(finish)]
        args = [*head, worker, lease_us, now, "1" if claim else "0", "1" if heirs else "0"]
        args += [want, len(earlier)]
        for held, held_data in earlier:
            args += [held_data, *record_args(held)]
        raw = call_folding_script(self.log, self._next, self._keys, args)
        items = unpack_reply(self.log, raw, 12 + 3 * len(earlier), 5)
        finished = reply_verdict(self.log, *items[0:3]) if items[0] else None
        claimed = reply_verdict(self.log, *items[3:6]) if items[3] else None
        record = None
        if claimed is not None:
            record = self._claim(claimed, items[6], worker, lease_us)
        tasks_read = pack_id(*parse_id(items[8])) + 1 if items[8] else None
        answers = tuple(
            reply_verdict(self.log, *items[i : i + 3]) for i in range(12, 12 + 3 * len(earlier), 3)
        )
        more = []
        for i in range(12 + 3 * len(earlier), len(items), 5):
            verdict = reply_verdict(self.log, *items[i : i + 3])
            made = self._claim(verdict, items[i + 3], worker, lease_us)
            more.append(MoreClaim(verdict, made, items[i + 4] or None))
        return NextTask(
            finished,
            claimed,
            record,
            items[7] if claimed is not None and items[7] else None,
            tasks_read,
            int(items[9]) if items[9] else None,
            items[10] == b"1",
            int(items[11]) if items[11] else None,
            answers,
            tuple(more),
        )

    @staticmethod
    def _claim(claimed: ServerVerdict, task: bytes, worker: str, lease_us: int) -> Claim:
        """A CLAIM the script made, as the fold sees it: at its entry's millisecond."""
        return Claim(int(task), worker, (claimed.position >> 20) * 1000, lease_us)


class ServerVerdictLog(Log):
    """A claims log whose appends go through the verdict script: what a worker with server
    verdicts gives every part that appends claims records (its lease keeper's renewals, a
    timed-out attempt's FAIL, a lost reply's recovery), so that the server folds them all.
    Reads, waits and everything else are the stream's own."""

    def __init__(self, log: RedisLog, batch: ClaimBatch | None = None) -> None:
        self.inner = log
        self.server = ServerVerdicts(log)
        self._batch = batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    def append(self, data: bytes, *, durable: bool = False) -> int:
        record = decode_claims(data)
        assert isinstance(record, Claim | Renew | Done | Fail), "a worker appends these only"
        if self._batch is not None:  # (a renewal, a time-out's FAIL: rare, and may be late)
            self._batch.send_held(self.server)
        return self.server.append(record, data).position

    def append_many(self, records: Sequence[bytes], *, durable: bool = False) -> list[int]:
        return [self.append(data) for data in records]

    def read(self, position: int, max_records: int | None = None) -> list[Entry]:
        return self.inner.read(position, max_records)

    def wait(self, position: int, timeout: float) -> bool:
        return self.inner.wait(position, timeout)

    @property
    def start(self) -> int:
        return self.inner.start

    @property
    def origin(self) -> int:  # (Log's own answers for a log never trimmed: the stream's)
        return self.inner.origin

    def end(self) -> int:
        return self.inner.end()

    def check(self, start: int | None = None) -> int:
        return self.inner.check(start)

    def checksum(self, start: int, end: int, seed: int = 0) -> int:
        return self.inner.checksum(start, end, seed)

    def iter_from(self, position: int, batch: int = 4096) -> Iterator[Entry]:
        return self.inner.iter_from(position, batch)

    def close(self) -> None:
        self.inner.close()


def wants_server_verdicts(log: Log) -> bool:
    """Does this claims log's queue use server verdicts (recorded in the queue when it was
    created: ``server`` by default, ``?verdicts=client`` otherwise; logstore.redis.verdict_mode)?"""
    return isinstance(log, RedisLog) and log.verdicts == "server"


__all__ = ["MoreClaim", "NextTask", "ServerClaims", "ServerVerdictLog", "wants_server_verdicts"]
