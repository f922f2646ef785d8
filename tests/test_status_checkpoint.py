"""`qw status` (supervisor.cli.queue_counts) begins from the fold checkpoint and folds only the
tail after it: the counts must be exactly those of a full fold of the same logs.

A checkpoint is taken at a chosen point of a history written to real file logs (the records'
times set by the test, the clock both readers read frozen: `frozen_clock`), then more is
appended. Each case compares the counts read from it with those of the same logs read from
their start (the checkpoint moved away) and with the supervisor's monitor. `record_count`
says which way a reading went: the records it read, the tail only when it began from the
checkpoint.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, cast

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import CorruptLogError
from queue_worker.compaction.files import compact
from queue_worker.compaction.settled import Retention
from queue_worker.history.checkpoint import CHECKPOINT_NAME, FORMAT, VERSION, restore_checkpoint
from queue_worker.history.checkpoint import save_checkpoint as save
from queue_worker.protocol.records import Claim, Fail, encode
from queue_worker.topics import open_topics
from tests.examples import examples
from tests.test_checkpoint import append_tasks, replay, topics
from tests.test_compaction import make_queue
from tests.test_queue_counts import (
    LEASE,
    NOW_US,
    WORKERS,
    Step,
    append_claims,
    frozen_clock,
    light_counts,
    monitor_counts,
    outcome,
)

__all__ = ["frozen_clock"]  # (a fixture: imported to be used)

S = 1_000_000
#: the throughput's window is the 3 complete seconds before NOW_S (the frozen clock reads
#: NOW_S + 0.5); a checkpoint whose last claims record is 1 s older than its start is used
WINDOW_START = NOW_US - 3 * S
NEWEST_USED = WINDOW_START - S - 1


def write(directory: Path, tasks: list[str], steps: list[Step], tcut: int, cut: int) -> None:
    """`tasks` (test_checkpoint's kinds) and the claims of `steps`, with a checkpoint saved
    by a fold of the first `tcut` tasks and `cut` claims records, as a worker saves one."""
    claimed: dict[tuple[int, str], int] = {}
    with topics(directory) as (tasks_log, claims_log):
        append_tasks(tasks_log, tasks[:tcut])
        append_claims(claims_log, steps[:cut], claimed)
        index, follower = replay(tasks_log, claims_log)
        save(directory, index, tasks_log, follower, claims_log)
        append_tasks(tasks_log, tasks[tcut:], first=tcut)
        append_claims(claims_log, steps[cut:], claimed)


def full_fold(directory: Path) -> tuple[str, object]:
    """What `qw status` says of the same logs with no checkpoint (read from their start)."""
    checkpoint, aside = directory / CHECKPOINT_NAME, directory / "aside"
    checkpoint.rename(aside)
    try:
        return outcome(light_counts, str(directory))
    finally:
        aside.rename(checkpoint)


def counted(found: tuple[str, object]) -> tuple[dict[str, Any], list[Any]]:
    """A reading's counts (as a dict) and held tasks: it must have counted."""
    assert found[0] == "counted", found
    return cast(tuple[dict[str, Any], list[Any]], found[1])


def without_records(found: tuple[str, object]) -> tuple[str, object]:
    if found[0] != "counted":
        return found
    counts, held = counted(found)
    return "counted", ({k: v for k, v in counts.items() if k != "record_count"}, held)


def record_count(found: tuple[str, object]) -> int:
    count: int = counted(found)[0]["record_count"]
    return count


old_step = st.tuples(  # before the checkpoint: older than the throughput's window
    st.sampled_from(["claim", "claim", "renew", "done", "done", "retry", "dead", "junk"]),
    st.integers(0, 3),  # (few tasks and workers: FAILs and DONEs from the holder)
    st.sampled_from(WORKERS[:2]),
    st.integers(-20 * S, NEWEST_USED - NOW_US),
)
new_step = st.tuples(  # after it: any time, the window's seconds included
    st.sampled_from(["claim", "claim", "renew", "done", "done", "retry", "dead", "junk"]),
    st.integers(0, 7),
    st.sampled_from(WORKERS),
    st.integers(-8 * S, S),
)


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    tasks=st.lists(st.sampled_from(["task", "task", "task", "foreign", "garbage"]), max_size=9),
    old=st.lists(old_step, max_size=25),
    new=st.lists(new_step, max_size=25),
    data=st.data(),
)
def test_status_from_the_checkpoint_counts_what_a_full_fold_counts(
    tmp_path_factory: pytest.TempPathFactory,
    frozen_clock: None,
    tasks: list[str],
    old: list[Step],
    new: list[Step],
    data: st.DataObject,
) -> None:
    tcut = data.draw(st.integers(0, len(tasks)), label="tasks before the checkpoint")
    directory = tmp_path_factory.mktemp("q")
    write(directory, tasks, old + new, tcut, len(old))
    got, full = outcome(light_counts, str(directory)), full_fold(directory)
    assert without_records(got) == without_records(full)
    assert without_records(full) == without_records(outcome(monitor_counts, str(directory)))
    if got[0] == "counted":
        # begun from the checkpoint unless its last record has no time to judge it by
        used = not old or old[-1][0] != "junk"
        tail = len(tasks) - tcut + len(new)
        assert record_count(got) == (tail if used else record_count(full))
        assert record_count(full) == len(tasks) + len(old) + len(new)


