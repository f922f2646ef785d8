"""The report: a replay of both logs from the beginning, and what it proves.

`build_report` is pure: it takes the records (TASK records in order; claims records with
their positions) and folds them through `ClaimState`, so its numbers are the verdicts every
worker reached, not a second opinion. `load_report` is the I/O around it: it opens the two
logs of a location and feeds it.

What the report proves (the exit code of `qw report`):

- every finished task was completed exactly once: accepted DONE records == tasks done;
- no task was worked twice: no DONE was stale *under a claim that had won*. Such a record
  means a handler ran to completion under a lease that another claim had taken over (the
  fold discarded the result, but the work itself happened twice);
- the accounting holds: every winning claim ended in exactly one way (done, failed, taken
  over) or still holds its task, and every task ever won is now done, held, dead or
  waiting for its retry (so done ≤ tasks won ≤ done + held + dead + waiting);
- each periodic tick was enqueued once and completed at most once (however many
  supervisors enqueued it: `queue_worker.proof.periodic_proof`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from logstore.base import LogError
from queue_worker.history.prefix import COUNTERS as PREFIX_COUNTERS
from queue_worker.history.prefix import Prefix
from queue_worker.names import worker_label
from queue_worker.percentile import nearest_rank
from queue_worker.proof.checker import QueueChecker, QueueChecks
from queue_worker.proof.dependency_proof import DependencyProof, check_dependencies
from queue_worker.proof.log_reading import (  # re-exported: the readers of the logs live there
    ReportInputError,
    compacted_prefix,
    count_tasks,
    counted_tasks,
    has_logs,
    missing_logs_text,
    prefix_state,
    read_claims,
    read_task,
    verify_logs,
)
from queue_worker.proof.periodic_proof import Completion, PeriodicProof, check_ticks
from queue_worker.protocol.clock_jumps import ClockJump, ClockWatch
from queue_worker.protocol.records import (
    Cancel,
    Claim,
    ClaimsRecord,
    Done,
    Fail,
    Renew,
    TaskRecord,
    Unknown,
)
from queue_worker.protocol.state import ClaimState, Lease, Outcome, Verdict
from queue_worker.times import clock_text, duration_text, is_date
from queue_worker.topics import (
    MALFORMED,
    open_topics,
)
from queue_worker.worker.handlers import resolved_to

if TYPE_CHECKING:
    from logstore.file.log import Verified

#: exit codes of `qw report` (and the checks built on it)
EXIT_OK: Final = 0  # every finished task completed exactly once, none worked twice
EXIT_WORKED_TWICE: Final = 1  # a task was worked twice, or the accounting does not hold
EXIT_BAD_INPUT: Final = 2  # no logs there, a corrupt log, a record that is not a qw record

__all__ = [
    # the replay
    "Report",
    "build_report",
    "load_report",
    # what a report holds
    "DeadTask",
    "HeldTask",
    "Margin",
    "RecordRef",
    "StaleCompletion",
    "Takeover",
    "WorkedTwice",
    "WorkerLine",
    # reading the logs
    "count_tasks",
    "has_logs",
    "missing_logs_text",
    "compacted_prefix",
    "prefix_state",
    "read_claims",
    "read_task",
    # errors and exit codes
    "EXIT_BAD_INPUT",
    "EXIT_OK",
    "EXIT_WORKED_TWICE",
    "ReportInputError",
    # how times read (queue_worker.times, re-exported)
    "clock_text",
    "duration_text",
    "json_safe",
]


# -- what the report holds -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Takeover:
    """A claim that won over an expired holder: the task was redistributed."""

    task: int
    position: int  # the winning CLAIM
    at: int
    new_holder: str
    victim: str
    victim_claim: int
    victim_expiry: int
    victim_last_at: int  # the victim's last accepted record under that claim (CLAIM or RENEW)

    @property
    def gap_after_expiry(self) -> int:
        """µs between the victim's lease expiring and the takeover (≥ 0 by Rule 1)."""
        return self.at - self.victim_expiry

    @property
    def gap_after_last(self) -> int:
        """µs between the victim's last sign of life in the log and the takeover."""
        return self.at - self.victim_last_at


