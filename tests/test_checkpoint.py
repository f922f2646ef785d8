"""The fold checkpoint (queue_worker/history/checkpoint.py) over real file logs.

A restored fold must be indistinguishable from a full replay (same state, same answers,
same verdict for every later record); a checkpoint that does not describe the logs in the
directory, or is not a whole checkpoint at all, must be refused without touching the logs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore import Log
from logstore.file.framing import encode_frame
from logstore.file.log import FileLog
from queue_worker.history.checkpoint import (
    CHECKPOINT_NAME,
    FORMAT,
    VERSION,
    CheckpointError,
    CheckpointRefused,
    load_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from queue_worker.protocol.records import (
    Cancel,
    Claim,
    ClaimsRecord,
    Done,
    Fail,
    RecordDecodeError,
    Renew,
    TaskRecord,
    encode,
)
from queue_worker.protocol.state import ClaimState, Outcome, Verdict
from queue_worker.topics import ClaimsFollower, TaskIndex, open_topics
from tests.examples import examples

MS = 1_000
T0 = 1_700_000_000 * 1_000_000


def pack(value: Any) -> bytes:
    data: bytes = msgpack.packb(value)
    return data


GARBAGE = b"\xc1 not msgpack"  # 0xc1 is a byte msgpack never uses
UNKNOWN_TYPE = pack([1, "X", "from a newer writer"])  # decodes as Unknown
BOGUS_TOKEN = 3  # a claim position no record of a file log has (the first is at 16)

# -- building logs ---------------------------------------------------------------------------


class Step(NamedTuple):
    """One claims record to append. `ref`: for RENEW/DONE/FAIL, the index of the earlier
    step whose record's position is the claim they act under (None: a bogus token)."""

    kind: str  # claim, renew, done, retry, dead, garbage, unknown
    task: int
    worker: str
    at: int
    amount: int = 0  # the lease (claim, renew) or the backoff (retry), µs
    ref: int | None = None


def encode_step(step: Step, positions: list[int]) -> bytes:
    if step.kind == "garbage":
        return GARBAGE
    if step.kind == "unknown":
        return UNKNOWN_TYPE
    t, w, at = step.task, step.worker, step.at
    if step.kind == "claim":
        return encode(Claim(t, w, at, step.amount))
    token = BOGUS_TOKEN if step.ref is None else positions[step.ref]
    record: ClaimsRecord
    if step.kind == "renew":
        record = Renew(t, w, at, token, step.amount)
    elif step.kind == "done":
        record = Done(t, w, at, token, {"result": t})
    elif step.kind == "retry":
        record = Fail(t, w, at, token, "try again", at + step.amount)
    else:
        assert step.kind == "dead"
        record = Fail(t, w, at, token, f"gave up on {t}", None)
    return encode(record)


def append_steps(log: Log, steps: list[Step], positions: list[int]) -> None:
    """Append `steps` one by one; `positions` holds the positions of the earlier ones."""
    for step in steps:
        positions.append(log.append(encode_step(step, positions)))


def task_bytes(kind: str, n: int) -> bytes:
    if kind in ("task", "task-y"):  # two kinds of task of the same length
        return encode(TaskRecord({"n": n, "pad": kind[-1] * (n % 7 + 1)}, T0 + n))
    if kind == "foreign":
        return pack([1, "Z", n])
    assert kind == "garbage"
    return GARBAGE


def append_tasks(log: Log, kinds: list[str], first: int = 0) -> None:
    log.append_many([task_bytes(kind, first + i) for i, kind in enumerate(kinds)])


@contextmanager
def topics(directory: Path) -> Iterator[tuple[Log, Log]]:
    tasks_log, claims_log = open_topics(directory)
    try:
        yield tasks_log, claims_log
    finally:
        tasks_log.close()
        claims_log.close()


def replay(tasks_log: Log, claims_log: Log) -> tuple[TaskIndex, ClaimsFollower]:
    """A full replay from the start, as a worker does without a checkpoint."""
    index, follower = TaskIndex(tasks_log.start), ClaimsFollower(claims_log.start)
    index.catch_up(tasks_log)
    follower.catch_up(claims_log)
    return index, follower


