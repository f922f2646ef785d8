"""ClaimState, the pure fold: every rule as a table of (records, verdicts), then the
behaviours the original's own tests check, fencing, watermark compaction and next_change."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Fail, Renew, Unknown
from queue_worker.protocol.state import ClaimState, Lease, Outcome, Verdict
from tests.examples import examples

S = 1_000_000  # one second, in the records' microseconds
LEASE = 30 * S

V = Verdict


def claim(task: int, worker: str, at: int, lease: int = LEASE) -> Claim:
    return Claim(task, worker, at, lease)


def renew(task: int, worker: str, at: int, claim: int, lease: int = LEASE) -> Renew:
    return Renew(task, worker, at, claim, lease)


def done(task: int, worker: str, at: int, claim: int, result: object = None) -> Done:
    return Done(task, worker, at, claim, result)


def fail(task: int, worker: str, at: int, claim: int, retry_at: int | None) -> Fail:
    return Fail(task, worker, at, claim, "boom", retry_at)


def fold(records: Sequence[ClaimsRecord]) -> tuple[ClaimState, list[Outcome]]:
    """Apply `records` to a new state, each at its index as its log position."""
    state = ClaimState()
    return state, [state.apply(r, pos) for pos, r in enumerate(records)]


def fold_at(records: Iterable[tuple[int, ClaimsRecord]]) -> tuple[ClaimState, list[Outcome]]:
    """Apply (position, record) pairs in order to a new state."""
    state = ClaimState()
    return state, [state.apply(r, pos) for pos, r in records]


def verdicts(records: Sequence[ClaimsRecord]) -> list[Verdict]:
    return [o.verdict for o in fold(records)[1]]


# -- every rule, as a table ----------------------------------------------------------------

RULES = [
    # CLAIM
    pytest.param([claim(0, "a", 0)], [V.WON], id="claim-won"),
    pytest.param([claim(0, "a", 0), claim(1, "b", 0)], [V.WON, V.WON], id="claim-won-other-task"),
    pytest.param([claim(0, "a", 0), claim(0, "b", S)], [V.WON, V.LOST_HELD], id="claim-lost-held"),
    pytest.param(
        [claim(0, "a", 0), claim(0, "b", LEASE - 1)],
        [V.WON, V.LOST_HELD],
        id="claim-lost-held-in-the-last-microsecond",
    ),
    pytest.param(
        [claim(0, "a", 10 * S), claim(0, "b", 5 * S)],
        [V.WON, V.LOST_HELD],
        id="claim-lost-held-with-a-clock-behind",
    ),
    pytest.param(
        [claim(0, "a", 0), claim(0, "a", S)],
        [V.WON, V.LOST_HELD],
        id="claim-lost-held-by-the-holder-itself",
    ),
    pytest.param(
        [claim(0, "a", 0), done(0, "a", S, 0), claim(0, "b", 9 * LEASE)],
        [V.WON, V.DONE, V.LOST_DONE],
        id="claim-lost-done",
    ),
    pytest.param(
        [claim(0, "a", 0), fail(0, "a", S, 0, None), claim(0, "b", 9 * LEASE)],
        [V.WON, V.DEAD, V.LOST_DEAD],
        id="claim-lost-dead",
    ),
    pytest.param(
        [claim(0, "a", 0), fail(0, "a", S, 0, 10 * S), claim(0, "b", 10 * S - 1)],
        [V.WON, V.RELEASED, V.LOST_BACKOFF],
        id="claim-lost-backoff",
    ),
    pytest.param(
        [claim(0, "a", 0), fail(0, "a", S, 0, 10 * S), claim(0, "b", 10 * S)],
        [V.WON, V.RELEASED, V.WON],
        id="claim-won-at-retry-at",
    ),
    pytest.param(
        [claim(0, "a", 0), fail(0, "a", S, 0, 0), claim(0, "b", S)],
        [V.WON, V.RELEASED, V.WON],
        id="claim-won-after-release-without-backoff",
    ),
    pytest.param(
        [claim(0, "a", 0), claim(0, "b", LEASE)], [V.WON, V.TAKEOVER], id="claim-takeover-at-expiry"
    ),
    pytest.param(
        [claim(0, "a", 0, lease=0), claim(0, "b", 0)],
        [V.WON, V.TAKEOVER],
        id="claim-takeover-of-a-zero-lease",
    ),
    pytest.param(
        [claim(0, "a", 0), claim(0, "b", LEASE), claim(0, "c", LEASE + 1)],
        [V.WON, V.TAKEOVER, V.LOST_HELD],
        id="claim-lost-held-by-the-new-holder",
    ),
    # RENEW
    pytest.param(
        [claim(0, "a", 0), renew(0, "a", 20 * S, 0), claim(0, "b", LEASE)],
        [V.WON, V.RENEWED, V.LOST_HELD],
        id="renew-accepted-moves-the-expiry",
    ),
    pytest.param(
        [claim(0, "a", 0), renew(0, "a", 2 * LEASE, 0), claim(0, "b", 2 * LEASE + S)],
        [V.WON, V.RENEWED, V.LOST_HELD],
        id="renew-accepted-after-expiry-while-nobody-took-over",
    ),
    pytest.param(
        [claim(0, "a", 0), renew(0, "a", S, 1)],
        [V.WON, V.LEASE_LOST],
        id="renew-lost-wrong-claim-position",
    ),
    pytest.param(
        [claim(0, "a", 0), renew(0, "b", S, 0)],
        [V.WON, V.LEASE_LOST],
        id="renew-lost-wrong-worker-right-position",
    ),
    pytest.param(
        [claim(0, "a", 0), claim(1, "a", 0), renew(1, "a", S, 0)],
        [V.WON, V.WON, V.LEASE_LOST],
        id="renew-lost-claim-of-another-task",
    ),
    pytest.param(
        [claim(0, "a", 0), claim(0, "b", S), renew(0, "b", 2 * S, 1)],
        [V.WON, V.LOST_HELD, V.LEASE_LOST],
        id="renew-lost-under-a-losing-claim",
    ),
    pytest.param(
        [claim(0, "a", 0), claim(0, "b", LEASE), renew(0, "a", LEASE + 1, 0)],
        [V.WON, V.TAKEOVER, V.LEASE_LOST],
        id="renew-lost-after-takeover",
    ),
    pytest.param(
        [claim(0, "a", 0), done(0, "a", S, 0), renew(0, "a", 2 * S, 0)],
        [V.WON, V.DONE, V.LEASE_LOST],
        id="renew-lost-after-done",
    ),
    pytest.param(
        [claim(0, "a", 0), fail(0, "a", S, 0, S), renew(0, "a", 2 * S, 0)],
        [V.WON, V.RELEASED, V.LEASE_LOST],
        id="renew-lost-after-release",
    ),
    pytest.param([renew(0, "a", 0, 0)], [V.LEASE_LOST], id="renew-lost-never-claimed"),
    pytest.param(
        [claim(0, "a", 0), renew(0, "b", S, 0, lease=9 * LEASE), claim(0, "c", LEASE)],
        [V.WON, V.LEASE_LOST, V.TAKEOVER],
        id="renew-lost-does-not-extend",
    ),
    # DONE
    pytest.param([claim(0, "a", 0), done(0, "a", S, 0)], [V.WON, V.DONE], id="done-accepted"),
    pytest.param(
        [claim(0, "a", 0), done(0, "a", 2 * LEASE, 0)],
        [V.WON, V.DONE],
        id="done-accepted-after-expiry-while-nobody-took-over",
    ),
    pytest.param(
        [
            claim(0, "a", 0),
            claim(0, "b", LEASE),
            done(0, "a", LEASE + 1, 0),
            done(0, "b", LEASE, 1),
        ],
        [V.WON, V.TAKEOVER, V.STALE_DONE, V.DONE],
        id="done-stale-after-takeover",
    ),
    pytest.param(
        [claim(0, "a", 0), done(0, "b", S, 0)], [V.WON, V.STALE_DONE], id="done-stale-by-non-holder"
    ),
    pytest.param(
        [claim(0, "a", 0), done(0, "a", S, 1)],
        [V.WON, V.STALE_DONE],
        id="done-stale-wrong-claim-position",
    ),
    pytest.param(
        [claim(0, "a", 0), claim(0, "b", S), done(0, "b", 2 * S, 1)],
        [V.WON, V.LOST_HELD, V.STALE_DONE],
        id="done-stale-under-a-losing-claim",
    ),
    pytest.param(
        [claim(0, "a", 0), done(0, "a", S, 0), done(0, "a", 2 * S, 0)],
        [V.WON, V.DONE, V.STALE_DONE],
        id="done-stale-twice",
    ),
    pytest.param(
        [claim(0, "a", 0), fail(0, "a", S, 0, S), done(0, "a", 2 * S, 0)],
        [V.WON, V.RELEASED, V.STALE_DONE],
        id="done-stale-after-release",
    ),
    pytest.param([done(0, "a", 0, 0)], [V.STALE_DONE], id="done-stale-never-claimed"),
    # FAIL
    pytest.param(
        [claim(0, "a", 0), fail(0, "a", S, 0, 5 * S)], [V.WON, V.RELEASED], id="fail-released"
    ),
    pytest.param([claim(0, "a", 0), fail(0, "a", S, 0, None)], [V.WON, V.DEAD], id="fail-dead"),
    pytest.param(
        [claim(0, "a", 0), fail(0, "b", S, 0, 5 * S), claim(0, "c", S)],
        [V.WON, V.STALE_FAIL, V.LOST_HELD],
        id="fail-stale-by-non-holder-releases-nothing",
    ),
    pytest.param(
        [claim(0, "a", 0), fail(0, "a", S, 3, None), claim(0, "c", S)],
        [V.WON, V.STALE_FAIL, V.LOST_HELD],
        id="fail-stale-wrong-claim-position-kills-nothing",
    ),
    pytest.param(
        [claim(0, "a", 0), claim(0, "b", LEASE), fail(0, "a", LEASE, 0, None)],
        [V.WON, V.TAKEOVER, V.STALE_FAIL],
        id="fail-stale-after-takeover",
    ),
    pytest.param(
        [claim(0, "a", 0), done(0, "a", S, 0), fail(0, "a", S, 0, None)],
        [V.WON, V.DONE, V.STALE_FAIL],
        id="fail-stale-after-done",
    ),
    pytest.param(
        [claim(0, "a", 0), fail(0, "a", S, 0, S), fail(0, "a", S, 0, S)],
        [V.WON, V.RELEASED, V.STALE_FAIL],
        id="fail-stale-twice",
    ),
    pytest.param(
        [claim(0, "a", 0), fail(0, "a", S, 0, None), fail(0, "a", S, 0, None)],
        [V.WON, V.DEAD, V.STALE_FAIL],
        id="fail-stale-after-dead",
    ),
    pytest.param([fail(0, "a", 0, 0, None)], [V.STALE_FAIL], id="fail-stale-never-claimed"),
    # unknown types
    pytest.param([Unknown("X")], [V.UNKNOWN], id="unknown"),
    pytest.param(
        [claim(0, "a", 0), Unknown("Z"), claim(0, "b", S), Unknown(""), done(0, "a", S, 0)],
        [V.WON, V.UNKNOWN, V.LOST_HELD, V.UNKNOWN, V.DONE],
        id="unknown-between-known",
    ),
]


@pytest.mark.parametrize(("records", "expected"), RULES)
def test_rule(records: list[ClaimsRecord], expected: list[Verdict]) -> None:
    state, outcomes = fold(records)
    assert [o.verdict for o in outcomes] == expected
    assert state.position == len(records) - 1
    for pos, (record, outcome) in enumerate(zip(records, outcomes, strict=True)):
        assert outcome.position == pos
        if isinstance(record, Unknown):
            assert (outcome.task, outcome.worker) == (None, None)
        else:
            assert (outcome.task, outcome.worker) == (record.task, record.worker)


# -- what each outcome says ----------------------------------------------------------------


def test_a_win_names_the_new_lease() -> None:
    state, [won] = fold([claim(4, "a", 7 * S, lease=3 * S)])
    assert won.holder == Lease(claim=0, worker="a", at=7 * S, expiry=10 * S)
    assert won.previous is None
    assert state.holder(4) == won.holder
    assert state.held_count == 1
    assert dict(state.held_tasks()) == {4: won.holder}
    assert state.attempts(4) == 1


def test_a_lost_claim_names_the_holder() -> None:
    state, [_, lost] = fold([claim(0, "a", 0), claim(0, "b", S)])
    assert lost.verdict is V.LOST_HELD
    assert lost.holder == Lease(0, "a", 0, LEASE)
    assert state.holder(0) == Lease(0, "a", 0, LEASE)
    assert state.attempts(0) == 1


def test_a_takeover_names_the_expired_lease_it_replaced() -> None:
    state, [_, took] = fold([claim(0, "a", 0), claim(0, "b", LEASE + 5)])
    assert took.verdict is V.TAKEOVER
    assert took.previous == Lease(0, "a", 0, LEASE)
    assert took.holder == Lease(1, "b", LEASE + 5, 2 * LEASE + 5)
    assert state.holder(0) == took.holder
    assert state.held_count == 1
    assert state.attempts(0) == 2


def test_a_renewal_moves_the_expiry_and_keeps_the_claim() -> None:
    state, [_, renewed] = fold([claim(0, "a", 0), renew(0, "a", 20 * S, 0, lease=S)])
    assert renewed.verdict is V.RENEWED
    assert renewed.holder == Lease(0, "a", 0, 21 * S)
    assert state.holder(0) == renewed.holder


def test_a_refused_renewal_names_the_current_holder_or_none() -> None:
    _, outcomes = fold([claim(0, "a", 0), renew(0, "b", S, 0), renew(1, "a", S, 0)])
    assert outcomes[1].holder == Lease(0, "a", 0, LEASE)
    assert outcomes[2].holder is None


def test_an_accepted_done_closes_the_task() -> None:
    state, [_, finished] = fold([claim(0, "a", 0), done(0, "a", S, 0, result=[1, 2])])
    assert finished.holder == Lease(0, "a", 0, LEASE)
    assert state.is_done(0) and state.is_closed(0) and not state.is_dead(0)
    assert (state.done_count, state.dead_count, state.held_count) == (1, 0, 0)
    assert state.holder(0) is None and state.task_state(0) is None
    assert not state.is_claimable(0, 10 * LEASE)


def test_a_stale_done_changes_nothing_and_names_the_holder() -> None:
    records = [claim(0, "a", 0), claim(0, "b", LEASE)]
    before, _ = fold(records)
    after, outcomes = fold([*records, done(0, "a", LEASE + 1, 0)])
    assert outcomes[-1].verdict is V.STALE_DONE
    assert outcomes[-1].holder == Lease(1, "b", LEASE, 2 * LEASE)
    after.position = before.position
    assert after == before
    assert after.done_count == 0


def test_a_release_sets_the_retry_time() -> None:
    state, outcomes = fold(
        [claim(0, "a", 0), fail(0, "a", S, 0, 9 * S), claim(0, "b", 8 * S), claim(0, "b", 9 * S)]
    )
    released, backoff, won = outcomes[1:]
    assert released.holder == Lease(0, "a", 0, LEASE)
    assert released.retry_at == 9 * S
    assert backoff.verdict is V.LOST_BACKOFF and backoff.retry_at == 9 * S
    assert won.verdict is V.WON and won.holder == Lease(3, "b", 9 * S, 9 * S + LEASE)
    task = state.task_state(0)
    assert task is not None
    assert (task.attempts, task.retry_at, task.last_error) == (2, None, "boom")


def test_a_released_task_is_held_by_nobody() -> None:
    state, _ = fold([claim(0, "a", 0), fail(0, "a", S, 0, 9 * S)])
    assert state.holder(0) is None
    assert state.held_count == 0
    task = state.task_state(0)
    assert task is not None and task.retry_at == 9 * S and task.last_error == "boom"


def test_a_dead_task_keeps_its_error() -> None:
    state, [_, dead] = fold([claim(0, "a", 0), Fail(0, "a", S, 0, "out of attempts", None)])
    assert dead.verdict is V.DEAD and dead.holder == Lease(0, "a", 0, LEASE)
    assert state.is_dead(0) and state.is_closed(0) and not state.is_done(0)
    assert state.dead_error(0) == "out of attempts"
    assert state.dead_tasks() == {0: "out of attempts"}
    assert (state.done_count, state.dead_count, state.held_count) == (0, 1, 0)


def test_verdict_properties() -> None:
    assert {v for v in Verdict if v.won} == {V.WON, V.TAKEOVER}
    assert {v for v in Verdict if v.lost} == {V.LOST_HELD, V.LOST_DONE, V.LOST_DEAD, V.LOST_BACKOFF}


# -- the seven behaviours the original's own tests check -----------------------------------


def test_the_first_claim_wins_and_the_second_loses() -> None:
    _, outcomes = fold([claim(0, "a", 5 * S), claim(0, "b", 5 * S)])
    assert [(o.verdict, o.worker) for o in outcomes] == [(V.WON, "a"), (V.LOST_HELD, "b")]


def test_a_claim_after_the_lease_lapses_takes_over() -> None:
    state, outcomes = fold([claim(0, "a", 0), claim(0, "b", LEASE - 1), claim(0, "b", LEASE)])
    assert [o.verdict for o in outcomes] == [V.WON, V.LOST_HELD, V.TAKEOVER]
    assert state.holder(0) == Lease(2, "b", LEASE, 2 * LEASE)


def test_a_finished_task_is_never_claimable_again() -> None:
    state, _ = fold([claim(0, "a", 0), done(0, "a", S, 0)])
    for at in (0, S, LEASE, 10**12, 2**62):
        assert state.apply(claim(0, "b", at), 100).verdict is V.LOST_DONE
        assert not state.is_claimable(0, at)
        assert list(state.claimable(at, known=1)) == []
    assert state.done_count == 1


RECORDS_FOR_CLOCK: list[ClaimsRecord] = [
    claim(0, "a", 0),
    claim(1, "b", S),
    claim(0, "c", 2 * S),
    renew(0, "a", 20 * S, 0),
    claim(0, "c", LEASE + S),
    fail(1, "b", 3 * S, 1, 40 * S),
    claim(1, "c", 39 * S),
    claim(0, "c", 20 * S + LEASE),
    done(0, "c", 60 * S, 7),
    claim(1, "a", 40 * S),
    done(1, "a", 41 * S, 9),
]


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.integers(min_value=-(2**62), max_value=2**62), min_size=1, max_size=30))
def test_the_verdict_does_not_depend_on_the_readers_clock(nows: list[int]) -> None:
    plain, expected = fold(RECORDS_FOR_CLOCK)
    looking = ClaimState()
    outcomes = []
    for pos, record in enumerate(RECORDS_FOR_CLOCK):
        now = nows[pos % len(nows)]
        list(looking.claimable(now, known=2))
        looking.next_change(now)
        looking.is_claimable(0, now)
        outcomes.append(looking.apply(record, pos))
    assert outcomes == expected
    assert looking == plain
    assert [o.verdict for o in expected] == [
        V.WON, V.WON, V.LOST_HELD, V.RENEWED, V.LOST_HELD, V.RELEASED, V.LOST_BACKOFF,
        V.TAKEOVER, V.DONE, V.WON, V.DONE,
    ]  # fmt: skip


def test_claimable_is_where_the_local_clock_matters() -> None:
    state, _ = fold([claim(0, "a", 0), claim(1, "b", 0), fail(1, "b", S, 1, 10 * S)])
    # the same state, three local clocks, three answers
    assert list(state.claimable(S, known=3)) == [2]
    assert list(state.claimable(10 * S, known=3)) == [1, 2]
    assert list(state.claimable(LEASE, known=3)) == [0, 1, 2]
    # a reader whose clock runs behind the writer's still sees the lease as running
    assert not state.is_claimable(0, -5 * S)
    assert state.is_claimable(0, LEASE) and not state.is_claimable(0, LEASE - 1)


def test_tasks_do_not_interfere() -> None:
    log: list[ClaimsRecord] = [
        claim(0, "a", 0),
        claim(1, "a", 0),
        claim(1, "b", S),
        done(0, "a", S, 0),
        claim(0, "b", LEASE),
        renew(1, "a", 2 * S, 1),
        fail(1, "a", 3 * S, 1, 4 * S),
        claim(1, "b", 4 * S),
        done(1, "b", 5 * S, 7),
    ]
    _, together = fold(log)
    for task in (0, 1):
        mine = [
            (pos, r)
            for pos, r in enumerate(log)
            if isinstance(r, Claim | Renew | Done | Fail) and r.task == task
        ]
        _, alone = fold_at(mine)
        assert alone == [together[pos] for pos, _ in mine]


def test_unknown_types_only_move_the_position() -> None:
    log: list[ClaimsRecord] = [
        Unknown("X"),
        claim(0, "a", 0),
        Unknown("lease-v2"),
        claim(0, "b", S),
        renew(0, "a", S, 1),
        Unknown(""),
        done(0, "a", 2 * S, 1),
        Unknown("X"),
    ]
    with_unknown, outcomes = fold(log)
    known = [(pos, r) for pos, r in enumerate(log) if not isinstance(r, Unknown)]
    without, known_outcomes = fold_at(known)
    assert known_outcomes == [outcomes[pos] for pos, _ in known]
    assert [o for o in outcomes if o.verdict is V.UNKNOWN] == [
        Outcome(V.UNKNOWN, pos) for pos, r in enumerate(log) if isinstance(r, Unknown)
    ]
    assert with_unknown.position == len(log) - 1 and with_unknown.unknown_count == 4
    without.position, without.unknown_count = with_unknown.position, with_unknown.unknown_count
    assert without == with_unknown


# -- fencing: ownership is a claim, not a name ----------------------------------------------


def test_two_workers_that_share_a_name_cannot_finish_each_others_task() -> None:
    # two processes both called "w": the first stalls past its lease, the second takes over
    first, second = 0, 1
    state, outcomes = fold(
        [
            claim(0, "w", 0),  # first
            claim(0, "w", LEASE),  # second: takeover
            renew(0, "w", LEASE + 1, first),
            done(0, "w", LEASE + 2, first),
            fail(0, "w", LEASE + 3, first, None),
        ]
    )
    assert [o.verdict for o in outcomes] == [
        V.WON, V.TAKEOVER, V.LEASE_LOST, V.STALE_DONE, V.STALE_FAIL,
    ]  # fmt: skip
    assert state.holder(0) == Lease(second, "w", LEASE, 2 * LEASE)
    assert not state.is_closed(0)
    assert state.apply(done(0, "w", LEASE + 4, second), 5).verdict is V.DONE


def test_a_namesake_whose_claim_lost_cannot_act_on_the_holders_task() -> None:
    state, outcomes = fold(
        [
            claim(0, "w", 0),  # the holder
            claim(0, "w", S),  # a namesake: lost
            renew(0, "w", 2 * S, 1, lease=100 * LEASE),
            done(0, "w", 3 * S, 1),
            fail(0, "w", 4 * S, 1, None),
        ]
    )
    assert [o.verdict for o in outcomes] == [
        V.WON, V.LOST_HELD, V.LEASE_LOST, V.STALE_DONE, V.STALE_FAIL,
    ]  # fmt: skip
    assert state.holder(0) == Lease(0, "w", 0, LEASE)


# -- watermark compaction --------------------------------------------------------------------


def _close(state: ClaimState, task: int, pos: int, dead: bool) -> int:
    """Claim and finish (or kill) `task` at positions pos, pos+1; return the next position."""
    assert state.apply(claim(task, "a", pos), pos).verdict is V.WON
    end = fail(task, "a", pos, pos, None) if dead else done(task, "a", pos, pos)
    assert state.apply(end, pos + 1).verdict is (V.DEAD if dead else V.DONE)
    return pos + 2


def _check_closed(
    state: ClaimState, done_set: set[int], dead_set: set[int], known: int, now: int = 0
) -> None:
    for t in range(-2, known + 2):
        assert state.is_done(t) == (t in done_set), t
        assert state.is_dead(t) == (t in dead_set), t
        assert state.is_closed(t) == (t in done_set | dead_set), t
    assert state.done_count == len(done_set)
    assert state.dead_count == len(dead_set)
    open_tasks = [t for t in range(known) if t not in done_set | dead_set]
    assert list(state.claimable(now, known)) == open_tasks


def test_closing_in_order_keeps_the_sets_empty() -> None:
    state = ClaimState()
    pos = 0
    done_set: set[int] = set()
    dead_set: set[int] = set()
    for task in range(1000):
        dead = task % 7 == 3
        pos = _close(state, task, pos, dead)
        (dead_set if dead else done_set).add(task)
        assert state.watermark == task + 1
        assert not state._closed_above and not state._open
    _check_closed(state, done_set, dead_set, 1000)
    assert len(state._dead) == len(dead_set)  # dead tasks keep their error, by design


def test_closing_in_reverse_order_compacts_at_the_end() -> None:
    state = ClaimState()
    pos = 0
    done_set: set[int] = set()
    dead_set: set[int] = set()
    n = 200
    for task in reversed(range(n)):
        dead = task % 5 == 0
        pos = _close(state, task, pos, dead)
        (dead_set if dead else done_set).add(task)
        _check_closed(state, done_set, dead_set, n)
        if task:
            assert state.watermark == 0
            assert len(state._closed_above) == n - task
    assert state.watermark == n
    assert not state._closed_above and not state._open


@settings(max_examples=examples(200), deadline=None)
@given(st.permutations(range(40)), st.lists(st.booleans(), min_size=40, max_size=40))
def test_closing_in_any_order_answers_right(order: list[int], deaths: list[bool]) -> None:
    state = ClaimState()
    for task in range(40):  # every task claimed first, then closed in `order`
        state.apply(claim(task, f"w{task}", 0), task)
    pos = 40
    done_set: set[int] = set()
    dead_set: set[int] = set()
    for task in order:
        end = (
            fail(task, f"w{task}", S, task, None)
            if deaths[task]
            else done(task, f"w{task}", S, task)
        )
        state.apply(end, pos)
        pos += 1
        (dead_set if deaths[task] else done_set).add(task)
        _check_closed(state, done_set, dead_set, 40, now=LEASE)  # every lease has lapsed
        closed = done_set | dead_set
        low = next(t for t in range(41) if t not in closed)
        assert state.watermark == low
        assert state._closed_above == {t for t in closed if t >= low}
        assert state.held_count == 40 - len(closed)
    assert state.watermark == 40 and not state._closed_above and not state._open


def test_closing_out_of_order_partially() -> None:
    state = ClaimState()
    pos = 0
    for task in (0, 1, 3, 5):
        pos = _close(state, task, pos, dead=False)
    assert state.watermark == 2
    assert state._closed_above == {3, 5}
    assert list(state.claimable(0, known=7)) == [2, 4, 6]
    pos = _close(state, 2, pos, dead=True)
    assert state.watermark == 4 and state._closed_above == {5}
    assert state.is_dead(2) and state.is_done(3) and not state.is_closed(4)


# -- claimable and next_change ---------------------------------------------------------------


def test_claimable_on_a_fresh_state() -> None:
    state = ClaimState()
    assert list(state.claimable(0, known=0)) == []
    assert list(state.claimable(0, known=3)) == [0, 1, 2]
    assert list(state.claimable(0, known=3, start=1)) == [1, 2, 0]
    assert list(state.claimable(0, known=3, start=2)) == [2, 0, 1]
    assert list(state.claimable(0, known=3, start=7)) == [0, 1, 2]
    assert list(state.claimable(0, known=3, start=-4)) == [0, 1, 2]


def test_claimable_starts_at_the_watermark_and_wraps() -> None:
    state = ClaimState()
    pos = _close(state, 0, 0, dead=False)
    pos = _close(state, 1, pos, dead=False)
    state.apply(claim(3, "a", 0), pos)
    assert list(state.claimable(S, known=6)) == [2, 4, 5]
    assert list(state.claimable(S, known=6, start=4)) == [4, 5, 2]
    assert list(state.claimable(S, known=6, start=0)) == [2, 4, 5]
    assert list(state.claimable(LEASE, known=6, start=3)) == [3, 4, 5, 2]
    assert list(state.claimable(S, known=1)) == []


def test_next_change() -> None:
    state = ClaimState()
    assert state.next_change(0) is None
    state.apply(claim(0, "a", 0), 0)
    assert state.next_change(0) == LEASE
    assert state.next_change(LEASE - 1) == LEASE
    assert state.next_change(LEASE) is None  # strictly after now
    state.apply(claim(1, "b", 0), 1)
    state.apply(fail(1, "b", S, 1, 5 * S), 2)
    assert state.next_change(0) == 5 * S  # the retry time comes before the lease expiry
    assert state.next_change(5 * S) == LEASE
    state.apply(renew(0, "a", LEASE, 0), 3)
    assert state.next_change(5 * S) == 2 * LEASE
    state.apply(done(0, "a", S, 0), 4)
    assert state.next_change(0) == 5 * S
    assert state.next_change(5 * S) is None
    state.apply(claim(1, "c", 5 * S), 5)
    assert state.next_change(0) == 5 * S + LEASE
    state.apply(fail(1, "c", 6 * S, 5, None), 6)
    assert state.next_change(0) is None