@dataclass(frozen=True, slots=True)
class StaleCompletion:
    """A DONE the fold refused: its result was discarded."""

    task: int
    position: int
    worker: str
    claim: int  # the claim it named
    claim_won: bool  # that claim had won: the handler ran under a lease it then lost
    holder: Lease | None  # who held the task when the DONE arrived
    done_position: int | None  # the accepted DONE, when the task was already done


@dataclass(frozen=True, slots=True)
class RecordRef:
    """One record that decided something about a task: a win, a completion, a failure."""

    position: int
    kind: str  # CLAIM, DONE, FAIL
    worker: str
    at: int
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class WorkedTwice:
    task: int
    records: tuple[RecordRef, ...]  # its winning claims and its completions, in log order


@dataclass(frozen=True, slots=True)
class DeadTask:
    task: int
    position: int  # the FAIL that gave up
    worker: str
    error: str


@dataclass(frozen=True, slots=True)
class HeldTask:
    task: int
    lease: Lease


@dataclass(slots=True)
class WorkerLine:
    """What one worker (one process: ids are unique) wrote, as the fold judged it."""

    worker: str
    attempts: int = 0
    won: int = 0
    takeovers: int = 0  # of those wins, over an expired holder
    lost: int = 0
    renewals: int = 0
    leases_lost: int = 0
    done: int = 0
    stale: int = 0
    released: int = 0
    dead: int = 0
    first_at: int = 0
    last_at: int = 0


@dataclass(frozen=True, slots=True)
class Margin:
    """How close records came to their lease's expiry: expiry − at, in µs.

    Negative values are records written after the lease had lapsed (the fold still accepted
    them because nobody had taken the task over).
    """

    samples: int = 0
    min: int | None = None
    p50: int | None = None
    late: int = 0

    @classmethod
    def of(cls, values: list[int]) -> Margin:
        if not values:
            return cls()
        ordered = sorted(values)
        late = sum(1 for v in ordered if v < 0)
        return cls(len(ordered), ordered[0], nearest_rank(ordered, 0.5), late)


