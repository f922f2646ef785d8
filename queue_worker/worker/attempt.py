"""One attempt of a task our claim won, whichever protocol settled the claim.

Both workers (the client fold, `queue_worker.worker.loop`, and server verdicts,
`queue_worker.redis.server_worker`) hand a won claim to their `AttemptRunner`, which

1. asks the claiming protocol how many attempts the task has had (a claim that wins attempt
   ``max_attempts + 1`` makes the task dead without running it: `_give_up`);
2. loads the task and runs the handler with a `LeaseKeeper` renewing the lease and the
   watchdog (`TimeLimits`) holding the attempt to its time limit;
3. makes the DONE (the result) or the FAIL (the error, and when to retry or that the task is
   dead), hands it to the protocol to append and settle (with the next task's CLAIM, when
   the protocol claims ahead), and says what the verdict came to (`StepResult`).

A handler cancelled after a lost lease writes nothing. What happens is counted by the
worker's `StatsRecorder`, one named event per call.

What the attempt asks of the protocol is `Claiming`: the task's history, its record, the
CLAIM to append ahead, and appending one record with it.
"""

from __future__ import annotations

import enum
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple, Protocol

from logstore import Log, LogError, RecordTooLargeError
from queue_worker.names import worker_label
from queue_worker.protocol.clock import Clock
from queue_worker.protocol.records import (
    Claim,
    Done,
    Fail,
    RecordDecodeError,
    RecordEncodeError,
    TaskRecord,
    encode,
    error_field,
    with_traceback,
)
from queue_worker.protocol.state import Verdict
from queue_worker.topics import ClaimsFollower, Settled, TaskIndex
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.dependencies import DependencyStates, refusal
from queue_worker.worker.handlers import (
    Handler,
    HandlerOutcome,
    NamedHandlers,
    TaskContext,
    attempts_used_up,
    failure_traceback,
    retry_at,
    run_task,
)
from queue_worker.worker.lease import FATAL_LOG_ERRORS, LeaseKeeper, RenewalThread
from queue_worker.worker.recorder import StatsRecorder
from queue_worker.worker.recovery import OutageRecovery
from queue_worker.worker.watchdog import TimeLimits


class StepKind(enum.Enum):
    """What one step of a worker came to."""

    IDLE = "idle"  # nothing claimable
    DRAINING = "draining"  # asked to drain: made no claim
    LOST = "lost"  # our CLAIM lost (the verdict says why)
    DONE = "done"  # ran the task; our DONE was accepted
    STALE = "stale"  # ran the task but the lease had been lost: DONE/FAIL refused
    FAILED = "failed"  # the handler failed; the task may be retried after a backoff
    DEAD = "dead"  # the handler failed for the last time: the task is dead
    CANCELLED = "cancelled"  # the lease was lost and the handler stopped: nothing written


#: builds a NamedTuple from every field at once, skipping its Python-level __new__: used for
#: the records and results made once a task (see docs/speed.md, "Where a worker's time goes")
new_tuple: Final = tuple.__new__

#: what an accepted DONE or FAIL of ours came to
_FINISHED_AS: Final = {
    Verdict.DONE: StepKind.DONE,
    Verdict.STALE_DONE: StepKind.STALE,
    Verdict.RELEASED: StepKind.FAILED,
    Verdict.DEAD: StepKind.DEAD,
    Verdict.STALE_FAIL: StepKind.STALE,
}


# A NamedTuple, not a frozen dataclass: one is made every task (see docs/speed.md).
class StepResult(NamedTuple):
    kind: StepKind
    task: int | None = None
    claim: int | None = None  # the position of our CLAIM
    verdict: Verdict | None = None  # LOST: the CLAIM's; otherwise that of our DONE/FAIL
    result: Any = None  # DONE: the handler's result
    error: str | None = None  # FAILED, DEAD, CANCELLED: why
    retry_at: int | None = None  # FAILED: when the task may be tried again (fold clock, µs)
    latency_us: int | None = None  # claim latency: CLAIM append start to its verdict
    drained: bool = False  # IDLE: no task is pending or held
    next_change: int | None = None  # IDLE: when a held/backed-off task frees up (fold clock)


