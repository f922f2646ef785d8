"""The supervisor's own reading of the queue: it tails both logs and folds the claims log.

`Monitor.poll()` reads what was appended since the last call, applies it to a `ClaimState`
(the same pure fold every worker runs, so its verdicts are the workers' verdicts) and turns
the interesting outcomes into feed events:

    takeover    task 17: w2·6975 → w5·7001, 1.2 s after w2·6975 died
    lease-lost  task 17: w2·6975 lost its lease to w5·7001
    stale       task 17: w2·6975's completion was discarded (w5·7001 holds it): worked twice
    dead-task   task 17 is dead after 3 attempts: ValueError: …
    clock       task 17: clock of w2·6975 ran back 1.0 h at @5120
    (queue_worker.protocol.clock_jumps)

The fold is the workers' own (`queue_worker.topics.ClaimsFollower`): the same decoding, the
same server clock on Redis, the same treatment of a malformed record.

Worker ids are long ("w2-4711-9f3a"): events name workers by `worker_label` (w2·4711), so a
restarted w2 never reads as the one it replaced. The supervisor tells the monitor when its
workers die (`worker_died`), so a takeover can say how long after the death it came.

The monitor starts by folding the whole claims log, silently: only records appended after
it was created become events, so a restart does not replay yesterday's feed. One `poll`
reads a bounded batch, so the supervisor's loop stays responsive while it catches up.
"""

from __future__ import annotations

import contextlib
import operator
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Final, cast

from logstore import Entry, IdentityError, Log, PositionCompactedError
from logstore.base import Durability
from logstore.location import log_file
from queue_worker.names import worker_label
from queue_worker.protocol.clock_jumps import ClockWatch
from queue_worker.protocol.records import (
    Claim,
    ClaimsRecord,
    Done,
    Fail,
    RecordDecodeError,
    Unknown,
    decode_claims_all,
    decode_task,
)
from queue_worker.protocol.state import ClaimState, Lease, Outcome, Verdict
from queue_worker.topics import (
    _TASK_PREFIX,
    CLAIMS_TOPIC,
    TASKS_TOPIC,
    ClaimsFollower,
    check_tasks_cover,
    claims_decoder,
    open_topics,
)
from supervisor.run.fold_begin import begin_from_checkpoint
from supervisor.run.model import Event, QueueView

#: the verdicts a poll does more for than fold them and count a DONE: an event, a takeover
#: remembered (`_remember_takeover`, `_event`; the FAILs accepted the fold counts itself,
#: `ClaimState.failed_count`); in a drain nearly every record is a won CLAIM or a DONE,
#: which need none of it
_NOTED: Final = frozenset(
    {Verdict.TAKEOVER, Verdict.LEASE_LOST, Verdict.STALE_DONE, Verdict.RELEASED, Verdict.DEAD}
)

_DATA: Final = operator.itemgetter(2)  # an Entry's bytes
#: the records `_fold_common` folds a batch of in one go
_COMMON: Final = frozenset({Claim, Done})

#: records read from each log by one `poll` (catching up on a long log takes several polls)
POLL_BATCH: Final = 20_000
#: seconds of throughput history kept (one value a second)
HISTORY_SECONDS: Final = 120
#: the throughput shown as "now" is the mean of this many complete seconds
THROUGHPUT_WINDOW: Final = 3
#: how often `poll` asks each log whether it lost records (`Log.verify_history`), seconds
HISTORY_CHECK_S: Final = 1.0
MICROS: Final = 1_000_000
#: takeovers remembered for `takeover_of` (the dashboard asks about recent ones only)
TAKEOVERS_KEPT: Final = 4096
#: worker deaths remembered (for "1.2 s after w2·6975 died"): the most recent ones
DEATHS_KEPT: Final = 4096


