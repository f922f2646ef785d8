"""What a worker has done, counted: one named event per method, into its `WorkerStats`.

The worker's protocol code reports each thing that happens in one line
(`record.claimed(verdict, latency_us)`, `record.finished()`, …); this module owns what
that means for the figures: the stats lock, the counters each event moves, the wording of
`last_error`, and when the snapshot is published (`SnapshotPublisher`).

Events come from two threads: the worker's own, and the lease keeper's renewal thread
(the `LeaseListener` methods at the end). Each event takes the stats lock once, as the
publisher does when it takes a snapshot, so a snapshot never sees half an event. The
worker calls an event several times per task: each is a few attribute writes under an
uncontended lock, with no allocation beyond the text it records.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from logstore import AppendError, LogError
from queue_worker.protocol.clock import us_to_seconds
from queue_worker.protocol.state import Lease, Verdict
from queue_worker.topics import ClaimsFollower, TaskIndex
from queue_worker.worker.publisher import SnapshotPublisher
from queue_worker.worker.stats import WorkerStats


class StatsRecorder:
    """Fills `stats` from the worker's events and publishes it to `path` (None: nowhere).

    `draining` is the worker's drain flag (a state shown while it is set reads "draining");
    `wall_seconds` turns a fold-clock time (µs) into wall-clock seconds for the snapshot.
    """

    def __init__(
        self,
        stats: WorkerStats,
        path: Path | None,
        *,
        draining: threading.Event,
        wall_seconds: Callable[[int], float],
    ) -> None:
        self.stats = stats
        self.lock = threading.Lock()
        self.publisher = SnapshotPublisher(stats, path, self.lock)
        #: write the snapshot soon (`force=True`: now, from the caller's thread)
        self.publish = self.publisher.publish
        self._draining = draining
        self._wall_seconds = wall_seconds
        self._on_task = False  # a task is in hand (`working`); the worker's thread only

    # -- the worker's state and its fold -------------------------------------------------------

    def state(self, state: str) -> None:
        """The worker is now `state` (shown as "draining" while claiming or working in a
        drain)."""
        with self.lock:
            draining = self._draining.is_set() and state in ("claiming", "working")
            self.stats.state = "draining" if draining else state
        self.publisher.publish()

    def folded(self, tasks: TaskIndex, claims: ClaimsFollower) -> None:
        """The folds moved on: the queue as this worker sees it, and a malformed claims
        record the fold skipped (reported once)."""
        with self.lock:
            self._folded(tasks, claims)

    def _folded(self, tasks: TaskIndex, claims: ClaimsFollower) -> None:
        """`folded`, under the stats lock (several events of a task's path note it too)."""
        state = claims.state
        s = self.stats
        s.known_tasks = tasks.known
        s.indexed_tasks = tasks.indexed
        s.tasks_position = tasks.next_position
        s.consumed_up_to = claims.next_position
        s.done_tasks = state.done_count
        s.held_by_anyone = state.held_count
        if claims.last_malformed is not None:
            s.last_error = claims.last_malformed
            claims.last_malformed = None

    def exited(self, reason: str) -> None:
        """The worker's loop ended (`reason`: why); written at once."""
        with self.lock:
            self.stats.state = "exited"
            self.stats.exit_reason = reason
        self.publisher.publish(force=True)

    def checkpoint_failed(self, error: str) -> None:
        """A fold checkpoint could not be saved (only the next start's replay is longer)."""
        with self.lock:
            self.stats.last_error = error

    # -- a claim and its task ------------------------------------------------------------------

    def claimed(
        self,
        verdict: Verdict,
        latency_us: int,
        folds: tuple[TaskIndex, ClaimsFollower] | None = None,
    ) -> None:
        """One of our CLAIMs was settled: `verdict`, `latency_us` after its append began;
        with `folds`, the folds moved on too (`folded`, under the same lock: every event
        on a task's path is a lock taken, and a drain runs thousands of tasks a second)."""
        with self.lock:
            self._claimed(verdict, latency_us, folds)

    def _claimed(
        self,
        verdict: Verdict,
        latency_us: int,
        folds: tuple[TaskIndex, ClaimsFollower] | None,
    ) -> None:
        """`claimed`, under the stats lock."""
        if folds is not None:
            self._folded(*folds)
        self.stats.attempts += 1
        self.stats.record_latency(latency_us)
        if verdict.won:
            self.stats.won += 1
            if verdict is Verdict.TAKEOVER:
                self.stats.takeovers += 1
        else:
            self.stats.count_lost(verdict.value)

    def working(
        self,
        task: int,
        claim_position: int,
        expiry: int,
        *,
        claimed: tuple[Verdict, int, tuple[TaskIndex, ClaimsFollower] | None] | None = None,
    ) -> None:
        """We run `task` under the claim at `claim_position`, leased until `expiry` (fold
        clock, µs): the state is "working" (as `state("working")` sets it). With `claimed`
        (verdict, latency_us, folds): that claim was just settled, and is counted here as
        `claimed` counts it (one event, one lock taken, where a drain's task had two)."""
        with self.lock:
            if claimed is not None:
                self._claimed(*claimed)
            self.stats.current_task = task
            self.stats.current_claim = claim_position
            self.stats.current_function = None  # (`running` names it once it is loaded)
            self.stats.current_since = time.time()
            self.stats.lease_expiry = self._wall_seconds(expiry)
            self.stats.state = "draining" if self._draining.is_set() else "working"
            self._on_task = True
        self.publisher.publish()

    def running(self, function: str | None) -> None:
        """The task in hand, loaded, calls `function` (None: a payload task): shown beside
        its id. (One attribute set, no lock: a snapshot reads either value whole.)"""
        if function is not None:
            self.stats.current_function = function
            self.publisher.publish()

    def off_task(self) -> None:
        """The task in hand is over, however it ended: the state is "idle". (At once when
        `finished` has already taken it off.)"""
        if not self._on_task:
            return
        with self.lock:
            self._off_task()
        self.publisher.publish()

    def _off_task(self) -> None:
        """`off_task`, under the stats lock."""
        self.stats.current_task = None
        self.stats.current_claim = None
        self.stats.current_function = None
        self.stats.current_since = None
        self.stats.lease_expiry = None
        self.stats.state = "idle"
        self._on_task = False

    def finished(self, folds: tuple[TaskIndex, ClaimsFollower] | None = None) -> None:
        """Our DONE was accepted (with `folds`: and the folds moved on, as in `claimed`):
        the task is off hand too, as `off_task` puts it (one event where there were two)."""
        with self.lock:
            if folds is not None:
                self._folded(*folds)
            self.stats.finished += 1
            self._off_task()
        self.publisher.publish()

    def failed(self, task: int, error: str) -> None:
        """Our FAIL was accepted (the task is retried later, or dead)."""
        with self.lock:
            self.stats.failed += 1
            self.stats.last_error = f"task {task}: {error}"

    def stale(self, task: int, error: str | None, *, done: bool, lease_noticed: bool) -> None:
        """Our DONE (`done`) or FAIL was refused: the lease had been lost. `lease_noticed`:
        the lease keeper had already counted that loss."""
        with self.lock:
            if done:
                self.stats.stale += 1
            if not lease_noticed:
                self.stats.leases_lost += 1
                self.stats.timeouts += 1
            if error is not None:
                self.stats.last_error = f"task {task}: {error}"

    def cancelled(self, task: int, why: str | None) -> None:
        """The handler stopped after the lease was lost: nothing written."""
        with self.lock:
            self.stats.cancelled += 1
            self.stats.last_error = f"task {task}: cancelled: {why}"

    def timed_out(self, task: int, error: str) -> None:
        """The task outran its time limit: its FAIL is written and the process ends now
        (from the watchdog's thread), so the snapshot is written at once."""
        with self.lock:
            self.stats.failed += 1
            self.stats.last_error = f"task {task}: {error}"
            self.stats.state = "exited"
            self.stats.exit_reason = f"task {task} {error}"
        self.publisher.publish(force=True)

    # -- the log out of reach ------------------------------------------------------------------

    def log_error(self, error: LogError) -> None:
        """A step failed on the log (it may pass: a full disk, a server restarting)."""
        with self.lock:
            self.stats.last_error = str(error)
            self._note_log_error(error)
        self.publisher.publish()

    def settle_retrying(self, task: int, kind: str, error: LogError) -> None:
        """Our `kind` record (CLAIM, DONE, FAIL) of `task` is not settled yet: retrying."""
        with self.lock:
            self.stats.last_error = f"task {task}: {kind} not settled, retrying: {error}"
            self._note_log_error(error)
        self.publisher.publish()

    def settle_given_up(self, task: int, kind: str, error: LogError) -> None:
        """Draining, with our lease lapsed: our `kind` record of `task` is given up."""
        with self.lock:
            self.stats.last_error = (
                f"task {task}: {kind} given up while draining (the lease lapsed): {error}"
            )

    def log_recovered(self) -> None:
        """A record of ours landed: the log answers again."""
        if self.stats.log_error is not None:
            with self.lock:
                self.stats.log_error = None

    def lapsed_out_of_reach(self, task: int) -> None:
        """A won task could not be run before our lease lapsed (the log was out of reach)."""
        with self.lock:
            self.stats.cancelled += 1
            self.stats.leases_lost += 1
            self.stats.timeouts += 1
            self.stats.last_error = f"task {task}: the lease lapsed while the log was out of reach"

    def lost_out_of_reach(self, task: int, error: str, *, lease_noticed: bool) -> None:
        """Our DONE/FAIL could not be written before our claim lost the task."""
        with self.lock:
            self.stats.cancelled += 1
            if not lease_noticed:
                self.stats.leases_lost += 1
                self.stats.timeouts += 1
            self.stats.last_error = f"task {task}: {error}"

    def _note_log_error(self, error: LogError) -> None:
        """Keep `error` as `stats.log_error` (under the stats lock): an append that failed
        always (it names the file and the cause: a full disk), another error only when
        none is noted (a CLAIM "not in the log" after a failed append is a consequence)."""
        if isinstance(error, AppendError) or self.stats.log_error is None:
            self.stats.log_error = str(error)

    # -- LeaseListener (called from the lease keeper's thread) ---------------------------------

    def lease_renewed(self, expiry: int) -> None:
        with self.lock:
            self.stats.renewals += 1
            self.stats.lease_expiry = self._wall_seconds(expiry)

    def lease_lost(self, holder: Lease | None) -> None:
        with self.lock:
            self.stats.leases_lost += 1
            self.stats.timeouts += 1
            self.stats.lease_expiry = None
            taken = f" (taken over by {holder.worker})" if holder is not None else ""
            self.stats.last_error = f"task {self.stats.current_task}: lease lost{taken}"
        self.publisher.publish()

    def lease_lapsed(self, overdue_us: int) -> None:
        """Our clock passed the lease's expiry before a renewal (the process was stopped or
        starved): the lease is treated as lost, and the handler is cancelled."""
        with self.lock:
            self.stats.leases_lapsed += 1
            self.stats.leases_lost += 1
            self.stats.timeouts += 1
            self.stats.lease_expiry = None
            self.stats.last_error = (
                f"task {self.stats.current_task}: lease lapsed while paused or stalled "
                f"({us_to_seconds(overdue_us):.1f} s past its expiry); handler cancelled"
            )
        self.publisher.publish()

    def lease_error(self, error: str) -> None:
        with self.lock:
            self.stats.last_error = error

    def lease_tick(self) -> None:
        # drain() may run in a signal handler, where taking the stats lock could deadlock;
        # the state it implies is shown from here instead.
        if self._draining.is_set():
            with self.lock:
                if self.stats.state == "working":
                    self.stats.state = "draining"
        self.publisher.publish()
