"""`qw status`'s light reading of a queue (supervisor.cli.queue_counts) counts what the
supervisor's monitor counts: the same logs give the same numbers, the same held leases and
the same error.

Histories are generated (Hypothesis) and appended to a real file log: claims won, lost and
taken over from expired leases, renewals, DONEs (stale ones too), FAILs for a retry or for
good, malformed records, tasks of a type this version does not know; one case is drained by
real worker processes (`qw up`), one damaged, one compacted (counted from its checkpoint).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import CorruptLogError, Log, LogError
from queue_worker.compaction.files import compact
from queue_worker.compaction.settled import Retention
from queue_worker.history.checkpoint import CHECKPOINT_NAME
from queue_worker.producer import Queue
from queue_worker.protocol.records import Claim, Done, Fail, Renew, Unknown, decode_task, encode
from queue_worker.topics import open_topics
from supervisor.cli.queue_counts import QueueCounts, queue_counts, sum_counts
from supervisor.run.monitor import Monitor
from tests.examples import examples
from tests.test_compaction import make_queue
from tests.test_damage import flip_a_byte_in_the_middle

NOW_S = 1_700_000_000  # the clock both readers read (time.time patched): seconds
NOW_US = NOW_S * 1_000_000
LEASE = 2_000_000
WORKERS = ("w0-1-a", "w1-2-b", "w2-3-c")

# one step of a history: (kind, task, worker, offset of `at` from NOW_US in µs)
step = st.tuples(
    st.sampled_from(["claim", "claim", "renew", "done", "done", "retry", "dead", "junk"]),
    st.integers(0, 7),
    st.sampled_from(WORKERS),
    st.integers(-8_000_000, 1_000_000),
)


def monitor_counts(location: str) -> tuple[dict[str, Any], list[Any]]:
    """What the supervisor's monitor says after its start-up check (as `qw status` did)."""
    monitor = Monitor(location, read_only=True)
    try:
        monitor.check_start()
        view = vars(monitor.queue_view())
        return {k: v for k, v in view.items() if k != "throughput_history"}, monitor.held_leases()
    finally:
        monitor.close()


def light_counts(location: str) -> tuple[dict[str, Any], list[Any]]:
    counts, held = queue_counts(location)
    return counts._asdict(), held


def outcome(read: Any, location: str) -> tuple[str, object]:
    """A reader's answer, or the error it raised (type and message)."""
    try:
        return "counted", read(location)
    except LogError as e:  # (IdentityError: the claims closed a task the tasks log lacks)
        return type(e).__name__, str(e)


def write_history(data: Path, tasks: int, foreign: list[int], steps: list[Any]) -> None:
    """`tasks` tasks (those in `foreign` of an unknown type), then the claims of `steps`:
    a DONE, RENEW or FAIL names the worker's last CLAIM of the task (or position 0)."""
    with Queue(str(data), "none") as queue:
        queue.enqueue_many({"n": i} for i in range(tasks))
    tasks_log, claims_log = open_topics(str(data), read_only=False)
    try:
        for _ in foreign:
            tasks_log.append(msgpack.packb([1, "Z", 0]))
        append_claims(claims_log, steps, {})
    finally:
        tasks_log.close()
        claims_log.close()


# one claims record: (kind, task, worker, `at` as an offset from NOW_US, µs)
Step = tuple[str, int, str, int]


def append_claims(log: Log, steps: list[Step], claimed: dict[tuple[int, str], int]) -> None:
    """Append the claims of `steps`: a DONE, RENEW or FAIL names the worker's last CLAIM of
    the task in `claimed` (or position 0); a CLAIM appended is noted there."""
    for kind, task, worker, offset in steps:
        at = NOW_US + offset
        claim = claimed.get((task, worker), 0)
        record: bytes
        if kind == "claim":
            record = encode(Claim(task, worker, at, LEASE))
        elif kind == "renew":
            record = encode(Renew(task, worker, at, claim, LEASE))
        elif kind == "done":
            record = encode(Done(task, worker, at, claim, None))
        elif kind == "retry":
            record = encode(Fail(task, worker, at, claim, "ValueError: x", at + 1_000))
        elif kind == "dead":
            record = encode(Fail(task, worker, at, claim, "ValueError: y", None))
        else:  # a record no reader can decode: the fold counts it malformed
            record = msgpack.packb([1, "C", "not a task"])
        position = log.append(record)
        if kind == "claim":
            claimed[(task, worker)] = position


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    # both readers take "now" from time.time (the throughput's last complete seconds)
    monkeypatch.setattr(time, "time", lambda: NOW_S + 0.5)


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    tasks=st.integers(0, 6),
    foreign=st.lists(st.integers(0, 1), max_size=2),
    steps=st.lists(step, max_size=40),
)
def test_the_light_reading_counts_what_the_monitor_counts(
    tmp_path_factory: pytest.TempPathFactory,
    frozen_clock: None,
    tasks: int,
    foreign: list[int],
    steps: list[Any],
) -> None:
    data = tmp_path_factory.mktemp("q") / "qw"
    write_history(data, tasks, foreign, steps)
    assert outcome(light_counts, str(data)) == outcome(monitor_counts, str(data))