@dataclass(frozen=True, slots=True)
class Takeover:
    """A CLAIM that won a task from an expired holder, as the fold judged it."""

    task: int
    worker: str  # the new holder's id
    previous: str  # the expired holder's id
    at: float  # the CLAIM's own time, wall clock seconds
    expiry: float  # when the previous lease lapsed, wall clock seconds


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """One task as the monitor's fold sees it now (what `/task/{id}` serves)."""

    task: int
    known: bool  # the tasks log has it (the monitor has read that far)
    done: bool
    dead: bool
    holder: Lease | None
    holder_name: str | None
    attempts: int
    last_error: str | None


class Monitor:
    """Tails the tasks and claims logs of one location; thread-safe."""

    def __init__(self, location: str, *, batch: int = POLL_BATCH, read_only: bool = False) -> None:
        """`read_only`: create and write nothing (`qw status`); otherwise the queue's logs
        are created if missing (the supervisor of a new queue)."""
        self.location = location
        self._batch = batch
        # Durability only matters to writers; the monitor never appends.
        self._tasks: Log
        self._claims: Log
        self._tasks, self._claims = open_topics(location, Durability.NONE, read_only=read_only)
        self._tasks_pos = self._tasks.start
        # The workers' own fold (same decoding, same server clock, same malformed records).
        self._follower = ClaimsFollower(self._claims.start)
        self._state: ClaimState = self._follower.state
        self._decoder = claims_decoder()  # a file log's records, decoded where they lie
        # Records before this position are history: folded, never turned into events.
        self._events_from = self._claims.end()
        self._published = 0
        # task ids whose record is of a type this version does not know: no worker of ours
        # will run them, so they are neither pending nor in the way of "drained"
        self._foreign: set[int] = set()
        self._records = 0
        self._done_per_second: Counter[int] = Counter()
        # DONEs of seconds before this are older than any view shows: not counted (folding a
        # month of history at start-up would otherwise fill a bucket per second of it)
        self._history_from = 0
        self._foreign_below = 0  # the watermark `_foreign` was last pruned at
        self._deaths: dict[str, float] = {}
        self._takeovers: dict[int, Takeover] = {}  # insertion order: the oldest first
        self._clock = ClockWatch()  # the workers' clock jumps, in the records since start
        self._caught_up = False
        self._lock = threading.Lock()
        #: where `check_start` begins to verify each log (tasks, claims): their starts, or
        #: where the checkpoint the fold begins from ends
        self._checked_from: tuple[int | None, int | None] = (None, None)
        self._history_due = 0.0  # when `poll` next verifies the logs' history
        self._start_from_checkpoint()

    def _start_from_checkpoint(self) -> None:
        """Begin from the fold checkpoint when one covers the logs (`supervisor.run.fold_begin`:
        a fold of compacted logs' rest alone would count wrong; on whole logs it saves
        folding the history again), else from the logs' start. The DONEs it covers are in
        no throughput bucket: a dashboard's history starts at its checkpoint."""
        try:
            begun = begin_from_checkpoint(self.location, self._tasks, self._claims, None)
        except IdentityError:
            self.close()
            raise
        if begun is None:
            return
        index, follower = begun
        # (what the checkpoint covers, its restore checksummed whole: `check_start` verifies
        # the rest)
        self._checked_from = (index.next_position, follower.next_position)
        self._follower = follower
        self._state = follower.state
        self._tasks_pos = index.next_position
        self._published = index.known
        self._foreign = set(index.foreign)

    def check_start(self, *, count_all: bool = True) -> None:
        """Verify every record of both logs (damage raises CorruptLogError naming the file
        and byte offset; after a checkpoint the fold begins from, whose restore checksummed
        what it covers) and fold the claims to their end; then refuse a claims log that
        closed a task the tasks log lacks (IdentityError). What a supervisor does before any
        worker starts, and `qw status` before it counts.

        `count_all=False` (the supervisor): the tasks log is read only as far as that check
        needs (none of it when no task was closed yet); `poll` reads the rest while the
        workers start. Counting a backlog of 10,000 tasks here first cost the first CLAIM
        about as much as verifying it (cProfile of `qw up`, bench/start_bench.py)."""
        tasks_from, claims_from = self._checked_from
        self._tasks.check(tasks_from)
        self._claims.check(claims_from)
        with self._lock:
            # to the end: a read stops short at the end of a segment, so only an empty
            # read says the end is reached (a short one stopped at the first segment's end)
            while self._read_claims()[1]:
                pass
            # after the claims: every task they name is in the tasks log by now
            highest = self._state.highest_closed()
            needed = -1 if highest is None else highest
            tasks_read = -1
            while count_all or self._published <= needed:
                tasks_read = self._read_tasks()
                if tasks_read == 0:
                    break
            self._caught_up = count_all and tasks_read == 0
            check_tasks_cover(self._tasks, self._published, self._claims, self._state)

    # -- what the supervisor tells it --------------------------------------------------------

    def worker_died(self, worker_id: str, at: float) -> None:
        with self._lock:
            self._deaths.pop(worker_id, None)
            self._deaths[worker_id] = at
            if len(self._deaths) > DEATHS_KEPT:
                del self._deaths[next(iter(self._deaths))]

    # -- reading -----------------------------------------------------------------------------

    def poll(self) -> list[Event]:
        """Read one batch of each log; return the events it produced."""
        with self._lock:
            self._history_from = int(time.time()) - HISTORY_SECONDS
            try:
                tasks_read = self._read_tasks()
                events, claims_read = self._read_claims()
            except PositionCompactedError:
                # Compaction removed records this monitor had not read yet (settled history,
                # which the checkpoint keeps): go on from the checkpoint, as a worker does.
                self._start_from_checkpoint()
                return []
            self._forget_settled_foreign()
            self._caught_up = tasks_read < self._batch and claims_read < self._batch
            self._verify_history()
            return events

    def _verify_history(self) -> None:
        """Every HISTORY_CHECK_S, each log's own check that no record went that nothing
        accounts for (`Log.verify_history`): records trimmed by hand under a running queue
        raise LostHistoryError, which stops the run, where reading on would wait for ever
        for tasks that are gone."""
        now = time.monotonic()
        if now >= self._history_due:
            self._history_due = now + HISTORY_CHECK_S
            self._tasks.verify_history()
            self._claims.verify_history()

    def _forget_settled_foreign(self) -> None:
        """A foreign task below the fold's watermark is closed (a newer worker ran it): it
        counts as done or dead like any other, and need not be remembered."""
        watermark = self._state.watermark
        if self._foreign and watermark > self._foreign_below:
            self._foreign = {t for t in self._foreign if t >= watermark}
        self._foreign_below = watermark

    def _read_tasks(self) -> int:
        # A task's id is its index in the tasks log, whatever the record holds. Counting is
        # nearly all the monitor needs (the workers decide what a bad record means); a
        # record of an unknown type is set apart, as the workers leave it alone.
        entries = self._tasks.read(self._tasks_pos, self._batch)
        if entries:
            for index, entry in enumerate(entries, self._published):
                if not entry.data.startswith(_TASK_PREFIX) and _is_foreign(entry):
                    self._foreign.add(index)
            self._published += len(entries)
            self._tasks_pos = entries[-1].next
            self._records += len(entries)
        return len(entries)

    def _read_claims(self) -> tuple[list[Event], int]:
        found = self._claims.read_span(self._follower.next_position, self._batch, self._decoder)
        records = found.items
        if None not in records and _COMMON.issuperset(map(type, records)):
            events = self._fold_common(cast("list[Claim | Done]", records), found.positions)
            self._follower.next_position = found.next
            self._records += len(records)
            return events, len(records)
        # a malformed record, a FAIL or a RENEW: read again as entries, one by one
        return self._read_entries()

    def _fold_common(self, records: list[Claim | Done], positions: list[int]) -> list[Event]:
        """Fold a batch of CLAIMs and DONEs (a drain's log is nothing else) as a worker's
        catch-up does (`ClaimState.apply_all`: no verdict built for a winning CLAIM or its
        holder's DONE), and make events of the records it has to judge one by one: a
        takeover, a stale DONE. Every record still goes past the clock watch, and every
        accepted DONE into its second's count."""
        others: list[tuple[ClaimsRecord, Outcome]] = []
        self._state.apply_all(records, positions, others)
        events: list[Event] = []
        events_from = self._events_from
        if positions and positions[-1] >= events_from:
            see = self._clock.see
            for position, record in zip(positions, records, strict=True):
                if position >= events_from and (jump := see(position, record)) is not None:
                    text = f"task {jump.task}: {jump.text}"
                    events.append(Event(time.time(), "clock", text, jump.task))
        history_from, done_per_second = self._history_from, self._done_per_second
        done_per_second.update(
            second
            for record in records
            if type(record) is Done and (second := record.at // MICROS) >= history_from
        )
        for judged, outcome in others:
            verdict = outcome.verdict
            if type(judged) is Done and verdict is not Verdict.DONE:  # counted above: not
                second = judged.at // MICROS  # accepted after all
                if second >= history_from:
                    done_per_second[second] -= 1
            if verdict in _NOTED:
                self._remember_takeover(judged, outcome)
                if outcome.position >= events_from:
                    event = self._event(judged, outcome, 0)  # (0: no DEAD without a FAIL)
                    if event is not None:
                        events.append(event)
        return events

    def _read_entries(self) -> tuple[list[Event], int]:
        """Read and fold the next records as entries, each by itself (any log, any record)."""
        entries = self._claims.read(self._follower.next_position, self._batch)
        events: list[Event] = []
        follower, state, events_from = self._follower, self._state, self._events_from
        # Decoded once, here, in one call for the batch (the workers' own batch decoder),
        # and handed to the fold; a malformed record (None) is left to the fold to decode,
        # count and report, as a worker's fold does.
        decoded = decode_claims_all(map(_DATA, entries))
        # The two verdicts of nearly every record, by identity: `in _NOTED` hashes the enum
        # member in Python (enum's __hash__), ~3 us a record in the monitor's profile
        won, done = Verdict.WON, Verdict.DONE
        history_from, done_per_second = self._history_from, self._done_per_second
        for entry, known in zip(entries, decoded, strict=True):
            # attempts before the record, for a DEAD event's text (a DEAD verdict, which only
            # a FAIL gets, forgets the task's state)
            attempts = state.attempts(known.task) if type(known) is Fail else 0
            outcome, record = follower.apply(entry, known)
            if entry.position >= events_from:
                jump = self._clock.see(entry.position, record)
                if jump is not None:
                    text = f"task {jump.task}: {jump.text}"
                    events.append(Event(time.time(), "clock", text, jump.task))
            verdict = outcome.verdict
            if verdict is won:
                continue
            if verdict is done:
                if type(record) is Done:  # bucketed by the record's own time: a catch-up
                    # on history fills the past
                    second = record.at // MICROS
                    if second >= history_from:
                        done_per_second[second] += 1
            elif verdict in _NOTED:
                self._remember_takeover(record, outcome)
                if entry.position >= events_from:
                    event = self._event(record, outcome, attempts)
                    if event is not None:
                        events.append(event)
        self._records += len(entries)
        return events, len(entries)

    def _remember_takeover(self, record: ClaimsRecord, outcome: Outcome) -> None:
        previous = outcome.previous
        if outcome.verdict is not Verdict.TAKEOVER or previous is None:
            return
        if not isinstance(record, Claim) or outcome.task is None or outcome.worker is None:
            return
        takeovers = self._takeovers
        takeovers.pop(outcome.task, None)  # re-inserted as the newest
        takeovers[outcome.task] = Takeover(
            outcome.task,
            outcome.worker,
            previous.worker,
            record.at / MICROS,
            previous.expiry / MICROS,
        )
        if len(takeovers) > TAKEOVERS_KEPT:
            del takeovers[next(iter(takeovers))]

    # -- events ------------------------------------------------------------------------------

    def _label(self, worker_id: str) -> str:
        return worker_label(worker_id)

    def _event(self, record: ClaimsRecord, outcome: Outcome, attempts: int) -> Event | None:
        verdict, task = outcome.verdict, outcome.task
        worker = outcome.worker
        if worker is None or task is None:
            return None
        now = time.time()
        who = self._label(worker)
        if verdict is Verdict.TAKEOVER and outcome.previous and isinstance(record, Claim):
            text = self._takeover_text(task, who, outcome.previous, record)
            return Event(now, "takeover", text, task)
        if verdict is Verdict.LEASE_LOST:
            holder = outcome.holder
            to = f" to {self._label(holder.worker)}" if holder and holder.worker != worker else ""
            return Event(now, "lease-lost", f"task {task}: {who} lost its lease{to}", task)
        if verdict is Verdict.STALE_DONE:
            holder = outcome.holder
            if holder is not None:
                why = f"{self._label(holder.worker)} holds it"
            else:
                why = "already done" if self._state.is_done(task) else "nobody holds it"
            text = f"task {task}: {who}'s completion was discarded ({why})"
            return Event(now, "stale", text, task)
        if verdict is Verdict.DEAD:
            error = self._state.dead_error(task) or "no error given"
            text = f"task {task} is dead after {attempts} attempt{'s' * (attempts != 1)}: {error}"
            return Event(now, "dead-task", text, task)
        return None

    def _takeover_text(self, task: int, who: str, previous: Lease, record: Claim) -> str:
        victim = self._label(previous.worker)
        claimed_at = record.at / MICROS
        died = self._deaths.get(previous.worker)
        if died is not None:
            return f"task {task}: {victim} → {who}, {claimed_at - died:.1f} s after {victim} died"
        lapsed = claimed_at - previous.expiry / MICROS
        return f"task {task}: {victim} → {who}, {lapsed:.1f} s after its lease lapsed"

    # -- queries -----------------------------------------------------------------------------

    @property
    def caught_up(self) -> bool:
        """The last poll reached the end of both logs."""
        with self._lock:
            return self._caught_up

    def is_drained(self) -> bool:
        """Caught up, and every published task is closed (done or dead): none pending or
        held. Only published ids count: a claim for an id the tasks log lacks (a hostile or
        foreign writer's) never keeps the queue from draining, nor does a task of a type no
        worker here can run."""
        with self._lock:
            if not self._caught_up or self._holds_published():
                return False  # (asked every 20 ms in a drain: the usual answer, cheaply)
            pending, held = self._open_counts()
            return pending == 0 and not held

    def _holds_published(self) -> bool:
        """Is a published task of this version held? (What `_open_counts` counts as held,
        without sorting them or counting the closed tasks.)"""
        published, foreign = self._published, self._foreign
        return any(t < published and t not in foreign for t, _ in self._state.held_tasks())

    def _held_published(self) -> list[tuple[int, Lease]]:
        return sorted(
            (task, lease)
            for task, lease in self._state.held_tasks()
            if task < self._published and task not in self._foreign
        )

    def _open_counts(self) -> tuple[int, list[tuple[int, Lease]]]:
        """(pending, held) among the published tasks this version can run."""
        state = self._state
        held = self._held_published()
        closed = state.done_count + state.dead_count - state.closed_from(self._published)
        foreign_open = sum(
            1 for t in self._foreign if not state.is_closed(t) and state.holder(t) is None
        )
        return max(0, self._published - closed - len(held) - foreign_open), held

    def open_below(self, first: int) -> tuple[int, int]:
        """(pending, held) among the published tasks whose ids are below `first`: what was
        left open before a run's own tasks (from `first` on) were enqueued."""
        with self._lock:
            state = self._state
            first = min(first, self._published)
            held = sum(1 for t, _ in state.held_tasks() if t < first and t not in self._foreign)
            closed = state.done_count + state.dead_count - state.closed_from(first)
            foreign = sum(
                1
                for t in self._foreign
                if t < first and not state.is_closed(t) and state.holder(t) is None
            )
            return max(0, first - closed - held - foreign), held

    @property
    def published(self) -> int:
        """Tasks read from the tasks log so far."""
        with self._lock:
            return self._published

    def held_leases(self) -> list[tuple[int, Lease, float | None]]:
        """The published tasks held now, by task id: (task, its lease, when the holder died
        if it was one of this supervisor's workers, wall-clock seconds). An expired lease
        is still held: the task waits for a survivor's claim."""
        with self._lock:
            return [
                (task, lease, self._deaths.get(lease.worker))
                for task, lease in self._held_published()
            ]

    def queue_view(self, now: float | None = None) -> QueueView:
        with self._lock:
            state = self._state
            second = int(time.time() if now is None else now)
            # Complete seconds only: the current one is still filling.
            history = [
                float(self._done_per_second.get(s, 0))
                for s in range(second - HISTORY_SECONDS, second)
            ]
            for s in [s for s in self._done_per_second if s < second - HISTORY_SECONDS]:
                del self._done_per_second[s]
            pending, held = self._open_counts()
            return QueueView(
                published=self._published,
                pending=pending,
                held=len(held),
                done=state.done_count,
                failed=state.failed_count,
                dead=state.dead_count,
                throughput_now=sum(history[-THROUGHPUT_WINDOW:]) / THROUGHPUT_WINDOW,
                throughput_history=history,
                log_bytes=self._log_bytes(),
                record_count=self._records,
            )

    def _log_bytes(self) -> int:
        total = 0  # a Redis location has no files: 0
        for topic in (TASKS_TOPIC, CLAIMS_TOPIC):
            path = log_file(self.location, topic)
            with contextlib.suppress(OSError):  # not created yet
                total += path.stat().st_size if path is not None else 0
        return total

    def holdings(self) -> dict[str, int]:
        """worker id -> a task its claim holds now, by the log (an expired lease included:
        a dead worker still "holds" its task until a survivor takes it over)."""
        with self._lock:
            return {lease.worker: task for task, lease in self._state.held_tasks()}

    def tasks_held_by(self, worker_id: str) -> list[tuple[int, Lease]]:
        """The tasks whose winning claim is `worker_id`'s, by the log as read so far (an
        expired lease included), in the fold's order."""
        with self._lock:
            return [
                (task, lease)
                for task, lease in self._state.held_tasks()
                if lease.worker == worker_id
            ]

    def takeover_of(self, task: int) -> Takeover | None:
        """The last takeover of `task` read so far (among the recent ones), or None."""
        with self._lock:
            return self._takeovers.get(task)

    def catch_up(self, max_polls: int = 10) -> list[Event]:
        """Poll until both logs are read to their end (or `max_polls` batches): the fold
        then knows every record written before the call."""
        events: list[Event] = []
        for _ in range(max_polls):
            events += self.poll()
            if self.caught_up:
                break
        return events

    def kept(self) -> dict[str, int]:
        """How many items each of the monitor's own collections holds (its memory beyond the
        fold's: each is bounded by time or by the live tasks, not by the history)."""
        with self._lock:
            return {
                "done_seconds": len(self._done_per_second),
                "foreign": len(self._foreign),
                "deaths": len(self._deaths),
                "takeovers": len(self._takeovers),
            }

    def task_info(self, task: int) -> TaskInfo:
        with self._lock:
            state = self._state
            holder = state.holder(task)
            open_state = state.task_state(task)
            return TaskInfo(
                task=task,
                known=0 <= task < self._published,
                done=state.is_done(task),
                dead=state.is_dead(task),
                holder=holder,
                holder_name=None if holder is None else self._label(holder.worker),
                attempts=state.attempts(task),
                last_error=state.dead_error(task)
                or (open_state.last_error if open_state else None),
            )

    def close(self) -> None:
        self._tasks.close()
        self._claims.close()


def _is_foreign(entry: Entry) -> bool:
    """A tasks-log record of a type this version does not know (a malformed one is not:
    a worker wins it and fails it for good, so it closes)."""
    try:
        return isinstance(decode_task(entry.data), Unknown)
    except RecordDecodeError:
        return False
