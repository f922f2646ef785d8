"""The worker of a Redis queue with server verdicts (the mode recorded in the queue:
`logstore.redis.verdict_mode`; the default for a new queue).

The server holds the fold (`queue_worker.redis.server_verdicts`) and picks
(`queue_worker.redis.server_claim`): one script call appends the last task's DONE or FAIL
and claims the next task, answering the task, its payload and the verdicts. The worker
folds no claims record on its way (docs/protocol.md §4, "Claiming on the server"):

1. `_claim_next`: the call claims a task (none: IDLE, with when the earliest lease or
   backoff runs out on the server's clock);
2. if won: the attempt runs as on any queue (`queue_worker.worker.attempt`);
3. `append_and_settle`: its DONE/FAIL goes with the next call, which claims the next task
   ahead in the same round trip. While tasks are short and the backlog deep, one call
   claims several and the DONEs wait for the next call (`queue_worker.redis.claim_batch`);
   only `run()` batches, and it sends the DONEs it holds before it returns.

Every other append (renewals, a time-out's FAIL, an outage's second append) goes through the
server's rules too (`ServerClaims.verdict_log`); an outage is resolved from our own fold of
the claims stream, as on any log (`queue_worker.worker.recovery`).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from logstore import Entry, Log, LogError, RecordTooLargeError
from queue_worker.protocol.records import (
    Claim,
    Done,
    Fail,
    RecordDecodeError,
    TaskRecord,
    decode_task,
    encode,
)
from queue_worker.protocol.state import Outcome, Verdict
from queue_worker.redis.claim_batch import ClaimBatch
from queue_worker.redis.server_claim import NextTask, ServerClaims, wants_server_verdicts
from queue_worker.redis.server_verdicts import ServerVerdict, TaskView, TaskViews
from queue_worker.topics import Settled, on_server_clock
from queue_worker.worker.attempt import StepKind, StepResult
from queue_worker.worker.base import AheadClaim, WorkerBase, WorkerOptions
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.lease import FATAL_LOG_ERRORS
from queue_worker.worker.settings import server_pick_refusal

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from logstore.redis.log import RedisLog


class ServerVerdictWorker(WorkerBase):
    """A worker whose tasks the server picks and whose claims the server judges."""

    def __init__(self, config: WorkerConfig, **options: Unpack[WorkerOptions]) -> None:
        if config.pick is not None:  # the server picks: a pick asked for would do nothing
            raise ValueError(f"pick {server_pick_refusal(config.pick)}")
        super().__init__(config, **options)
        #: the task the server last gave us: its id, its state as the server had it, and
        #: its record (what `task_history` and `load_task` answer for it)
        self._won: tuple[int, TaskView | None, bytes | None] | None = None
        self._tasks_read = self.tasks_log.start  # where the server has read the tasks to
        # On Redis only compaction writes a fold checkpoint (queue_worker.compaction.redis_streams):
        # a worker reads it, for the outage recovery's fold.
        self.stats.last_error = self._load_checkpoint()
        self.tasks.keep_payloads(config.slot, config.slots)  # the tasks spread gives us
        #: inside `run()`, which works every task a batch claimed ahead and sends the DONEs
        #: it holds before it returns: only there are several tasks claimed in one call;
        #: `step()` alone appends each DONE as it returns
        self._batching = False

    def _appending_log(self, tasks_log: Log, claims_log: Log) -> Log:
        """The claims log through the server's rules (`ServerClaims.verdict_log`)."""
        if not wants_server_verdicts(claims_log):
            for log in self._owned_logs:
                log.close()
            raise ValueError(
                f"{claims_log.name}: not a Redis queue with server verdicts; open its worker "
                "with queue_worker.opening.open_worker"
            )
        # (a queue with server verdicts is a Redis queue: `wants_server_verdicts`)
        self._server = ServerClaims(cast("RedisLog", claims_log), cast("RedisLog", tasks_log))
        return self._server.verdict_log

    def _catch_up(self) -> None:
        """Our own fold, which only an outage's recovery and the stats read."""
        self.tasks.catch_up(self.tasks_log)
        self.claims.catch_up(self.claims_log)
        self.record.folded(self.tasks, self.claims)

    # -- one iteration: the server claims ------------------------------------------------------

    def _claim_next(self, now: int | None) -> StepResult:
        """The server picks and claims the next task: no fold of ours to catch up."""
        if self._draining.is_set():
            return StepResult(StepKind.DRAINING)
        self.record.state("claiming")
        batch = self._settled_batch()
        now = self._clock()
        started = time.perf_counter_ns()
        held = batch.take_held()  # (a task claimed ahead was cancelled: see claim_batch)
        try:
            got = self._server.next(
                self.worker_id, self._lease_us, now, heirs=self.config.slots > 1,
                earlier=held,
            )  # fmt: skip
        except LogError as e:
            batch.uncertain.extend((done, data, e) for done, data in held)
            raise
        latency_us = (time.perf_counter_ns() - started) // 1000
        batch.keep(got.more, time.monotonic())
        settled = self._claimed_for_us(got)
        if settled is None:
            if got.server_now is not None:  # (the server's clock, as a CLAIM would tell it)
                self.clock_offset_us = got.server_now - now
            self.record.state("idle")
            return StepResult(StepKind.IDLE, drained=got.nothing_open, next_change=got.next_change)
        assert got.claim is not None
        claim = Claim(got.claim.task, self.worker_id, now, self._lease_us)
        return self._claimed(claim, settled, latency_us)

    def _claimed_for_us(self, got: NextTask) -> Settled | None:
        """The CLAIM the server made for us, as our own fold would have settled it."""
        if got.tasks_read is not None:
            self._tasks_read = got.tasks_read
        claimed, claim = got.claimed, got.claim
        if claimed is None or claim is None:
            return None
        return self._won_claim(claimed, claim, got.payload)

    def _won_claim(self, claimed: ServerVerdict, claim: Claim, payload: bytes | None) -> Settled:
        """A CLAIM the server made for us (`claim`, on its clock) and its verdict, kept as
        the task in hand (`_won`) and settled as our own fold would have settled it."""
        self._won = (claim.task, claimed.task, payload)
        holder = claimed.task.holder if claimed.task is not None else None
        outcome = Outcome(claimed.verdict, claimed.position, claim.task, claim.worker, holder)
        entry = Entry(claimed.position, claimed.position + 1, b"", claim.at)
        return Settled(outcome, claim, entry)

    def _wait_for_work(self, idle: StepResult) -> None:
        """The server reads the tasks log: wait for a task after its read."""
        self.tasks_log.wait(self._tasks_read, self._idle_timeout(idle))

    # -- what the attempt asks of us (attempt.Claiming) ----------------------------------------

    def task_history(self, task: int) -> tuple[int, str | None]:
        """By the server's fold (its state when it gave us the task)."""
        won = self._won
        if won is not None and won[0] == task:
            view = won[1]
            return (0, None) if view is None else (view.attempts, view.error)
        st = self.claims.state.task_state(task)
        return (0, None) if st is None else (st.attempts, st.last_error)

    def load_task(self, task: int) -> TaskRecord:
        """As the server handed it over with the task, or from the log."""
        won = self._won
        if won is not None and won[0] == task and won[2] is not None:
            record = decode_task(won[2])
            if not isinstance(record, TaskRecord):
                raise RecordDecodeError(f"task {task} is a record of unknown type {record.code!r}")
            return record
        self.tasks.catch_up(self.tasks_log)  # not indexed as we go: the server picks
        return self.tasks.load(self.tasks_log, task)

    def dependency_states(self, after: Sequence[int]) -> TaskViews:
        """The server's, which holds the fold (ours is not read as we go)."""
        return self._server.verdict_log.server.views(after)

    def claim_to_append_ahead(self) -> Claim | None:
        """The server picks the task: the id here is unused."""
        if not self.claim_ahead or self._drain_asked or self._stop.is_set():
            return None
        return Claim(0, self.worker_id, self._clock(), self._lease_us)

    def append_and_settle(
        self, record: Claim | Done | Fail, ahead: Claim | None = None
    ) -> Settled | None:
        """Our DONE or FAIL, and (with `ahead`) the next task's CLAIM, in one call; a DONE
        may be held for the next call instead (the next task is in hand already)."""
        assert not isinstance(record, Claim), "the server makes our CLAIMs (_claim_next)"
        batch = self._settled_batch()
        data = encode(record)
        limit = self._server.log.max_record
        if len(data) > limit:  # now, not when a later call sends a DONE held for it
            raise RecordTooLargeError(len(data), limit)
        ran_s = time.monotonic() - self._attempts.task_started if self._batching else math.inf
        if isinstance(record, Done) and batch.can_hold(ran_s, self.config.lease_s):
            # the next task is in hand already: this DONE goes with the next call
            batch.hold(record, data)
            self._take_ahead()
            outcome = Outcome(Verdict.DONE, -1, record.task, record.worker)
            return Settled(outcome, record, Entry(-1, -1, data))
        held = batch.take_held()
        started = time.perf_counter_ns()
        try:
            got = self._server.next(
                self.worker_id,
                self._lease_us,
                ahead.at if ahead is not None else self._clock(),
                finish=record,
                finish_data=data,
                claim=ahead is not None and not batch.has_ahead,
                heirs=self.config.slots > 1,
                want=batch.want(ran_s),
                earlier=held,
            )
        except (RecordTooLargeError, *FATAL_LOG_ERRORS):
            raise
        except LogError as e:
            # Out of reach: our fold finds out whether it landed (a claim ahead that did
            # land holds its task until its lease lapses; then it is taken over). The held
            # DONEs of the same call after it: found, or appended again.
            folds = (self.tasks, self.claims)
            found, _ = self._recovery.resolve(folds, record, data, None, e)
            for was_held, held_data in held:
                self._recovery.resolve(folds, was_held, held_data, None, e)
            if found is not None:
                self.record.log_recovered()
            return found
        latency_us = (time.perf_counter_ns() - started) // 1000
        for answer, (was_held, _) in zip(got.earlier, held, strict=True):
            if answer.verdict is not Verdict.DONE:
                self.record.stale(was_held.task, None, done=True, lease_noticed=False)
        if got.claimed is not None:
            batch.keep(got.more, time.monotonic())
        assert got.finished is not None
        done = got.finished
        at = (done.position >> 20) * 1000  # the entry's millisecond: the server's time
        holder = done.task.holder if done.task is not None else None
        outcome = Outcome(done.verdict, done.position, record.task, record.worker, holder)
        entry = Entry(done.position, done.position + 1, data, at)
        settled = Settled(outcome, on_server_clock(record, at), entry)
        ahead_settled = self._claimed_for_us(got)
        if ahead is not None and ahead_settled is not None and got.claim is not None:
            claim = ahead._replace(task=got.claim.task)
            self._ahead = AheadClaim(claim, ahead_settled, latency_us)
        elif batch.has_ahead:
            self._take_ahead()
        self.record.log_recovered()
        return settled

    # -- the claim batch (queue_worker.redis.claim_batch) --------------------------------------

    def _settled_batch(self) -> ClaimBatch:
        """The claim batch, after counting what its held DONEs sent by another thread came
        to, and resolving those whose sending failed."""
        batch = self._server.batch
        late, uncertain = batch.take_late()
        for done, _ in late:
            self.record.stale(done.task, None, done=True, lease_noticed=False)
        for done, data, error in uncertain:
            self._recovery.resolve((self.tasks, self.claims), done, data, None, error)
        return batch

    def _take_ahead(self) -> None:
        """The next task the batch claimed ahead, in hand for the next step (none: every one
        left was lost, see ClaimBatch.take_ahead)."""
        now = self._clock()
        got = self._server.batch.take_ahead(
            self._server.verdict_log.server, self.worker_id, self._lease_us, now
        )
        if got is None:
            return
        settled = self._won_claim(got.claimed, got.claim, got.payload)
        # `at` as our clock read when the call made it: the clock offset stays what it is
        claim = got.claim
        mine = Claim(claim.task, self.worker_id, claim.at - self.clock_offset_us, self._lease_us)
        self._ahead = AheadClaim(mine, settled, 0)

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> str:
        """As `WorkerBase.run`, claiming several tasks a call while the tasks are short."""
        self._batching = True
        try:
            return super().run(stop)
        finally:
            self._batching = False

    def _after_step(self) -> None:
        """Nothing: the server's state is the fold, and compaction saves its checkpoint."""

    def _end_run(self) -> None:
        """Send the DONEs the batch still holds."""
        self._server.batch.send_held(self._server.verdict_log.server)
        self._settled_batch()

    def close(self) -> None:
        with contextlib.suppress(LogError):  # (sent by run() already, unless it raised)
            self._server.batch.send_held(self._server.verdict_log.server)
        super().close()
