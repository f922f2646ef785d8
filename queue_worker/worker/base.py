"""What every worker is, whichever protocol claims its tasks.

A worker holds the queue's two logs and its folds of them (`TaskIndex`, `ClaimsFollower`),
its stats and their recorder, the outage recovery, and an `AttemptRunner` that runs each
task a claim of ours wins. `step()` first works what is in hand (a task whose payload could
not be read, or a CLAIM appended ahead with the last DONE/FAIL), else asks the protocol to
claim the next task (`_claim_next`); `run(stop)` repeats `step()` and waits while idle.

The protocols are the subclasses: `queue_worker.worker.loop.Worker` (the worker folds the
claims log itself, docs/protocol.md §4) and `queue_worker.redis.server_worker
.ServerVerdictWorker` (the server folds it and picks). `queue_worker.opening
.open_worker` chooses between them from the queue.

Clocks: records carry `at` from the injected `clock` (wall clock µs). On a backend that
stamps records with its server's clock (Redis), the fold judges by that clock instead (see
`queue_worker.topics`): the worker estimates its offset to the server from its own
CLAIM (`clock_offset_us`) and asks `claimable` on the server's clock (`fold_time`).
"""

from __future__ import annotations

import abc
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict, TypeVar

from logstore import Log, LogError, PositionCompactedError
from queue_worker.history.checkpoint import Location
from queue_worker.protocol.clock import Clock, now_us, us_to_seconds
from queue_worker.protocol.records import Claim, Done, Fail, TaskRecord, error_text
from queue_worker.topics import ClaimsFollower, Settled, TaskIndex, open_topics
from queue_worker.worker.attempt import AttemptRunner, StepKind, StepResult
from queue_worker.worker.config import WorkerConfig, default_host
from queue_worker.worker.handlers import (
    Handler,
    NamedHandlers,
    handler_from_function,
    load_handlers,
)
from queue_worker.worker.inherited import begin_folds
from queue_worker.worker.lease import FATAL_LOG_ERRORS
from queue_worker.worker.recorder import StatsRecorder
from queue_worker.worker.recovery import OutageRecovery
from queue_worker.worker.stats import WorkerStats

if TYPE_CHECKING:
    from queue_worker.worker.dependencies import DependencyStates


# A NamedTuple, not a frozen dataclass: one is made every task (see docs/speed.md).
class AheadClaim(NamedTuple):
    """A CLAIM appended and settled with the previous task's DONE/FAIL, for the next step
    to count and work."""

    claim: Claim
    settled: Settled
    latency_us: int  # claim latency: the batch's append start → this verdict


_Worker = TypeVar("_Worker", bound="WorkerBase")


def new_worker_id(name: str, host: str | None = None) -> str:
    """Unique per process: a restarted worker is a new id (ownership is never by name).
    With `host` (workers of several machines on one log), it names the machine too:
    ``w0@box-4711-9f3a``."""
    at_host = f"@{host}" if host else ""
    return f"{name}{at_host}-{os.getpid()}-{secrets.token_hex(2)}"


def worker_handler(
    config: WorkerConfig, handler: Callable[..., Any] | Handler | NamedHandlers | None
) -> Handler | NamedHandlers:
    """The handler a worker runs: `handler` (a function, for tests and embedding), else the
    one `config.handler` names, or every function the queue it names registered
    (`qw up --app`); HandlerLoadError, a ValueError, when it cannot be loaded."""
    if isinstance(handler, Handler | NamedHandlers):
        return handler
    if handler is None:
        return load_handlers(config.handler)
    return handler_from_function(handler)


class WorkerOptions(TypedDict, total=False):
    """What every worker takes beside its config (the defaults: `WorkerBase`'s).

    `clock`: the worker's clock (wall clock µs); `handler` runs the tasks instead of the
    one `config.handler` names (tests, embedding); the logs, when given, are used instead of
    opening config.location (`own_logs`: they were opened from it for this worker, which
    closes them, and the queue's fold checkpoint applies); `rng`: the backoff's and the
    pick's randomness; `claim_ahead=False`: one CLAIM per step, never appended with a DONE
    (tests that drive `step()` one claim at a time)."""

    clock: Clock
    tasks_log: Log | None
    claims_log: Log | None
    rng: random.Random | None
    handler: Callable[..., Any] | Handler | NamedHandlers | None
    claim_ahead: bool
    own_logs: bool