class Claiming(Protocol):
    """What an attempt asks of the protocol that claimed its task (the worker)."""

    tasks: TaskIndex
    claims: ClaimsFollower

    def task_history(self, task: int) -> tuple[int, str | None]:
        """The task's winning claims so far and its last FAIL's error."""
        ...

    def load_task(self, task: int) -> TaskRecord:
        """The task's record."""
        ...

    def dependency_states(self, after: Sequence[int]) -> DependencyStates:
        """Where the task's dependencies `after` stand (done, dead, open), by a fold that has
        read at least as far as our winning CLAIM."""
        ...

    def claim_to_append_ahead(self) -> Claim | None:
        """The CLAIM to append with the DONE/FAIL about to be written, or None."""
        ...

    def append_and_settle(
        self, record: Claim | Done | Fail, ahead: Claim | None = None
    ) -> Settled | None:
        """Append one of our records (with `ahead`, the next task's CLAIM) and settle it;
        None: given up (the log was out of reach until our claim lost the task)."""
        ...


class AttemptRunner:
    """Runs the attempts of one worker, one at a time, for the protocol `claiming`.

    `claims_log` is where the lease keeper renews and the watchdog writes a timed-out FAIL
    (with server verdicts, the log whose appends go through the server's rules); `fold_now`
    is the current time on the fold's clock (µs).
    """

    def __init__(
        self,
        config: WorkerConfig,
        *,
        worker_id: str,
        handler: Handler | NamedHandlers,
        claiming: Claiming,
        claims_log: Log,
        clock: Clock,
        fold_now: Callable[[], int],
        rng: random.Random,
        record: StatsRecorder,
        recovery: OutageRecovery,
    ) -> None:
        self.config = config
        self.worker_id = worker_id
        self.handler = handler
        self._claiming = claiming
        self._claims_log = claims_log
        self._clock = clock
        self._fold_now = fold_now
        self._rng = rng
        self._record = record
        self._recovery = recovery
        # one renewal thread for the worker's life, handed each task's lease (see lease.py)
        self._renewer = RenewalThread()
        # ends the process when a task outruns its time limit or a drain (see watchdog.py)
        self.time_limits = TimeLimits(config.drain_timeout_s)
        #: monotonic time the current/last task's run began
        self.task_started = 0.0
        #: a won claim whose task could not be loaded (the log out of reach), to run next
        self.in_hand: tuple[Settled, int] | None = None
        # What each task's run reads of the config, read once (see docs/speed.md).
        self._lease_us = config.lease_us
        self._max_attempts = config.max_attempts
        self._work_ms = config.work_ms
        self._task_timeout_s = config.task_timeout_s

    def close(self) -> None:
        self._renewer.close()
        self.time_limits.close()

    def resume_in_hand(self) -> StepResult:
        """Run the won task whose payload could not be read last time, if our claim still
        holds it (a LogError leaves it in hand again)."""
        assert self.in_hand is not None
        settled, latency_us = self.in_hand
        claiming = self._claiming
        holds = self._recovery.still_holds(claiming.claims, settled)
        self.in_hand = None
        task = settled.outcome.task
        assert task is not None
        if holds:
            return self.work(task, settled, latency_us)
        self._record.lapsed_out_of_reach(task)
        self._record.folded(claiming.tasks, claiming.claims)
        return StepResult(
            StepKind.CANCELLED,
            task,
            settled.entry.position,
            error="the lease lapsed while the log was out of reach; not run",
            latency_us=latency_us,
        )

    def work(
        self,
        task: int,
        settled: Settled,
        latency_us: int,
        won: Verdict | None = None,
        folds_noted: bool = False,
    ) -> StepResult:
        """Run the task our claim holds. `won`: the claim's verdict, just settled (counted
        with the task taken in hand, one stats event); None: counted before (in hand).
        `folds_noted`: the stats have the folds as they are now."""
        claim = settled.record
        lease = settled.outcome.holder
        assert isinstance(claim, Claim) and lease is not None
        claim_position = settled.entry.position
        claiming = self._claiming
        folds = None if folds_noted else (claiming.tasks, claiming.claims)
        claimed = None if won is None else (won, latency_us, folds)
        self._record.working(task, claim_position, lease.expiry, claimed=claimed)
        self.task_started = time.monotonic()
        try:
            attempt, _ = claiming.task_history(task)
            if attempt > self._max_attempts:
                return self._give_up(task, settled, attempt, latency_us)
            keeper = LeaseKeeper(
                self._claims_log,
                claim=claim,
                claim_position=claim_position,
                read_from=settled.entry.next,
                lease_us=self._lease_us,
                clock=self._clock,
                listener=self._record,
                renewer=self._renewer,
                fold_clock=self._fold_now,
            )
            ctx = TaskContext(
                task_id=task,
                attempt=attempt,
                cancelled=keeper.cancelled,
                worker_id=self.worker_id,
                work_ms=self._work_ms,
                lease_lapsed=keeper.check_lapse,
            )
            limit_s = self.handler.time_limit_s or self._task_timeout_s

            def timed_out(error: str) -> None:  # called from the watchdog's thread
                self._fail_timed_out(task, claim_position, attempt, error)

            try:
                with keeper, self.time_limits.running(limit_s, timed_out):
                    outcome = self._run_task(task, ctx)
            except FATAL_LOG_ERRORS:
                raise
            except LogError:
                # The payload could not be read (the log is out of reach): the task stays
                # in hand, and the next step runs it once the log answers again.
                self.in_hand = (settled, latency_us)
                raise
            # (the error first: a task nearly always ends ok, and then the event is not asked)
            if outcome.error is not None and keeper.cancelled.is_set():
                # The handler stopped because the lease was lost: the task is someone else's.
                why = "the lease lapsed while paused or stalled" if keeper.lapsed else None
                self._record.cancelled(task, why or outcome.error)
                return StepResult(
                    StepKind.CANCELLED,
                    task,
                    claim_position,
                    error=outcome.error,
                    latency_us=latency_us,
                )
            return self._finish(task, claim_position, ctx.attempt, outcome, keeper, latency_us)
        finally:
            self._record.off_task()  # (the state is idle again)

    def _run_task(self, task: int, ctx: TaskContext) -> HandlerOutcome:
        try:
            record = self._claiming.load_task(task)
        except RecordDecodeError as e:  # it will not decode next time either: fail for good
            return HandlerOutcome(error=f"RecordDecodeError: {e}", exception=e, permanent=True)
        self._record.running(record.function)
        if record.after and record.resolves_to is None:  # a dependency dead (or still open)
            refused = refusal(record.after, self._claiming.dependency_states(record.after))
            if refused is not None:
                return refused
        return run_task(self.handler, record, ctx, self.time_limits)

    def _attempt_failed(
        self,
        task: int,
        claim_position: int,
        at: int,
        attempt: int,
        error: str,
        *,
        permanent: bool = False,
        traceback: str | None = None,
        max_attempts: int | None = None,
    ) -> Fail:
        """The FAIL of a failed attempt (an exception or a time-out): when the task may be
        retried, by this worker's backoff, or that it is dead (attempts used up, or
        `permanent`)."""
        retry = retry_at(
            at,
            attempt,
            max_attempts=self.config.max_attempts if max_attempts is None else max_attempts,
            backoff_s=self.config.backoff_s,
            backoff_max_s=self.config.backoff_max_s,
            rng=self._rng,
            permanent=permanent,
        )
        # (error_field: whatever the error says, the FAIL is bounded and encodes)
        error = with_traceback(error_field(error), traceback)
        return Fail(task, self.worker_id, at, claim_position, error, retry)

    def _fail_timed_out(self, task: int, claim_position: int, attempt: int, error: str) -> None:
        """The attempt outran its time limit (the watchdog's thread calls this, then ends
        the process): append its FAIL, durably, under our claim, which still holds the task.
        Like an exception's FAIL, it says when to retry, or that the task is dead."""
        max_attempts = self.handler.in_hand_max_attempts  # (the task's own, if it has one)
        fail = self._attempt_failed(
            task, claim_position, self._clock(), attempt, error, max_attempts=max_attempts
        )
        self._claims_log.append(encode(fail), durable=True)
        print(f"qw worker {worker_label(self.worker_id)}: task {task} {error}", file=sys.stderr)
        self._record.timed_out(task, error)

    def _give_up(self, task: int, settled: Settled, attempt: int, latency_us: int) -> StepResult:
        """Our claim won attempt `attempt` > max_attempts: the attempts before it ended with
        no FAIL (their workers died running the task, or were ended past their lease), so
        the task is made dead without running it again: a handler that kills its worker
        gets max_attempts runs, as one that raises does. Written under our claim: the holder."""
        claim = settled.record
        assert isinstance(claim, Claim)
        previous = settled.outcome.previous if settled.outcome.verdict is Verdict.TAKEOVER else None
        error = attempts_used_up(
            attempt,
            self.config.max_attempts,
            worker_label(previous.worker) if previous is not None else None,
            self._claiming.task_history(task)[1],
        )
        keeper = LeaseKeeper(  # never started: `_finish` only asks whether it lost the lease
            self._claims_log,
            claim=claim,
            claim_position=settled.entry.position,
            read_from=settled.entry.next,
            lease_us=self._lease_us,
            clock=self._clock,
        )
        outcome = HandlerOutcome(error=error, permanent=True)
        return self._finish(task, settled.entry.position, attempt, outcome, keeper, latency_us)

    def _finish(
        self,
        task: int,
        claim_position: int,
        attempt: int,
        outcome: HandlerOutcome,
        keeper: LeaseKeeper,
        latency_us: int,
    ) -> StepResult:
        """Make the DONE (or FAIL), have the protocol append and settle it (with the next
        task's CLAIM when it has one to append ahead: one batch, both land or neither), and
        count what the verdict made of it."""
        at = self._clock()
        claiming = self._claiming
        ahead = claiming.claim_to_append_ahead()
        settled: Settled | None = None
        recorded = False  # a DONE or FAIL was made (settled is None: our claim lost the task)
        if outcome.error is None:
            try:
                done = new_tuple(Done, (task, self.worker_id, at, claim_position, outcome.result))
                settled = claiming.append_and_settle(done, ahead)
                recorded = True
            except (RecordEncodeError, RecordTooLargeError) as e:
                outcome = HandlerOutcome(error=f"result cannot be recorded: {e}", exception=e)
        if not recorded:
            assert outcome.error is not None
            fail = self._attempt_failed(
                task,
                claim_position,
                at,
                attempt,
                outcome.error,
                permanent=outcome.permanent,
                traceback=failure_traceback(outcome.exception),
                max_attempts=self.handler.in_hand_max_attempts,
            )
            settled = claiming.append_and_settle(fail, ahead)
        if settled is None:
            return self._lost_while_unreachable(task, claim_position, outcome, keeper, latency_us)
        verdict = settled.outcome.verdict
        # (the usual verdict by identity first, then the table: see docs/speed.md)
        kind = StepKind.DONE if verdict is Verdict.DONE else _FINISHED_AS[verdict]
        if kind is StepKind.DONE:
            self._record.finished((claiming.tasks, claiming.claims))
            # every field given (see new_tuple): kind, task, claim, verdict, result, error,
            # retry_at, latency_us, drained, next_change
            return new_tuple(
                StepResult,
                (
                    kind,
                    task,
                    claim_position,
                    verdict,
                    outcome.result,
                    None,
                    None,
                    latency_us,
                    False,
                    None,
                ),
            )
        self._record.folded(claiming.tasks, claiming.claims)
        if kind is StepKind.STALE:
            was_done = verdict is Verdict.STALE_DONE
            self._record.stale(task, outcome.error, done=was_done, lease_noticed=keeper.lost)
        else:
            assert outcome.error is not None  # a FAIL was written: it carries the error
            self._record.failed(task, outcome.error)
        retry = settled.record.retry_at if isinstance(settled.record, Fail) else None
        return StepResult(
            kind,
            task,
            claim_position,
            verdict,
            result=outcome.result if outcome.ok else None,
            error=outcome.error,
            retry_at=retry if kind is StepKind.FAILED else None,
            latency_us=latency_us,
        )

    def _lost_while_unreachable(
        self,
        task: int,
        claim_position: int,
        outcome: HandlerOutcome,
        keeper: LeaseKeeper,
        latency_us: int,
    ) -> StepResult:
        """Our DONE/FAIL could not be written before our claim lost the task (the log was
        out of reach until the lease lapsed and the task was taken over): nothing written."""
        claiming = self._claiming
        self._record.folded(claiming.tasks, claiming.claims)
        error = "the lease was lost while the log was out of reach; nothing recorded"
        self._record.lost_out_of_reach(task, error, lease_noticed=keeper.lost)
        return StepResult(
            StepKind.CANCELLED,
            task,
            claim_position,
            result=None,
            error=outcome.error or error,
            latency_us=latency_us,
        )
