"""ClaimState against random claims logs: properties of every prefix, and a state machine
that checks the fold step by step against a small reference model written from
docs/protocol.md (section 3)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule

from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Fail, Renew, Unknown
from queue_worker.protocol.state import ClaimSnapshot, ClaimState, Lease, Outcome, Verdict
from tests.examples import examples

V = Verdict
UNIT = 1_000  # the logs below move in steps of a millisecond (records are in microseconds)
WORKERS = ("a", "b", "c")  # few names: several claims share one, as two processes could
SETTINGS = settings(max_examples=examples(200), deadline=None)

# -- random claims logs ----------------------------------------------------------------------

KINDS = ("claim", "claim", "claim", "renew", "done", "done", "fail", "unknown")
REFS = ("real", "real", "real", "real", "namesake", "bogus")


@st.composite
def claims_logs(draw: st.DrawFn) -> list[ClaimsRecord]:
    """A log as several workers on a few tasks could write it: `at` roughly increasing with
    each writer's clock a little off, leases of their own, and RENEW/DONE/FAIL naming a real
    claim (often one that lost or was taken over), a real claim under another worker's name,
    or a position that was never a claim of that task."""
    tasks = draw(st.integers(min_value=1, max_value=4))
    length = draw(st.integers(min_value=0, max_value=50))
    clock = 0
    log: list[ClaimsRecord] = []
    claims: list[tuple[int, Claim]] = []
    for pos in range(length):
        clock += draw(st.integers(min_value=0, max_value=8)) * UNIT
        at = clock + draw(st.integers(min_value=-3, max_value=3)) * UNIT
        kind = draw(st.sampled_from(KINDS))
        if kind == "unknown":
            log.append(Unknown(draw(st.sampled_from(["X", "lease-v2", ""]))))
            continue
        task = draw(st.integers(min_value=0, max_value=tasks - 1))
        worker = draw(st.sampled_from(WORKERS))
        if kind == "claim":
            record = Claim(task, worker, at, draw(st.integers(0, 20)) * UNIT)
            claims.append((pos, record))
            log.append(record)
            continue
        ref = draw(st.sampled_from(REFS)) if claims else "bogus"
        if ref == "bogus":
            token = draw(st.integers(min_value=-1, max_value=pos))
        else:
            token, real = draw(st.sampled_from(claims))
            task = real.task
            if ref == "real":
                worker = real.worker
        if kind == "renew":
            log.append(Renew(task, worker, at, token, draw(st.integers(0, 20)) * UNIT))
        elif kind == "done":
            log.append(Done(task, worker, at, token, pos))
        else:
            retry = draw(st.none() | st.integers(min_value=-2, max_value=15))
            retry_at = None if retry is None else at + retry * UNIT
            log.append(Fail(task, worker, at, token, "boom", retry_at))
    return log


def fold(records: Sequence[ClaimsRecord]) -> tuple[ClaimState, list[Outcome]]:
    state = ClaimState()
    return state, [state.apply(r, pos) for pos, r in enumerate(records)]


def acting(record: ClaimsRecord) -> Renew | Done | Fail:
    assert isinstance(record, Renew | Done | Fail)
    return record


# -- properties of every prefix -----------------------------------------------------------------


# make test holds the fold to the reference model in TestFoldAgainstReference and the invariants
@pytest.mark.slow
@SETTINGS
@given(claims_logs(), st.data())
def test_two_folds_of_the_same_prefix_agree(log: list[ClaimsRecord], data: st.DataObject) -> None:
    k = data.draw(st.integers(min_value=0, max_value=len(log)))
    _, whole_outcomes = fold(log)
    first, first_outcomes = fold(log[:k])
    second, second_outcomes = fold(log[:k])
    assert first_outcomes == second_outcomes == whole_outcomes[:k]
    assert first == second
    # a reader that keeps looking at its own clock in between reaches the same verdicts
    nows = data.draw(st.lists(st.integers(-(10**6), 10**7), min_size=1, max_size=5))
    looking = ClaimState()
    for pos, record in enumerate(log[:k]):
        for now in nows:
            list(looking.claimable(now, known=5))
            looking.next_change(now)
        assert looking.apply(record, pos) == whole_outcomes[pos]
    assert looking == first


@SETTINGS
@given(claims_logs())
def test_a_task_never_has_two_holders(log: list[ClaimsRecord]) -> None:
    """Replay the outcomes alone and track who holds what: every win is over nobody or over
    exactly the current holder after its expiry, and the fold agrees at every step."""
    state = ClaimState()
    holders: dict[int, Lease] = {}
    for pos, record in enumerate(log):
        o = state.apply(record, pos)
        v = o.verdict
        if isinstance(record, Unknown):
            assert v is V.UNKNOWN
        elif isinstance(record, Claim):
            assert o.task == record.task
            t = record.task
            if v is V.WON:
                assert t not in holders
                assert o.holder == Lease(pos, record.worker, record.at, record.at + record.lease)
                holders[t] = o.holder
            elif v is V.TAKEOVER:
                assert o.previous is not None and holders[t] == o.previous
                assert record.at >= o.previous.expiry
                assert o.holder == Lease(pos, record.worker, record.at, record.at + record.lease)
                holders[t] = o.holder
            elif v is V.LOST_HELD:
                assert o.holder is not None and holders[t] == o.holder
                assert record.at < o.holder.expiry
            else:
                assert v in (V.LOST_DONE, V.LOST_DEAD, V.LOST_BACKOFF)
                assert t not in holders
        else:
            t = record.task
            if v in (V.RENEWED, V.DONE, V.DEAD, V.RELEASED):
                held = holders[t]
                assert (held.claim, held.worker) == (record.claim, record.worker)
                if v is V.RENEWED:
                    assert isinstance(record, Renew)
                    assert o.holder == Lease(
                        held.claim, held.worker, held.at, record.at + record.lease
                    )
                    holders[t] = o.holder
                else:
                    assert o.holder == held
                    del holders[t]
            else:
                assert v in (V.LEASE_LOST, V.STALE_DONE, V.STALE_FAIL)
                assert o.holder == holders.get(t)
                if o.holder is not None:
                    assert (o.holder.claim, o.holder.worker) != (record.claim, record.worker)
        assert dict(state.held_tasks()) == holders
        assert state.held_count == len(holders)


# make test holds the fold to the reference model in TestFoldAgainstReference and the invariants
@pytest.mark.slow
@SETTINGS
@given(claims_logs())
def test_a_task_is_closed_once_and_stays_closed(log: list[ClaimsRecord]) -> None:
    _, outcomes = fold(log)
    closed: dict[int, Verdict] = {}
    for o in outcomes:
        if o.task is None:
            continue
        if o.verdict in (V.DONE, V.DEAD):
            assert o.task not in closed, "at most one accepted DONE (or DEAD) per task"
            closed[o.task] = o.verdict
        elif o.task in closed:
            assert not o.verdict.won
            assert o.verdict not in (V.RENEWED, V.RELEASED)
            if o.verdict.lost:
                assert o.verdict is (V.LOST_DONE if closed[o.task] is V.DONE else V.LOST_DEAD)


# make test holds the fold to the reference model in TestFoldAgainstReference and the invariants
@pytest.mark.slow
@SETTINGS
@given(claims_logs())
def test_a_reader_further_along_never_sees_fewer_tasks_done(log: list[ClaimsRecord]) -> None:
    state = ClaimState()
    seen: list[tuple[int, int]] = []
    for pos, record in enumerate(log):
        o = state.apply(record, pos)
        seen.append((state.done_count, state.dead_count))
        done_so_far = {t for t in range(5) if state.is_done(t)}
        assert state.done_count == len(done_so_far)
        if o.verdict is V.DONE:
            assert o.task in done_so_far
    assert seen == sorted(seen)  # both counts only ever grow
    for k in range(len(log) + 1):  # and a fresh reader of any prefix agrees
        prefix, _ = fold(log[:k])
        assert (prefix.done_count, prefix.dead_count) == (seen[k - 1] if k else (0, 0))


@SETTINGS
@given(claims_logs())
def test_the_invariants_of_the_original(log: list[ClaimsRecord]) -> None:
    """done <= won <= done + held, made exact: every win starts one lease, and every lease
    ends in a DONE, a FAIL or a takeover, or is held now. An accepted RENEW, DONE or FAIL
    acts under the latest winning claim of its task, written by the same worker."""
    state, outcomes = fold(log)
    counts = Counter(o.verdict for o in outcomes)
    assert counts[V.WON] == counts[V.DONE] + counts[V.DEAD] + counts[V.RELEASED] + state.held_count
    assert state.done_count == counts[V.DONE] and state.dead_count == counts[V.DEAD]
    tasks_won = {o.task for o in outcomes if o.verdict.won}
    tasks_done = {o.task for o in outcomes if o.verdict is V.DONE}
    assert tasks_done <= tasks_won
    assert state.done_count + state.dead_count + state.held_count <= len(tasks_won)
    latest_win: dict[int, int] = {}
    for pos, (record, o) in enumerate(zip(log, outcomes, strict=True)):
        if o.verdict.won:
            assert o.task is not None
            latest_win[o.task] = pos
        elif o.verdict in (V.RENEWED, V.DONE, V.DEAD, V.RELEASED):
            r = acting(record)
            assert latest_win.get(r.task) == r.claim
            winner = log[r.claim]
            assert isinstance(winner, Claim) and winner.worker == r.worker
            assert outcomes[r.claim].verdict.won


# -- the fold against a reference model ---------------------------------------------------------


class Reference:
    """The verdict as docs/protocol.md states it, kept as plainly as possible: who holds each task
    (the winning claim's position, its worker, the expiry), the tasks done and dead, and
    the retry time of each task a FAIL released."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[int, str, int]] = {}
        self.retry_at: dict[int, int] = {}
        self.done: set[int] = set()
        self.dead: set[int] = set()

    def claim(self, pos: int, r: Claim) -> Verdict:
        if r.task in self.done:
            return V.LOST_DONE
        if r.task in self.dead:
            return V.LOST_DEAD
        holder = self.held.get(r.task)
        if holder is not None and r.at < holder[2]:
            return V.LOST_HELD
        if holder is None and r.at < self.retry_at.get(r.task, r.at):
            return V.LOST_BACKOFF
        self.held[r.task] = (pos, r.worker, r.at + r.lease)
        self.retry_at.pop(r.task, None)  # the retry has happened
        return V.WON if holder is None else V.TAKEOVER

    def _is_holder(self, r: Renew | Done | Fail) -> bool:
        holder = self.held.get(r.task)
        return holder is not None and holder[:2] == (r.claim, r.worker)

    def renew(self, r: Renew) -> Verdict:
        if not self._is_holder(r):
            return V.LEASE_LOST
        self.held[r.task] = (r.claim, r.worker, r.at + r.lease)
        return V.RENEWED

    def finish(self, r: Done) -> Verdict:
        if not self._is_holder(r):
            return V.STALE_DONE
        del self.held[r.task]
        self.done.add(r.task)
        return V.DONE

    def fail(self, r: Fail) -> Verdict:
        if not self._is_holder(r):
            return V.STALE_FAIL
        del self.held[r.task]
        if r.retry_at is None:
            self.dead.add(r.task)
            return V.DEAD
        self.retry_at[r.task] = r.retry_at
        return V.RELEASED

    def claimable(self, now: int, known: int, start: int) -> list[int]:
        order = [*range(start, known), *range(start)]
        return [
            t
            for t in order
            if t not in self.done
            and t not in self.dead
            and not (t in self.held and now < self.held[t][2])
            and not (t in self.retry_at and now < self.retry_at[t])
        ]

    def next_change(self, now: int) -> int | None:
        times = [h[2] for h in self.held.values()] + list(self.retry_at.values())
        return min((t for t in times if t > now), default=None)


TASKS = st.integers(min_value=0, max_value=3)
KNOWN = 5  # one more than the tasks claimed: task 4 stays untouched
JITTER = st.integers(min_value=-3, max_value=3)
LEASES = st.integers(min_value=0, max_value=20)
Token = tuple[int, int, str]  # a claim as written: its position, task, worker


class FoldAgainstReference(RuleBasedStateMachine):
    claims: Bundle[Token] = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.state = ClaimState()
        self.ref = Reference()
        self.pos = 0
        self.clock = 0

    def _at(self, jitter: int) -> int:
        return self.clock + jitter * UNIT

    def _apply(self, record: ClaimsRecord, expected: Verdict) -> Outcome:
        outcome = self.state.apply(record, self.pos)
        assert outcome.verdict is expected, (record, outcome)
        assert outcome.position == self.pos
        self.pos += 1
        return outcome

    @rule(ms=st.integers(min_value=0, max_value=10))
    def time_passes(self, ms: int) -> None:
        self.clock += ms * UNIT

    @rule(target=claims, task=TASKS, worker=st.sampled_from(WORKERS), jitter=JITTER, lease=LEASES)
    def claim(self, task: int, worker: str, jitter: int, lease: int) -> Token:
        record = Claim(task, worker, self._at(jitter), lease * UNIT)
        pos = self.pos
        self._apply(record, self.ref.claim(pos, record))
        return (pos, task, worker)

    @rule(
        target=claims,
        task=TASKS,
        worker=st.sampled_from(WORKERS),
        early=st.sampled_from([0, 1]),
        lease=LEASES,
    )
    def claim_at_the_boundary(self, task: int, worker: str, early: int, lease: int) -> Token:
        """A claim at the very microsecond a lease expires or a backoff ends (or one before)."""
        held = self.ref.held.get(task)
        edge = held[2] if held is not None else self.ref.retry_at.get(task, self.clock)
        record = Claim(task, worker, edge - early, lease * UNIT)
        pos = self.pos
        self._apply(record, self.ref.claim(pos, record))
        return (pos, task, worker)

    @rule(
        c=claims,
        impostor=st.none() | st.sampled_from(WORKERS),
        jitter=JITTER,
        lease=LEASES,
    )
    def renew(self, c: Token, impostor: str | None, jitter: int, lease: int) -> None:
        pos, task, worker = c
        record = Renew(task, impostor or worker, self._at(jitter), pos, lease * UNIT)
        self._apply(record, self.ref.renew(record))

    @rule(c=claims, impostor=st.none() | st.sampled_from(WORKERS), jitter=JITTER)
    def finish(self, c: Token, impostor: str | None, jitter: int) -> None:
        pos, task, worker = c
        record = Done(task, impostor or worker, self._at(jitter), pos, {"by": worker})
        self._apply(record, self.ref.finish(record))

    @rule(
        c=claims,
        impostor=st.none() | st.sampled_from(WORKERS),
        jitter=JITTER,
        retry=st.none() | st.integers(min_value=-2, max_value=15),
    )
    def fail(self, c: Token, impostor: str | None, jitter: int, retry: int | None) -> None:
        pos, task, worker = c
        at = self._at(jitter)
        record = Fail(
            task, impostor or worker, at, pos, "boom", None if retry is None else at + retry * UNIT
        )
        self._apply(record, self.ref.fail(record))

    @rule(
        kind=st.sampled_from(["renew", "done", "fail"]),
        task=TASKS,
        worker=st.sampled_from(WORKERS),
        token=st.integers(min_value=-1, max_value=60),
    )
    def act_under_a_bogus_claim(self, kind: str, task: int, worker: str, token: int) -> None:
        at = self.clock
        if kind == "renew":
            renewal = Renew(task, worker, at, token, UNIT)
            self._apply(renewal, self.ref.renew(renewal))
        elif kind == "done":
            finished = Done(task, worker, at, token)
            self._apply(finished, self.ref.finish(finished))
        else:
            failed = Fail(task, worker, at, token, "boom", at)
            self._apply(failed, self.ref.fail(failed))

    @rule(code=st.sampled_from(["X", "lease-v2", ""]))
    def unknown(self, code: str) -> None:
        before = (self.state.done_count, self.state.dead_count, dict(self.state.held_tasks()))
        self._apply(Unknown(code), V.UNKNOWN)
        after = (self.state.done_count, self.state.dead_count, dict(self.state.held_tasks()))
        assert after == before

    @invariant()
    def same_view(self) -> None:
        s, ref = self.state, self.ref
        assert {t: (h.claim, h.worker, h.expiry) for t, h in s.held_tasks()} == ref.held
        assert s.held_count == len(ref.held)
        assert (s.done_count, s.dead_count) == (len(ref.done), len(ref.dead))
        assert set(s.dead_tasks()) == ref.dead
        for t in range(KNOWN):
            assert s.is_done(t) == (t in ref.done)
            assert s.is_dead(t) == (t in ref.dead)
            assert s.is_closed(t) == (t in ref.done or t in ref.dead)
        assert s.position == self.pos - 1

    @invariant()
    def same_claimable(self) -> None:
        for ms in (-5, 0, 3, 10, 30):
            now = self.clock + ms * UNIT
            for start in (0, 2):
                assert list(self.state.claimable(now, KNOWN, start)) == self.ref.claimable(
                    now, KNOWN, start
                ), (now, start)
            assert self.state.next_change(now) == self.ref.next_change(now), now


TestFoldAgainstReference = FoldAgainstReference.TestCase
TestFoldAgainstReference.settings = settings(
    max_examples=examples(200), stateful_step_count=50, deadline=None
)


# -- the catch-up fold: apply_all ------------------------------------------------------------


# make test holds the fold to the reference model in TestFoldAgainstReference and the invariants
@pytest.mark.slow
@SETTINGS
@given(claims_logs(), st.data())
def test_apply_all_reaches_the_state_apply_reaches(
    log: list[ClaimsRecord], data: st.DataObject
) -> None:
    """`apply_all` (no outcomes, the common cases inlined) leaves exactly the state that
    `apply` record by record leaves, however the log is cut into calls."""
    one_by_one, _ = fold(log)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(log)), max_size=4)))
    batched = ClaimState()
    for start, end in zip([0, *cuts], [*cuts, len(log)], strict=True):
        batched.apply_all(log[start:end], range(start, end))
    assert comparable(batched.snapshot()) == comparable(one_by_one.snapshot())
    assert batched.held_count == one_by_one.held_count
    assert list(batched.held_tasks()) == list(one_by_one.held_tasks())


