"""ClaimState: the verdict of the claims log, as a pure fold.

Rules this module keeps (docs/protocol.md, section 3, "The verdict"):

Rule 0. Everything that decides who owns a task lives in `ClaimState.apply`. It reads no
        clock, no file and no other topic: every reader that applies the same prefix of the
        claims log reaches the same state and the same outcome for every record.
Rule 1. CLAIM(t, w, at, lease) loses when t is done or dead; loses when another claim holds t
        and `at` < that holder's expiry; loses when `at` < a retry_at set by FAIL; otherwise
        it wins: the claim (its position) holds t until `at` + lease. A win over an expired
        holder is a TAKEOVER.
Rule 2. RENEW, DONE and FAIL name the claim they act under (its log position: the fencing
        token) and are accepted only from the current holder: same claim position, same
        worker. Owners are claims, not names: two workers that share a name cannot act on
        each other's claim.
Rule 3. RENEW accepted: expiry becomes `at` + lease. Otherwise the lease is lost.
Rule 4. DONE accepted: t is done, for ever. Otherwise it is STALE: its result is discarded
        (and the report counts the work as done twice when that claim had won).
Rule 5. FAIL accepted: the holder lets t go at once; t may be claimed again from `retry_at`,
        or never (retry_at None: dead). The writer decides which; the fold obeys.
        The fold counts each task's winning claims (`attempts`), however the attempt ends: a
        takeover after the holder died is one too. Writers measure max_attempts by it: an
        exception's or a time-out's FAIL, and the dead FAIL of a claim that finds the
        attempts used up by workers that died (queue_worker.worker.handlers, "Attempts").
Rule 6. A record of an unknown type changes nothing but the position.
Rule 7. Expiry is judged by the records' own timestamps. The reader's clock enters only
        through `claimable(now)`: which tasks a worker may *try* for.

Memory stays small with long logs: closed (done or dead) tasks below a watermark are kept
as one integer, and per-task state exists only for tasks that are open and have been claimed.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple

from queue_worker.protocol.records import (
    MAX_TASK_ID,
    Cancel,
    Claim,
    ClaimsRecord,
    Done,
    Fail,
    Renew,
    Unknown,
)


class Verdict(enum.Enum):
    """What one claims record did. The value is the word people read in reports."""

    WON = "won"
    TAKEOVER = "takeover"
    LOST_HELD = "lost: held"
    LOST_DONE = "lost: done"
    LOST_DEAD = "lost: dead"
    LOST_BACKOFF = "lost: backoff"
    RENEWED = "renewed"
    LEASE_LOST = "lease lost"
    DONE = "done"
    STALE_DONE = "stale done"
    RELEASED = "released"
    DEAD = "dead"
    STALE_FAIL = "stale fail"
    UNKNOWN = "unknown"

    @property
    def won(self) -> bool:
        return self is Verdict.WON or self is Verdict.TAKEOVER

    @property
    def lost(self) -> bool:
        """A CLAIM that did not win (the task was held, closed, or backing off)."""
        return self in _LOST


#: the verdicts of a CLAIM that lost (named here, not read off the words people see)
_LOST: Final = frozenset(
    {Verdict.LOST_HELD, Verdict.LOST_DONE, Verdict.LOST_DEAD, Verdict.LOST_BACKOFF}
)

#: `ClaimState.apply_all` holds back at most this many winning CLAIMs for their DONEs: in a
#: drain's log a task's DONE comes a few records after its CLAIM (two for each other
#: worker, a claim appended ahead with each DONE)
PENDING_CLAIMS: Final = 64


# Lease and Outcome are NamedTuples, not frozen dataclasses: every record read makes one,
# and a frozen dataclass builds itself through object.__setattr__ (4x slower, measured).
# The fold's two commonest verdicts (WON, DONE) build theirs with `_new` (tuple.__new__,
# every field given): a NamedTuple's own __new__ is a Python function that only forwards
# its arguments, and costs twice as much (0.34 vs 0.15 µs here).
_new: Final = tuple.__new__


class Lease(NamedTuple):
    """A winning claim: who holds the task under which claim, and until when."""

    claim: int  # the CLAIM's log position: the fencing token
    worker: str
    at: int
    expiry: int


class Outcome(NamedTuple):
    """The verdict on one record, with what a reader needs to explain it.

    `holder` is the lease that decided the verdict: the holder a lost claim ran into, the
    holder when a renewal/completion was refused (None when nobody held the task), and the
    new lease for a win, a takeover or a renewal. A TAKEOVER's expired lease, the one it
    replaced, is `previous` (None for every other verdict).
    """

    verdict: Verdict
    position: int
    task: int | None = None
    worker: str | None = None
    holder: Lease | None = None
    previous: Lease | None = None  # for a TAKEOVER: the expired lease it replaced
    retry_at: int | None = None  # for LOST_BACKOFF and RELEASED


# TaskState and ClaimState are plain classes with __slots__, not dataclasses: importing
# `dataclasses` (it imports inspect, ast, dis, tokenize) and building the classes was
# ~15 ms of every command that folds the claims log (`qw status`, `task`, `why`).


class TaskState:
    """An open task that has been claimed at least once."""

    __slots__ = ("attempts", "holder", "last_error", "retry_at")

    def __init__(
        self,
        holder: Lease | None = None,
        attempts: int = 0,  # winning claims so far
        retry_at: int | None = None,
        last_error: str | None = None,
    ) -> None:
        self.holder = holder
        self.attempts = attempts
        self.retry_at = retry_at
        self.last_error = last_error

    def _fields(self) -> tuple[Lease | None, int, int | None, str | None]:
        return (self.holder, self.attempts, self.retry_at, self.last_error)

    def __eq__(self, other: object) -> bool:  # field by field, as a dataclass compares
        if not isinstance(other, TaskState):
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        holder, attempts, retry_at, last_error = self._fields()
        return (
            f"TaskState(holder={holder!r}, attempts={attempts!r}, retry_at={retry_at!r}, "
            f"last_error={last_error!r})"
        )


class OpenTask(NamedTuple):
    """An open task that has been claimed, as a `ClaimSnapshot` holds it."""

    task: int
    holder: Lease | None
    attempts: int
    retry_at: int | None
    last_error: str | None


class ClaimSnapshot(NamedTuple):
    """Everything a ClaimState holds, as immutable values (what a checkpoint saves).

    The held count is not in it: `ClaimState.restore` counts the holders again, so that it
    cannot disagree with them. `dead` and `open` keep the state's order (`dead_tasks` and
    `held_tasks` iterate in it), so a restored state answers exactly as the original.

    `failed_count` is exact only when `failed_exact`; otherwise it counts the FAILs accepted
    since a fold restored a snapshot that did not know them (a version-3 checkpoint:
    `queue_worker.history.checkpoint`), a lower bound. (Defaults: a snapshot built without them
    knows nothing of the FAILs.)
    """

    position: int
    done_count: int
    dead_count: int
    unknown_count: int
    watermark: int
    closed_above: tuple[int, ...]
    dead: tuple[tuple[int, str], ...]
    open: tuple[OpenTask, ...]
    failed_count: int = 0
    failed_exact: bool = False


#: ClaimState's fields, in the order `_fields` gives them (its repr names them)
_STATE_FIELDS: Final = (
    "position",
    "done_count",
    "dead_count",
    "unknown_count",
    "watermark",
    "_closed_above",
    "_dead",
    "_open",
    "_held",
    "failed_count",
    "failed_exact",
)


class ClaimState:
    """The fold over the claims log. Apply records in log order with their positions."""

    __slots__ = (
        "_closed_above",
        "_dead",
        "_held",
        "_open",
        "dead_count",
        "done_count",
        "failed_count",
        "failed_exact",
        "position",
        "unknown_count",
        "watermark",
    )

    def __init__(
        self,
        position: int = -1,  # the position of the last record applied
        done_count: int = 0,
        dead_count: int = 0,
        unknown_count: int = 0,
        watermark: int = 0,
        failed_count: int = 0,
        failed_exact: bool = True,
    ) -> None:
        self.position = position
        self.done_count = done_count
        self.dead_count = dead_count
        self.unknown_count = unknown_count
        # FAILs accepted (released for a retry, or dead): one answer for every reader that
        # shows "failed". Exact when the fold began at the log's first record or from a
        # snapshot that knew them; otherwise those since it began (`ClaimSnapshot`).
        self.failed_count = failed_count
        self.failed_exact = failed_exact
        # every task below `watermark` is closed (done or dead); closed tasks above it:
        self.watermark = watermark
        self._closed_above: set[int] = set()
        self._dead: dict[int, str] = {}  # dead task -> its last error
        self._open: dict[int, TaskState] = {}
        self._held = 0

    def _fields(self) -> tuple[object, ...]:
        return (
            self.position,
            self.done_count,
            self.dead_count,
            self.unknown_count,
            self.watermark,
            self._closed_above,
            self._dead,
            self._open,
            self._held,
            self.failed_count,
            self.failed_exact,
        )

    def __eq__(self, other: object) -> bool:  # field by field, as a dataclass compares
        if not isinstance(other, ClaimState):
            return NotImplemented
        return self._fields() == other._fields()

    def __repr__(self) -> str:
        shown = ", ".join(f"{n}={v!r}" for n, v in zip(_STATE_FIELDS, self._fields(), strict=True))
        return f"ClaimState({shown})"

    # -- the fold --------------------------------------------------------------------------

    def apply(self, record: ClaimsRecord, position: int) -> Outcome:
        """Apply one record read at `position`; return its verdict."""
        self.position = position
        if isinstance(record, Claim):
            return self._claim(record, position)
        if isinstance(record, Renew):
            return self._renew(record, position)
        if isinstance(record, Done):
            return self._done(record, position)
        if isinstance(record, Fail):
            return self._fail(record, position)
        assert isinstance(record, Unknown)
        self.unknown_count += 1
        return Outcome(Verdict.UNKNOWN, position)

    def apply_all(
        self,
        records: Sequence[ClaimsRecord],
        positions: Sequence[int],
        others: list[tuple[ClaimsRecord, Outcome]] | None = None,
    ) -> None:
        """`apply` each record at its position, in order, without building the outcomes:
        what a reader that only catches up needs (every worker folds every record).
        `others`, when given, receives each record that went through `apply` with its
        outcome (every verdict but WON for a first CLAIM and DONE for its holder's DONE):
        for a reader that reports the uncommon verdicts (the supervisor's monitor).

        The two commonest cases are `_claim` and `_done` inlined, with exactly their effect
        on the state: a CLAIM of a task nobody has claimed yet (it wins), and a DONE from the
        holder (accepted). Every other record goes through `apply` itself, so the rules stay
        in one place. (2.6× faster than `apply` a record at a time on a replay, measured.)

        A winning CLAIM is held back (`pending`, up to PENDING_CLAIMS of them, oldest
        first): when its holder's DONE of it (the claim's position, the claim's worker:
        accepted) comes while it is held, the task closes with no lease or task state built
        for it and dropped at once (in a drain's log a task's DONE follows its CLAIM a few
        records later, the other workers' records between). Every held claim's effect lands,
        in their order, before any record goes through `apply`, when more are held than the
        limit (the oldest), and at the end whatever happens: `apply` never sees the state
        without them, and the open tasks keep the order of their claims.
        """
        open_ = self._open
        closed = self._closed_above
        find = open_.get
        # the classes in locals: each use of a module global is a dict lookup
        claim_type, done_type = Claim, Done
        position = self.position
        # The newest held claim in two locals (a drain by one worker puts each DONE right
        # after its CLAIM: no dict touched), the older ones in `pending`, oldest first.
        last: Claim | None = None
        last_position = -1
        pending: dict[int, tuple[Claim, int]] = {}  # task -> its winning CLAIM, position
        try:
            for record, position in zip(records, positions, strict=True):
                if type(record) is claim_type:
                    task = record.task
                    # not closed (above the watermark, not closed above it), never claimed
                    if (
                        task >= self.watermark
                        and task not in closed
                        and task not in open_
                        and task not in pending
                        and (last is None or task != last.task)
                    ):
                        if last is not None:
                            pending[last.task] = (last, last_position)
                            if len(pending) > PENDING_CLAIMS:
                                self._won_oldest(pending)
                        last, last_position = record, position
                        continue
                elif type(record) is done_type:
                    task = record.task
                    if last is not None and task == last.task:
                        if record.claim == last_position and record.worker == last.worker:
                            last = None  # `_claim` then `_done` accepted: closed
                            self.done_count += 1
                            self._pass(task)
                            continue
                    elif task in pending:
                        claim, claim_position = pending[task]
                        if record.claim == claim_position and record.worker == claim.worker:
                            del pending[task]  # as above
                            self.done_count += 1
                            self._pass(task)
                            continue
                    else:
                        st = find(task)
                        if st is not None:
                            h = st.holder
                            # the holder's claim, from the holder's worker: accepted
                            if (
                                h is not None
                                and h.claim == record.claim
                                and h.worker == record.worker
                            ):
                                del open_[task]
                                self._held -= 1
                                self.done_count += 1
                                self._pass(task)
                                continue
                # any other record: every held claim folded first, in order
                while pending:
                    self._won_oldest(pending)
                if last is not None:
                    self._won(last, last_position)
                    last = None
                outcome = self.apply(record, position)
                if others is not None:
                    others.append((record, outcome))
        finally:
            while pending:
                self._won_oldest(pending)
            if last is not None:
                self._won(last, last_position)
        self.position = position

    def _won_oldest(self, pending: dict[int, tuple[Claim, int]]) -> None:
        """Fold the oldest winning CLAIM `apply_all` holds back."""
        claim, position = pending.pop(next(iter(pending)))
        self._won(claim, position)

    def _won(self, r: Claim, position: int) -> None:
        """`_claim`'s effect for a CLAIM of a task nobody has claimed yet (`apply_all`)."""
        at = r.at
        self._open[r.task] = TaskState(_new(Lease, (position, r.worker, at, at + r.lease)), 1)
        self._held += 1

    def _pass(self, task: int) -> None:
        """`_close`'s effect on the closed tasks for `task`, done, no longer open: add it to
        them, then advance the watermark over the closed run (the task at the watermark is
        not added, only passed)."""
        watermark = self.watermark
        closed = self._closed_above
        if task == watermark:
            watermark += 1
        else:
            closed.add(task)
        while watermark in closed:
            closed.discard(watermark)
            watermark += 1
        self.watermark = watermark

    def _claim(self, r: Claim, position: int) -> Outcome:
        t = r.task
        if 0 <= t < self.watermark or t in self._closed_above:  # is_closed, inlined: hot
            verdict = Verdict.LOST_DEAD if t in self._dead else Verdict.LOST_DONE
            return Outcome(verdict, position, t, r.worker)
        st = self._open.get(t)
        if st is None:
            st = self._open[t] = TaskState()
        previous = st.holder
        if previous is not None and r.at < previous.expiry:
            return Outcome(Verdict.LOST_HELD, position, t, r.worker, previous)
        if st.retry_at is not None and r.at < st.retry_at:
            return Outcome(Verdict.LOST_BACKOFF, position, t, r.worker, retry_at=st.retry_at)
        lease = _new(Lease, (position, r.worker, r.at, r.at + r.lease))
        if previous is None:
            self._held += 1
        st.holder = lease
        st.attempts += 1
        st.retry_at = None
        if previous is not None:
            return Outcome(Verdict.TAKEOVER, position, t, r.worker, lease, previous)
        return _new(Outcome, (Verdict.WON, position, t, r.worker, lease, None, None))

    def _holder_of(self, task: int, claim: int, worker: str) -> TaskState | None:
        st = self._open.get(task)
        if st is None or st.holder is None:
            return None
        if st.holder.claim != claim or st.holder.worker != worker:
            return None
        return st

    def _current(self, task: int) -> Lease | None:
        st = self._open.get(task)
        return None if st is None else st.holder

    def _renew(self, r: Renew, position: int) -> Outcome:
        st = self._holder_of(r.task, r.claim, r.worker)
        if st is None:
            return Outcome(Verdict.LEASE_LOST, position, r.task, r.worker, self._current(r.task))
        assert st.holder is not None
        st.holder = Lease(st.holder.claim, st.holder.worker, st.holder.at, r.at + r.lease)
        return Outcome(Verdict.RENEWED, position, r.task, r.worker, st.holder)

    def _done(self, r: Done, position: int) -> Outcome:
        st = self._holder_of(r.task, r.claim, r.worker)
        if st is None:
            return Outcome(Verdict.STALE_DONE, position, r.task, r.worker, self._current(r.task))
        lease = st.holder
        self._close(r.task, dead_error=None)
        self.done_count += 1
        return _new(Outcome, (Verdict.DONE, position, r.task, r.worker, lease, None, None))

    def _fail(self, r: Fail, position: int) -> Outcome:
        if type(r) is Cancel:
            return self._cancel(r, position)
        st = self._holder_of(r.task, r.claim, r.worker)
        if st is None:
            return Outcome(Verdict.STALE_FAIL, position, r.task, r.worker, self._current(r.task))
        lease = st.holder
        self.failed_count += 1  # (not on the hot path: apply_all sends every FAIL here)
        if r.retry_at is None:
            self._close(r.task, dead_error=r.message)
            self.dead_count += 1
            return Outcome(Verdict.DEAD, position, r.task, r.worker, lease)
        st.holder = None
        self._held -= 1
        st.retry_at = r.retry_at
        st.last_error = r.message
        return Outcome(Verdict.RELEASED, position, r.task, r.worker, lease, retry_at=r.retry_at)

    def _cancel(self, r: Cancel, position: int) -> Outcome:
        """Rule 6: a CANCEL of an open task makes it dead, held or not (its holder's records
        are refused from now on); of a closed one, it changes nothing."""
        task = r.task
        if self.is_closed(task):
            return Outcome(Verdict.STALE_FAIL, position, task, r.worker, None)
        lease = self._current(task)
        if task not in self._open:  # never claimed: open it to close it
            self._open[task] = TaskState(None, 0)
        self._close(task, dead_error=r.message)
        self.dead_count += 1
        return Outcome(Verdict.DEAD, position, task, r.worker, lease)

    def _close(self, task: int, dead_error: str | None) -> None:
        st = self._open.pop(task)
        if st.holder is not None:
            self._held -= 1
        if dead_error is not None:
            self._dead[task] = dead_error
        self._closed_above.add(task)
        # Advance the watermark over the closed run so that, with tasks finishing roughly in
        # order, the sets above stay small however long the log grows.
        while self.watermark in self._closed_above:
            self._closed_above.discard(self.watermark)
            self.watermark += 1

    # -- snapshots (checkpoints) -------------------------------------------------------------

    def snapshot(self) -> ClaimSnapshot:
        """The state as immutable values: `ClaimState.restore` of it gives this state back."""
        return ClaimSnapshot(
            self.position,
            self.done_count,
            self.dead_count,
            self.unknown_count,
            self.watermark,
            tuple(self._closed_above),
            tuple(self._dead.items()),
            tuple(
                OpenTask(task, st.holder, st.attempts, st.retry_at, st.last_error)
                for task, st in self._open.items()
            ),
            self.failed_count,
            self.failed_exact,
        )

    @classmethod
    def restore(cls, snap: ClaimSnapshot) -> ClaimState:
        """The state `snap` was taken of. Raises ValueError for a snapshot that no fold
        reaches (a checkpoint is read from a file: it must not build a state that would
        give verdicts no replay gives)."""
        counts = (snap.done_count, snap.dead_count, snap.unknown_count, snap.failed_count)
        if min(*counts, snap.watermark) < 0:
            raise ValueError("a negative count or watermark")
        if snap.position < -1:
            raise ValueError(f"position {snap.position} is before the first record")
        # (no bound between the FAILs accepted and the dead: a CANCEL of a task nobody held
        # makes it dead with no FAIL accepted)
        state = cls(
            snap.position,
            snap.done_count,
            snap.dead_count,
            snap.unknown_count,
            snap.watermark,
            snap.failed_count,
            snap.failed_exact,
        )
        # A task id no record can name (records.py decodes one as malformed) means the
        # snapshot was taken by a fold that read such records: refused, so that its reader
        # replays the log and agrees with every other reader.
        ids = [*snap.closed_above, *(t for t, _ in snap.dead), *(o.task for o in snap.open)]
        if any(not 0 <= t <= MAX_TASK_ID for t in ids):
            raise ValueError(f"a task id outside 0..{MAX_TASK_ID}")
        state._closed_above = set(snap.closed_above)
        if len(state._closed_above) != len(snap.closed_above):
            raise ValueError("a task closed twice")
        # `_close` drains the watermark over every closed id: none at or below it stays above.
        if any(0 <= t <= snap.watermark for t in state._closed_above):
            raise ValueError("a closed task at or below the watermark is kept above it")
        # Each DONE or DEAD closes one task once (and every closed task was closed that way).
        if snap.done_count + snap.dead_count != snap.watermark + len(state._closed_above):
            raise ValueError("done + dead counts do not match the closed tasks")
        for task, error in snap.dead:
            if not state.is_closed(task) or task in state._dead:
                raise ValueError(f"dead task {task} is not closed, or dead twice")
            state._dead[task] = error
        if len(state._dead) != snap.dead_count:
            raise ValueError("the dead count does not match the dead tasks")
        for o in snap.open:
            if state.is_closed(o.task) or o.task in state._open:
                raise ValueError(f"open task {o.task} is closed, or open twice")
            if o.attempts < 0 or (o.holder is not None and o.holder.claim > snap.position):
                raise ValueError(f"open task {o.task}: bad attempts or a claim from the future")
            state._open[o.task] = TaskState(o.holder, o.attempts, o.retry_at, o.last_error)
            if o.holder is not None:
                state._held += 1
        return state

    # -- queries ---------------------------------------------------------------------------

    def is_closed(self, task: int) -> bool:
        """Done or dead: never claimable again."""
        return (0 <= task < self.watermark) or task in self._closed_above

    def highest_closed(self) -> int | None:
        """The largest id of a closed (done or dead) task; None when none is closed."""
        above = max(self._closed_above, default=-1)
        highest = max(self.watermark - 1, above)
        return highest if highest >= 0 else None

    def closed_from(self, first: int) -> int:
        """How many closed tasks have an id >= `first` (a query, for readers that count only
        the tasks published so far: the fold itself does not know the tasks log)."""
        below_watermark = max(0, self.watermark - max(first, 0))
        return below_watermark + sum(1 for t in self._closed_above if t >= first)

    def is_dead(self, task: int) -> bool:
        return task in self._dead

    def dead_error(self, task: int) -> str | None:
        return self._dead.get(task)

    def is_done(self, task: int) -> bool:
        return self.is_closed(task) and task not in self._dead

    def holder(self, task: int) -> Lease | None:
        """The winning claim that holds `task` now (it may have expired), or None."""
        return self._current(task)

    def task_state(self, task: int) -> TaskState | None:
        return self._open.get(task)

    def attempts(self, task: int) -> int:
        st = self._open.get(task)
        return 0 if st is None else st.attempts

    @property
    def held_count(self) -> int:
        """Tasks whose last winning claim has not finished or failed (expired or not)."""
        return self._held

    def held_tasks(self) -> Iterator[tuple[int, Lease]]:
        for task, st in self._open.items():
            if st.holder is not None:
                yield task, st.holder

    def dead_tasks(self) -> dict[int, str]:
        return dict(self._dead)

    # -- where the local clock enters --------------------------------------------------------

    def is_claimable(self, task: int, now: int) -> bool:
        """May a worker whose clock reads `now` try for `task`? (Known tasks only.)"""
        if self.is_closed(task):
            return False
        st = self._open.get(task)
        if st is None:
            return True
        if st.holder is not None and now < st.holder.expiry:
            return False
        return st.retry_at is None or now >= st.retry_at

    def claimable(self, now: int, known: int, start: int = 0) -> Iterator[int]:
        """Claimable tasks among ids 0..known-1 in id order, beginning at `start` and
        wrapping around: the only place the reader's clock (`now`, µs) is used."""
        low = self.watermark
        begin = max(low, min(start, known))
        for t in range(begin, known):
            if self.is_claimable(t, now):
                yield t
        for t in range(low, begin):
            if self.is_claimable(t, now):
                yield t

    def next_change(self, now: int) -> int | None:
        """The earliest time after `now` at which a held or backed-off task becomes
        claimable (a lease expiry or a retry time), or None: when an idle worker looks again."""
        soonest: int | None = None
        for st in self._open.values():
            for t in (st.holder.expiry if st.holder else None, st.retry_at):
                if t is not None and t > now and (soonest is None or t < soonest):
                    soonest = t
        return soonest
