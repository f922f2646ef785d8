"""The original design's rules, without fencing, and where they part from qw's on one log.

qw comes from `dev/queue-worker` (a Kotlin worker on a Kafka-like log): its `ClaimState`
folds the claims log as qw's does, but a DONE closes the task whoever wrote it, a lease
belongs to a worker's name, and nothing renews a lease. These are those rules, written once
and named as the original's (docs/protocol.md, section 3, "Unfenced: the original's rules"),
so that a real run can be judged again without fencing and every record on which the two
rule sets disagree can be shown:

Rule U1. CLAIM(t, w, at, lease) loses when t is done or dead; loses when another *name*
         holds t and `at` < that hold's expiry; loses when `at` < a retry_at set by FAIL;
         otherwise it wins: w holds t until `at` + lease (a CLAIM by the name that holds t
         wins too: owners are names). A win over an expired hold is a TAKEOVER.
Rule U2. RENEW changes nothing: the original has no renewal (the lease a CLAIM sets must
         outlast the work).
Rule U3. DONE naming t is accepted from anyone, whatever claim it names: t is done. A DONE
         of a task already done is accepted again ("done again"): the task is completed
         once more, its result delivered twice. Only a dead task refuses it.
Rule U4. FAIL is accepted from the name that holds t (any claim): it releases t until
         retry_at, or makes it dead (the original has no FAIL; this is qw's FAIL judged by
         name). CANCEL, as in qw: an open task becomes dead, held or not.
Rule U5. A record of an unknown type changes nothing but the position.

`UnfencedState.apply` reads no clock and no file, like `ClaimState.apply`; `RulesComparison`
steps both folds record by record and returns each record whose verdicts differ (RENEWs
aside: rule U2 ignores every one, and its effect shows in the CLAIMs after it).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import NamedTuple

from queue_worker.protocol.records import Cancel, Claim, ClaimsRecord, Done, Fail, Renew
from queue_worker.protocol.state import ClaimState, Lease, Outcome, Verdict


class UnfencedVerdict(enum.Enum):
    """What one record did under the original's rules; a word shared with `Verdict` means
    the same effect."""

    WON = "won"
    TAKEOVER = "takeover"
    LOST_HELD = "lost: held"
    LOST_DONE = "lost: done"
    LOST_DEAD = "lost: dead"
    LOST_BACKOFF = "lost: backoff"
    IGNORED = "ignored"  # a RENEW: no renewal (rule U2)
    DONE = "done"
    DONE_AGAIN = "done again"  # a DONE of a task already done: completed once more
    STALE_DONE = "stale done"  # a DONE of a dead task
    RELEASED = "released"
    DEAD = "dead"
    STALE_FAIL = "stale fail"
    UNKNOWN = "unknown"

    @property
    def accepted_done(self) -> bool:
        return self is UnfencedVerdict.DONE or self is UnfencedVerdict.DONE_AGAIN


class UnfencedOutcome(NamedTuple):
    """The verdict on one record under the original's rules. `holder` is the hold that
    decided it (the one a lost claim ran into; the new one for a win), `previous` the
    expired hold a TAKEOVER replaced, `completions` the task's accepted DONEs before this
    record (for LOST_DONE and DONE_AGAIN)."""

    verdict: UnfencedVerdict
    position: int
    task: int | None = None
    worker: str | None = None
    holder: Lease | None = None
    previous: Lease | None = None
    retry_at: int | None = None
    completions: tuple[int, ...] = ()


class _Task:
    __slots__ = ("completions", "dead", "holder", "retry_at")

    def __init__(self) -> None:
        self.holder: Lease | None = None  # `claim` is the CLAIM that set it: not a token
        self.retry_at: int | None = None
        self.completions: list[int] = []  # positions of the accepted DONEs
        self.dead = False

    def copy(self) -> _Task:
        other = _Task()
        other.holder, other.retry_at, other.dead = self.holder, self.retry_at, self.dead
        other.completions = list(self.completions)
        return other


class UnfencedState:
    """The fold of the claims log under the original's rules. Apply records in log order
    with their positions (as `ClaimState`)."""

    def __init__(self) -> None:
        self.position = -1
        self._tasks: dict[int, _Task] = {}

    def copy(self) -> UnfencedState:
        """An independent state equal to this one (a player keeps these as snapshots)."""
        other = UnfencedState()
        other.position = self.position
        other._tasks = {t: st.copy() for t, st in self._tasks.items()}
        return other

    def apply(self, record: ClaimsRecord, position: int) -> UnfencedOutcome:
        """Apply one record read at `position`; return its verdict."""
        self.position = position
        if isinstance(record, Claim):
            return self._claim(record, position)
        if isinstance(record, Renew):
            return UnfencedOutcome(UnfencedVerdict.IGNORED, position, record.task, record.worker)
        if isinstance(record, Done):
            return self._done(record, position)
        if isinstance(record, Fail):
            return self._fail(record, position)
        return UnfencedOutcome(UnfencedVerdict.UNKNOWN, position)

    def _task(self, task: int) -> _Task:
        st = self._tasks.get(task)
        if st is None:
            st = self._tasks[task] = _Task()
        return st

    def _claim(self, r: Claim, position: int) -> UnfencedOutcome:
        st = self._task(r.task)
        t, w = r.task, r.worker
        if st.dead:
            return UnfencedOutcome(UnfencedVerdict.LOST_DEAD, position, t, w)
        if st.completions:
            done = tuple(st.completions)
            return UnfencedOutcome(UnfencedVerdict.LOST_DONE, position, t, w, completions=done)
        previous = st.holder
        if previous is not None and previous.worker != w and r.at < previous.expiry:
            return UnfencedOutcome(UnfencedVerdict.LOST_HELD, position, t, w, previous)
        if st.retry_at is not None and r.at < st.retry_at:
            verdict = UnfencedVerdict.LOST_BACKOFF
            return UnfencedOutcome(verdict, position, t, w, retry_at=st.retry_at)
        st.holder = Lease(position, w, r.at, r.at + r.lease)
        st.retry_at = None
        if previous is not None and previous.worker != w:
            return UnfencedOutcome(UnfencedVerdict.TAKEOVER, position, t, w, st.holder, previous)
        return UnfencedOutcome(UnfencedVerdict.WON, position, t, w, st.holder)

    def _done(self, r: Done, position: int) -> UnfencedOutcome:
        st = self._task(r.task)
        if st.dead:
            return UnfencedOutcome(UnfencedVerdict.STALE_DONE, position, r.task, r.worker)
        before = tuple(st.completions)
        verdict = UnfencedVerdict.DONE_AGAIN if before else UnfencedVerdict.DONE
        holder, st.holder = st.holder, None
        st.completions.append(position)
        return UnfencedOutcome(verdict, position, r.task, r.worker, holder, completions=before)

    def _fail(self, r: Fail, position: int) -> UnfencedOutcome:
        st = self._task(r.task)
        t, w, holder = r.task, r.worker, st.holder
        closed = st.dead or bool(st.completions)
        if type(r) is Cancel:
            if closed:
                return UnfencedOutcome(UnfencedVerdict.STALE_FAIL, position, t, w)
            st.dead, st.holder = True, None
            return UnfencedOutcome(UnfencedVerdict.DEAD, position, t, w, holder)
        if closed or holder is None or holder.worker != w:
            return UnfencedOutcome(UnfencedVerdict.STALE_FAIL, position, t, w, holder)
        st.holder = None
        if r.retry_at is None:
            st.dead = True
            return UnfencedOutcome(UnfencedVerdict.DEAD, position, t, w, holder)
        st.retry_at = r.retry_at
        return UnfencedOutcome(UnfencedVerdict.RELEASED, position, t, w, holder, None, r.retry_at)

    # -- queries ---------------------------------------------------------------------------

    def completions(self, task: int) -> tuple[int, ...]:
        """The positions of the DONEs of `task` accepted so far."""
        st = self._tasks.get(task)
        return () if st is None else tuple(st.completions)

    def holder(self, task: int) -> Lease | None:
        st = self._tasks.get(task)
        return None if st is None else st.holder

    def is_done(self, task: int) -> bool:
        return bool(self.completions(task))


class Difference(NamedTuple):
    """One record judged differently by qw's rules and the original's. `qw_done` is the
    position of qw's accepted DONE of the task before this record (None: not done then);
    `completions` the task's DONEs the original's rules accepted, up to this record
    (`compare` extends them to the whole log)."""

    position: int
    record: Claim | Done | Fail
    qw: Outcome
    unfenced: UnfencedOutcome
    qw_done: int | None
    completions: tuple[int, ...]

    @property
    def task(self) -> int:
        return self.record.task


class RulesComparison:
    """qw's fold and the original's side by side, one record at a time: what a replay
    player steps, and what `compare` runs over a whole log."""

    def __init__(self) -> None:
        self.qw = ClaimState()
        self.unfenced = UnfencedState()
        self._qw_done: dict[int, int] = {}  # task -> qw's accepted DONE

    def apply(self, record: ClaimsRecord, position: int) -> Difference | None:
        """Apply `record` under both rule sets; the difference, or None where they agree."""
        ours = self.qw.apply(record, position)
        theirs = self.unfenced.apply(record, position)
        if not isinstance(record, Claim | Done | Fail):  # RENEW: rule U2; unknown: alike
            return None
        done_before = self._qw_done.get(record.task)
        if ours.verdict is Verdict.DONE:
            self._qw_done[record.task] = position
        if ours.verdict.value == theirs.verdict.value:
            return None
        done = self.unfenced.completions(record.task)
        return Difference(position, record, ours, theirs, done_before, done)


class Comparison(NamedTuple):
    """Every difference over a log, and the tasks the original's rules completed more than
    once (task -> the positions of its accepted DONEs)."""

    differences: tuple[Difference, ...]
    completed_twice: dict[int, tuple[int, ...]]
    records: int


def compare(claims: Iterable[tuple[int, ClaimsRecord]]) -> Comparison:
    """Fold the claims records (in log order, with their positions) under both rule sets;
    return every record whose verdicts differ, each with its task's completions under the
    original's rules over the whole log."""
    both = RulesComparison()
    found: list[Difference] = []
    count = 0
    for position, record in claims:
        count += 1
        difference = both.apply(record, position)
        if difference is not None:
            found.append(difference)
    state = both.unfenced
    differences = tuple(d._replace(completions=state.completions(d.task)) for d in found)
    twice = {
        t: state.completions(t)
        for t in sorted({d.task for d in differences})
        if len(state.completions(t)) > 1
    }
    return Comparison(differences, twice, count)