def comparable(snap: ClaimSnapshot) -> ClaimSnapshot:
    """A snapshot with its closed tasks in id order (a set's order is not the state's)."""
    return snap._replace(closed_above=tuple(sorted(snap.closed_above)))


@st.composite
def logs_with_pairs(draw: st.DrawFn) -> list[ClaimsRecord]:
    """`claims_logs`, with CLAIMs followed at once by a DONE: the claim's own (its position,
    its worker), or a near miss (another worker, another position, another task)."""
    log = draw(claims_logs())
    out: list[ClaimsRecord] = []
    for record in log:
        out.append(record)
        if type(record) is Claim and draw(st.booleans()):
            pos = len(out) - 1
            miss = draw(st.sampled_from(["none", "none", "worker", "position", "task"]))
            worker = "z" if miss == "worker" else record.worker
            token = pos - 1 if miss == "position" else pos
            task = record.task + 1 if miss == "task" else record.task
            out.append(Done(task, worker, record.at + UNIT, token, None))
    return out


# make test holds the fold to the reference model in TestFoldAgainstReference and the invariants
@pytest.mark.slow
@SETTINGS
@given(logs_with_pairs(), st.data())
def test_apply_all_folds_a_claim_and_its_done_as_apply_does(
    log: list[ClaimsRecord], data: st.DataObject
) -> None:
    """A winning CLAIM followed at once by its DONE (closed without a lease built) and every
    near miss of one: the state `apply` reaches, however the log is cut into calls."""
    one_by_one, _ = fold(log)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(log)), max_size=4)))
    batched = ClaimState()
    for start, end in zip([0, *cuts], [*cuts, len(log)], strict=True):
        batched.apply_all(log[start:end], range(start, end))
    assert comparable(batched.snapshot()) == comparable(one_by_one.snapshot())
    assert batched.held_count == one_by_one.held_count
    assert list(batched.held_tasks()) == list(one_by_one.held_tasks())