def fold_rest(follower: ClaimsFollower, log: Log) -> list[Outcome]:
    """Fold every record the follower has not read yet; the verdict of each."""
    return [follower.apply(entry)[0] for entry in log.iter_from(follower.next_position)]


def log_bytes(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in ("tasks.log", "claims.log")}


# -- comparing folds -------------------------------------------------------------------------

TASK_IDS = range(-1, 9)


def assert_same_claims(a: ClaimsFollower, b: ClaimsFollower) -> None:
    assert (a.next_position, a.malformed, a.last_malformed) == (
        b.next_position,
        b.malformed,
        b.last_malformed,
    )
    sa, sb = a.state, b.state
    assert sa == sb  # every field, _open/_dead/_closed_above/_held included
    assert list(sa.held_tasks()) == list(sb.held_tasks())  # in the same order
    assert list(sa.dead_tasks().items()) == list(sb.dead_tasks().items())
    counts = ("position", "done_count", "dead_count", "unknown_count", "watermark", "held_count")
    assert [getattr(sa, c) for c in counts] == [getattr(sb, c) for c in counts]
    times = sorted({T0, *(lease.expiry for _, lease in sa.held_tasks()), T0 + 10**9})
    times += [t - 1 for t in times]
    for now in times:
        assert sa.next_change(now) == sb.next_change(now)
        assert list(sa.claimable(now, 9)) == list(sb.claimable(now, 9))
    for t in TASK_IDS:
        assert sa.holder(t) == sb.holder(t)
        assert sa.task_state(t) == sb.task_state(t)
        assert sa.attempts(t) == sb.attempts(t)
        assert (sa.is_done(t), sa.is_dead(t), sa.dead_error(t)) == (
            sb.is_done(t),
            sb.is_dead(t),
            sb.dead_error(t),
        )
        assert [sa.is_claimable(t, now) for now in times] == [
            sb.is_claimable(t, now) for now in times
        ]


def assert_same_index(a: TaskIndex, b: TaskIndex, log: Log) -> None:
    assert (a.known, a.next_position) == (b.known, b.next_position)
    assert [a.position_of(t) for t in range(a.known)] == [b.position_of(t) for t in range(b.known)]
    assert a.foreign == b.foreign
    assert list(a.unreadable.items()) == list(b.unreadable.items())
    for t in range(a.known):
        if t in a.unreadable:
            with pytest.raises(RecordDecodeError):
                a.load(log, t)
        elif t not in a.foreign:
            assert a.load(log, t) == b.load(log, t)
            assert a.load(log, t).payload["n"] == t


# -- round trip: random logs, random checkpoint points ---------------------------------------

CLAIMS_KINDS = ("claim", "claim", "claim", "renew", "done", "done", "retry", "dead")
OTHER_KINDS = ("garbage", "unknown")


@st.composite
def claims_steps(draw: st.DrawFn) -> list[Step]:
    """A claims log as a few workers could write it: acting records mostly name a real
    claim of theirs, sometimes another's, a non-claim, or a bogus token."""
    steps: list[Step] = []
    at = T0
    for _ in range(draw(st.integers(0, 40))):
        at += draw(st.integers(0, 6)) * MS
        kind = draw(st.sampled_from(CLAIMS_KINDS + OTHER_KINDS))
        task = draw(st.integers(-1, 5))
        worker = draw(st.sampled_from("abc"))
        amount = draw(st.integers(0, 12)) * MS
        ref = None
        claims = [i for i, s in enumerate(steps) if s.kind == "claim"]
        if kind in CLAIMS_KINDS[3:] and steps and draw(st.integers(0, 4)):
            ref = draw(st.sampled_from(claims)) if claims else len(steps) - 1
            task = steps[ref].task
            if draw(st.integers(0, 4)):
                worker = steps[ref].worker
        steps.append(Step(kind, task, worker, at, amount, ref))
    return steps