@dataclass(frozen=True)
class Report:
    tasks_published: int
    claims_records: int  # claims records replayed
    claims_position: int | None  # the position of the last one (None: none)
    workers: tuple[WorkerLine, ...]
    tasks_done: int
    tasks_held: int
    tasks_dead: int
    tasks_won: int  # distinct tasks some claim won
    tasks_waiting: int  # released by a FAIL, waiting for their retry time
    attempts: int  # CLAIM records
    wins: int
    lost: int
    lost_by_reason: dict[str, int]
    takeovers: tuple[Takeover, ...]
    renewals: int
    renewals_refused: int
    completions: int  # DONE records written
    completions_accepted: int
    stale_completions: tuple[StaleCompletion, ...]
    fails_accepted: int  # FAILs that ended a win (a CANCEL of a task nobody held ends none)
    fails_stale: int
    dead: tuple[DeadTask, ...]
    held: tuple[HeldTask, ...]
    worked_twice: tuple[WorkedTwice, ...]
    attempts_histogram: dict[int, int]  # claims per published task -> how many tasks
    renewal_margin: Margin
    completion_margin: Margin
    unpublished_tasks: tuple[int, ...]  # task ids the claims name but tasks.log lacks
    unknown_records: int  # records of a type this version does not know (skipped)
    malformed: tuple[int, ...]  # positions of claims records that do not decode (skipped)
    # positions of records whose time (at, its lease's end, retry_at) is no date: hostile or
    # broken writers; the fold still applies them as written (they decode)
    impossible_times: tuple[int, ...] = ()
    # records that show their worker's clock jumped (queue_worker.protocol.clock_jumps):
    # observations
    # beside the verdicts, which they do not change
    clock_jumps: tuple[ClockJump, ...] = ()
    checks: QueueChecks = field(
        default_factory=QueueChecks
    )  # the total-queue classes (queue_worker.proof.checker)
    # logs compacted: the removed history, taken from the checkpoint (queue_worker.history.prefix);
    # the counts above include it, the lists (takeovers, stale, dead) hold the retained part
    prefix: Prefix | None = None
    compacted_segments: int = 0  # segments compaction removed (both logs)
    # tasks a CANCEL made dead before any claim won them (dead, never won)
    cancelled_unclaimed: int = 0
    # what each Redis stream verified of its history (`Log.verify_history`), in a few words
    history_verified: tuple[str, ...] = ()
    # each file log's segments, their lengths and its forced offset, as judged by the rule
    # of what a reader may cut (`log_reading.verify_logs`); empty on Redis
    verified: dict[str, Verified] = field(default_factory=dict)
    # each periodic task's ticks: enqueued once, completed at most once (periodic_proof)
    periodic: tuple[PeriodicProof, ...] = ()
    # the tasks with dependencies: none run before them (dependency_proof); None: none
    dependencies: DependencyProof | None = None

    @property
    def completions_stale(self) -> int:
        return len(self.stale_completions)

    @property
    def lost_percent(self) -> float:
        return 100.0 * self.lost / self.attempts if self.attempts else 0.0

    def accounting_errors(self) -> list[str]:
        """Identities the fold must keep; any line here is a bug in the fold, not in a run."""
        errors: list[str] = []
        if self.completions_accepted != self.tasks_done:
            errors.append(
                f"{self.completions_accepted} completions accepted but {self.tasks_done} "
                "distinct tasks done: a task was completed more than once"
            )
        takeovers = len(self.takeovers) + (self.prefix.takeovers if self.prefix else 0)
        ended = self.completions_accepted + self.fails_accepted + takeovers
        if self.wins != ended + self.tasks_held:
            errors.append(
                f"{self.wins} wins, but done + failed + taken over + held = "
                f"{ended} + {self.tasks_held}"
            )
        if self.tasks_done > self.tasks_won:
            errors.append(f"{self.tasks_done} tasks done but only {self.tasks_won} ever won")
        dead_won = self.tasks_dead - self.cancelled_unclaimed
        accounted = self.tasks_done + self.tasks_held + dead_won + self.tasks_waiting
        if self.tasks_won != accounted:
            errors.append(
                f"{self.tasks_won} tasks won but done + held + dead + waiting = {accounted}"
            )
        return errors

    @property
    def ok(self) -> bool:
        periodic_ok = all(p.ok for p in self.periodic)
        dependencies_ok = self.dependencies is None or self.dependencies.ok
        return (
            not self.worked_twice
            and not self.accounting_errors()
            and periodic_ok
            and dependencies_ok
        )

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_WORKED_TWICE

    @property
    def verdict(self) -> str:
        """The one line that sums the run up."""
        if self.worked_twice:
            tasks = ", ".join(str(w.task) for w in self.worked_twice)
            noun = "a task was" if len(self.worked_twice) == 1 else "tasks were"
            return f"FAIL: {noun} worked twice: {tasks}"
        errors = self.accounting_errors()
        if errors:
            return f"FAIL: {errors[0]}"
        broken = [line for p in self.periodic for line in p.problems]
        if broken:
            return f"FAIL: a periodic {broken[0]}"
        if self.dependencies is not None and not self.dependencies.ok:
            return f"FAIL: {self.dependencies.problems[0]}"
        return (
            f"OK: every finished task was completed exactly once ({self.tasks_done} done), "
            "none was worked twice"
        )

    def to_json(self) -> dict[str, Any]:
        """The `qw report --json` object: plain JSON types, times in µs since the epoch."""
        skip = (
            "workers",
            "takeovers",
            "stale_completions",
            "worked_twice",
            "prefix",
            "clock_jumps",
            "periodic",
            "dependencies",
        )
        data: dict[str, Any] = {
            f.name: json_safe(getattr(self, f.name)) for f in fields(self) if f.name not in skip
        }
        data.update(
            verdict=self.verdict,
            ok=self.ok,
            lost_percent=round(self.lost_percent, 2),
            completions_stale=self.completions_stale,
            worked_twice=[w.task for w in self.worked_twice],
            worked_twice_records={str(w.task): json_safe(w.records) for w in self.worked_twice},
            takeovers=[
                json_safe(t)
                | {"gap_after_expiry": t.gap_after_expiry, "gap_after_last": t.gap_after_last}
                for t in self.takeovers
            ],
            stale_completions=json_safe(self.stale_completions),
            clock_jumps=[json_safe(j) | {"text": j.text} for j in self.clock_jumps],
            workers=[json_safe(w) | {"label": worker_label(w.worker)} for w in self.workers],
            accounting_errors=self.accounting_errors(),
            checks=self.checks.to_json(),
            prefix=None if self.prefix is None else json_safe(self.prefix.summary()),
            periodic=[
                {"name": p.name, "ticks": p.ticks, "ok": p.ok, "problems": list(p.problems)}
                for p in self.periodic
            ],
            dependencies=None if self.dependencies is None else json_safe(self.dependencies),
        )
        return data


