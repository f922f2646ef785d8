"""The worker that folds the claims log itself (docs/protocol.md §4): the file log's way.

One iteration (`Worker.step`):

1. catch up on both logs (index new tasks; fold new claims records into the `ClaimState`);
2. pick a claimable task (`queue_worker.worker.pick`);
3. append CLAIM and *settle* it: read the claims log up to and including that record,
   folding everything before it; its verdict decides (claim latency = append start to
   verdict);
4. if won: run the attempt (`queue_worker.worker.attempt`: the handler, with a lease keeper
   renewing the lease in a thread); it appends DONE (the result) or FAIL (the error, and
   when to retry or that the task is dead), both durable, through `append_and_settle`,
   which settles that too. With another task claimable, its CLAIM is appended in the same
   batch as the DONE/FAIL ("claim ahead", `claim_to_append_ahead`), and the next step works
   it instead of steps 1–3: a drain then costs one append and one read of the claims log
   per task instead of two of each.

`run(stop)` repeats `step()` (`queue_worker.worker.base`); an idle worker blocks in
`tasks_log.wait` until a task is enqueued, a lease or backoff it knows of runs out, or
`idle_poll_s` passes. `drain()` (or the stop event) means: no new claims, finish the task
in hand, return.

A log out of reach (a networked log restarting, a partition): a failed read or wait only
pauses the loop, and the worker resumes from the positions it has folded; an append whose
reply was lost is resolved from the log (`queue_worker.worker.recovery`).

The worker in slot 0 saves a fold checkpoint as it goes, so that the next start replays
only what came after (`queue_worker.history.checkpoint`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from logstore import LogError, RecordTooLargeError
from queue_worker.history.checkpoint import CheckpointError, save_checkpoint
from queue_worker.protocol.records import Claim, Done, Fail, TaskRecord, encode
from queue_worker.topics import Settled, check_tasks_cover
from queue_worker.worker.attempt import StepKind, StepResult, new_tuple
from queue_worker.worker.base import AheadClaim, WorkerBase, WorkerOptions, new_worker_id
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.inherited import StartingFold
from queue_worker.worker.lease import FATAL_LOG_ERRORS
from queue_worker.worker.pick import Picker

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["AheadClaim", "StepKind", "StepResult", "Worker", "new_worker_id"]

# Not Final, these three: the tests set them on the module.
#: claim ahead: a fold settled this recently (seconds) is fresh enough to pick from
FRESH_FOLD_S = 0.002
#: ... on a networked log, where the read before the pick is a round trip (see docs/speed.md)
FRESH_FOLD_REMOTE_S = 0.05

#: the worker in slot 0 saves a fold checkpoint each time it has folded this much more of
#: the claims log (~100k tasks' CLAIM + DONE)
CHECKPOINT_EVERY_BYTES = 8 << 20


class Worker(WorkerBase):
    """A worker whose own fold of the claims log decides what it holds.

    `start`: a fold of the queue's logs to start from (inherited from the fork server),
    when it fits the logs this worker opens; it is the worker's own from then on."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        start: StartingFold | None = None,
        **options: Unpack[WorkerOptions],
    ) -> None:
        super().__init__(config, **options)
        if self.claims_log.verdicts == "server":
            # Our appends would bypass the rules that judge this queue's claims, and the
            # queue would be refused from then on (logstore.redis.verdict_mode).
            self.close()
            raise ValueError(
                f"{self.claims_log.name}: the queue's claims are judged on the server "
                "(verdicts=server); open its worker with queue_worker.opening.open_worker"
            )
        #: which task to try next, and what that choice keeps between picks (see pick.py)
        self._picker = Picker(
            config.pick,
            self.worker_id,
            config.lease_us,
            slot=config.slot,
            slots=config.slots,
            rng=self._rng,
        )
        # (slot 0 only, see _save_checkpoint; on a networked log only compaction saves one)
        self._saves_checkpoints = (
            self._checkpoint_dir is not None and not self.networked and config.slot == 0
        )
        self.stats.last_error = self._begin(start)
        self.record.folded(self.tasks, self.claims)  # what the start gave us, shown at once
        self._covered = False  # whether the claims fold was checked against the tasks log
        self.tasks.keep_payloads(config.slot, config.slots)  # the tasks spread gives us
        self._fresh_s = FRESH_FOLD_REMOTE_S if self.networked else FRESH_FOLD_S

    def _begin(self, start: StartingFold | None) -> str | None:
        """Start the folds from `start` (made by the fork server, inherited with the fork:
        see queue_worker.worker.inherited) when it is a fold of our own logs, else from the
        queue's checkpoint or the start (`_load_checkpoint`); returns why an existing
        checkpoint was refused (None otherwise)."""
        if start is None or self._checkpoint_dir is None:
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

    # -- one iteration: catch up, pick, claim, settle ------------------------------------------

    def _claim_next(self, now: int | None) -> StepResult:
        """Catch up, pick, claim and settle; run the task if the claim won."""
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
        settled = self.append_and_settle(claim)
        if settled is None:
            raise LogError(f"{self.claims_log.name}: our CLAIM of task {task} is not in the log")
        return self._claimed(claim, settled, (time.perf_counter_ns() - started) // 1000)

    def append_and_settle(
        self, record: Claim | Done | Fail, ahead: Claim | None = None
    ) -> Settled | None:
        """Append one of our records (a DONE or FAIL durably; with `ahead`, the next CLAIM in
        the same batch, left in `_ahead` for the next step) and settle it: fold the claims
        log up to it.

        When the append or the settling fails (a LogError other than a log that cannot be
        used or a record too large: the log is out of reach, say), the record may or may
        not be in the log: `OutageRecovery.resolve` finds out, and returns None for a record
        given up. A record that landed clears `stats.log_error`."""
        durable = not isinstance(record, Claim)
        data = encode(record)
        started = time.perf_counter_ns()
        try:
            # One batch, settled by reading the log up to it (on a networked log, by the
            # append's own round trip: `Log.append_and_read`).
            if ahead is None:
                [settled] = self.claims.append_and_settle(
                    self.claims_log, [record], [data], durable=durable
                )
            else:
                settled, ahead_settled = self.claims.append_and_settle(
                    self.claims_log, [record, ahead], [data, encode(ahead)], durable=durable
                )
                latency_us = (time.perf_counter_ns() - started) // 1000
                self._ahead = new_tuple(AheadClaim, (ahead, ahead_settled, latency_us))
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

    # -- what the attempt asks of us (attempt.Claiming) ----------------------------------------

    def task_history(self, task: int) -> tuple[int, str | None]:
        st = self.claims.state.task_state(task)
        return (0, None) if st is None else (st.attempts, st.last_error)

    def load_task(self, task: int) -> TaskRecord:
        return self.tasks.load(self.tasks_log, task)

    def claim_to_append_ahead(self) -> Claim | None:
        if not self.claim_ahead or self._drain_asked or self._stop.is_set():
            return None
        try:
            # The fold is as fresh as our claim's settling: after a short task, pick on it
            # as it is (the batch's settling folds what others appended meanwhile). The
            # tasks log only when the tasks known leave nothing to pick: with a backlog,
            # reading it finds nothing new.
            if time.monotonic() - self._attempts.task_started > self._fresh_s:
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
        if task is None:
            return None
        return new_tuple(Claim, (task, self.worker_id, now, self._lease_us))

    # -- nothing to claim ----------------------------------------------------------------------

    def _idle(self, now: int) -> StepResult:
        self.record.state("idle")
        next_change = self.claims.state.next_change(self.fold_time(now))
        recheck = self._picker.recheck_at(self.fold_time)  # a held-back task becomes ours
        if recheck is not None:
            next_change = recheck if next_change is None else min(next_change, recheck)
        return StepResult(StepKind.IDLE, drained=self.is_drained(), next_change=next_change)

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

    def _next_task_is_anothers(self) -> bool:
        """Spread: will the next task enqueued (id = tasks known) be another slot's?"""
        return self._picker.next_is_anothers(self.tasks.known)

    def _wait_for_work(self, idle: StepResult) -> None:
        """Block until a task may be enqueued, a known lease/backoff runs out, or the poll
        interval passes: no CPU while idle, and awake within a wake-up of an enqueue."""
        timeout = self._idle_timeout(idle)
        if self.config.exit_when_drained and not idle.drained:
            # Idle but not drained: what ends the run is the DONE of a task another worker
            # holds, which goes to the claims log; waiting on the tasks log would see it only
            # at the poll, up to idle_poll_s after the last DONE (a task enqueued meanwhile
            # waits that poll at most, and any CLAIM of it wakes us).
            self.claims_log.wait(self.claims.next_position, timeout)
        else:
            self.tasks_log.wait(self.tasks.next_position, timeout)
        self._picker.step_aside(self.tasks.known)

    # -- the fold checkpoint (see queue_worker.history.checkpoint) -----------------------------

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

    #: after each step of `run` (bound to the save itself: no call of its own per task)
    _after_step = _save_checkpoint

    def _end_run(self) -> None:
        """The last save, so that the next start replays nothing of this run."""
        self._save_checkpoint(final=True)