task_kinds = st.lists(st.sampled_from(("task", "task", "task", "foreign", "garbage")), max_size=12)


def logs_with_checkpoint(
    directory: Path, steps: list[Step], tasks: list[str], cut: int, tcut: int
) -> tuple[TaskIndex, ClaimsFollower]:
    """Logs of `tasks` and `steps` in `directory`, with a checkpoint taken after the first
    `cut` claims records and `tcut` tasks; returns the folds it saved."""
    positions: list[int] = []
    with topics(directory) as (tasks_log, claims_log):
        append_tasks(tasks_log, tasks[:tcut])
        append_steps(claims_log, steps[:cut], positions)
        index, follower = replay(tasks_log, claims_log)
        save_checkpoint(directory, index, tasks_log, follower, claims_log)
        append_tasks(tasks_log, tasks[tcut:], first=tcut)
        append_steps(claims_log, steps[cut:], positions)
    return index, follower


@settings(max_examples=examples(75), deadline=None)
@given(steps=claims_steps(), tasks=task_kinds, data=st.data())
def test_restored_fold_matches_full_replay(
    steps: list[Step], tasks: list[str], data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(steps)), label="claims records before the checkpoint")
    tcut = data.draw(st.integers(0, len(tasks)), label="task records before the checkpoint")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        saved_index, saved_claims = logs_with_checkpoint(directory, steps, tasks, cut, tcut)
        with topics(directory) as (tasks_log, claims_log):  # a new worker starts
            loaded = load_checkpoint(directory, tasks_log, claims_log)
            assert loaded is not None
            index, follower = loaded
            assert_same_claims(follower, saved_claims)
            assert_same_index(index, saved_index, tasks_log)

            tail = fold_rest(follower, claims_log)
            index.catch_up(tasks_log)
            full = ClaimsFollower(claims_log.start)
            everything = fold_rest(full, claims_log)
            assert len(tail) == len(steps) - cut
            assert tail == everything[cut:]  # the same verdict for every later record
            assert_same_claims(follower, full)
            full_index, _ = replay(tasks_log, claims_log)
            assert_same_index(index, full_index, tasks_log)


# -- a scenario with every verdict -----------------------------------------------------------


def scenario(worker: str = "a", other: str = "b") -> tuple[list[Step], list[Verdict]]:
    """Claims records that reach every kind of verdict, and those verdicts."""
    w, o, s = worker, other, 1_000 * MS
    steps = [
        Step("claim", 0, w, T0, s),  # 0
        Step("claim", 1, w, T0, s),  # 1
        Step("claim", 0, o, T0 + 1, s),  # 2
        Step("renew", 0, w, T0 + 2, 2 * s, ref=0),  # 3
        Step("done", 0, w, T0 + 3, ref=0),  # 4
        Step("garbage", 0, w, 0),  # 5
        Step("retry", 1, w, T0 + 4, 10 * s, ref=1),  # 6
        Step("claim", 1, o, T0 + 5, s),  # 7
        Step("claim", 2, w, T0 + 6, s),  # 8
        Step("dead", 2, w, T0 + 7, ref=8),  # 9
        Step("claim", 3, w, T0 + 8, 5),  # 10
        Step("claim", 3, o, T0 + 20, s),  # 11
        Step("done", 3, w, T0 + 21, ref=10),  # 12
        Step("unknown", 0, w, 0),  # 13
        Step("claim", 4, w, T0 + 22, s),  # 14
        Step("claim", 1, w, T0 + 11 * s, s),  # 15
        Step("done", 1, w, T0 + 11 * s + 1, ref=15),  # 16
        Step("claim", 0, o, T0 + 12 * s, s),  # 17
        Step("claim", 2, o, T0 + 12 * s, s),  # 18
        Step("renew", 3, w, T0 + 12 * s, s, ref=10),  # 19
        Step("retry", 3, w, T0 + 12 * s, s, ref=10),  # 20
    ]
    V = Verdict
    verdicts = [V.WON, V.WON, V.LOST_HELD, V.RENEWED, V.DONE, V.UNKNOWN, V.RELEASED]
    verdicts += [V.LOST_BACKOFF, V.WON, V.DEAD, V.WON, V.TAKEOVER, V.STALE_DONE, V.UNKNOWN]
    verdicts += [V.WON, V.WON, V.DONE, V.LOST_DONE, V.LOST_DEAD, V.LEASE_LOST, V.STALE_FAIL]
    return steps, verdicts