# make test holds the fold to the reference model in TestFoldAgainstReference and the invariants
@pytest.mark.slow
@SETTINGS
@given(logs_with_pairs(), st.data())
def test_apply_all_reports_the_verdicts_apply_gives_the_uncommon_records(
    log: list[ClaimsRecord], data: st.DataObject
) -> None:
    """`others` gets every record `apply` does not judge WON (a first CLAIM) or DONE (its
    holder's DONE), with the very outcome `apply` gives it, in log order, however the log
    is cut into calls (the supervisor's monitor makes its events of them)."""
    _, outcomes = fold(log)
    common = {Verdict.WON, Verdict.DONE}
    cuts = sorted(data.draw(st.lists(st.integers(0, len(log)), max_size=4)))
    batched = ClaimState()
    others: list[tuple[ClaimsRecord, Outcome]] = []
    for start, end in zip([0, *cuts], [*cuts, len(log)], strict=True):
        batched.apply_all(log[start:end], range(start, end), others)
    reported = {outcome.position: (record, outcome) for record, outcome in others}
    assert [o.position for _, o in others] == sorted(reported)  # in log order, once each
    for position, outcome in enumerate(outcomes):
        if outcome.verdict not in common:
            assert reported.pop(position) == (log[position], outcome)
    # what is left was judged WON or DONE by `apply` too (apply_all's own way of a case it
    # does not inline, which reports it all the same)
    for position, (record, outcome) in reported.items():
        assert (log[position], outcomes[position]) == (record, outcome)
        assert outcome.verdict in common


def test_a_claim_held_back_is_folded_when_the_positions_run_out() -> None:
    """zip(strict=True) raises after the last pair: the winning CLAIM held back for its DONE
    is in the state all the same, as `apply` would have left it."""
    log: list[ClaimsRecord] = [Claim(0, "a", 0, UNIT), Done(0, "a", 1, 0, None)]
    state = ClaimState()
    with pytest.raises(ValueError, match="zip"):
        state.apply_all(log, [0])
    one, _ = fold(log[:1])
    assert list(state.held_tasks()) == list(one.held_tasks()) != []
    assert state.held_count == 1