def json_safe(value: Any) -> Any:
    """Dataclasses, enums, tuples and int-keyed dicts as plain JSON values."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_safe(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_asdict"):  # a NamedTuple (Lease, …)
        return {k: json_safe(v) for k, v in value._asdict().items()}
    if isinstance(value, Verdict):
        return value.value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


# -- the replay ------------------------------------------------------------------------------


@dataclass
class _Replay:
    """The fold plus the bookkeeping the report needs beyond the fold's own state."""

    state: ClaimState = field(default_factory=ClaimState)
    workers: dict[str, WorkerLine] = field(default_factory=dict)
    claims_per_task: Counter[int] = field(default_factory=Counter)
    won_tasks: set[int] = field(default_factory=set)
    last_at: dict[int, int] = field(default_factory=dict)  # open claim -> its last record's at
    refs: dict[int, list[RecordRef]] = field(default_factory=dict)
    done_position: dict[int, int] = field(default_factory=dict)
    resolved: dict[int, int] = field(default_factory=dict)  # a later task of a key -> first
    takeovers: list[Takeover] = field(default_factory=list)
    stale: list[StaleCompletion] = field(default_factory=list)
    worked_twice: dict[int, None] = field(default_factory=dict)  # ordered set
    dead: list[DeadTask] = field(default_factory=list)
    lost_by_reason: Counter[str] = field(default_factory=Counter)
    renew_margins: list[int] = field(default_factory=list)
    done_margins: list[int] = field(default_factory=list)
    malformed: list[int] = field(default_factory=list)
    impossible_times: list[int] = field(default_factory=list)
    clock: ClockWatch = field(default_factory=ClockWatch)
    clock_jumps: list[ClockJump] = field(default_factory=list)
    checker: QueueChecker = field(default_factory=QueueChecker)
    records: int = 0
    attempts: int = 0
    wins: int = 0
    renewals: int = 0
    renewals_refused: int = 0
    completions: int = 0
    completions_accepted: int = 0
    fails_accepted: int = 0
    fails_stale: int = 0
    cancelled_unclaimed: int = 0  # tasks a CANCEL made dead before any claim won them
    prefix: Prefix | None = None  # the compacted history this replay continues from
    won_before: int = 0  # tasks won in the prefix and closed there (done or dead)

    @classmethod
    def start_from(cls, prefix: Prefix) -> _Replay:
        """A replay that continues from a compacted prefix (queue_worker.history.prefix): its fold,
        its counters, and what the checks need of the tasks still open at its end."""
        replay = cls(state=ClaimState.restore(prefix.state), prefix=prefix)
        for name in PREFIX_COUNTERS:
            setattr(replay, name, getattr(prefix, name))
        replay.lost_by_reason.update(dict(prefix.lost_by_reason))
        snap = prefix.state
        # (a task closes only once won, but for those a CANCEL made dead unclaimed)
        replay.won_before = snap.done_count + snap.dead_count - prefix.cancelled_unclaimed
        replay.worked_twice = dict.fromkeys(prefix.worked_twice)
        checker = replay.checker
        dead = {t for t, _ in snap.dead}
        closed = itertools.chain(range(snap.watermark), snap.closed_above)
        for t in closed:
            if t in dead:
                checker.dead.add(t)
            else:
                checker.done[t] = 1
        for o in snap.open:
            if o.attempts:
                replay.won_tasks.add(o.task)
                checker.wins[o.task] = o.attempts
            if o.holder is not None:
                h = o.holder
                checker.held.add(o.task)
                checker.won_claims.add(h.claim)
                replay.last_at[h.claim] = h.at
                replay.ref(o.task, RecordRef(h.claim, "CLAIM", h.worker, h.at, Verdict.WON))
            elif o.attempts:
                checker.waiting.add(o.task)
        return replay

    def to_prefix(self, position: int, tasks: int) -> Prefix:
        """This replay as the prefix of a log compacted up to `position` (`tasks` published
        before the retained tasks records)."""
        before = self.prefix
        return Prefix(
            position,
            tasks,
            self.state.snapshot(),
            **{name: getattr(self, name) for name in PREFIX_COUNTERS},
            takeovers=len(self.takeovers) + (before.takeovers if before else 0),
            stale_completions=len(self.stale) + (before.stale_completions if before else 0),
            malformed=len(self.malformed) + self._malformed_before,
            worked_twice=tuple(self.worked_twice),
            lost_by_reason=tuple(sorted(self.lost_by_reason.items())),
        )

    @property
    def _malformed_before(self) -> int:
        return 0 if self.prefix is None else self.prefix.malformed

    def worker(self, name: str, at: int) -> WorkerLine:
        line = self.workers.get(name)
        if line is None:
            line = self.workers[name] = WorkerLine(name, first_at=at, last_at=at)
        line.first_at = min(line.first_at, at)
        line.last_at = max(line.last_at, at)
        return line

    def ref(self, task: int, ref: RecordRef) -> None:
        self.refs.setdefault(task, []).append(ref)

    def apply(self, record: ClaimsRecord, position: int) -> Outcome:
        self.records += 1
        # The holder before the record: a renewal's margin is measured against the lease it
        # extends, which the fold replaces as it applies the record.
        before = None if isinstance(record, Unknown) else self.state.holder(record.task)
        outcome = self.state.apply(record, position)
        self.checker.apply(record, outcome)
        if isinstance(record, Claim):
            self._claim(record, outcome)
        elif isinstance(record, Renew):
            self._renew(record, outcome, before)
        elif isinstance(record, Done):
            self._done(record, outcome)
        elif isinstance(record, Fail):
            self._fail(record, outcome)
        elif record.code == MALFORMED:
            self.malformed.append(position)
        if not isinstance(record, Unknown) and not _times_are_dates(record):
            self.impossible_times.append(position)
        jump = self.clock.see(position, record)
        if jump is not None:
            self.clock_jumps.append(jump)
        return outcome

    def _claim(self, r: Claim, outcome: Outcome) -> None:
        line = self.worker(r.worker, r.at)
        line.attempts += 1
        self.attempts += 1
        self.claims_per_task[r.task] += 1
        if not outcome.verdict.won:
            line.lost += 1
            self.lost_by_reason[outcome.verdict.value] += 1
            return
        line.won += 1
        self.wins += 1
        self.won_tasks.add(r.task)
        self.last_at[outcome.position] = r.at
        self.ref(r.task, RecordRef(outcome.position, "CLAIM", r.worker, r.at, outcome.verdict))
        previous = outcome.previous
        if outcome.verdict is Verdict.TAKEOVER and previous is not None:
            line.takeovers += 1
            victim_last = self.last_at.pop(previous.claim, previous.at)
            self.takeovers.append(
                Takeover(
                    r.task,
                    outcome.position,
                    r.at,
                    r.worker,
                    previous.worker,
                    previous.claim,
                    previous.expiry,
                    victim_last,
                )
            )

    def _renew(self, r: Renew, outcome: Outcome, before: Lease | None) -> None:
        line = self.worker(r.worker, r.at)
        if outcome.verdict is Verdict.RENEWED:
            line.renewals += 1
            self.renewals += 1
            self.last_at[r.claim] = r.at
            if before is not None:
                self.renew_margins.append(before.expiry - r.at)
        else:
            line.leases_lost += 1
            self.renewals_refused += 1

    def _done(self, r: Done, outcome: Outcome) -> None:
        line = self.worker(r.worker, r.at)
        self.completions += 1
        self.ref(r.task, RecordRef(outcome.position, "DONE", r.worker, r.at, outcome.verdict))
        if outcome.verdict is Verdict.DONE:
            line.done += 1
            self.completions_accepted += 1
            self.done_position[r.task] = outcome.position
            first = resolved_to(r.result)
            if first is not None:
                self.resolved[r.task] = first
            self.last_at.pop(r.claim, None)
            if outcome.holder is not None:
                self.done_margins.append(outcome.holder.expiry - r.at)
            return
        line.stale += 1
        # The handler ran only if the claim it names won, for this task, by this worker; it
        # ran *twice* only if another claim also won the task (a takeover). A DONE repeated
        # under the claim that already completed the task is stale, but no work was redone.
        wins = [ref for ref in self.refs.get(r.task, ()) if ref.kind == "CLAIM"]
        claim_won = any(ref.position == r.claim and ref.worker == r.worker for ref in wins)
        other_won = any(ref.position != r.claim for ref in wins)
        self.stale.append(
            StaleCompletion(
                r.task,
                outcome.position,
                r.worker,
                r.claim,
                claim_won,
                outcome.holder,
                self.done_position.get(r.task),
            )
        )
        if claim_won and other_won:
            self.worked_twice[r.task] = None

    def _fail(self, r: Fail, outcome: Outcome) -> None:
        line = self.worker(r.worker, r.at)
        if outcome.verdict is Verdict.STALE_FAIL:
            self.fails_stale += 1
            return
        if type(r) is Cancel:  # ends a win only when a claim held the task
            if r.task not in self.won_tasks:
                self.cancelled_unclaimed += 1
            if outcome.holder is not None:
                self.fails_accepted += 1
        else:
            self.fails_accepted += 1
        self.last_at.pop(r.claim, None)
        self.ref(r.task, RecordRef(outcome.position, "FAIL", r.worker, r.at, outcome.verdict))
        if outcome.verdict is Verdict.DEAD:
            line.dead += 1
            self.dead.append(DeadTask(r.task, outcome.position, r.worker, r.error))
        else:
            line.released += 1

    def periodic(self, keyed: list[tuple[int, str]]) -> tuple[PeriodicProof, ...]:
        """The periodic ticks' proof (`periodic_proof.check_ticks`) of the keyed tasks."""
        accepted: dict[int, Completion] = {}
        reruns: dict[int, list[int]] = {}
        for task, _ in keyed:
            done = self.done_position.get(task)
            held = self._accepted_claim(task)
            if done is not None:
                accepted[task] = Completion(done, self.resolved.get(task))
            for s in self.stale:
                if s.task == task and s.claim_won and (done is None or s.claim != held):
                    reruns.setdefault(task, []).append(s.position)
        return check_ticks(keyed, accepted, reruns)

    def _accepted_claim(self, task: int) -> int | None:
        """The claim `task`'s accepted DONE acted under: the last winning CLAIM before it
        (rule 2); None when it is not done."""
        done = self.done_position.get(task)
        if done is None:
            return None
        claims = (ref.position for ref in self.refs.get(task, ()) if ref.kind == "CLAIM")
        return max((c for c in claims if c < done), default=None)

    def dependencies(
        self, after: list[tuple[int, tuple[int, ...]]], first_retained: int
    ) -> DependencyProof | None:
        """The dependencies' proof (`dependency_proof.check_dependencies`)."""
        claims = {t: c for t, _ in after if (c := self._accepted_claim(t)) is not None}
        dead = self.state.dead_tasks()
        return check_dependencies(after, self.done_position, claims, dead, first_retained)

    def report(self, tasks_published: int) -> Report:
        st = self.state
        held = tuple(HeldTask(t, lease) for t, lease in sorted(st.held_tasks()))
        first = 0 if self.prefix is None else self.prefix.tasks  # (the retained tasks)
        histogram: Counter[int] = Counter(
            self.claims_per_task.get(t, 0) for t in range(first, tasks_published)
        )
        unpublished = tuple(sorted(t for t in self.claims_per_task if t >= tasks_published))
        # Released by a FAIL and not claimed since: open, unheld, once won.
        waiting = sum(
            1
            for t in self.won_tasks
            if (open_task := st.task_state(t)) is not None and open_task.holder is None
        )
        return Report(
            tasks_published=tasks_published,
            claims_records=self.records,
            claims_position=st.position if self.records else None,
            workers=tuple(sorted(self.workers.values(), key=lambda w: (w.first_at, w.worker))),
            tasks_done=st.done_count,
            tasks_held=st.held_count,
            tasks_dead=st.dead_count,
            tasks_won=self.won_before + len(self.won_tasks),
            tasks_waiting=waiting,
            attempts=self.attempts,
            wins=self.wins,
            lost=self.attempts - self.wins,
            lost_by_reason=dict(self.lost_by_reason),
            takeovers=tuple(self.takeovers),
            renewals=self.renewals,
            renewals_refused=self.renewals_refused,
            completions=self.completions,
            completions_accepted=self.completions_accepted,
            stale_completions=tuple(self.stale),
            fails_accepted=self.fails_accepted,
            fails_stale=self.fails_stale,
            cancelled_unclaimed=self.cancelled_unclaimed,
            dead=tuple(self.dead),
            held=held,
            worked_twice=tuple(
                WorkedTwice(t, tuple(self.refs.get(t, ()))) for t in self.worked_twice
            ),
            attempts_histogram=dict(histogram),
            renewal_margin=Margin.of(self.renew_margins),
            completion_margin=Margin.of(self.done_margins),
            unpublished_tasks=unpublished,
            # (the fold's count includes the prefix's malformed records: so does this one)
            unknown_records=st.unknown_count - len(self.malformed) - self._malformed_before,
            malformed=tuple(self.malformed),
            impossible_times=tuple(self.impossible_times),
            clock_jumps=tuple(self.clock_jumps),
            checks=self.checker.result(tasks_published),
            prefix=self.prefix,
        )