TASKS = ["task", "foreign", "garbage", "task", "task", "task"]
CUT = 10  # the checkpoint is taken after this many claims records, with these many tasks:
TASK_CUT = 4


def build(directory: Path, steps: list[Step] | None = None, tasks: list[str] = TASKS) -> None:
    """The scenario (or `steps`) in `directory`, with a checkpoint after CUT claims records
    and TASK_CUT tasks."""
    steps = scenario()[0] if steps is None else steps
    logs_with_checkpoint(directory, steps, tasks, CUT, TASK_CUT)


def test_the_scenario_reaches_every_verdict(tmp_path: Path) -> None:
    steps, verdicts = scenario()
    with topics(tmp_path) as (_, claims_log):
        append_steps(claims_log, steps, [])
        got = fold_rest(ClaimsFollower(claims_log.start), claims_log)
    assert [o.verdict for o in got] == verdicts
    assert set(verdicts) == set(Verdict)
    assert set(verdicts[:CUT]) != set(verdicts[CUT:])  # the checkpoint falls in the middle


def test_restore_then_tail_in_the_scenario(tmp_path: Path) -> None:
    build(tmp_path)
    _, verdicts = scenario()
    with topics(tmp_path) as (tasks_log, claims_log):
        loaded = load_checkpoint(tmp_path, tasks_log, claims_log)
        assert loaded is not None
        index, follower = loaded
        # what the fold knew at the checkpoint: task 0 done, 1 backing off, 2 dead, one bad
        state = follower.state
        assert (state.done_count, state.dead_count, state.watermark) == (1, 1, 1)
        assert state.dead_tasks() == {2: "gave up on 2"}
        backing_off = state.task_state(1)
        assert backing_off is not None and backing_off.retry_at is not None
        assert follower.malformed == 1 and state.unknown_count == 1
        assert (index.known, index.foreign, set(index.unreadable)) == (TASK_CUT, {1}, {2})

        tail = fold_rest(follower, claims_log)
        assert [o.verdict for o in tail] == verdicts[CUT:]
        assert index.catch_up(tasks_log) == len(TASKS) - TASK_CUT
        full_index, full = replay(tasks_log, claims_log)
        assert_same_claims(follower, full)
        assert_same_index(index, full_index, tasks_log)
        assert follower.state.held_count == 2  # task 3 (taken over) and task 4
        taken_over = follower.state.task_state(3)
        assert taken_over is not None and taken_over.holder == full.state.holder(3)


# -- refusing checkpoints of other logs ------------------------------------------------------


def check_refused(directory: Path) -> str:
    """Load must give None, say why, and leave the logs and the checkpoint as they were."""
    before = log_bytes(directory)
    checkpoint = directory / CHECKPOINT_NAME
    saved = checkpoint.read_bytes() if checkpoint.is_file() else None
    with topics(directory) as (tasks_log, claims_log):
        assert load_checkpoint(directory, tasks_log, claims_log) is None
        with pytest.raises(CheckpointRefused) as refused:
            restore_checkpoint(directory, tasks_log, claims_log)
    assert log_bytes(directory) == before
    if saved is not None:
        assert checkpoint.read_bytes() == saved
    return str(refused.value)


def check_loads(directory: Path) -> None:
    with topics(directory) as (tasks_log, claims_log):
        assert load_checkpoint(directory, tasks_log, claims_log) is not None


def test_no_checkpoint(tmp_path: Path) -> None:
    with topics(tmp_path) as (tasks_log, _):
        append_tasks(tasks_log, ["task"])
    assert "no checkpoint" in check_refused(tmp_path)


