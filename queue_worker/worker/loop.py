"""The worker: one process that claims tasks through the claims log and runs them.

One iteration (`Worker.step`):

1. catch up on both logs (index new tasks; fold new claims records into the `ClaimState`);
2. pick a claimable task (`queue_worker.worker.pick`);
3. append CLAIM and *settle* it: read the claims log up to and including that record,
   folding everything before it; its verdict decides (claim latency = append start to
   verdict);
4. if won: run the handler with a `LeaseKeeper` renewing the lease in a thread; then append
   DONE (the result) or FAIL (the error, and when to retry or that the task is dead), both
   durable, and settle that too. A handler cancelled after a lost lease writes nothing.
   With another task claimable, its CLAIM is appended in the same batch as the DONE/FAIL
   ("claim ahead"), and the next step settles it instead of steps 1–3: a drain then costs
   one append and one read of the claims log per task instead of two of each.

`run(stop)` repeats `step()`; an idle worker blocks in `tasks_log.wait` until a task is
enqueued, a lease or backoff it knows of runs out, or `idle_poll_s` passes. `drain()` (or
the stop event) means: no new claims, finish the task in hand, return.

The process the supervisor starts (``python -m queue_worker.worker.process '<json>'``) is in
`queue_worker.worker.process`: it dies with its parent, drains on SIGTERM, exits at once on a
second SIGTERM, and ignores SIGINT (the supervisor owns Ctrl-C).

Clocks: records carry `at` from the injected `clock` (wall clock µs). On a backend that
stamps records with its server's clock (Redis), the fold judges by that clock instead (see
`queue_worker.worker.topics`), so the worker estimates its offset to the server from its own CLAIM
and asks `claimable` on the server's clock.

A log out of reach (a Redis server restarting, a network partition): a failed read or wait
only pauses the loop, and the worker resumes from the positions it has folded; an append
whose reply was lost is resolved from the log (`queue_worker.worker.recovery`).

With server verdicts (a Redis queue's mode, the default) steps 1–3 happen on the server: one
call appends the last task's DONE/FAIL and claims the next task, and the worker folds no
claims record (`queue_worker.redis.server_claim`); its other appends go through the server's
rules too.

What the worker does is counted by `queue_worker.worker.recorder` (one named event per call), which
publishes the stats snapshot and hears the lease keeper.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import random
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from logstore import (
    Entry,
    Log,
    LogError,
    PositionCompactedError,
    RecordTooLargeError,
    is_redis_url,
)
from queue_worker.history.checkpoint import CheckpointError, Location, save_checkpoint
from queue_worker.names import worker_label
from queue_worker.protocol.clock import Clock, now_us, us_to_seconds
from queue_worker.protocol.records import (
    Claim,
    Done,
    Fail,
    RecordDecodeError,
    RecordEncodeError,
    TaskRecord,
    decode_task,
    encode,
    error_field,
    error_text,
    with_traceback,
)
from queue_worker.protocol.state import Outcome, Verdict
from queue_worker.worker.config import WorkerConfig, default_host
from queue_worker.worker.handlers import (
    HandlerOutcome,
    TaskContext,
    attempts_used_up,
    failure_traceback,
    handler_from_function,
    load_handlers,
    retry_at,
    run_task,
)
from queue_worker.worker.inherited import StartingFold, begin_folds
from queue_worker.worker.lease import FATAL_LOG_ERRORS, LeaseKeeper, RenewalThread
from queue_worker.worker.pick import Picker
from queue_worker.worker.recorder import StatsRecorder
from queue_worker.worker.recovery import OutageRecovery
from queue_worker.worker.stats import WorkerStats
from queue_worker.worker.topics import (
    ClaimsFollower,
    Settled,
    TaskIndex,
    check_tasks_cover,
    on_server_clock,
    open_topics,
)
from queue_worker.worker.watchdog import TimeLimits

if TYPE_CHECKING:  # redis is an optional extra: imported by `_server_claims` when used
    from queue_worker.redis.claim_batch import ClaimBatch
    from queue_worker.redis.server_claim import NextTask, ServerClaims
    from queue_worker.redis.server_verdicts import TaskView

# Not Final, these three: the tests set them on the module.
#: claim ahead: a fold settled this recently (seconds) is fresh enough to pick from
FRESH_FOLD_S = 0.002
#: ... on a networked log (Redis), where the read before the pick is a round trip: 0.3 of
#: a round trip per no-op task saved, for ~0.1 % more lost CLAIMs (measured, 8 workers)
FRESH_FOLD_REMOTE_S = 0.05

#: the worker in slot 0 saves a fold checkpoint each time it has folded this much more of
#: the claims log (~100k tasks' CLAIM + DONE; a save of 1M tasks' fold takes ~30 ms)
CHECKPOINT_EVERY_BYTES = 8 << 20


class StepKind(enum.Enum):
    """What one `Worker.step` came to."""

    IDLE = "idle"  # nothing claimable
    DRAINING = "draining"  # asked to drain: made no claim
    LOST = "lost"  # our CLAIM lost (the verdict says why)
    DONE = "done"  # ran the task; our DONE was accepted
    STALE = "stale"  # ran the task but the lease had been lost: DONE/FAIL refused
    FAILED = "failed"  # the handler failed; the task may be retried after a backoff
    DEAD = "dead"  # the handler failed for the last time: the task is dead
    CANCELLED = "cancelled"  # the lease was lost and the handler stopped: nothing written


#: a NamedTuple built with every field given, on a task's path: tuple.__new__ is one C call,
#: where the NamedTuple's own __new__ is a Python function (~1k instructions more a build)
_new: Final = tuple.__new__

#: what an accepted DONE or FAIL of ours came to (`_finish`)
_FINISHED_AS: Final = {
    Verdict.DONE: StepKind.DONE,
    Verdict.STALE_DONE: StepKind.STALE,
    Verdict.RELEASED: StepKind.FAILED,
    Verdict.DEAD: StepKind.DEAD,
    Verdict.STALE_FAIL: StepKind.STALE,
}


# StepResult and AheadClaim are NamedTuples, not frozen dataclasses: one of each is made
# every task, and a frozen dataclass sets each field through object.__setattr__ (a
# StepResult took ~4x the time of the NamedTuple to build).
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


class AheadClaim(NamedTuple):
    """A CLAIM appended and settled with the previous task's DONE/FAIL, for the next step
    to count and work."""

    claim: Claim
    settled: Settled
    latency_us: int  # claim latency: the batch's append start → this verdict


def new_worker_id(name: str, host: str | None = None) -> str:
    """Unique per process: a restarted worker is a new id (ownership is never by name).
    With `host` (workers of several machines on one log), it names the machine too:
    ``w0@box-4711-9f3a``."""
    at_host = f"@{host}" if host else ""
    return f"{name}{at_host}-{os.getpid()}-{secrets.token_hex(2)}"


class Worker:
    """A worker over the two logs. Drive it with `step()` (tests) or `run()` (a process)."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        clock: Clock = now_us,
        tasks_log: Log | None = None,
        claims_log: Log | None = None,
        rng: random.Random | None = None,
        handler: Callable[..., Any] | None = None,
        claim_ahead: bool = True,
        start: StartingFold | None = None,
    ) -> None:
        """`handler` runs the tasks instead of the one `config.handler` names (tests,
        embedding); the logs, when given, are used instead of opening config.location.
        `start`: a fold of the queue's logs to start from (inherited from the fork server),
        when it fits the logs this worker opens; it is the worker's own from then on.
        `claim_ahead=False`: one CLAIM per step, never appended with a DONE (tests that
        drive `step()` one claim at a time)."""
        config.validate()
        self.config = config
        host = config.host if config.host is not None else default_host()
        # On a log that several machines share (Redis), or with a host named on purpose, the
        # id says where the worker runs: a pid is unique only on its own machine.
        shared = config.host is not None or is_redis_url(config.location)
        self.worker_id = new_worker_id(config.name, host if shared else None)
        self.handler = (
            load_handlers(config.handler) if handler is None else handler_from_function(handler)
        )
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        # A fold checkpoint belongs to the queue whose logs we open ourselves. On Redis only
        # compaction writes one (queue_worker.redis.compaction): a worker reads it.
        checkpoints = tasks_log is None and claims_log is None
        on_redis = is_redis_url(config.location)
        if tasks_log is None or claims_log is None:
            opened_tasks, opened_claims = open_topics(config.location, config.durability)
            self._owned_logs = [opened_tasks, opened_claims]
            tasks_log = tasks_log if tasks_log is not None else opened_tasks
            claims_log = claims_log if claims_log is not None else opened_claims
        else:
            self._owned_logs = []
        self.tasks_log: Log = tasks_log
        self.claims_log: Log = claims_log
        #: server verdicts (a Redis queue's mode, logstore.redis.verdict_mode; the default for a
        #: new queue): the server folds every claims record we write, and
        #: hands us the next task (queue_worker.redis.server_claim); None: our own fold decides
        self._server: ServerClaims | None = None
        self._server_won: tuple[int, TaskView | None, bytes | None] | None = None
        self._server_tasks_read = tasks_log.start  # where the server has read the tasks to
        if getattr(claims_log, "verdicts", None) == "server":
            self._server = _server_claims(tasks_log, claims_log)
            self.claims_log = self._server.verdict_log
        self.tasks = TaskIndex(tasks_log.start)
        #: which task to try next, and what that choice keeps between picks (see pick.py)
        self._picker = Picker(
            config.pick,
            self.worker_id,
            config.lease_us,
            slot=config.slot,
            slots=config.slots,
            rng=self._rng,
        )
        self.claims = ClaimsFollower(claims_log.start)
        self._checkpoint_dir: Location | None = None
        if checkpoints:
            self._checkpoint_dir = config.location if on_redis else Path(config.location)
        # (slot 0 only, see _save_checkpoint: decided once, not read off the config each step)
        self._saves_checkpoints = checkpoints and not on_redis and config.slot == 0
        checkpoint_note = self._begin(start, checkpoints)
        self._covered = False  # whether the claims fold was checked against the tasks log
        self.tasks.keep_payloads(config.slot, config.slots)  # the tasks spread gives us
        # server clock − our clock, µs (0 unless the backend stamps records: see topics.py)
        self.clock_offset_us = 0
        self._draining = threading.Event()
        #: `_draining.is_set()` as a plain field, set by `drain()` with the event: what the
        #: claim ahead asks at every task (Event.is_set is a Python call, ~650 instructions)
        self._drain_asked = False
        self.stats = WorkerStats(
            worker=self.worker_id,
            name=config.name,
            pid=os.getpid(),
            host=host if config.host is not None else socket.gethostname(),
            started_at=time.time(),
        )
        self.stats.last_error = checkpoint_note
        path = Path(config.run_dir) / f"{self.worker_id}.json" if config.run_dir else None
        #: counts each event into `stats` and publishes it (the lease keeper reports to it)
        self.record = StatsRecorder(
            self.stats, path, draining=self._draining, wall_seconds=self._wall_seconds
        )
        #: resolves our appends whose replies were lost (see recovery.py); its second
        #: append of a DONE/FAIL goes through the verdict script with server verdicts
        self._recovery = OutageRecovery(
            self.claims_log,
            self.record,
            draining=self._draining,
            poll_s=config.idle_poll_s,
            fold_now=lambda: self.fold_time(self._clock()),
        )
        # one renewal thread for the worker's life, handed each task's lease (see lease.py)
        self._renewer = RenewalThread()
        # ends the process when a task outruns its time limit or a drain (see watchdog.py)
        self._time_limits = TimeLimits(config.drain_timeout_s)
        #: append the next task's CLAIM with each DONE/FAIL (see `_finish`)
        self.claim_ahead = claim_ahead
        self._fresh_s = FRESH_FOLD_REMOTE_S if is_redis_url(config.location) else FRESH_FOLD_S
        self._ahead: AheadClaim | None = None
        self._task_started = 0.0  # monotonic time the current/last task's run began
        #: a won claim whose task could not be loaded (the log out of reach), to run next
        self._in_hand: tuple[Settled, int] | None = None
        self._stop = threading.Event()  # run()'s stop event: no claim ahead once it is set
        #: the lease in µs (`config.lease_us` computes it at each call: twice a task)
        self._lease_us = config.lease_us
        #: what each task's run reads of the config, as the worker's own fields: WorkerConfig
        #: is not compiled, and each read of it is a generic lookup (~230 instructions)
        self._max_attempts = config.max_attempts
        self._work_ms = config.work_ms
        self._task_timeout_s = config.task_timeout_s
        #: inside `run()`, which works every task a batch claimed ahead and sends the DONEs
        #: it holds before it returns: only there are several tasks claimed in one call
        #: (queue_worker.redis.claim_batch); `step()` alone appends each DONE as it returns
        self._batching = False

    # -- the fold checkpoint (see queue_worker.history.checkpoint) ---------------------------------

    def _begin(self, start: StartingFold | None, own_logs: bool) -> str | None:
        """Start the folds from `start` (made by the fork server, inherited with the fork:
        see queue_worker.worker.inherited) when it is a fold of our own logs, else from the data
        directory's checkpoint or the start (`_load_checkpoint`); returns why an existing
        checkpoint was refused (None otherwise)."""
        if start is None or not own_logs or self._server is not None:
            return self._load_checkpoint()
        misfit = start.misfit(self.config.location, self.tasks_log, self.claims_log)
        if misfit is not None:
            return self._load_checkpoint()
        self.tasks, self.claims = start.tasks, start.claims
        self._checkpointed = start.began_at
        if self.tasks.known > start.first_new_task:
            # New to this worker, as they would be in its own replay (a spread pick holds
            # fresh tasks back for their slot's worker).
            self._picker.saw(start.first_new_task, self._clock())
        return start.note

    def _load_checkpoint(self) -> str | None:
        """Start the folds from the data directory's checkpoint when it fits these logs;
        returns why an existing checkpoint was refused (None otherwise)."""
        self._checkpointed = (self.tasks.next_position, self.claims.next_position)
        restored, note = begin_folds(self.tasks_log, self.claims_log, self._checkpoint_dir)
        if restored is not None:
            self.tasks, self.claims = restored
            self._checkpointed = (self.tasks.next_position, self.claims.next_position)
        return note

    def _save_checkpoint(self, *, final: bool = False) -> None:
        """The worker in slot 0 saves the fold every CHECKPOINT_EVERY_BYTES of claims log,
        and when it exits cleanly, so that the next start replays only what came after."""
        directory = self._checkpoint_dir
        if directory is None or not self._saves_checkpoints:
            return
        now_at = (self.tasks.next_position, self.claims.next_position)
        moved = now_at[1] - self._checkpointed[1]
        if now_at == self._checkpointed or (not final and moved < CHECKPOINT_EVERY_BYTES):
            return
        try:
            save_checkpoint(directory, self.tasks, self.tasks_log, self.claims, self.claims_log)
        except CheckpointError as e:  # only the next start's replay is longer
            self.record.checkpoint_failed(str(e))
            return
        self._checkpointed = now_at

    # -- one iteration -------------------------------------------------------------------------

    def step(self, now: int | None = None) -> StepResult:
        """One iteration: catch up, pick, claim, settle, and run the task if won. Blocks only
        while the handler runs. `now` is the worker's clock (µs) for the pick and the CLAIM.

        A CLAIM made ahead (appended with the previous task's DONE, see `_finish`) is
        settled and worked first, even when draining: it is a task in hand."""
        if self._in_hand is not None:
            return self._resume_in_hand(*self._in_hand)
        ahead = self._ahead
        if ahead is not None:
            return self._settle_ahead(ahead)
        if self._server is not None:
            return self._server_step()
        self.catch_up()
        if now is None:
            # After the catch-up: a long replay must not leave the CLAIM's `at` (and so its
            # lease) stale by the replay's length.
            now = self._clock()
        if self._draining.is_set():
            return StepResult(StepKind.DRAINING)
        task = self.pick(now)
        if task is None:
            return self._idle(now)
        return self.attempt(task, now)

    def catch_up(self) -> None:
        """Index new tasks and fold new claims records."""
        try:
            self._catch_up()
        except PositionCompactedError:
            # Compaction removed records this worker had not read yet (all of them settled
            # history, in the checkpoint): start again from the checkpoint.
            if self._load_checkpoint() is not None:
                raise
            self.tasks.keep_payloads(self.config.slot, self.config.slots)
            self._catch_up()

    def _catch_up(self) -> None:
        before = self.tasks.known
        self.tasks.catch_up(self.tasks_log)
        if self.tasks.known > before:
            self._picker.saw(before, self._clock())
        self.claims.catch_up(self.claims_log)
        # What the fold closed below its watermark is closed for good: the index forgets it,
        # so a worker's memory follows the live tasks, not the history.
        self.tasks.settle_below(self.claims.state.watermark)
        if not self._covered:
            # Once, at the start: the claims fold must not have closed a task the tasks log
            # does not hold (a tasks log cut short or replaced: see check_tasks_cover).
            known = self.tasks.known
            if self.tasks.catch_up(self.tasks_log):
                self._picker.saw(known, self._clock())
            check_tasks_cover(self.tasks_log, self.tasks.known, self.claims_log, self.claims.state)
            self._covered = True
        self.record.folded(self.tasks, self.claims)

    def pick(self, now: int) -> int | None:
        """A claimable task by the configured strategy (as of the last catch-up), or None."""
        return self._picker.pick(self.claims.state, self.tasks, now, self.fold_time(now))

    def attempt(self, task: int, now: int) -> StepResult:
        """Claim `task` at `now`, settle the claim, and run the task if the claim won."""
        self.record.state("claiming")
        claim = Claim(task, self.worker_id, now, self._lease_us)
        started = time.perf_counter_ns()
        settled = self._append_and_settle(claim)
        if settled is None:
            raise LogError(f"{self.claims_log.name}: our CLAIM of task {task} is not in the log")
        return self._claimed(claim, settled, (time.perf_counter_ns() - started) // 1000)

    def _settle_ahead(self, ahead: AheadClaim) -> StepResult:
        self._ahead = None
        # The folds have not moved since the DONE/FAIL settled with this CLAIM, and that
        # event noted them: no need to note them again.
        return self._claimed(ahead.claim, ahead.settled, ahead.latency_us, folds_noted=True)

    def _resume_in_hand(self, settled: Settled, latency_us: int) -> StepResult:
        """Run a won task whose payload could not be read last time, if our claim still
        holds it (a LogError leaves it in hand again)."""
        holds = self._recovery.still_holds(self.claims, settled)
        self._in_hand = None
        task = settled.outcome.task
        assert task is not None
        if holds:
            return self._work(task, settled, latency_us)
        self.record.lapsed_out_of_reach(task)
        self.record.folded(self.tasks, self.claims)
        return StepResult(
            StepKind.CANCELLED,
            task,
            settled.entry.position,
            error="the lease lapsed while the log was out of reach; not run",
            latency_us=latency_us,
        )

    def _claimed(
        self, claim: Claim, settled: Settled, latency_us: int, *, folds_noted: bool = False
    ) -> StepResult:
        """Count a settled CLAIM of ours, and run its task if it won. `folds_noted`: the
        stats have the folds as they are now (the CLAIM's event need not note them)."""
        task, now = claim.task, claim.at
        position = settled.entry.position
        # Our CLAIM as folded carries the server's time where there is one: now we know
        # (to within a round trip) how far our clock is from the server's.
        self.clock_offset_us = settled.record.at - now if isinstance(settled.record, Claim) else 0
        verdict = settled.outcome.verdict
        if not verdict.won:
            self.record.claimed(verdict, latency_us, (self.tasks, self.claims))
            self.record.state("idle")
            return StepResult(StepKind.LOST, task, position, verdict, latency_us=latency_us)
        return self._work(task, settled, latency_us, verdict, folds_noted)

    def fold_time(self, now: int) -> int:
        """`now` on the clock the fold judges by (the server's, when the backend has one)."""
        return now + self.clock_offset_us

    def _fold_now(self) -> int:
        return self._clock() + self.clock_offset_us

    def drain(self) -> None:
        """Make no new claims; the task in hand is finished. (Safe from a signal handler.)"""
        self._drain_asked = True
        self._draining.set()
        self._time_limits.drain()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def is_drained(self) -> bool:
        """Nothing pending or held: every known task (that this version can run) is closed."""
        state = self.claims.state
        known = self.tasks.known
        # A claim for an id the tasks log lacks (a foreign or hostile writer's) holds no task
        # of this queue: it must not keep `--exit-when-drained` from ever exiting.
        if state.held_count and any(t < known for t, _ in state.held_tasks()):
            return False
        return all(
            state.is_closed(t) or t in self.tasks.foreign
            for t in range(state.watermark, self.tasks.known)
        )

    def _idle(self, now: int) -> StepResult:
        self.record.state("idle")
        next_change = self.claims.state.next_change(self.fold_time(now))
        recheck = self._picker.recheck_at(self.fold_time)  # a held-back task becomes ours
        if recheck is not None:
            next_change = recheck if next_change is None else min(next_change, recheck)
        return StepResult(StepKind.IDLE, drained=self.is_drained(), next_change=next_change)

    # -- running a won task --------------------------------------------------------------------

    def _work(
        self,
        task: int,
        settled: Settled,
        latency_us: int,
        won: Verdict | None = None,
        folds_noted: bool = False,
    ) -> StepResult:
        """Run the task our claim holds. `won`: the claim's verdict, just settled (counted
        with the task taken in hand, one stats event); None: counted before (in hand)."""
        claim = settled.record
        lease = settled.outcome.holder
        assert isinstance(claim, Claim) and lease is not None
        claim_position = settled.entry.position
        folds = None if folds_noted else (self.tasks, self.claims)
        claimed = None if won is None else (won, latency_us, folds)
        self.record.working(task, claim_position, lease.expiry, claimed=claimed)  # (the state)
        self._task_started = time.monotonic()
        try:
            attempt, _ = self._history(task)
            if attempt > self._max_attempts:
                return self._give_up(task, settled, attempt, latency_us)
            keeper = LeaseKeeper(
                self.claims_log,
                claim=claim,
                claim_position=claim_position,
                read_from=settled.entry.next,
                lease_us=self._lease_us,
                clock=self._clock,
                listener=self.record,
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
                with keeper, self._time_limits.running(limit_s, timed_out):
                    outcome = self._run_task(task, ctx)
            except FATAL_LOG_ERRORS:
                raise
            except LogError:
                # The payload could not be read (the log is out of reach): the task stays
                # in hand, and the next step runs it once the log answers again.
                self._in_hand = (settled, latency_us)
                raise
            # (whether it failed first: Event.is_set is a Python call, and a task nearly always
            # ends ok. `error is not None` is `not outcome.ok` read as a field: compiled, the
            # property is a lookup by name)
            if outcome.error is not None and keeper.cancelled.is_set():
                # The handler stopped because the lease was lost: the task is someone else's.
                why = "the lease lapsed while paused or stalled" if keeper.lapsed else None
                self.record.cancelled(task, why or outcome.error)
                return StepResult(
                    StepKind.CANCELLED,
                    task,
                    claim_position,
                    error=outcome.error,
                    latency_us=latency_us,
                )
            return self._finish(task, claim_position, ctx.attempt, outcome, keeper, latency_us)
        finally:
            self.record.off_task()  # (the state is idle again)

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
        self.claims_log.append(encode(fail), durable=True)
        print(f"qw worker {worker_label(self.worker_id)}: task {task} {error}", file=sys.stderr)
        self.record.timed_out(task, error)

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
            self._history(task)[1],
        )
        keeper = LeaseKeeper(  # never started: `_finish` only asks whether it lost the lease
            self.claims_log,
            claim=claim,
            claim_position=settled.entry.position,
            read_from=settled.entry.next,
            lease_us=self.config.lease_us,
            clock=self._clock,
        )
        outcome = HandlerOutcome(error=error, permanent=True)
        return self._finish(task, settled.entry.position, attempt, outcome, keeper, latency_us)

    def _history(self, task: int) -> tuple[int, str | None]:
        """The task's winning claims so far and its last FAIL's error, by the fold that
        decides: ours, or the server's (its state when it gave us the task)."""
        won = self._server_won
        if won is not None and won[0] == task:
            view = won[1]
            return (0, None) if view is None else (view.attempts, view.error)
        st = self.claims.state.task_state(task)
        return (0, None) if st is None else (st.attempts, st.last_error)

    def _load(self, task: int) -> TaskRecord:
        """The task's record: as the server handed it over with the task, or from the log."""
        won = self._server_won
        if won is not None and won[0] == task and won[2] is not None:
            record = decode_task(won[2])
            if not isinstance(record, TaskRecord):
                raise RecordDecodeError(f"task {task} is a record of unknown type {record.code!r}")
            return record
        if self._server is not None:
            self.tasks.catch_up(self.tasks_log)  # not indexed as we go: the server picks
        return self.tasks.load(self.tasks_log, task)

    def _run_task(self, task: int, ctx: TaskContext) -> HandlerOutcome:
        try:
            record = self._load(task)
        except RecordDecodeError as e:  # it will not decode next time either: fail for good
            return HandlerOutcome(error=f"RecordDecodeError: {e}", exception=e, permanent=True)
        return run_task(self.handler, record, ctx, self._time_limits)

    def _finish(
        self,
        task: int,
        claim_position: int,
        attempt: int,
        outcome: HandlerOutcome,
        keeper: LeaseKeeper,
        latency_us: int,
    ) -> StepResult:
        """Append DONE (or FAIL), settle it, and count what the fold made of it.

        With another task to do, its CLAIM goes into the same append as the DONE (one
        batch: both land or neither does): one append and one read of the log fewer per
        task. It is settled, and worked, by the next `step`."""
        at = self._clock()
        ahead = self._claim_to_append_ahead()
        settled: Settled | None = None
        recorded = False  # a DONE or FAIL was made (settled is None: our claim lost the task)
        if outcome.error is None:  # (outcome.ok, read as a field: see _work)
            try:
                done = _new(Done, (task, self.worker_id, at, claim_position, outcome.result))
                settled = self._append_and_settle(done, ahead)
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
            settled = self._append_and_settle(fail, ahead)
        if settled is None:
            return self._lost_while_unreachable(task, claim_position, outcome, keeper, latency_us)
        verdict = settled.outcome.verdict
        # (an Enum's hash is a Python call: the usual verdict by identity first)
        kind = StepKind.DONE if verdict is Verdict.DONE else _FINISHED_AS[verdict]
        if kind is StepKind.DONE:
            self.record.finished((self.tasks, self.claims))
            # every field given (see _new): kind, task, claim, verdict, result, error,
            # retry_at, latency_us, drained, next_change
            return _new(
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
        self.record.folded(self.tasks, self.claims)
        if kind is StepKind.STALE:
            was_done = verdict is Verdict.STALE_DONE
            self.record.stale(task, outcome.error, done=was_done, lease_noticed=keeper.lost)
        else:
            assert outcome.error is not None  # a FAIL was written: it carries the error
            self.record.failed(task, outcome.error)
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
        self.record.folded(self.tasks, self.claims)
        error = "the lease was lost while the log was out of reach; nothing recorded"
        self.record.lost_out_of_reach(task, error, lease_noticed=keeper.lost)
        return StepResult(
            StepKind.CANCELLED,
            task,
            claim_position,
            result=None,
            error=outcome.error or error,
            latency_us=latency_us,
        )

    # -- appending when the log may be out of reach --------------------------------------------

    def _claim_to_append_ahead(self) -> Claim | None:
        """The CLAIM to append with the DONE/FAIL about to be written, or None."""
        if not self.claim_ahead or self._drain_asked or self._stop.is_set():
            return None
        if self._server is not None:  # the server picks it: the task id here is unused
            return Claim(0, self.worker_id, self._clock(), self.config.lease_us)
        try:
            # The fold is as fresh as our claim's settling: after a short task, pick on it
            # as it is (the batch's settling folds what others appended meanwhile; a read
            # saved per task, a round trip on Redis). The tasks log only when the tasks
            # known leave nothing to pick: with a backlog, reading it finds nothing new.
            if time.monotonic() - self._task_started > self._fresh_s:
                self.claims.catch_up(self.claims_log)
            now = self._clock()
            task = self.pick(now)
            if task is None:
                self.catch_up()
                now = self._clock()
                task = self.pick(now)
        except FATAL_LOG_ERRORS:
            raise
        except LogError:  # out of reach: the DONE/FAIL alone, with its own retries
            return None
        return None if task is None else _new(Claim, (task, self.worker_id, now, self._lease_us))

    def _append_and_settle(
        self, record: Claim | Done | Fail, ahead: Claim | None = None
    ) -> Settled | None:
        """Append one of our records (a DONE or FAIL durably) and settle it. With `ahead`
        (a CLAIM, after a DONE or FAIL only), both are appended as one batch and the CLAIM
        is left in `_ahead` for the next step.

        When the append or the settling fails (a LogError other than a log that cannot be
        used or a record too large: the server is out of reach, say), the record may or may
        not be in the log: `OutageRecovery.resolve` finds out, and returns None for a record
        given up. A record that landed clears `stats.log_error`.
        """
        if self._server is not None and not isinstance(record, Claim):
            return self._server_finish(record, ahead)
        durable = not isinstance(record, Claim)
        data = encode(record)
        started = time.perf_counter_ns()
        try:
            # One batch, settled by reading the log up to it (on Redis, by the append's own
            # round trip: `Log.append_and_read`).
            if ahead is None:
                [settled] = self.claims.append_and_settle(
                    self.claims_log, [record], [data], durable=durable
                )
            else:
                settled, ahead_settled = self.claims.append_and_settle(
                    self.claims_log, [record, ahead], [data, encode(ahead)], durable=durable
                )
                latency_us = (time.perf_counter_ns() - started) // 1000
                self._ahead = _new(AheadClaim, (ahead, ahead_settled, latency_us))
        except (RecordTooLargeError, *FATAL_LOG_ERRORS):
            raise
        except LogError as e:
            folds = (self.tasks, self.claims)
            found, found_ahead = self._recovery.resolve(folds, record, data, ahead, e)
            if ahead is not None and found_ahead is not None:  # one batch: both landed
                latency_us = (time.perf_counter_ns() - started) // 1000
                self._ahead = AheadClaim(ahead, found_ahead, latency_us)
            if found is None:
                return None
            settled = found
        self.record.log_recovered()
        return settled

    # -- claiming on the server (?verdicts=server, see queue_worker.redis.server_claim) ------------

    def _server_step(self) -> StepResult:
        """The server picks and claims the next task: no fold of ours to catch up."""
        assert self._server is not None
        if self._draining.is_set():
            return StepResult(StepKind.DRAINING)
        self.record.state("claiming")
        batch = self._server_batch_settle()
        now = self._clock()
        started = time.perf_counter_ns()
        held = batch.take_held()  # (a task claimed ahead was cancelled: see claim_batch)
        try:
            got = self._server.next(
                self.worker_id, self.config.lease_us, now, heirs=self.config.slots > 1,
                earlier=held,
            )  # fmt: skip
        except LogError as e:
            batch.uncertain.extend((done, data, e) for done, data in held)
            raise
        latency_us = (time.perf_counter_ns() - started) // 1000
        batch.keep(got.more, time.monotonic())
        settled = self._server_claimed(got)
        if settled is None:
            if got.server_now is not None:  # (the server's clock, as a CLAIM would tell it)
                self.clock_offset_us = got.server_now - now
            self.record.state("idle")
            return StepResult(StepKind.IDLE, drained=got.nothing_open, next_change=got.next_change)
        assert got.claim is not None
        claim = Claim(got.claim.task, self.worker_id, now, self.config.lease_us)
        return self._claimed(claim, settled, latency_us)

    def _server_claimed(self, got: NextTask) -> Settled | None:
        """The CLAIM the server made for us, as our own fold would have settled it."""
        if got.tasks_read is not None:
            self._server_tasks_read = got.tasks_read
        claimed, claim = got.claimed, got.claim
        if claimed is None or claim is None:
            return None
        self._server_won = (claim.task, claimed.task, got.payload)
        holder = claimed.task.holder if claimed.task is not None else None
        outcome = Outcome(claimed.verdict, claimed.position, claim.task, claim.worker, holder)
        entry = Entry(claimed.position, claimed.position + 1, b"", claim.at)
        return Settled(outcome, claim, entry)

    def _server_finish(self, record: Done | Fail, ahead: Claim | None) -> Settled | None:
        """Our DONE or FAIL, and (with `ahead`) the next task's CLAIM, in one call."""
        assert self._server is not None
        batch = self._server_batch_settle()
        data = encode(record)
        limit = self._server.log.max_record
        if len(data) > limit:  # now, not when a later call sends a DONE held for it
            raise RecordTooLargeError(len(data), limit)
        ran_s = time.monotonic() - self._task_started if self._batching else math.inf
        if isinstance(record, Done) and batch.can_hold(ran_s, self.config.lease_s):
            # the next task is in hand already: this DONE goes with the next call
            batch.hold(record, data)
            self._server_take_ahead()
            outcome = Outcome(Verdict.DONE, -1, record.task, record.worker)
            return Settled(outcome, record, Entry(-1, -1, data))
        held = batch.take_held()
        started = time.perf_counter_ns()
        try:
            got = self._server.next(
                self.worker_id,
                self.config.lease_us,
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
        ahead_settled = self._server_claimed(got)
        if ahead is not None and ahead_settled is not None and got.claim is not None:
            claim = ahead._replace(task=got.claim.task)
            self._ahead = AheadClaim(claim, ahead_settled, latency_us)
        elif batch.has_ahead:
            self._server_take_ahead()
        self.record.log_recovered()
        return settled

    def _server_batch_settle(self) -> ClaimBatch:
        """The claim batch (queue_worker.redis.claim_batch), after counting what its held DONEs
        sent by another thread came to, and resolving those whose sending failed."""
        assert self._server is not None
        batch = self._server.batch
        late, uncertain = batch.take_late()
        for done, _ in late:
            self.record.stale(done.task, None, done=True, lease_noticed=False)
        for done, data, error in uncertain:
            self._recovery.resolve((self.tasks, self.claims), done, data, None, error)
        return batch

    def _server_take_ahead(self) -> None:
        """The next task the batch claimed ahead, in hand for the next step (none: every one
        left was lost, see ClaimBatch.take_ahead)."""
        assert self._server is not None
        now = self._clock()
        got = self._server.batch.take_ahead(
            self._server.verdict_log.server, self.worker_id, self._lease_us, now
        )
        if got is None:
            return
        claimed, claim = got.claimed, got.claim
        self._server_won = (claim.task, claimed.task, got.payload)
        holder = claimed.task.holder if claimed.task is not None else None
        outcome = Outcome(claimed.verdict, claimed.position, claim.task, claim.worker, holder)
        entry = Entry(claimed.position, claimed.position + 1, b"", claim.at)
        # `at` as our clock read when the call made it: the clock offset stays what it is
        mine = Claim(claim.task, self.worker_id, claim.at - self.clock_offset_us, self._lease_us)
        self._ahead = AheadClaim(mine, Settled(outcome, claim, entry), 0)

    def _server_send_held(self) -> None:
        """Send the DONEs the batch still holds (at the end of the run)."""
        if self._server is not None:
            self._server.batch.send_held(self._server.verdict_log.server)
            self._server_batch_settle()

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> str:
        """Step until drained, stopped, or (exit_when_drained) the queue is empty; return
        why it stopped."""
        stop = stop if stop is not None else threading.Event()
        self._stop = stop
        reason = "stopped"
        self._batching = True
        try:
            while True:
                in_hand = self._ahead is not None or self._in_hand is not None
                # (in hand first: Event.is_set is a Python call, and a busy worker nearly
                # always has a CLAIM made ahead in hand)
                if not in_hand and (stop.is_set() or self._draining.is_set()):
                    reason = "drained" if self._draining.is_set() else "stopped"
                    break
                try:
                    result = self.step()
                    self._save_checkpoint()
                    if result.kind is StepKind.IDLE:
                        if self.config.exit_when_drained and result.drained:
                            reason = "queue drained"
                            break
                        self.record.publish()
                        self._wait_for_work(result)
                        self._picker.step_aside(self.tasks.known)
                    elif result.kind is not StepKind.DONE:  # (a DONE's event published)
                        self.record.publish()
                except FATAL_LOG_ERRORS:
                    raise
                except LogError as e:  # may pass (disk full, server restarting): retry
                    self.record.log_error(e)
                    if stop.is_set() or self._draining.is_set():
                        # Asked to stop, and the log does not answer: let go of a claim in
                        # hand (its lease lapses and another worker takes the task over).
                        self._ahead = self._in_hand = None
                    stop.wait(self.config.idle_poll_s)
            self._server_send_held()
            self._save_checkpoint(final=True)
        except BaseException as e:
            reason = f"error: {error_text(e)}"
            raise
        finally:
            self._batching = False
            self.record.exited(reason)
        return reason

    def _next_task_is_anothers(self) -> bool:
        """Spread: will the next task enqueued (id = tasks known) be another slot's?"""
        return self._picker.next_is_anothers(self.tasks.known)

    def _wait_for_work(self, idle: StepResult) -> None:
        """Block until a task may be enqueued, a known lease/backoff runs out, or the poll
        interval passes: no CPU while idle, and awake within a wake-up of an enqueue."""
        timeout = self.config.idle_poll_s
        if idle.next_change is not None:
            until_change = us_to_seconds(idle.next_change - self.fold_time(self._clock()))
            timeout = max(0.0, min(timeout, until_change))
        if self._server is None and self.config.exit_when_drained and not idle.drained:
            # Idle but not drained: what ends the run is the DONE of a task another worker
            # holds, which goes to the claims log; waiting on the tasks log would see it only
            # at the poll, up to idle_poll_s after the last DONE (a task enqueued meanwhile
            # waits that poll at most, and any CLAIM of it wakes us).
            self.claims_log.wait(self.claims.next_position, timeout)
            return
        # with the server picking, the tasks log is read by the server: wait after its read
        wait_from = self.tasks.next_position if self._server is None else self._server_tasks_read
        self.tasks_log.wait(wait_from, timeout)

    # -- stats ---------------------------------------------------------------------------------

    def _wall_seconds(self, fold_time_us: int) -> float:
        return us_to_seconds(fold_time_us - self.clock_offset_us)

    def close(self) -> None:
        if self._server is not None:  # (sent by run() already, unless it raised)
            with contextlib.suppress(LogError):
                self._server.batch.send_held(self._server.verdict_log.server)
        self._renewer.close()
        self._time_limits.close()
        for log in self._owned_logs:
            log.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _server_claims(tasks_log: Log, claims_log: Log) -> ServerClaims:
    """The server's claiming script for these logs (imported here: redis is optional)."""
    from logstore.redis.log import RedisLog
    from queue_worker.redis.server_claim import ServerClaims

    assert isinstance(tasks_log, RedisLog) and isinstance(claims_log, RedisLog)
    return ServerClaims(claims_log, tasks_log)