def test_a_varied_history_gives_every_count(tmp_path: Path, frozen_clock: None) -> None:
    # the differential test above means something only if the histories reach every count
    data = tmp_path / "qw"
    steps = [
        ("claim", 0, "w0-1-a", -1_000_000),
        ("done", 0, "w0-1-a", -900_000),  # done in the last complete seconds
        ("claim", 1, "w0-1-a", -7_000_000),  # its lease expired at -5 s
        ("claim", 2, "w1-2-b", -6_000_000),
        ("dead", 2, "w1-2-b", -5_000_000),
        ("claim", 3, "w1-2-b", -6_000_000),
        ("retry", 3, "w1-2-b", -5_000_000),
        ("claim", 4, "w2-3-c", 0),  # held, not expired
        ("done", 4, "w0-1-a", 0),  # stale: not its holder
        ("junk", 0, "w0-1-a", 0),
    ]
    write_history(data, 6, [0], steps)
    tasks_log, _ = open_topics(str(data), read_only=True)
    try:
        assert isinstance(decode_task(tasks_log.read(tasks_log.start, 7)[-1].data), Unknown)
    finally:
        tasks_log.close()
    counts, held = light_counts(str(data))
    assert counts == monitor_counts(str(data))[0]
    assert counts["published"] == 7 and counts["done"] == 1 and counts["dead"] == 1
    assert counts["failed"] == 2 and counts["held"] == 2 and counts["pending"] == 2
    assert counts["throughput_now"] == pytest.approx(1 / 3)
    assert [(t, lease.worker, lease.expiry) for t, lease, _ in held] == [
        (1, "w0-1-a", NOW_US - 5_000_000),  # expired: still held
        (4, "w2-3-c", NOW_US + LEASE),
    ]


def test_a_queue_drained_by_real_workers(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    with Queue(str(data), "none") as queue:
        queue.enqueue_many({"n": i} for i in range(30))
    up = ["up", "--dir", str(data), "--workers", "2", "--work-ms", "0", "--fsync", "none"]
    subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", *up, "--no-tui", "--exit-when-drained"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=120,
    )
    counts, held = light_counts(str(data))
    monitor, monitor_held = monitor_counts(str(data))
    # the throughput: read a moment apart on a live clock; the records read: the monitor
    # begins from the checkpoint the workers left, `qw status` only once its last record is
    # older than the throughput's window (supervisor/run/fold_begin.py)
    differ = ("throughput_now", "record_count")
    assert {k: v for k, v in counts.items() if k not in differ} == {
        k: v for k, v in monitor.items() if k not in differ
    }
    assert monitor["record_count"] <= counts["record_count"]
    assert counts["done"] == 30 and counts["pending"] == 0 and held == monitor_held == []


def test_damage_is_the_same_error(tmp_path: Path, frozen_clock: None) -> None:
    data = tmp_path / "qw"
    write_history(data, 3, [], [("claim", t, "w0-1-a", 0) for t in range(3)])
    position = flip_a_byte_in_the_middle(data / "claims.log")
    errors: list[str] = []
    for read in (light_counts, monitor_counts):
        with pytest.raises(CorruptLogError) as caught:
            read(str(data))
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and "claims" in errors[0] and str(position) in errors[0]


def test_partition_sums_add_as_the_supervisor_adds() -> None:
    a = QueueCounts(3, 1, 1, 1, 2, 0, 0.1, 100, 7)
    b = QueueCounts(4, 2, 0, 2, 0, 1, 0.2, 50, 9)
    assert sum_counts([a, b]) == QueueCounts(7, 3, 1, 3, 2, 1, 0.1 + 0.2, 150, 16)
    assert sum_counts([]) == QueueCounts()


def test_a_missing_log_is_a_log_error_for_both(tmp_path: Path) -> None:
    with pytest.raises(LogError):
        queue_counts(str(tmp_path / "nothing"))


def test_a_log_of_several_segments_is_read_to_its_end(tmp_path: Path) -> None:
    # (the monitor's start-up check, which `qw up` runs too, stopped at the first segment's
    # end: 55 of these 320 tasks)
    make_queue(tmp_path, done=300, held=250)  # 4 KiB segments
    assert len(list(tmp_path.glob("claims.*.seg"))) > 1
    assert len(list(tmp_path.glob("tasks.*.seg"))) > 1
    for counts, held in (light_counts(str(tmp_path)), monitor_counts(str(tmp_path))):
        assert (counts["published"], counts["done"], counts["pending"]) == (320, 299, 20)
        assert counts["failed"] == 30 and [task for task, _, _ in held] == [250]


def test_a_compacted_queue_counts_from_its_checkpoint(tmp_path: Path) -> None:
    make_queue(tmp_path, done=300, held=250)  # (a live lease keeps the segments after it)
    before = light_counts(str(tmp_path))
    done = compact(tmp_path, Retention(seconds=0, bytes=0))
    assert done.removed["claims"] and done.removed["tasks"]  # the checkpoint's path is taken
    after = light_counts(str(tmp_path))
    # what was removed is in the checkpoint: the queue's counts stay, the FAILs accepted too
    # (the records read are those still in the logs, as for the monitor)
    same = ("published", "pending", "held", "done", "dead", "failed")
    assert {k: after[0][k] for k in same} == {k: before[0][k] for k in same}
    assert after[0]["record_count"] < before[0]["record_count"] and after[1] == before[1]
    (tmp_path / CHECKPOINT_NAME).unlink()
    refused = outcome(light_counts, str(tmp_path))
    assert refused == outcome(monitor_counts, str(tmp_path))
    assert refused[0] == "IdentityError" and "fold checkpoint cannot be used" in str(refused[1])