def changed(index: int, **fields: Any) -> list[Step]:
    steps = scenario()[0]
    steps[index] = steps[index]._replace(**fields)
    return steps


# Each variant differs from the scenario in records the checkpoint covers, with the same
# lengths: every record stays at the same position, only the bytes differ. The first and
# the last covered record are the ones a load reads again.
VARIANTS: dict[str, tuple[list[Step], list[str]]] = {
    "every claims record": (scenario("x", "y")[0], TASKS),
    "first claims record": (changed(0, at=T0 - 1), TASKS),
    "last claims record": (changed(CUT - 1, at=T0 + 77), TASKS),
    "first task record": (scenario()[0], ["task-y", *TASKS[1:]]),
    "last task record": (scenario()[0], [*TASKS[:3], "task-y", *TASKS[4:]]),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_checkpoint_of_another_directory_is_refused(tmp_path: Path, variant: str) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    build(mine)
    build(other, *VARIANTS[variant])
    check_loads(other)  # its own checkpoint is fine...
    shutil.copyfile(mine / CHECKPOINT_NAME, other / CHECKPOINT_NAME)
    assert "differs" in check_refused(other)  # ...mine is not
    check_loads(mine)


def test_a_checkpoint_of_another_queue_with_the_same_records_is_refused(tmp_path: Path) -> None:
    """Byte for byte the same records, but another queue: the checkpoint names its logs'
    identity (queue id and topic), and that is what is refused."""
    mine, other = tmp_path / "mine", tmp_path / "other"
    build(mine)
    build(other)
    shutil.copyfile(mine / CHECKPOINT_NAME, other / CHECKPOINT_NAME)
    assert "taken of the log" in check_refused(other)
    check_loads(mine)


@pytest.mark.parametrize("topic", ["claims", "tasks"])
def test_a_record_changed_between_the_first_and_the_last_is_refused(
    tmp_path: Path, topic: str
) -> None:
    """The checkpoint covers every byte up to its position, not only its two ends: a middle
    record rewritten as a valid frame (its checksum recomputed: the log itself reads fine)
    refuses it; a damaged one too."""
    build(tmp_path)
    path = tmp_path / f"{topic}.log"
    with FileLog.open(path, read_only=True) as log:
        entries = list(log.iter_from(log.start))
    middle = entries[(TASK_CUT if topic == "tasks" else CUT) // 2]
    image = bytearray(path.read_bytes())
    continued = bool(image[middle.position + 3] & 0x80)
    changed = bytes([middle.data[0] ^ 0x01]) + middle.data[1:]
    image[middle.position : middle.next] = encode_frame(changed, continued)
    path.write_bytes(bytes(image))
    with FileLog.open(path, read_only=True) as log:
        assert log.check() == len(image)  # a valid log, only different
    assert "have changed since it was taken" in check_refused(tmp_path)
    image[middle.next - 1] ^= 0x01  # and now damaged (a replay then names the offset)
    path.write_bytes(bytes(image))
    why = check_refused(tmp_path)
    assert "have changed" in why or f"corrupt record at byte offset {middle.position}" in why


def test_a_claims_log_cut_short_is_refused(tmp_path: Path) -> None:
    build(tmp_path)
    with topics(tmp_path) as (tasks_log, claims_log):
        loaded = load_checkpoint(tmp_path, tasks_log, claims_log)
        assert loaded is not None
        covered = loaded[1].next_position
        last = loaded[1].state.position
    # cut after what the checkpoint covers: still the same log, the checkpoint holds
    os.truncate(tmp_path / "claims.log", covered)
    check_loads(tmp_path)
    # cut into the last record the checkpoint folded (a power cut could): refused
    os.truncate(tmp_path / "claims.log", last)
    assert "missing" in check_refused(tmp_path)


def test_a_log_replaced_by_a_longer_one_is_refused(tmp_path: Path) -> None:
    build(tmp_path)
    for name in os.listdir(tmp_path):
        if name.startswith("claims.log"):
            os.unlink(tmp_path / name)
    with topics(tmp_path) as (_, claims_log):  # a new log, longer than the old one
        steps, _ = scenario("other-worker", "other-b")
        append_steps(claims_log, steps + steps, [])
    check_refused(tmp_path)


def test_an_empty_log_is_not_the_log_it_was(tmp_path: Path) -> None:
    build(tmp_path)
    for name in ("claims.log", "claims.log.sync"):
        os.unlink(tmp_path / name)
    with topics(tmp_path):
        pass  # a new, empty claims log
    assert "missing" in check_refused(tmp_path)


# -- refusing files that are not whole checkpoints -------------------------------------------


def envelope(body: bytes, *, version: Any = VERSION, crc: int | None = None) -> bytes:
    crc = zlib.crc32(body) if crc is None else crc
    return pack({"format": FORMAT, "version": version, "crc32": crc, "body": body})


def saved_body(directory: Path) -> dict[str, Any]:
    outer = msgpack.unpackb((directory / CHECKPOINT_NAME).read_bytes())
    body: dict[str, Any] = msgpack.unpackb(outer["body"])
    return body


def with_state(directory: Path, **changes: Any) -> bytes:
    body = saved_body(directory)
    body["claims"]["state"].update(changes)
    return envelope(pack(body))


BAD_FILES: dict[str, Callable[[Path], bytes]] = {
    "empty": lambda d: b"",
    "garbage": lambda d: b"\x00\xff garbage \x01" * 50,
    "msgpack, not a map": lambda d: pack([1, 2, 3]),
    "another format": lambda d: pack({"format": "something else", "version": 1}),
    "a newer version": lambda d: envelope(pack(saved_body(d)), version=VERSION + 1),
    "a bad checksum": lambda d: envelope(pack(saved_body(d)), crc=12345),
    "a body of garbage": lambda d: envelope(b"\xc1\xc1"),
    "a body with no claims": lambda d: envelope(pack({"tasks": saved_body(d)["tasks"]})),
    "a bool for an int": lambda d: with_state(d, watermark=True),
    "a dead count that is off": lambda d: with_state(d, dead_count=5),
    "an open task that is closed": lambda d: with_state(d, open=[[0, None, 1, None, None]]),
    "a negative count of FAILs": lambda d: with_state(d, failed_count=-1, failed_exact=False),
    "a number for the FAILs' exactness": lambda d: with_state(d, failed_exact=1),
    "a truncated file": lambda d: (d / CHECKPOINT_NAME).read_bytes()[:-7],
    "task positions cut mid-integer": lambda d: envelope(
        pack({**saved_body(d), "tasks": {**saved_body(d)["tasks"], "positions": b"\x10\x00\x00"}})
    ),
}


@pytest.mark.parametrize("bad", BAD_FILES)
def test_a_bad_checkpoint_file_means_replay(tmp_path: Path, bad: str) -> None:
    build(tmp_path)
    check_loads(tmp_path)
    (tmp_path / CHECKPOINT_NAME).write_bytes(BAD_FILES[bad](tmp_path))
    check_refused(tmp_path)


def test_the_checkpoint_keeps_the_fails_accepted(tmp_path: Path) -> None:
    # (the scenario's records before the checkpoint: a FAIL for a retry and a dead one)
    build(tmp_path)
    assert saved_body(tmp_path)["claims"]["state"]["failed_count"] == 2
    with topics(tmp_path) as (tasks_log, claims_log):
        loaded = load_checkpoint(tmp_path, tasks_log, claims_log)
        assert loaded is not None
        state = loaded[1].state
        assert (state.failed_count, state.failed_exact) == (2, True)
        full = replay(tasks_log, claims_log)[1].state
        fold_rest(loaded[1], claims_log)  # (the tail's FAIL is stale: not counted)
        assert (state.failed_count, state.failed_exact) == (full.failed_count, True) == (2, True)


def test_a_fold_with_tasks_cancelled_before_any_claim_restores() -> None:
    """A CANCEL of a task nobody held makes it dead with no FAIL accepted: the snapshot of
    such a fold (a checkpoint's, a compacted prefix's) restores as it was."""
    state = ClaimState()
    for task in range(3):
        state.apply(Cancel(task, "op", T0, -1, "cancelled by op", None), 48 + task)
    snap = state.snapshot()
    assert (snap.dead_count, snap.failed_count, snap.failed_exact) == (3, 0, True)
    assert ClaimState.restore(snap).snapshot() == snap


def version_3(body: dict[str, Any]) -> bytes:
    """A checkpoint of the previous format: the same body without the FAIL count."""
    for state in (body["claims"]["state"], body.get("base", {}).get("state", {})):
        state.pop("failed_count", None)
        state.pop("failed_exact", None)
    return envelope(pack(body), version=VERSION - 1)


def test_a_version_3_checkpoint_of_logs_never_compacted_is_refused(tmp_path: Path) -> None:
    # a cache there: a replay from the start replaces it with one that counts the FAILs
    build(tmp_path)
    (tmp_path / CHECKPOINT_NAME).write_bytes(version_3(saved_body(tmp_path)))
    assert "version 3" in check_refused(tmp_path)


@pytest.mark.parametrize("position", [2**63 - 1, 2**63, 2**64 - 1])
def test_an_absurd_position_means_replay(tmp_path: Path, position: int) -> None:
    """A checkpoint consistent in itself whose last claims record is where no log read can
    go (the file log's pread raises OSError or OverflowError there)."""
    build(tmp_path)
    body = saved_body(tmp_path)
    claims = body["claims"]
    claims["state"]["position"] = position
    claims["log"]["last"][0] = position
    claims["log"]["last"][1] = claims["next_position"] = min(position + 20, 2**64 - 1)
    (tmp_path / CHECKPOINT_NAME).write_bytes(envelope(pack(body)))
    check_refused(tmp_path)


def test_a_directory_in_the_checkpoints_place_means_replay(tmp_path: Path) -> None:
    build(tmp_path)
    os.unlink(tmp_path / CHECKPOINT_NAME)
    (tmp_path / CHECKPOINT_NAME).mkdir()
    assert "cannot read" in check_refused(tmp_path)


def test_every_single_byte_change_is_refused(tmp_path: Path) -> None:
    build(tmp_path)
    good = (tmp_path / CHECKPOINT_NAME).read_bytes()
    with topics(tmp_path) as (tasks_log, claims_log):
        for i in range(len(good)):
            for flip in (0x01, 0x80):
                bad = good[:i] + bytes([good[i] ^ flip]) + good[i + 1 :]
                (tmp_path / CHECKPOINT_NAME).write_bytes(bad)
                assert load_checkpoint(tmp_path, tasks_log, claims_log) is None, (i, flip)


def enveloped(value: Any) -> bytes:
    return envelope(pack(value))


# msgpack values of every kind a checkpoint could hold, in and out of range
plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=5)
    | st.binary(max_size=9),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.sampled_from(["position", "state", "open", "log"]) | st.text(), inner)
    ),
    max_leaves=20,
)


