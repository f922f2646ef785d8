"""The stepping engine of `qw replay`: the fold at any position of the tape, forwards and back.

`Stepper` applies the tape's records one at a time through its `Rules` (qw's: ClaimState),
so what it holds at index i is the fold of records 0..i: the state `qw report --at
POSITION` replays to (tests/test_replay.py holds the two equal). Its counters are the
verdicts counted as they come (done, takeovers, stale, lost …), nothing re-judged.

Stepping back cannot un-apply a record (a fold only goes forwards): the first pass over the
tape keeps a snapshot of the fold every `EVERY` records, and going to any index restores
the snapshot before it and applies at most `EVERY` records. The same pass lists the events
that matter (takeovers, lost leases, stale DONEs, FAILs, deaths, and the ops log's kills,
pauses and deaths), so `]` and `[` are a bisection. No terminal here: supervisor.replay.view
draws what `moment()` returns.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Final, NamedTuple

from queue_worker.names import worker_label
from queue_worker.ops import DEATH, KILL, PAUSE, OpRecord
from queue_worker.protocol.records import ClaimsRecord, Unknown
from queue_worker.protocol.state import Lease, Outcome, Verdict
from supervisor.replay.rules import QW_RULES, FoldState, Rules, Why
from supervisor.replay.tape import Tape

#: records between two snapshots of the fold: a step back applies at most this many
EVERY: Final = 2048

# the events `]` and `[` stop at
TAKEOVER: Final = "takeover"
LEASE_LOST: Final = "lease lost"
STALE: Final = "stale done"
FAIL: Final = "fail"
DEAD: Final = "dead"
EVENT_OF_VERDICT: Final = {
    Verdict.TAKEOVER: TAKEOVER,
    Verdict.LEASE_LOST: LEASE_LOST,
    Verdict.STALE_DONE: STALE,
    Verdict.RELEASED: FAIL,
    Verdict.STALE_FAIL: FAIL,
    Verdict.DEAD: DEAD,
}
#: the ops records that are events (a resume, a restart or a clock skew is not one)
OP_EVENTS: Final = frozenset({KILL, PAUSE, DEATH})


class Counters(NamedTuple):
    """The verdicts so far, counted."""

    done: int = 0
    takeovers: int = 0
    stale: int = 0  # DONEs refused
    lost: int = 0  # CLAIMs that did not win
    leases_lost: int = 0  # RENEWs refused
    released: int = 0  # FAILs accepted with a retry time
    dead: int = 0

    def plus(self, outcome: Outcome) -> Counters:
        v = outcome.verdict
        if v is Verdict.WON or v is Verdict.RENEWED or v is Verdict.UNKNOWN:
            return self
        if v is Verdict.DONE:
            return self._replace(done=self.done + 1)
        if v is Verdict.TAKEOVER:
            return self._replace(takeovers=self.takeovers + 1)
        if v is Verdict.STALE_DONE:
            return self._replace(stale=self.stale + 1)
        if v.lost:
            return self._replace(lost=self.lost + 1)
        if v is Verdict.LEASE_LOST:
            return self._replace(leases_lost=self.leases_lost + 1)
        if v is Verdict.RELEASED:
            return self._replace(released=self.released + 1)
        if v is Verdict.DEAD:
            return self._replace(dead=self.dead + 1)
        return self  # a stale FAIL


class Event(NamedTuple):
    """A moment that matters: the record at `place` had this verdict, or an ops record
    sits right after it (`op`)."""

    place: int  # the record's index on the tape
    kind: str
    op: OpRecord | None = None


class InPlay(NamedTuple):
    """A task held at this moment, as the fold holds it."""

    task: int
    lease: Lease  # holder, fencing token (`lease.claim`), expiry
    attempts: int  # winning claims of it so far
    left: int  # µs of lease left by the current record's clock (< 0: lapsed)


class Moment(NamedTuple):
    """What the screen shows at one index of the tape."""

    place: int  # the cursor's index on the tape; -1: before the first record
    total: int
    position: int | None
    record: ClaimsRecord | None
    outcome: Outcome | None
    why: Why | None
    now: int | None  # the current record's own clock (µs)
    counters: Counters
    in_play: tuple[InPlay, ...]
    ops: tuple[OpRecord, ...]  # the ops records that sit right after this record
    follow: str | None  # what is followed, in words
    #: with `--rules unfenced`: how the original's rules judge this record differently
    #: (None: alike), and how many records they judged differently so far
    unfenced: str | None = None
    differences: int | None = None


class Follow(NamedTuple):
    """A task or a worker followed: steps and jumps stop only at its records."""

    label: str  # "task 7", "w1·1234"
    task: int | None
    worker: str | None
    indices: Sequence[int]
    ops: frozenset[OpRecord] = frozenset()  # for a task: the ops done to its holders


class Stepper:
    """The fold of the tape at a cursor (`index`), moved by steps, jumps and goes."""

    def __init__(
        self, tape: Tape, rules: Rules = QW_RULES, every: int = EVERY, beside: bool = False
    ) -> None:
        """`beside`: also judge the tape by the original's unfenced rules
        (queue_worker.proof.unfenced), each record they judge differently an event."""
        self.tape = tape
        self.rules = rules
        self.beside = beside
        self.every = every
        self.follow: Follow | None = None
        state = rules.fresh()
        counters = Counters()
        snaps: list[tuple[object, Counters]] = [(rules.snapshot(state), counters)]
        events: list[Event] = []
        records, positions = tape.records, tape.positions
        # a span between snapshots at a time, through the fold's own fast path: the
        # verdicts that are not a first claim's WON or its holder's DONE come back to be
        # counted, and DONEs are counted by the fold itself
        for begin in range(0, len(records), every):
            end = min(len(records), begin + every)
            others: list[tuple[ClaimsRecord, Outcome]] = []
            state.apply_all(records[begin:end], positions[begin:end], others)
            for _, outcome in others:
                if outcome.verdict is not Verdict.DONE:
                    counters = counters.plus(outcome)
                kind = EVENT_OF_VERDICT.get(outcome.verdict)
                if kind is not None:
                    place = bisect.bisect_left(positions, outcome.position, begin, end)
                    events.append(Event(place, kind))
            counters = counters._replace(done=state.done_count)
            if end - begin == every:
                snaps.append((rules.snapshot(state), counters))
        for op, place in zip(tape.ops, tape.op_index, strict=True):
            if op.kind in OP_EVENTS:
                events.append(Event(place, op.kind, op))
        #: place -> the original's judgement of it, where it differs from qw's
        self.differences: dict[int, str] = {}
        if beside:
            from queue_worker.proof.unfenced import compare
            from supervisor.unfenced_text import difference_text

            place_of = {position: place for place, position in enumerate(positions)}
            for d in compare(zip(positions, records, strict=True)).differences:
                place = place_of[d.position]
                self.differences[place] = difference_text(d)
                events.append(Event(place, "unfenced differs"))
        self._difference_places = sorted(self.differences)
        events.sort(key=lambda e: e.place)  # (stable: a record's verdict before its ops)
        self._snaps = snaps
        self.events = tuple(events)
        self._event_index = [e.place for e in self.events]
        # the cursor: the state after records 0..index, and the outcome of the last
        self.index = len(records) - 1
        self._state: FoldState = state
        self._counters = counters
        self._outcome: Outcome | None = None
        if records:
            self._restart_at(self.index)

    # -- moving ----------------------------------------------------------------------------

    def seek(self, target: int) -> None:
        """Put the cursor at index `target` (clamped to -1 .. the last record)."""
        target = max(-1, min(len(self.tape) - 1, target))
        if target == self.index:
            return
        if target < self.index or target - self.index > self.every:
            self._restart_at(target)
            return
        self._apply_up_to(target)

    def _restart_at(self, target: int) -> None:
        """From the snapshot before `target`, apply up to it (at most `every` records)."""
        k = max(0, target) // self.every
        snap, counters = self._snaps[k]
        self._state = self.rules.restore(snap)
        self._counters = counters
        self._outcome = None
        self.index = k * self.every - 1
        self._apply_up_to(target)

    def _apply_up_to(self, target: int) -> None:
        records, positions = self.tape.records, self.tape.positions
        state, counters, outcome = self._state, self._counters, self._outcome
        for i in range(self.index + 1, target + 1):
            outcome = state.apply(records[i], positions[i])
            counters = counters.plus(outcome)
        if target > self.index:
            self._outcome = outcome
        self._counters = counters
        self.index = target

    def step(self, by: int) -> None:
        """`by` records forwards (> 0) or back (< 0); only the followed one's, if any."""
        if self.follow is None:
            self.seek(self.index + by)
            return
        indices = self.follow.indices
        if by > 0:
            at = bisect.bisect_right(indices, self.index) + by - 1
            if at < len(indices):
                self.seek(indices[at])
        else:
            at = bisect.bisect_left(indices, self.index) + by
            self.seek(indices[at] if at >= 0 else -1)

    def _matches(self, event: Event) -> bool:
        f = self.follow
        if f is None:
            return True
        if event.op is not None:
            if f.worker is not None:
                return self.tape.op_worker(event.op) == f.worker
            return event.op in f.ops
        record = self.tape.records[event.place]
        if isinstance(record, Unknown):
            return False
        return record.task == f.task if f.task is not None else record.worker == f.worker

    def next_event(self) -> Event | None:
        """Go to the next event after the cursor (of the followed one); None: there is none."""
        start = bisect.bisect_right(self._event_index, self.index)
        for event in self.events[start:]:
            if self._matches(event):
                self.seek(event.place)
                return event
        return None

    def previous_event(self) -> Event | None:
        """Go to the last event before the cursor; None: there is none."""
        end = bisect.bisect_left(self._event_index, self.index)
        for event in reversed(self.events[:end]):
            if self._matches(event):
                self.seek(event.place)
                return event
        return None

    def events_before(self, count: int) -> tuple[Event, ...]:
        """The last `count` events at or before the cursor (of the followed one), oldest
        first."""
        end = bisect.bisect_right(self._event_index, self.index)
        found: list[Event] = []
        for event in reversed(self.events[:end]):
            if len(found) == count:
                break
            if self._matches(event):
                found.append(event)
        return tuple(reversed(found))

    def events_here(self) -> tuple[Event, ...]:
        """The events at the cursor."""
        low = bisect.bisect_left(self._event_index, self.index)
        high = bisect.bisect_right(self._event_index, self.index)
        return self.events[low:high]

    def go_position(self, position: int) -> None:
        """To the last record at or before `position` (as `qw report --at` replays)."""
        self.seek(self.tape.index_at(position))

    def go_time(self, at: int) -> None:
        """To the last record written at or before `at` (µs, the records' clocks)."""
        self.seek(self.tape.index_at_time(at))

    def follow_text(self, text: str) -> str | None:
        """Follow what `text` names: a task ("7", "#7", "task 7") or a worker (its id or
        its label, w1·1234); "" stops following. Returns what went wrong, or None."""
        words = text.strip().removeprefix("task").strip().lstrip("#")
        if not words:
            self.follow = None
            return None
        tape = self.tape
        if words.isdigit():
            task = int(words)
            if task not in tape.by_task:
                return f"no record names task {task}"
            indices = tape.by_task[task]
            records = [tape.records[i] for i in indices]
            positions = [tape.positions[i] for i in indices]
            ops = self.rules.ops_about(task, records, positions, tape.ops)
            self.follow = Follow(f"task {task}", task, None, indices, frozenset(ops))
            return None
        wanted = text.strip()
        for worker in tape.by_worker:
            if wanted in (worker, worker_label(worker)):
                label = worker_label(worker)
                self.follow = Follow(label, None, worker, tape.by_worker[worker])
                return None
        return f"no task or worker {wanted!r} in this run (a task id, or a worker as w1·1234)"

    def state_before(self, block: int) -> FoldState:
        """The fold of the first `block` × `every` records (a snapshot, restored: the
        cursor does not move)."""
        return self.rules.restore(self._snaps[block][0])

    # -- what is shown ---------------------------------------------------------------------

    @property
    def counters(self) -> Counters:
        return self._counters

    @property
    def state(self) -> FoldState:
        return self._state

    def moment(self) -> Moment:
        """The screen's facts at the cursor."""
        tape, i = self.tape, self.index
        record = tape.records[i] if i >= 0 else None
        now: int | None = None
        why: Why | None = None
        if record is not None:
            now = tape.clock[i] if isinstance(record, Unknown) else record.at
            if not isinstance(record, Unknown):
                indices = tape.by_task[record.task]
                mine = indices[: bisect.bisect_right(indices, i)]
                why = self.rules.why(
                    record.task,
                    [tape.records[j] for j in mine],
                    [tape.positions[j] for j in mine],
                )
        state = self._state
        clock = now if now is not None else 0
        in_play = tuple(
            sorted(
                (
                    InPlay(task, lease, state.attempts(task), lease.expiry - clock)
                    for task, lease in state.held_tasks()
                ),
                key=lambda p: p.lease.claim,
            )
        )
        low = bisect.bisect_left(tape.op_index, i)
        high = bisect.bisect_right(tape.op_index, i)
        return Moment(
            i,
            len(tape),
            tape.positions[i] if i >= 0 else None,
            record,
            self._outcome if i >= 0 else None,
            why,
            now,
            self._counters,
            in_play,
            tape.ops[low:high],
            None if self.follow is None else self.follow.label,
            self.differences.get(i),
            bisect.bisect_right(self._difference_places, i) if self.beside else None,
        )


__all__ = ["EVERY", "Counters", "Event", "InPlay", "Moment", "Stepper"]