def _times_are_dates(r: Claim | Renew | Done | Fail) -> bool:
    if not is_date(r.at):
        return False
    if isinstance(r, Claim | Renew):
        return is_date(r.at + r.lease)
    if isinstance(r, Fail) and r.retry_at is not None:
        return is_date(r.retry_at)
    return True


def fold_prefix(
    prefix: Prefix | None, claims: Iterable[tuple[int, ClaimsRecord]], position: int, tasks: int
) -> Prefix:
    """The prefix of a log compacted up to `position`: `prefix` (the one compacted before,
    None: none) continued over `claims`, the records from its end to `position`."""
    replay = _Replay() if prefix is None else _Replay.start_from(prefix)
    for at, record in claims:
        replay.apply(record, at)
    return replay.to_prefix(position, tasks)


def build_report(tasks_published: int, claims: Iterable[tuple[int, ClaimsRecord]]) -> Report:
    """The report of a run: how many tasks its tasks topic holds, and its claims records
    with their positions, in log order."""
    replay = _Replay()
    for position, record in claims:
        replay.apply(record, position)
    return replay.report(tasks_published)


# -- reading the logs ------------------------------------------------------------------------


def _check_pair(location: str | Path) -> tuple[str, ...]:
    """Raise LogError unless `location` holds the tasks and the claims log of one queue,
    each with every record since its start that nothing else accounts for
    (`Log.verify_history`: LostHistoryError); return what that verified."""
    tasks, claims = open_topics(location, read_only=True)
    with tasks, claims:
        said = (tasks.verify_history(), claims.verify_history())
    return tuple(line for line in said if line is not None)