@settings(max_examples=examples(100), deadline=None)
@given(
    junk=st.binary(max_size=200)
    | st.builds(pack, plain_values)
    | st.builds(enveloped, plain_values)
)
def test_arbitrary_bytes_never_raise(junk: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        with topics(directory) as (tasks_log, claims_log):
            append_tasks(tasks_log, ["task"])
            (directory / CHECKPOINT_NAME).write_bytes(junk)
            assert load_checkpoint(directory, tasks_log, claims_log) is None


def replace_somewhere(data: st.DataObject, value: Any) -> Any:
    """`value` with one item somewhere inside it (or itself) replaced by a random value."""
    if isinstance(value, dict) and value and data.draw(st.integers(0, 5)):
        key = data.draw(st.sampled_from(sorted(value)))
        return {**value, key: replace_somewhere(data, value[key])}
    if isinstance(value, list) and value and data.draw(st.integers(0, 5)):
        i = data.draw(st.integers(0, len(value) - 1))
        return [*value[:i], replace_somewhere(data, value[i]), *value[i + 1 :]]
    return data.draw(plain_values)


@settings(max_examples=examples(150), deadline=None)
@given(data=st.data())
def test_a_damaged_body_with_a_good_checksum_never_raises(data: st.DataObject) -> None:
    """A writer's bug, not damage: the checksum is right and the content is not. A load
    refuses it, or (when the change is one no check can tell, a worker's name say) loads a
    fold; it never raises."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        build(directory)
        damaged = replace_somewhere(data, saved_body(directory))
        (directory / CHECKPOINT_NAME).write_bytes(envelope(pack(damaged)))
        before = log_bytes(directory)
        with topics(directory) as (tasks_log, claims_log):
            load_checkpoint(directory, tasks_log, claims_log)
        assert log_bytes(directory) == before


# -- saving ----------------------------------------------------------------------------------


def tmp_files(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.endswith(".tmp")]


def test_saving_again_replaces_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    steps, _ = scenario()
    positions: list[int] = []
    with topics(tmp_path) as (tasks_log, claims_log):
        append_steps(claims_log, steps[:3], positions)
        index, follower = replay(tasks_log, claims_log)
        save_checkpoint(tmp_path, index, tasks_log, follower, claims_log)
        first = (tmp_path / CHECKPOINT_NAME).stat()
        append_steps(claims_log, steps[3:], positions)
        append_tasks(tasks_log, TASKS)
        index.catch_up(tasks_log)
        follower.catch_up(claims_log)
        save_checkpoint(tmp_path, index, tasks_log, follower, claims_log)
        assert tmp_files(tmp_path) == []
        assert (tmp_path / CHECKPOINT_NAME).stat().st_ino != first.st_ino  # a new file, renamed
        loaded = load_checkpoint(tmp_path, tasks_log, claims_log)
        assert loaded is not None
        assert loaded[1].next_position == claims_log.end()
        assert_same_claims(loaded[1], follower)
        assert_same_index(loaded[0], index, tasks_log)


def test_a_failed_save_raises_checkpoint_error_and_leaves_nothing(tmp_path: Path) -> None:
    build(tmp_path)
    os.unlink(tmp_path / CHECKPOINT_NAME)
    (tmp_path / CHECKPOINT_NAME).mkdir()  # os.replace cannot put a file there
    with topics(tmp_path) as (tasks_log, claims_log):
        index, follower = replay(tasks_log, claims_log)
        with pytest.raises(CheckpointError, match=CHECKPOINT_NAME):
            save_checkpoint(tmp_path, index, tasks_log, follower, claims_log)
    assert tmp_files(tmp_path) == []
    assert (tmp_path / CHECKPOINT_NAME).is_dir()


def test_saving_a_fold_of_other_logs_raises(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    build(mine)
    with topics(mine) as (tasks_log, claims_log):
        index, follower = replay(tasks_log, claims_log)
    with topics(other) as (tasks_log, claims_log):
        append_steps(claims_log, scenario()[0][:2], [])
        with pytest.raises(CheckpointError, match="does not match"):
            save_checkpoint(other, index, tasks_log, follower, claims_log)
    assert not (other / CHECKPOINT_NAME).exists()


def test_a_save_removes_the_temporary_files_of_dead_savers_only(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # its pid is free now (and, this soon after, not yet reused)
    dead = tmp_path / f".{CHECKPOINT_NAME}.{child.pid}.0123.tmp"
    alive = tmp_path / f".{CHECKPOINT_NAME}.{os.getppid()}.4567.tmp"
    not_ours = tmp_path / "notes.tmp"
    for path in (dead, alive, not_ours):
        path.write_bytes(b"partial")
    with topics(tmp_path) as (tasks_log, claims_log):
        index, follower = replay(tasks_log, claims_log)
        save_checkpoint(tmp_path, index, tasks_log, follower, claims_log)
    assert not dead.exists()
    assert alive.exists() and not_ours.exists()
