"""The original's rules (queue_worker.proof.unfenced) on hand-built records, each rule as a
table, then the comparison with qw's fold and its words (supervisor.unfenced_text)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queue_worker.proof.unfenced import RulesComparison, UnfencedState, UnfencedVerdict, compare
from queue_worker.protocol.records import Cancel, Claim, ClaimsRecord, Done, Fail, Renew, Unknown
from queue_worker.protocol.state import ClaimState, Verdict
from supervisor.unfenced_text import comparison_json, comparison_lines, difference_text
from tests.examples import examples

S = 1_000_000  # one second, in the records' microseconds
A = "w0-15186-a1b2"  # people see it as w0·15186
B = "w1-15187-c3d4"
U = UnfencedVerdict


def claim(task: int, worker: str, at: int, lease: int = S) -> Claim:
    return Claim(task, worker, at, lease)


def done(task: int, worker: str, at: int, claim: int) -> Done:
    return Done(task, worker, at, claim, None)


def fail(task: int, worker: str, at: int, claim: int, retry_at: int | None) -> Fail:
    return Fail(task, worker, at, claim, "E: boom", retry_at)


def unfenced(records: Sequence[ClaimsRecord]) -> list[UnfencedVerdict]:
    state = UnfencedState()
    return [state.apply(r, pos).verdict for pos, r in enumerate(records)]


RULES = [
    pytest.param([claim(0, A, 0), claim(0, B, S // 2)], [U.WON, U.LOST_HELD], id="U1-held"),
    pytest.param([claim(0, A, 0), claim(0, B, S)], [U.WON, U.TAKEOVER], id="U1-expired"),
    pytest.param([claim(0, A, 0), claim(0, A, S // 2)], [U.WON, U.WON], id="U1-owners-are-names"),
    pytest.param(
        [claim(0, A, 0), done(0, A, 1, 0), claim(0, B, 2)],
        [U.WON, U.DONE, U.LOST_DONE],
        id="U1-done",
    ),
    pytest.param(
        [claim(0, A, 0), Renew(0, A, S // 2, 0, S), claim(0, B, S + 1)],
        [U.WON, U.IGNORED, U.TAKEOVER],
        id="U2-no-renewal",
    ),
    pytest.param([done(0, B, 0, 99)], [U.DONE], id="U3-from-anyone-unclaimed"),
    pytest.param(
        [claim(0, A, 0), done(0, B, 1, 12345)], [U.WON, U.DONE], id="U3-from-anyone-any-claim"
    ),
    pytest.param(
        [claim(0, A, 0), claim(0, B, S), done(0, B, S + 1, 1), done(0, A, S + 2, 0)],
        [U.WON, U.TAKEOVER, U.DONE, U.DONE_AGAIN],
        id="U3-done-again",
    ),
    pytest.param(
        [claim(0, A, 0), fail(0, A, 1, 0, None), done(0, A, 2, 0)],
        [U.WON, U.DEAD, U.STALE_DONE],
        id="U3-dead-refuses",
    ),
    pytest.param(
        [claim(0, A, 0), fail(0, A, 1, 77, 5 * S), claim(0, B, S), claim(0, B, 5 * S)],
        [U.WON, U.RELEASED, U.LOST_BACKOFF, U.WON],
        id="U4-fail-by-name",
    ),
    pytest.param(
        [claim(0, A, 0), fail(0, B, 1, 0, None)], [U.WON, U.STALE_FAIL], id="U4-not-the-name"
    ),
    pytest.param(
        [claim(0, A, 0), Cancel(0, "op", 1, -1, "cancelled", None), claim(0, B, 2 * S)],
        [U.WON, U.DEAD, U.LOST_DEAD],
        id="U4-cancel",
    ),
    pytest.param([Unknown("Z")], [U.UNKNOWN], id="U5-unknown"),
]


@pytest.mark.parametrize(("records", "expected"), RULES)
def test_each_rule_of_the_original(records: list[ClaimsRecord], expected: list[U]) -> None:
    assert unfenced(records) == expected


def test_a_copy_goes_on_alone() -> None:
    state = UnfencedState()
    state.apply(claim(0, A, 0), 0)
    snapshot = state.copy()
    state.apply(done(0, A, 1, 0), 1)
    assert state.completions(0) == (1,) and snapshot.completions(0) == ()
    assert snapshot.apply(claim(0, B, 2), 2).verdict is U.LOST_HELD  # A still holds it there


# -- the comparison --------------------------------------------------------------------------

# A pauses past its lease, B takes task 0 over and completes it, then A wakes and completes.
LATE_AFTER: list[ClaimsRecord] = [
    claim(0, A, 0),
    claim(0, B, S + 1),
    done(0, B, 2 * S, 1),
    done(0, A, 3 * S, 0),
]
# ... A wakes before B completes (the issue's example: the stale DONE first).
LATE_BEFORE: list[ClaimsRecord] = [
    claim(0, A, 0),
    claim(0, B, S + 1),
    done(0, A, 2 * S, 0),
    done(0, B, 3 * S, 1),
]


def test_a_stale_done_after_the_takers_is_a_second_completion_without_fencing() -> None:
    c = compare(enumerate(LATE_AFTER))
    assert [d.position for d in c.differences] == [3]
    (d,) = c.differences
    assert d.qw.verdict is Verdict.STALE_DONE and d.unfenced.verdict is U.DONE_AGAIN
    assert c.completed_twice == {0: (2, 3)}
    assert difference_text(d) == (
        "task 0: w0·15186's DONE @3 — refused as stale under qw's rules (its token @0 no "
        "longer holds the task; the task was already done @2); accepted again under "
        "unfenced rules, so task 0 would have been completed twice (@2 and @3)"
    )


def test_a_stale_done_before_the_takers_is_the_issues_example() -> None:
    c = compare(enumerate(LATE_BEFORE))
    first, second = c.differences
    assert (first.qw.verdict, first.unfenced.verdict) == (Verdict.STALE_DONE, U.DONE)
    assert (second.qw.verdict, second.unfenced.verdict) == (Verdict.DONE, U.DONE_AGAIN)
    assert difference_text(first) == (
        "task 0: w0·15186's DONE @2 — refused as stale under qw's rules (its token @0 no "
        "longer holds the task; the holder is w1·15187 (claim @1)); accepted under "
        "unfenced rules, so task 0 would have been completed twice (@2 and @3)"
    )
    assert "accepted again under unfenced rules" in difference_text(second)


def test_a_renewed_lease_is_not_one_without_renewal() -> None:
    records: list[ClaimsRecord] = [
        claim(0, A, 0),
        Renew(0, A, S // 2, 0, S),
        claim(0, B, S + S // 4),  # qw: A renewed until 1.5 s; the original: A's lease is over
        done(0, A, S + S // 2, 0),
    ]
    c = compare(enumerate(records))
    (d,) = c.differences  # the RENEW itself is no difference (rule U2 ignores every one)
    assert d.position == 2
    assert (d.qw.verdict, d.unfenced.verdict) == (Verdict.LOST_HELD, U.TAKEOVER)
    assert "with no renewal its lease ended at" in difference_text(d)
    assert c.completed_twice == {}


def test_a_clean_drain_is_judged_alike() -> None:
    records: list[ClaimsRecord] = [claim(t, A if t % 2 else B, t * S) for t in range(3)]
    records += [done(t, A if t % 2 else B, t * S + 1, t) for t in range(3)]
    c = compare(enumerate(records))
    assert c.differences == () and c.records == 6
    assert comparison_lines(c)[-1] == (
        "both rule sets reach the same verdict on every one of the 6 records"
    )


def test_stepping_gives_what_the_whole_comparison_gives() -> None:
    both = RulesComparison()
    stepped = [d for pos, r in enumerate(LATE_BEFORE) if (d := both.apply(r, pos)) is not None]
    whole = compare(enumerate(LATE_BEFORE)).differences
    assert [d.position for d in stepped] == [d.position for d in whole]
    assert stepped[0].completions == (2,)  # the log so far; `compare` sees it all
    assert whole[0].completions == (2, 3)


def test_the_json_names_each_difference_and_the_tasks_completed_twice() -> None:
    body = comparison_json(compare(enumerate(LATE_AFTER)))
    assert body["completed_twice"] == {"0": [2, 3]}
    (d,) = body["differences"]
    assert (d["kind"], d["qw"], d["unfenced"], d["label"]) == (
        "DONE",
        "stale done",
        "done again",
        "w0·15186",
    )


# -- a property over generated logs ----------------------------------------------------------

WORKERS = (A, B, "w2-15188-e5f6")


@st.composite
def logs(draw: st.DrawFn) -> list[ClaimsRecord]:
    """CLAIM, RENEW and DONE records of two tasks by three workers, naming earlier positions
    (or any position) as their claims, at times that mostly increase."""
    records: list[ClaimsRecord] = []
    at = 0
    for position in range(draw(st.integers(1, 24))):
        at += draw(st.integers(0, S))
        task, worker = draw(st.integers(0, 1)), draw(st.sampled_from(WORKERS))
        named = draw(st.integers(0, max(0, position - 1)))
        kind = draw(st.sampled_from("CCRDD"))
        if kind == "C":
            records.append(claim(task, worker, at))
        elif kind == "R":
            records.append(Renew(task, worker, at, named, S))
        else:
            records.append(done(task, worker, at, named))
    return records


@settings(max_examples=examples(150), deadline=None)
@given(logs())
def test_fencing_only_refuses_completions(records: list[ClaimsRecord]) -> None:
    """Every DONE qw accepts, the original accepts too; and the comparison names exactly the
    CLAIMs and DONEs whose verdicts differ."""
    both, ours, theirs = RulesComparison(), ClaimState(), UnfencedState()
    for position, record in enumerate(records):
        difference = both.apply(record, position)
        qw_outcome, unfenced_outcome = ours.apply(record, position), theirs.apply(record, position)
        if qw_outcome.verdict is Verdict.DONE:
            assert unfenced_outcome.verdict.accepted_done
        differs = qw_outcome.verdict.value != unfenced_outcome.verdict.value
        expected = differs and not isinstance(record, Renew)
        assert (difference is not None) == expected