def load_report(location: str | Path, up_to: int | None = None) -> Report:
    """Replay the logs at `location` (a data directory or a log URL).

    Raises ReportInputError for a location without logs or a damaged log (the message of a
    CorruptLogError names the file and the byte offset).
    """
    try:
        if not has_logs(location):
            raise ReportInputError(missing_logs_text(location))
        # Both logs, of one queue (their identity is checked as they open), or nothing.
        history_verified = _check_pair(location)
        compacted = compacted_prefix(location)
        replay, claims_start, tasks_start, before, segments = _Replay(), None, None, 0, 0
        if compacted is not None:
            prefix, claims_start, tasks_start, segments = compacted
            replay, before = _Replay.start_from(prefix), prefix.tasks
        claims_last = claims_start
        for position, record in read_claims(location, up_to, claims_start):
            replay.apply(record, position)
            claims_last = position
        # after the claims: a live queue only grows
        options: list[tuple[int, TaskRecord]] = []  # (index among those counted, record)
        counted, tasks_last = counted_tasks(location, tasks_start, options)
        published = before + counted
        # what the reads could not see: every segment's length, and the bytes after the
        # last record (the reads checked every frame before where they stopped)
        verified = verify_logs(location, tasks_last or tasks_start, claims_last)
        highest = replay.state.highest_closed()
        if highest is not None and highest >= published:
            raise ReportInputError(
                f"the tasks log at {location} holds {published} tasks, but its claims log "
                f"closed task {highest}: the tasks log was cut short or replaced"
            )
        report = replay.report(published)
        return dataclasses.replace(
            report,
            compacted_segments=segments,
            verified=verified,
            history_verified=history_verified,
            periodic=replay.periodic([(before + i, t.key) for i, t in options if t.key]),
            dependencies=replay.dependencies(
                [(before + i, t.after) for i, t in options if t.after], before
            ),
        )
    except (LogError, OSError) as e:  # a damaged or foreign log; a file we may not read
        raise ReportInputError(str(e)) from e
