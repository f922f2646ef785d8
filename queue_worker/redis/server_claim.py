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

With delays and priorities (a producer writes them beside the record:
`queue_worker.redis.task_options`) the highest priority goes first, orphans first within a
priority, then the lowest id; no task before its delay's end; those below 0 only when
nothing else is. The cursor parks the tasks it passes without handing them out (a delay
not over, a priority other than 0, every task up to one of a priority above 0 a producer
noted in ``~ahead``) in two sorted sets beside the state (`parked_keys`): docs/redis.md,
"Claiming on the server". A task with dependencies (`after=`) whose dependency is open,
and none dead, waits in a third, under each open one, until a record that closes one lets
it go (lua/parked.lua): then it is parked as the others, and handed out.

This is the pick of every worker of such a queue: none of `--pick`'s strategies (first,
random, spread: ways for workers that each pick for themselves to collide less) is its
rule, and asking for one is refused (`queue_worker.worker.pick.Picker`,
`supervisor.cli.server_pick`) rather than ignored.

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
from logstore.redis.scripts import lua_file
from queue_worker.protocol.records import Claim, Done, Fail, Renew, decode_claims, encode
from queue_worker.redis.claim_batch import ClaimBatch
from queue_worker.redis.server_verdicts import (
    RULES_LUA,
    ServerVerdict,
    ServerVerdicts,
    call_folding_script,
    parked_keys,
    record_args,
    reply_verdict,
    state_keys,
    unpack_reply,
)

# the claiming call: the fold's rules, then its own body (lua/next_task.lua: what it takes
# and answers)
_NEXT_LUA: Final = RULES_LUA + lua_file("queue_worker.redis", "next_task.lua")


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
        # (after the log's own two: folding_keys, with the tasks stream as the caller has it)
        self._keys = [*state_keys(claims_log), tasks_log.key, *parked_keys(claims_log)]
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
    return log.verdicts == "server"


__all__ = ["MoreClaim", "NextTask", "ServerClaims", "ServerVerdictLog", "wants_server_verdicts"]
