"""The claiming script (queue_worker.redis.server_claim) on a real redis-server: the next task in
one call, orphans before fresh tasks, the previous task's DONE/FAIL in the same call, and
the report's fold agreeing with the server's state after all of it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from logstore.redis.log import RedisLog
from queue_worker.proof.verdict_check import check_log
from queue_worker.protocol.records import Done, Fail, TaskRecord, Unknown, decode_task, encode
from queue_worker.protocol.state import ClaimState, Verdict
from queue_worker.redis.server_claim import ServerClaims
from queue_worker.redis.server_verdicts import fold_view
from queue_worker.topics import decode_claims_entry, open_topics
from queue_worker.worker.dependencies import waits
from tests.examples import examples

pytestmark = pytest.mark.redis

NEVER = 10**9


@pytest.fixture
def logs(redis_url: str) -> Iterator[tuple[RedisLog, RedisLog]]:
    tasks, claims = open_topics(f"{redis_url}?prefix=c{uuid.uuid4().hex[:10]}")
    with tasks, claims:
        assert isinstance(tasks, RedisLog) and isinstance(claims, RedisLog)
        yield tasks, claims


def _enqueue(tasks: RedisLog, count: int) -> None:
    tasks.append_many([encode(TaskRecord({"n": n}, 1)) for n in range(count)])


def test_tasks_are_claimed_in_order_with_the_done_of_the_last(
    logs: tuple[RedisLog, RedisLog],
) -> None:
    tasks, claims = logs
    _enqueue(tasks, 3)
    server = ServerClaims(claims, tasks)
    got = server.next("a", NEVER, 1)
    seen = []
    while got.claimed is not None:
        assert got.claimed.verdict is Verdict.WON
        assert got.claim is not None and got.payload is not None
        assert decode_task(got.payload) == TaskRecord({"n": got.claim.task}, 1)
        seen.append(got.claim.task)
        done = Done(got.claim.task, "a", 2, got.claimed.position, "ok")
        got = server.next("a", NEVER, 2, finish=done)
        assert got.finished is not None and got.finished.verdict is Verdict.DONE
    assert seen == [0, 1, 2]
    assert got.nothing_open and got.next_change is None
    assert got.tasks_read == tasks.end()  # a worker waits for a task after the last one
    assert check_log(claims) == []


def test_a_lapsed_lease_is_taken_over_before_a_fresh_task(
    logs: tuple[RedisLog, RedisLog],
) -> None:
    tasks, claims = logs
    _enqueue(tasks, 2)
    server = ServerClaims(claims, tasks)
    dead = server.next("killed", -1000, 1)  # a lease already over: its worker is gone
    assert dead.claim is not None and dead.claim.task == 0
    survivor = server.next("b", NEVER, 2)
    assert survivor.claimed is not None and survivor.claimed.verdict is Verdict.TAKEOVER
    assert survivor.claim is not None and survivor.claim.task == 0
    assert survivor.claimed.task is not None and survivor.claimed.task.attempts == 2
    assert survivor.payload is not None  # read again by the entry id kept in its state
    stale = Done(0, "killed", 3, dead.claimed.position if dead.claimed else 0)
    late = server.next("killed", NEVER, 3, finish=stale, claim=False)
    assert late.finished is not None and late.finished.verdict is Verdict.STALE_DONE
    assert late.claimed is None
    assert check_log(claims) == []


def test_a_task_backing_off_is_not_claimed_until_its_time(
    logs: tuple[RedisLog, RedisLog],
) -> None:
    tasks, claims = logs
    _enqueue(tasks, 1)
    server = ServerClaims(claims, tasks)
    got = server.next("a", NEVER, 1)
    assert got.claimed is not None and got.claim is not None
    fail = Fail(0, "a", 5, got.claimed.position, "boom", 5 + NEVER)
    after = server.next("a", NEVER, 6, finish=fail)
    assert after.finished is not None and after.finished.verdict is Verdict.RELEASED
    assert after.claimed is None and not after.nothing_open
    # when the worker should look again: the retry time, on the server's clock
    assert after.next_change == after.finished.position // 2**20 * 1000 + NEVER
    assert check_log(claims) == []


WORKERS = ("w0-1-aa", "w1-2-bb", "w2-3-cc")
# a call of the claiming script by a worker: its lease, how it ends the first task it holds
# (if any) in the same call: DONE, FAIL with a backoff, dead FAIL, or not at all; whether
# to claim; how many tasks to claim at most; and whether its other held tasks are DONE and
# go first in the same call (queue_worker.redis.claim_batch: DONEs held for the next call)
calls = st.tuples(
    st.sampled_from(WORKERS),
    st.sampled_from([-1000, 0, 500, 1000, 10**9]),
    st.sampled_from(["done", "retry", "dead", "keep"]),
    st.sampled_from([-1000, 0, 2000, 10**9]),
    st.booleans(),
    st.integers(1, 3),
    st.booleans(),
)


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(history=st.lists(calls, min_size=1, max_size=30), tasks=st.integers(0, 12))
def test_the_claiming_scripts_verdicts_are_the_folds(
    redis_url: str, history: list[tuple[str, int, str, int, bool, int, bool]], tasks: int
) -> None:
    """Generated runs of the claiming script (each call maybe finishing the caller's tasks,
    maybe claiming one or several): every record it appends, CLAIMs built on the server
    included, is folded by ClaimState from the stream's bytes, in the stream's order, with
    the server's verdict and task state, and the report's cross-check finds nothing."""
    tasks_log, claims = open_topics(f"{redis_url}?prefix=h{uuid.uuid4().hex[:10]}")
    with tasks_log, claims:
        assert isinstance(tasks_log, RedisLog) and isinstance(claims, RedisLog)
        _enqueue(tasks_log, tasks)
        server = ServerClaims(claims, tasks_log)
        fold = ClaimState()
        held: dict[str, list[tuple[int, int]]] = {}  # worker -> (task, claim position)s
        for i, (worker, lease, end, backoff, claim, want, batch) in enumerate(history):
            at = 1_700_000_000_000_000 + i
            mine = held.get(worker, [])
            finish: Done | Fail | None = None
            earlier: list[tuple[Done | Fail, bytes]] = []
            if mine and end != "keep":
                if batch:
                    for task, position in mine[1:]:
                        done = Done(task, worker, at, position, i)
                        earlier.append((done, encode(done)))
                    del mine[1:]
                task, position = mine.pop(0)
                if end == "done":
                    finish = Done(task, worker, at, position, i)
                else:
                    retry = at + backoff if end == "retry" else None
                    finish = Fail(task, worker, at, position, f"boom {i}", retry)
            got = server.next(
                worker,
                lease,
                i,
                finish=finish,
                claim=claim or finish is None,
                want=want,
                earlier=earlier,
            )
            assert len(got.earlier) == len(earlier)
            event(f"claimed with others: {len(got.more)}")
            assert len(got.more) <= want - 1 and (not got.more or got.claimed is not None)
            answers = [*got.earlier, got.finished, got.claimed, *(m.claimed for m in got.more)]
            for answer in [a for a in answers if a is not None]:
                [entry] = claims.read(answer.position, 1)
                record = decode_claims_entry(entry)
                assert not isinstance(record, Unknown)
                outcome = fold.apply(record, entry.position)
                assert answer.verdict is outcome.verdict, (i, record)
                assert answer.task == fold_view(fold, record.task), (i, record)
            assert fold.position == claims.end() - 1  # every record appended was answered
            made = [(got.claimed, got.claim)] if got.claim is not None else []
            for claimed, claim_made in [*made, *((m.claimed, m.claim) for m in got.more)]:
                assert claimed is not None and claimed.verdict.won  # the pick let it go
                # (a task of ours again: our lease on it had lapsed, the new claim holds it)
                mine = [(t, p) for t, p in mine if t != claim_made.task]
                mine.append((claim_made.task, claimed.position))
            held[worker] = mine
        assert check_log(claims) == []


def test_several_tasks_are_claimed_in_one_call_and_their_dones_sent_in_the_next(
    logs: tuple[RedisLog, RedisLog],
) -> None:
    """`want` tasks from a deep backlog (twice as many untouched tasks as wanted), one from
    a shallow one (each of the last tasks to a worker of its own); the DONEs held for the
    next call are folded first, in order."""
    tasks, claims = logs
    _enqueue(tasks, 10)
    server = ServerClaims(claims, tasks)
    got = server.next("a", NEVER, 1, want=3)
    assert got.claim is not None and got.claim.task == 0
    assert [m.claim.task for m in got.more] == [1, 2]
    assert [decode_task(m.payload or b"") for m in got.more] == [
        TaskRecord({"n": 1}, 1),
        TaskRecord({"n": 2}, 1),
    ]
    assert got.claimed is not None
    held = [(got.claimed.position, 0), *((m.claimed.position, m.claim.task) for m in got.more)]
    earlier = [(d, encode(d)) for d in (Done(t, "a", 2, p, "ok") for p, t in held[:2])]
    last = Done(2, "a", 2, held[2][0], "ok")
    after = server.next("a", NEVER, 2, finish=last, earlier=earlier, want=3)
    assert [a.verdict for a in after.earlier] == [Verdict.DONE, Verdict.DONE]
    assert [a.position for a in after.earlier] == sorted(a.position for a in after.earlier)
    assert after.finished is not None and after.finished.verdict is Verdict.DONE
    assert after.finished.position > after.earlier[-1].position
    assert after.claim is not None and after.claim.task == 3  # 7 untouched: deep
    assert [m.claim.task for m in after.more] == [4, 5]
    shallow = server.next("b", NEVER, 3, want=3)  # 4 untouched: fewer than twice 3
    assert shallow.claim is not None and shallow.claim.task == 6 and shallow.more == ()
    assert check_log(claims) == []


def test_a_restarted_worker_leaves_its_predecessors_lapsed_task_to_the_others(
    logs: tuple[RedisLog, RedisLog],
) -> None:
    """Not by the heir (queue_worker.worker.pick): the lapsed task of a worker with our name and
    host but another process is left to the others for one lease after its lapse."""
    tasks, claims = logs
    _enqueue(tasks, 2)
    server = ServerClaims(claims, tasks)
    lease = 60_000_000
    dead = server.next("w0@h-1-aa", -1000, 0)  # its lease lapsed at once: killed, say
    assert dead.claim is not None and dead.claim.task == 0
    heir = server.next("w0@h-2-bb", lease, 0, heirs=True)
    assert heir.claim is not None and heir.claim.task == 1  # fresh backlog, not task 0
    assert heir.claimed is not None and heir.claimed.verdict is Verdict.WON
    again = server.next("w0@h-2-bb", lease, 0, heirs=True)
    assert again.claimed is None  # nothing else: it waits until its wait for task 0 ends
    assert again.server_now is not None and again.next_change is not None
    assert again.next_change > again.server_now
    sibling = server.next("w1@h-3-cc", lease, 0, heirs=True)
    assert sibling.claim is not None and sibling.claim.task == 0
    assert sibling.claimed is not None and sibling.claimed.verdict is Verdict.TAKEOVER


def test_a_worker_without_siblings_takes_its_predecessors_lapsed_task(
    logs: tuple[RedisLog, RedisLog],
) -> None:
    tasks, claims = logs
    _enqueue(tasks, 2)
    server = ServerClaims(claims, tasks)
    server.next("w0@h-1-aa", -1000, 0)
    heir = server.next("w0@h-2-bb", 60_000_000, 0, heirs=False)  # nobody to leave it to
    assert heir.claim is not None and heir.claim.task == 0
    assert heir.claimed is not None and heir.claimed.verdict is Verdict.TAKEOVER


# -- delays, priorities and cancel: the server's pick against a model of the pick rules -----

HOUR = 3_600_000_000
# a task: its priority, and when it is due: "plain" (no options: a record without them),
# "now" (options, no delay), "past" (a delay already over) or "later" (an hour ahead)
task_specs = st.tuples(
    st.sampled_from([-2, -1, 0, 0, 2, 5]), st.sampled_from(["plain", "now", "past", "later"])
)
# an op: a claim by the worker that finishes what it claims ("run"), by one that dies
# holding it ("orphan": its lease lapsed a second ago), or a CANCEL of task n
pick_ops = st.tuples(st.sampled_from(["run", "run", "orphan", "cancel"]), st.integers(0, 9))


def _enqueue_spec(tasks: RedisLog, n: int, priority: int, due: str, now: int) -> None:
    from queue_worker.redis.task_options import append_with_options

    if due == "plain" and priority == 0:
        tasks.append(encode(TaskRecord({"n": n}, 1)))
        return
    not_before = {"plain": 0, "now": 0, "past": 1, "later": now + HOUR}[due]
    record = TaskRecord(None, 1, "f", [n], {}, not_before, priority)
    append_with_options(tasks, encode(record), key=None, not_before=not_before, priority=priority)


def _expected_pick(
    fold: ClaimState,
    specs: list[tuple[int, int]],
    now: int,
    after: dict[int, tuple[int, ...]] | None = None,
) -> tuple[tuple[int, int, int], ...]:
    """The tasks the pick rules would try first, best first: the highest priority; within
    one, the lapsed leases (oldest first), then the lowest id; none not due, none waiting
    for a dependency (`after`)."""
    ranked = []
    for task, (priority, not_before) in enumerate(specs):
        if not_before > now or not fold.is_claimable(task, now):
            continue
        if after and task in after and waits(after[task], fold):
            continue
        holder = fold.holder(task)
        if holder is not None:
            ranked.append((-priority, 0, holder.expiry, task))
        else:
            ranked.append((-priority, 1, task, task))
    ranked.sort()
    return tuple((r[0], r[1], r[3]) for r in ranked)


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    specs=st.lists(task_specs, min_size=1, max_size=10),
    ops=st.lists(pick_ops, min_size=1, max_size=25),
)
def test_the_server_picks_by_priority_and_delay_as_the_pick_rules_say(
    redis_url: str, specs: list[tuple[int, str]], ops: list[tuple[str, int]]
) -> None:
    """Tasks with priorities and delays, enqueued as producers do (in any order: a task of
    a higher priority behind a backlog is found), claimed by workers that finish them or
    die holding them, some cancelled: every CLAIM is the best task by the pick rules (never
    one not due, never a cancelled one), every record the fold's verdict, and the report's
    cross-check finds nothing."""
    import time

    from queue_worker.protocol.records import Cancel
    from queue_worker.redis.server_verdicts import ServerVerdicts

    now = time.time_ns() // 1000
    tasks_log, claims = open_topics(f"{redis_url}?prefix=p{uuid.uuid4().hex[:10]}")
    with tasks_log, claims:
        assert isinstance(tasks_log, RedisLog) and isinstance(claims, RedisLog)
        due_at = []
        for n, (priority, due) in enumerate(specs):
            _enqueue_spec(tasks_log, n, priority, due, now)
            due_at.append((priority, now + HOUR if due == "later" else 0))
        server, verdicts = ServerClaims(claims, tasks_log), ServerVerdicts(claims)
        fold = ClaimState()

        def folded(position: int) -> Verdict:
            [entry] = claims.read(position, 1)
            return fold.apply(decode_claims_entry(entry), entry.position).verdict

        for i, (op, n) in enumerate(ops):
            if op == "cancel":
                if n < len(specs):
                    answer = verdicts.append(Cancel(n, "op", i, -1, "cancelled by op", None))
                    assert answer.verdict is folded(answer.position)
                continue
            worker, lease = ("a", NEVER) if op == "run" else (f"dies{i}", -1_000_000)
            expected = _expected_pick(fold, due_at, time.time_ns() // 1000)
            got = server.next(worker, lease, i)
            if got.claimed is None or got.claim is None:
                assert expected == (), i
                continue
            assert got.claimed.verdict.won and got.claimed.verdict is folded(got.claimed.position)
            assert expected and got.claim.task == expected[0][2], (i, expected)
            if op == "run":
                done = Done(got.claim.task, worker, i, got.claimed.position, i)
                ended = server.next(worker, lease, i, finish=done, claim=False)
                assert ended.finished is not None
                assert ended.finished.verdict is folded(ended.finished.position)
        for task, (_, not_before) in enumerate(due_at):
            if not_before:
                assert fold.task_state(task) is None or fold.is_dead(task)  # never claimed
        assert check_log(claims) == []


# -- dependencies: a task waits while one of them is open and none is dead -------------------

# a task: its priority, when it is due, and which earlier tasks it depends on (bits of an
# integer: bit k is task k)
dependent_specs = st.tuples(
    st.sampled_from([-1, 0, 0, 0, 2]), st.sampled_from(["plain", "plain", "later"]),
    st.integers(0, 2**10 - 1),
)  # fmt: skip
# an op: a claim by a worker that finishes what it claims ("run"), fails it for good
# ("die"), or dies holding it ("orphan"); or a CANCEL of task n
dependency_ops = st.tuples(
    st.sampled_from(["run", "run", "die", "orphan", "cancel"]), st.integers(0, 9)
)


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    specs=st.lists(dependent_specs, min_size=1, max_size=10),
    ops=st.lists(dependency_ops, min_size=1, max_size=30),
)
def test_the_server_never_hands_out_a_task_whose_dependency_is_open_and_none_dead(
    redis_url: str, specs: list[tuple[int, str, int]], ops: list[tuple[str, int]]
) -> None:
    """Tasks with dependencies (and priorities, delays), claimed by workers that finish
    them, fail them for good or die holding them, some cancelled: every CLAIM is the best
    task by the pick rules, none waiting (a dependency open, none dead), and each task whose
    dependencies close is handed out once they do, the verdict of every record the fold's;
    at the end every task is closed or waits (a delay, or a dependency still open)."""
    import time

    from queue_worker.protocol.records import Cancel
    from queue_worker.redis.server_verdicts import ServerVerdicts
    from queue_worker.redis.task_options import append_with_options

    now = time.time_ns() // 1000
    tasks_log, claims = open_topics(f"{redis_url}?prefix=d{uuid.uuid4().hex[:10]}")
    with tasks_log, claims:
        assert isinstance(tasks_log, RedisLog) and isinstance(claims, RedisLog)
        due_at, after = [], {}
        for n, (priority, due, bits) in enumerate(specs):
            deps = tuple(d for d in range(n) if bits >> d & 1)
            not_before = now + HOUR if due == "later" else 0
            record = TaskRecord(None, 1, "f", [n], {}, not_before, priority, after=deps)
            append_with_options(
                tasks_log, encode(record), key=None, not_before=not_before, priority=priority,
                after=deps,
            )  # fmt: skip
            due_at.append((priority, not_before))
            if deps:
                after[n] = deps
        event(f"{len(after)} of {len(specs)} tasks with dependencies")
        server, verdicts = ServerClaims(claims, tasks_log), ServerVerdicts(claims)
        fold = ClaimState()

        def folded(position: int) -> Verdict:
            [entry] = claims.read(position, 1)
            return fold.apply(decode_claims_entry(entry), entry.position).verdict

        for i, (op, n) in enumerate([*ops, *[("run", 0)] * len(specs)]):
            if op == "cancel":
                if n < len(specs):
                    answer = verdicts.append(Cancel(n, "op", i, -1, "cancelled by op", None))
                    assert answer.verdict is folded(answer.position)
                continue
            worker, lease = ("a", NEVER) if op != "orphan" else (f"dies{i}", -1_000_000)
            expected = _expected_pick(fold, due_at, time.time_ns() // 1000, after)
            got = server.next(worker, lease, i)
            if got.claimed is None or got.claim is None:
                assert expected == (), i
                continue
            assert got.claimed.verdict.won and got.claimed.verdict is folded(got.claimed.position)
            assert expected and got.claim.task == expected[0][2], (i, expected)
            position = got.claimed.position
            end: Done | Fail | None = None
            if op == "run":
                end = Done(got.claim.task, worker, i, position, i)
            elif op == "die":
                end = Fail(got.claim.task, worker, i, position, f"E: {i}", None)
            if end is not None:
                ended = server.next(worker, lease, i, finish=end, claim=False)
                assert ended.finished is not None
                assert ended.finished.verdict is folded(ended.finished.position)
        for task, (_, not_before) in enumerate(due_at):  # the runs at the end ran them all
            assert fold.is_closed(task) or not_before or waits(after.get(task, ()), fold), task
        assert check_log(claims) == []