#: a history that reaches every count, a checkpoint in its middle (after VARIED_CUT records)
VARIED = [
    ("claim", 0, "w0-1-a", -9 * S),
    ("retry", 0, "w0-1-a", -9 * S + 1),  # a FAIL for a retry (failed 1)
    ("claim", 1, "w1-2-b", -9 * S),
    ("dead", 1, "w1-2-b", -8 * S),  # a FAIL for good (failed 2, dead 1)
    ("claim", 2, "w2-3-c", -8 * S),
    ("done", 2, "w2-3-c", -7 * S),
    ("junk", 0, "w0-1-a", 0),
    ("claim", 3, "w0-1-a", -7 * S),  # held across the checkpoint, lease long expired
    ("claim", 0, "w2-3-c", -6 * S),  # task 0 again, after its backoff
    # ---- the checkpoint
    ("dead", 0, "w2-3-c", -2 * S),  # failed 3, dead 2
    ("claim", 4, "w1-2-b", -S),
    ("done", 4, "w1-2-b", -S + 10),  # done in the window
    ("claim", 6, "w1-2-b", 0),  # held, live
    ("retry", 2, "w2-3-c", 0),  # stale: task 2 is done
]
VARIED_CUT = 9
#: two tasks of a type this version does not know (one before the checkpoint, one after)
VARIED_TASKS = ["task"] * 5 + ["foreign", "task", "foreign", "garbage", "task"]
VARIED_TCUT = 6


def test_a_varied_history_from_its_checkpoint(tmp_path: Path, frozen_clock: None) -> None:
    write(tmp_path, VARIED_TASKS, VARIED, VARIED_TCUT, VARIED_CUT)
    got, full = outcome(light_counts, str(tmp_path)), full_fold(tmp_path)
    assert without_records(got) == without_records(full)
    assert without_records(got) == without_records(outcome(monitor_counts, str(tmp_path)))
    counts, held = counted(got)
    assert counts["failed"] == 3 and counts["dead"] == 2 and counts["done"] == 2
    # pending: 8 (of a bad record: a worker fails it) and 9, not the foreign 5 and 7
    assert counts["published"] == 10 and counts["held"] == 2 and counts["pending"] == 2
    assert counts["throughput_now"] == pytest.approx(1 / 3)
    assert [task for task, _, _ in held] == [3, 6]
    assert record_count(got) == (10 - VARIED_TCUT) + (len(VARIED) - VARIED_CUT)  # the tail


@pytest.mark.parametrize(
    ("last_at", "used"),
    [
        (NEWEST_USED, True),
        (NEWEST_USED + 1, False),  # within 1 s of the window: its DONEs might be in it
        (-S + NOW_US, False),  # in the window itself
    ],
)
def test_a_checkpoint_too_recent_for_the_throughput_is_not_used(
    tmp_path: Path, frozen_clock: None, last_at: int, used: bool
) -> None:
    steps: list[Step] = [
        ("claim", 0, "w0-1-a", last_at - NOW_US - 10),
        ("done", 0, "w0-1-a", last_at - NOW_US),  # the checkpoint's last record
        ("claim", 1, "w0-1-a", -S),
        ("done", 1, "w0-1-a", -S + 1),
    ]
    write(tmp_path, ["task", "task"], steps, 2, 2)
    got = outcome(light_counts, str(tmp_path))
    assert without_records(got) == without_records(full_fold(tmp_path))
    assert record_count(got) == (2 if used else 6)
    in_window = last_at >= WINDOW_START
    assert counted(got)[0]["throughput_now"] == pytest.approx((2 if in_window else 1) / 3)


def test_a_checkpoint_of_logs_re_created_is_not_used(tmp_path: Path, frozen_clock: None) -> None:
    # the logs deleted and written again (another queue): their checkpoint is refused, and
    # on logs that hold every record a checkpoint is a cache: the full fold, no error
    write(tmp_path, VARIED_TASKS, VARIED, VARIED_TCUT, VARIED_CUT)
    checkpoint = (tmp_path / CHECKPOINT_NAME).read_bytes()
    for path in tmp_path.iterdir():
        path.unlink()
    write(tmp_path, VARIED_TASKS[:3], VARIED[:4], 3, 4)
    (tmp_path / CHECKPOINT_NAME).write_bytes(checkpoint)
    got = outcome(light_counts, str(tmp_path))
    assert got == full_fold(tmp_path)  # record_count too: every record was read
    assert record_count(got) == 3 + 4 and counted(got)[0]["failed"] == 2