class WorkerBase(abc.ABC):
    """A worker over the two logs. Drive it with `step()` (tests) or `run()` (a process);
    its options are `WorkerOptions`."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        clock: Clock = now_us,
        tasks_log: Log | None = None,
        claims_log: Log | None = None,
        rng: random.Random | None = None,
        handler: Callable[..., Any] | Handler | NamedHandlers | None = None,
        claim_ahead: bool = True,
        own_logs: bool = False,
    ) -> None:
        config.validate()
        self.config = config
        host = config.host if config.host is not None else default_host()
        #: the queue's logs are on a server that several machines share (see WorkerConfig)
        self.networked = config.networked
        # On such a log, or with a host named on purpose, the id says where the worker
        # runs: a pid is unique only on its own machine.
        shared = config.host is not None or self.networked
        self.worker_id = new_worker_id(config.name, host if shared else None)
        self.handler = worker_handler(config, handler)
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        # A fold checkpoint belongs to the queue whose logs we open ourselves.
        checkpoints = own_logs or (tasks_log is None and claims_log is None)
        if tasks_log is None or claims_log is None:
            opened_tasks, opened_claims = open_topics(config.location, config.durability)
            self._owned_logs = [opened_tasks, opened_claims]
            tasks_log = tasks_log if tasks_log is not None else opened_tasks
            claims_log = claims_log if claims_log is not None else opened_claims
        else:
            self._owned_logs = [tasks_log, claims_log] if own_logs else []
        self.tasks_log: Log = tasks_log
        #: the log our claims records go to (and the fold reads)
        self.claims_log: Log = self._appending_log(tasks_log, claims_log)
        self.tasks = TaskIndex(tasks_log.start)
        self.claims = ClaimsFollower(claims_log.start)
        self._checkpoint_dir: Location | None = config.location if checkpoints else None
        # server clock − our clock, µs (0 unless the backend stamps records: see topics.py)
        self.clock_offset_us = 0
        self._draining = threading.Event()
        #: `_draining.is_set()` as a plain field, set by `drain()` with the event: what the
        #: claim ahead asks at every task (see docs/speed.md)
        self._drain_asked = False
        self._stop = threading.Event()  # run()'s stop event: no claim ahead once it is set
        #: append the next task's CLAIM with each DONE/FAIL
        self.claim_ahead = claim_ahead
        self._ahead: AheadClaim | None = None
        #: the lease in µs (`config.lease_us` computes it at each call)
        self._lease_us = config.lease_us
        self.stats = WorkerStats(
            worker=self.worker_id,
            name=config.name,
            pid=os.getpid(),
            host=host if config.host is not None else socket.gethostname(),
            started_at=time.time(),
        )
        path = Path(config.run_dir) / f"{self.worker_id}.json" if config.run_dir else None
        #: counts each event into `stats` and publishes it (the lease keeper reports to it)
        self.record = StatsRecorder(
            self.stats, path, draining=self._draining, wall_seconds=self._wall_seconds
        )
        #: resolves our appends whose replies were lost (see recovery.py)
        self._recovery = OutageRecovery(
            self.claims_log,
            self.record,
            draining=self._draining,
            poll_s=config.idle_poll_s,
            fold_now=self._fold_now,
        )
        self._attempts = AttemptRunner(
            config,
            worker_id=self.worker_id,
            handler=self.handler,
            claiming=self,
            claims_log=self.claims_log,
            clock=self._clock,
            fold_now=self._fold_now,
            rng=self._rng,
            record=self.record,
            recovery=self._recovery,
        )

    def _appending_log(self, tasks_log: Log, claims_log: Log) -> Log:
        """The log our claims records are appended to: the claims log itself."""
        return claims_log

    # -- the folds ---------------------------------------------------------------------------

    def _load_checkpoint(self) -> str | None:
        """Start the folds from the queue's fold checkpoint when it fits these logs (see
        queue_worker.history.checkpoint); returns why an existing checkpoint was refused
        (None otherwise)."""
        self._checkpointed = (self.tasks.next_position, self.claims.next_position)
        restored, note = begin_folds(self.tasks_log, self.claims_log, self._checkpoint_dir)
        if restored is not None:
            self.tasks, self.claims = restored
            self._checkpointed = (self.tasks.next_position, self.claims.next_position)
        return note

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

    @abc.abstractmethod
    def _catch_up(self) -> None: ...

    # -- one iteration -------------------------------------------------------------------------

    def step(self, now: int | None = None) -> StepResult:
        """One iteration: work what is in hand, else claim the next task and run it if the
        claim won. Blocks only while the handler runs. `now` is the worker's clock (µs) for
        the pick and the CLAIM.

        A CLAIM made ahead (appended with the previous task's DONE) is worked first, even
        when draining: it is a task in hand."""
        attempts = self._attempts
        if attempts.in_hand is not None:
            return attempts.resume_in_hand()
        ahead = self._ahead
        if ahead is not None:
            self._ahead = None
            # The folds have not moved since the DONE/FAIL settled with this CLAIM, and that
            # event noted them.
            return self._claimed(ahead.claim, ahead.settled, ahead.latency_us, folds_noted=True)
        return self._claim_next(now)

    @abc.abstractmethod
    def _claim_next(self, now: int | None) -> StepResult:
        """Claim a task by the protocol and run it if the claim won (IDLE: none to claim)."""

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
        return self._attempts.work(task, settled, latency_us, verdict, folds_noted)

    def fold_time(self, now: int) -> int:
        """`now` on the clock the fold judges by (the server's, when the backend has one)."""
        return now + self.clock_offset_us

    def _fold_now(self) -> int:
        return self._clock() + self.clock_offset_us

    def drain(self) -> None:
        """Make no new claims; the task in hand is finished. (Safe from a signal handler.)"""
        self._drain_asked = True
        self._draining.set()
        self._attempts.time_limits.drain()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    # -- what the attempt asks of the protocol (see attempt.Claiming) --------------------------

    @abc.abstractmethod
    def task_history(self, task: int) -> tuple[int, str | None]: ...

    @abc.abstractmethod
    def load_task(self, task: int) -> TaskRecord: ...

    def dependency_states(self, after: Sequence[int]) -> DependencyStates:
        """Our own fold, settled past our CLAIM."""
        return self.claims.state

    @abc.abstractmethod
    def claim_to_append_ahead(self) -> Claim | None: ...

    @abc.abstractmethod
    def append_and_settle(
        self, record: Claim | Done | Fail, ahead: Claim | None = None
    ) -> Settled | None:
        """With `ahead`, the CLAIM is left in `_ahead` for the next step."""

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> str:
        """Step until drained, stopped, or (exit_when_drained) the queue is empty; return
        why it stopped."""
        stop = stop if stop is not None else threading.Event()
        self._stop = stop
        reason = "stopped"
        attempts = self._attempts
        try:
            while True:
                # (in hand first: a busy worker nearly always has a CLAIM made ahead in hand)
                in_hand = self._ahead is not None or attempts.in_hand is not None
                if not in_hand and (stop.is_set() or self._draining.is_set()):
                    reason = "drained" if self._draining.is_set() else "stopped"
                    break
                try:
                    result = self.step()
                    self._after_step()
                    if result.kind is StepKind.IDLE:
                        if self.config.exit_when_drained and result.drained:
                            reason = "queue drained"
                            break
                        self.record.publish()
                        self._wait_for_work(result)
                    elif result.kind is not StepKind.DONE:  # (a DONE's event published)
                        self.record.publish()
                except FATAL_LOG_ERRORS:
                    raise
                except LogError as e:  # may pass (disk full, server restarting): retry
                    self.record.log_error(e)
                    if stop.is_set() or self._draining.is_set():
                        # Asked to stop, and the log does not answer: let go of a claim in
                        # hand (its lease lapses and another worker takes the task over).
                        self._ahead = attempts.in_hand = None
                    stop.wait(self.config.idle_poll_s)
            self._end_run()
        except BaseException as e:
            reason = f"error: {error_text(e)}"
            raise
        finally:
            self.record.exited(reason)
        return reason

    @abc.abstractmethod
    def _after_step(self) -> None:
        """What the run does after each step."""

    @abc.abstractmethod
    def _end_run(self) -> None:
        """What the run does once it stops stepping, before it returns."""

    @abc.abstractmethod
    def _wait_for_work(self, idle: StepResult) -> None:
        """Block until a task may be claimable, or `_idle_timeout(idle)` passes."""

    def _idle_timeout(self, idle: StepResult) -> float:
        """How long an idle worker waits at most: the poll interval, or until a held or
        backed-off task it knows of frees up."""
        timeout = self.config.idle_poll_s
        if idle.next_change is not None:
            until_change = us_to_seconds(idle.next_change - self.fold_time(self._clock()))
            timeout = max(0.0, min(timeout, until_change))
        return timeout

    # -- stats ---------------------------------------------------------------------------------

    def _wall_seconds(self, fold_time_us: int) -> float:
        return us_to_seconds(fold_time_us - self.clock_offset_us)

    def close(self) -> None:
        self._attempts.close()
        for log in self._owned_logs:
            log.close()

    def __enter__(self: _Worker) -> _Worker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
