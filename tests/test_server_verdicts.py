"""The verdict script (queue_worker.redis.server_verdicts) against the fold, on a real redis-server:
generated histories of CLAIM/RENEW/DONE/FAIL from several workers, every verdict and every
task's state compared record by record with ClaimState's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import IdentityError, LogError
from logstore.redis.log import RedisLog
from queue_worker.compaction.verdict_trim import trim_claims
from queue_worker.protocol.records import Cancel, Claim, Done, Fail, Renew
from queue_worker.protocol.state import ClaimState, Verdict
from queue_worker.redis.server_verdicts import (
    ServerVerdicts,
    VerdictsBehindError,
    fold_view,
    reply_verdict,
    server_view,
    state_key,
)
from queue_worker.topics import decode_claims_entry
from tests.examples import examples
from tests.helpers import lose_first_script_reply

pytestmark = pytest.mark.redis

WORKERS = ("w0-1-aa", "w1-2-bb", "w2-3-cc")
#: leases and backoffs around the server clock's millisecond, so that generated histories
#: hold claims that meet a live lease, an expired one (takeovers) and a backoff
LEASES = (-1000, 0, 1000, 2000, 5000, 10**9)
BACKOFFS = (None, -1000, 0, 1000, 3000, 10**9)

claims_op = st.tuples(
    st.just("C"), st.integers(0, 4), st.sampled_from(WORKERS), st.sampled_from(LEASES)
)
# an op acting under a claim: which of the claims so far (counted from the last), whether
# it is written by that claim's own worker for its task (else by `worker` for `task`)
acting = st.tuples(
    st.sampled_from(["R", "D", "F"]),
    st.integers(0, 4),
    st.sampled_from(WORKERS),
    st.integers(0, 5),
    st.booleans(),
    st.sampled_from(LEASES),
    st.sampled_from(BACKOFFS),
)
# compaction's step on the state (queue_worker.compaction.verdict_trim): the done tasks'
# fields below the fold's watermark dropped, the state's ~below moved up to it
trim_op = st.just(("T",))
# a CANCEL (`qw cancel`: a FAIL from no holder) of a task, pending, held or closed
cancel_op = st.tuples(st.just("V"), st.integers(0, 4), st.sampled_from(WORKERS))
histories = st.lists(st.one_of(claims_op, acting, trim_op, cancel_op), min_size=1, max_size=40)


def _record(
    op: tuple[object, ...], claims: list[tuple[int, Claim]], at: int
) -> Claim | Renew | Done | Fail:
    if op[0] == "C":
        _, task, worker, lease = op
        assert isinstance(task, int) and isinstance(worker, str) and isinstance(lease, int)
        return Claim(task, worker, at, lease)
    if op[0] == "V":
        _, task, by = op
        assert isinstance(task, int) and isinstance(by, str)
        return Cancel(task, by, at, -1, f"cancelled by {by}", None)
    kind, task, worker, back, own, lease, backoff = op
    assert isinstance(task, int) and isinstance(worker, str) and isinstance(back, int)
    assert isinstance(lease, int) and (backoff is None or isinstance(backoff, int))
    claim = 1  # no claim has this position: the record is refused by both
    if claims:
        claim, made = claims[-1 - back % len(claims)]
        if own:
            task, worker = made.task, made.worker
    if kind == "R":
        return Renew(task, worker, at, claim, lease)
    if kind == "D":
        return Done(task, worker, at, claim, {"r": task})
    retry = None if backoff is None else at + backoff
    return Fail(task, worker, at, claim, f"boom {task}", retry)


@pytest.fixture
def claims_log(redis_url: str) -> Iterator[RedisLog]:
    log = RedisLog.open(f"{redis_url}?prefix={uuid.uuid4().hex}", "claims")
    try:
        yield log
    finally:
        log.close()


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(history=histories)
def test_every_verdict_and_task_state_is_the_folds(
    redis_url: str, history: list[tuple[object, ...]]
) -> None:
    with RedisLog.open(f"{redis_url}?prefix={uuid.uuid4().hex}", "claims") as log:
        assert isinstance(log, RedisLog)
        server = ServerVerdicts(log)
        fold = ClaimState()
        claims: list[tuple[int, Claim]] = []
        for i, op in enumerate(history):
            if op[0] == "T":
                snap = fold.snapshot()
                trim_claims(log, log.start, snap.watermark, (t for t, _ in snap.dead))
                continue
            record = _record(op, claims, 1_700_000_000_000_000 + i)
            answer = server.append(record)
            [entry] = log.read(answer.position, 1)
            # the fold as every reader applies it: the bytes in the stream, on the server clock
            folded = decode_claims_entry(entry)
            outcome = fold.apply(folded, entry.position)
            assert answer.verdict is outcome.verdict, (i, record)
            assert answer.task == fold_view(fold, record.task), (i, record)
            if isinstance(record, Claim):
                claims.append((entry.position, record))
        state = server.state()
        if state is None:  # nothing appended: only trims
            assert all(op[0] == "T" for op in history)
            return
        assert state.through == state.tail == fold.position
        for task in range(5):
            assert state.view(task) == fold_view(fold, task)
            if task < state.below and not fold.is_dead(task):
                assert task not in state.tasks  # dropped by the trim


def test_a_history_that_meets_every_rule(claims_log: RedisLog) -> None:
    """One history by hand: each verdict the rules give, in order."""
    server = ServerVerdicts(claims_log)
    never = 10**9
    won = server.append(Claim(0, "a", 1, never))
    assert won.verdict is Verdict.WON
    assert server.append(Claim(0, "b", 2, never)).verdict is Verdict.LOST_HELD
    assert server.append(Renew(0, "b", 3, won.position, never)).verdict is Verdict.LEASE_LOST
    assert server.append(Renew(0, "a", 3, won.position, never)).verdict is Verdict.RENEWED
    released = server.append(Fail(0, "a", 4, won.position, "boom", 4 + never))
    assert released.verdict is Verdict.RELEASED
    assert released.task is not None and released.task.error == "boom"
    assert server.append(Claim(0, "b", 5, never)).verdict is Verdict.LOST_BACKOFF
    assert server.append(Done(0, "a", 6, won.position)).verdict is Verdict.STALE_DONE
    lapsed = server.append(Claim(1, "a", 7, -1))
    assert lapsed.verdict is Verdict.WON
    taken = server.append(Claim(1, "b", 8, never))
    assert taken.verdict is Verdict.TAKEOVER
    assert taken.task is not None and taken.task.attempts == 2
    assert server.append(Done(1, "a", 9, lapsed.position)).verdict is Verdict.STALE_DONE
    assert server.append(Done(1, "b", 9, taken.position)).verdict is Verdict.DONE
    assert server.append(Claim(1, "c", 10, never)).verdict is Verdict.LOST_DONE
    doomed = server.append(Claim(2, "c", 11, never))
    assert server.append(Fail(2, "c", 12, doomed.position, "bad", None)).verdict is Verdict.DEAD
    assert server.append(Claim(2, "a", 13, never)).verdict is Verdict.LOST_DEAD
    assert server.append(Fail(2, "c", 14, doomed.position, "x", None)).verdict is Verdict.STALE_FAIL


def test_a_lost_reply_is_answered_again_not_appended_twice(
    claims_log: RedisLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = ServerVerdicts(claims_log)
    lost = lose_first_script_reply(claims_log, monkeypatch)
    answer = server.append(Claim(0, "a", 1, 10**9))
    assert lost  # the first reply was lost, and the call retried
    assert answer.verdict is Verdict.WON  # the first call's verdict, not a LOST_HELD
    assert [e.position for e in claims_log.read(0)] == [answer.position]


def test_a_record_appended_without_the_script_stops_it(claims_log: RedisLog) -> None:
    """A state that misses a record would give verdicts no fold gives: refused, loudly."""
    server = ServerVerdicts(claims_log)
    server.append(Claim(0, "a", 1, 10**9))
    from queue_worker.protocol.records import encode

    sneaked = claims_log.append(encode(Claim(1, "b", 2, 10**9)))
    with pytest.raises(VerdictsBehindError, match="a writer appended without them") as refused:
        server.append(Claim(1, "a", 3, 10**9))
    assert isinstance(refused.value, IdentityError)  # a worker stops: it cannot go on
    assert claims_log.end() == sneaked + 1  # nothing appended
    assert state_key(claims_log).endswith(":qw:claims:verdicts")


def test_after_a_trim_of_the_state_the_verdicts_are_the_folds(claims_log: RedisLog) -> None:
    """Done tasks' fields dropped below the watermark (compaction's step): a CLAIM of one
    still loses as done, of a dead one as dead, and the task above is claimed as before."""
    server = ServerVerdicts(claims_log)
    never = 10**9
    fold = ClaimState()

    def append(record: Claim | Renew | Done | Fail) -> Verdict:
        answer = server.append(record)
        [entry] = claims_log.read(answer.position, 1)
        assert fold.apply(decode_claims_entry(entry), entry.position).verdict is answer.verdict
        return answer.verdict

    first = server.append(Claim(0, "a", 1, never))
    fold.apply(decode_claims_entry(claims_log.read(first.position, 1)[0]), first.position)
    assert append(Done(0, "a", 2, first.position)) is Verdict.DONE
    doomed = server.append(Claim(1, "a", 3, never))
    fold.apply(decode_claims_entry(claims_log.read(doomed.position, 1)[0]), doomed.position)
    assert append(Fail(1, "a", 4, doomed.position, "bad", None)) is Verdict.DEAD
    snap = fold.snapshot()
    assert snap.watermark == 2
    trim_claims(claims_log, claims_log.start, snap.watermark, (t for t, _ in snap.dead))
    state = server.state()
    assert state is not None and state.below == 2 and set(state.tasks) == {1}
    assert append(Claim(0, "b", 5, never)) is Verdict.LOST_DONE
    assert append(Claim(1, "b", 6, never)) is Verdict.LOST_DEAD
    assert append(Claim(2, "b", 7, never)) is Verdict.WON


@pytest.mark.parametrize(
    ("entry_id", "word", "st"),
    [
        (b"12-0", b"won", {b"s": b"o", b"n": 1, b"c": b"12-0", b"w": b"a", b"a": 1}),  # no e
        (b"12-0", b"won", {b"s": b"o", b"n": b"1"}),  # attempts not a number
        (b"12-0", b"won", {b"s": b"?"}),
        (b"12-0", b"won", [b"o"]),
        (b"12-0", b"maybe", False),
        (b"12", b"done", False),
        (b"12-1048576", b"done", False),  # a sequence number qw cannot pack
        ("12-0", b"done", False),
    ],
)
def test_a_reply_the_script_cannot_have_given_is_an_error_naming_it(
    claims_log: RedisLog, entry_id: object, word: object, st: object
) -> None:
    with pytest.raises(LogError, match="unexpected reply from redis") as caught:
        reply_verdict(claims_log, entry_id, word, st)
    assert repr(entry_id)[:20] in str(caught.value)


def test_a_reply_is_read_as_the_hash_state_is(claims_log: RedisLog) -> None:
    """The state in a reply and the same state kept in the hash read alike (the reply's
    map is read by `reply_verdict`, the hash's packed string by `server_view`)."""
    server = ServerVerdicts(claims_log)
    claim = server.append(Claim(3, "a", 1, 10**9))
    failed = server.append(Fail(3, "a", 2, claim.position, "boom é", 2 + 10**9))
    state = server.state()
    assert state is not None and failed.task is not None
    assert failed.task == state.view(3) == server_view(state.tasks[3])
    assert failed.task.retry_at is not None and failed.task.error == "boom é"
    again = server.append(Claim(3, "b", 3, 10**9))  # within the backoff: lost, unchanged
    assert again.verdict is Verdict.LOST_BACKOFF and again.task == failed.task