def test_damage_in_what_the_checkpoint_covers_is_still_found(
    tmp_path: Path, frozen_clock: None
) -> None:
    # the checkpoint's crc of what it covers no longer matches: refused, and the fold from
    # the start meets the damage and names it, as without a checkpoint
    write(tmp_path, VARIED_TASKS, VARIED, VARIED_TCUT, VARIED_CUT)
    with topics(tmp_path) as (_, claims_log):
        third = list(claims_log.iter_from(claims_log.start))[2]
    assert third.next <= restore_fold_position(tmp_path)  # (covered by the checkpoint)
    with open(tmp_path / "claims.log", "r+b") as f:
        f.seek(third.next - 1)  # its last payload byte
        byte = f.read(1)
        f.seek(third.next - 1)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(CorruptLogError) as caught:
        light_counts(str(tmp_path))
    assert "claims" in str(caught.value) and str(third.position) in str(caught.value)


def restore_fold_position(directory: Path) -> int:
    """Where the checkpoint's claims fold stops (the first record it does not cover)."""
    with topics(directory) as (tasks_log, claims_log):
        return restore_checkpoint(directory, tasks_log, claims_log)[1].next_position


# -- compacted logs: the checkpoint is no cache there ----------------------------------------


def as_version_3(directory: Path) -> None:
    """Rewrite the checkpoint in the previous format: the same, without the FAIL counts."""
    path = directory / CHECKPOINT_NAME
    outer = msgpack.unpackb(path.read_bytes())
    body = msgpack.unpackb(outer["body"])
    for state in (body["claims"]["state"], body["base"]["state"]):
        del state["failed_count"], state["failed_exact"]
    packed = msgpack.packb(body)
    envelope = {"format": FORMAT, "version": VERSION - 1, "crc32": zlib.crc32(packed)}
    path.write_bytes(msgpack.packb({**envelope, "body": packed}))


def fail_one_more(directory: Path) -> None:
    """Append a CLAIM of a pending task (300: `make_queue`'s first) and a FAIL of it."""
    tasks_log, claims_log = open_topics(str(directory))
    try:
        claim = claims_log.append(encode(Claim(300, "w1-2-b", NOW_US, LEASE)))
        claims_log.append(encode(Fail(300, "w1-2-b", NOW_US + 1, claim, "boom", NOW_US + 2)))
    finally:
        tasks_log.close()
        claims_log.close()


@pytest.mark.parametrize("version", ["current", "previous"])
def test_a_compacted_queue_counts_failed_as_its_checkpoint_knows(
    tmp_path: Path, version: str
) -> None:
    make_queue(tmp_path, done=300, held=250)  # 30 FAILs accepted (a live lease keeps some)
    assert light_counts(str(tmp_path))[0]["failed"] == 30
    done = compact(tmp_path, Retention(seconds=0, bytes=0))
    assert done.removed["claims"]
    if version == "previous":
        as_version_3(tmp_path)
    fail_one_more(tmp_path)
    counts, _ = light_counts(str(tmp_path))
    monitor, _ = monitor_counts(str(tmp_path))
    with topics(tmp_path) as (tasks_log, claims_log):
        state = restore_checkpoint(tmp_path, tasks_log, claims_log)[1].state
    if version == "current":  # every FAIL, the compacted ones too
        assert (state.failed_count, state.failed_exact) == (30, True)
        assert counts["failed"] == monitor["failed"] == 31
    else:  # loads, not knowing them: only the FAILs after it (a lower bound)
        assert (state.failed_count, state.failed_exact) == (0, False)
        assert counts["failed"] == monitor["failed"] == 1
    assert counts["dead"] == 0 and counts["done"] == 299 and counts["held"] == 1


def test_a_save_carries_a_count_it_does_not_know_on(tmp_path: Path) -> None:
    # a worker that began from a version-3 checkpoint saves version 4, still not exact
    make_queue(tmp_path, done=300, held=250)
    compact(tmp_path, Retention(seconds=0, bytes=0))
    as_version_3(tmp_path)
    fail_one_more(tmp_path)
    with topics(tmp_path) as (tasks_log, claims_log):
        index, follower = restore_checkpoint(tmp_path, tasks_log, claims_log)
        follower.catch_up(claims_log)
        index.catch_up(tasks_log)
        save(tmp_path, index, tasks_log, follower, claims_log)
        state = restore_checkpoint(tmp_path, tasks_log, claims_log)[1].state
    assert (state.failed_count, state.failed_exact) == (1, False)
    outer: dict[str, Any] = msgpack.unpackb((tmp_path / CHECKPOINT_NAME).read_bytes())
    assert outer["version"] == VERSION
