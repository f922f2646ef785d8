"""Partitions on the file log: the layout and its identity, enqueue assignment, the
assignor, `qw up --partitions`, the report per partition — with real files and processes."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import psutil
import pytest

from logstore import IdentityError, LogError
from queue_worker.partition_layout import (
    Manifest,
    PartitionError,
    TaskRef,
    assign,
    parse_task_ref,
    partition_location,
    read_manifest,
    slot_partitions,
)
from queue_worker.partitions.queue import PartitionedQueue, resolve_partitions
from queue_worker.producer import Queue
from queue_worker.proof.report import read_claims
from queue_worker.protocol.records import RecordEncodeError
from queue_worker.protocol.state import ClaimState
from tests.helpers import wait_until
from tests.test_cli import qw, start_up

# -- the manifest and the layout ------------------------------------------------------------------


def test_manifest_round_trips_and_refuses_damage() -> None:
    manifest = Manifest.of([bytes([k]) * 16 for k in range(3)])
    raw = manifest.encode()
    assert Manifest.decode(raw, "m") == manifest
    damaged = raw[:20] + bytes([raw[20] ^ 1]) + raw[21:]
    with pytest.raises(PartitionError, match="damaged"):
        Manifest.decode(damaged, "m")
    with pytest.raises(PartitionError, match="not a qw partitions manifest"):
        Manifest.decode(b"hello world, not a manifest", "m")


def test_partition_locations_keep_each_partition_in_one_redis_slot() -> None:
    from redis.crc import key_slot

    assert partition_location("/data/q", 3, 4) == "/data/q/p3"
    for count in (2, 3, 8):
        for k in range(count):
            url = partition_location("redis://h:6379/0?retries=2", k, count)
            query = dict(parse_qsl(urlsplit(url).query))
            assert query["retries"] == "2"
            tag = query["prefix"]
            assert tag.startswith(f"{{p{k}") and tag.endswith("}")
            # each partition in its own share of the slots: spread over the nodes
            assert k * 16384 // count <= key_slot(tag.encode()) < (k + 1) * 16384 // count
    app = dict(parse_qsl(urlsplit(partition_location("redis://h/0?prefix=app", 0, 2)).query))
    assert app["prefix"].startswith("app:{app.p0")
    with pytest.raises(ValueError, match="braces"):
        partition_location("redis://h/0?prefix=a{b}", 0, 2)


def test_task_refs_parse_and_name_partition_and_id() -> None:
    assert str(TaskRef(3, 17)) == "3:17"
    assert parse_task_ref("3:17", 4) == TaskRef(3, 17)
    for bad in ("17", "3:", "x:1", "-1:2"):
        with pytest.raises(ValueError, match="PARTITION:ID"):
            parse_task_ref(bad, 4)
    with pytest.raises(ValueError, match="partition 4 does not exist"):
        parse_task_ref("4:1", 4)


# -- the assignor ---------------------------------------------------------------------------------


@pytest.mark.parametrize("members", [1, 2, 3, 5, 8, 11])
@pytest.mark.parametrize("partitions", [1, 2, 3, 8])
def test_assign_covers_every_partition_and_every_member(members: int, partitions: int) -> None:
    names = [f"m{i}" for i in range(members)]
    given = assign(names, partitions)
    assert assign(list(reversed(names)), partitions) == given  # same from any order
    assert set(given) == set(names)
    assert all(given[m] for m in names)  # every member works
    covered = Counter(p for ps in given.values() for p in ps)
    assert set(covered) == set(range(partitions))  # every partition is worked
    if members <= partitions:  # each partition by exactly one member (Kafka-style)
        assert all(n == 1 for n in covered.values())
    else:  # shared as evenly as can be
        assert max(covered.values()) - min(covered.values()) <= 1


def test_slot_partitions_spreads_a_supervisors_workers() -> None:
    assert slot_partitions(4, 2) == [0, 1, 0, 1]
    assert slot_partitions(3, 3) == [0, 1, 2]


# -- creating, finding and refusing ---------------------------------------------------------------


def test_a_partitioned_queue_is_created_once_with_its_count(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    manifest = resolve_partitions(data, 3)
    assert manifest is not None and manifest.count == 3
    assert sorted(p.name for p in data.iterdir()) == ["p0", "p1", "p2", "partitions"]
    assert not (data / "tasks.log").exists()  # no top-level topics
    assert resolve_partitions(data, None) == manifest == resolve_partitions(data, 3)
    with pytest.raises(PartitionError, match="3 partitions, not 4"):
        resolve_partitions(data, 4)
    with pytest.raises(PartitionError, match="3 partitions: a command that works one topic"):
        Queue(data)  # a command that knows no partitions is refused, never given a topic


def test_a_queue_without_partitions_stays_one(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    with Queue(data) as queue:
        queue.enqueue({"n": 0})
    assert resolve_partitions(data, None) is None
    assert resolve_partitions(data, 1) is None  # one partition is today's queue
    with pytest.raises(PartitionError, match="created without partitions"):
        resolve_partitions(data, 2)
    assert read_manifest(data) is None
    assert sorted(p.name for p in data.glob("*.log")) == ["claims.log", "ops.log", "tasks.log"]


def test_swapped_partitions_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    manifest = resolve_partitions(data, 2)
    assert manifest is not None
    os.rename(data / "p0", data / "swap")
    os.rename(data / "p1", data / "p0")
    os.rename(data / "swap", data / "p1")
    with PartitionedQueue(data, manifest) as queue, pytest.raises(PartitionError, match="swapped"):
        queue.enqueue_many([{"n": 0}, {"n": 1}])
    result = qw("report", "--dir", str(data), cwd=tmp_path)
    assert result.returncode == 2
    assert "not to partition 0 of queue" in result.stderr


def test_a_damaged_manifest_stops_every_command(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    resolve_partitions(data, 2)
    raw = bytearray((data / "partitions").read_bytes())
    raw[10] ^= 0xFF
    (data / "partitions").write_bytes(bytes(raw))
    for args in (["enqueue", "--count", "1"], ["report"], ["up", "--workers", "2"]):
        result = qw(*args, "--dir", str(data), cwd=tmp_path)
        assert result.returncode == 2, args
        assert "partitions manifest is damaged" in result.stderr, args
    assert all((data / f"p{k}" / "tasks.log").stat().st_size == 48 for k in range(2))


# -- enqueue assignment ---------------------------------------------------------------------------


def test_enqueue_spreads_round_robin_and_keys_stick(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    manifest = resolve_partitions(data, 4)
    assert manifest is not None
    with PartitionedQueue(data, manifest) as queue:
        refs = queue.enqueue_many([{"n": n} for n in range(40)])
        keyed = [queue.enqueue({"k": n}, key="customer-7") for n in range(5)]
    assert Counter(r.partition for r in refs) == {0: 10, 1: 10, 2: 10, 3: 10}
    for k in range(4):  # each partition's ids are 0, 1, … in enqueue order
        assert [r.task for r in refs if r.partition == k] == list(range(10))
    assert len({r.partition for r in keyed}) == 1
    assert [r.task for r in keyed] == list(range(10, 15))


def test_a_payload_that_cannot_be_encoded_writes_nothing_anywhere(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    manifest = resolve_partitions(data, 3)
    assert manifest is not None
    with PartitionedQueue(data, manifest) as queue, pytest.raises(RecordEncodeError):
        queue.enqueue_many([{"n": 0}, {"n": 1}, {"bad": object()}])
    assert all((data / f"p{k}" / "tasks.log").stat().st_size == 48 for k in range(3))


def test_qw_enqueue_names_tasks_partition_colon_id(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    resolve_partitions(data, 2)
    result = qw("enqueue", "--count", "5", "--dir", str(data), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("enqueued 5 tasks (")
    assert "0:" in result.stdout and "1:" in result.stdout


# -- qw up --partitions and the report ------------------------------------------------------------


def test_qw_up_partitions_drains_exactly_once_each_worker_on_one_partition(
    tmp_path: Path,
) -> None:
    data = tmp_path / "qw"
    result = qw(
        "up", "--no-tui", "--dir", str(data), "--partitions", "3", "--workers", "5",
        "--tasks", "150", "--work-ms", "2", "--exit-when-drained",
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "qw: drained (3 partitions: published 150, done 150" in result.stdout
    report = qw("report", "--json", "--dir", str(data), cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    body = json.loads(report.stdout)
    assert body["ok"] and body["partitions"] == 3
    assert body["tasks_published"] == body["tasks_done"] == body["completions_accepted"] == 150
    parts = body["per_partition"]
    assert [p["partition"] for p in parts] == [0, 1, 2]
    assert all(p["tasks_done"] == p["tasks_published"] == 50 for p in parts)
    workers = [{w["worker"] for w in p["workers"]} for p in parts]
    assert all(workers)
    assert not (workers[0] & workers[1] or workers[0] & workers[2] or workers[1] & workers[2])
    assert sorted(len(w) for w in workers) == [1, 2, 2]  # 5 workers over 3 partitions
    text = qw("report", "--dir", str(data), cwd=tmp_path)
    assert text.returncode == 0
    assert "partition 2: OK · published 50 · done 50" in text.stdout
    assert "OK: every finished task was completed exactly once (150 done in 3 partitions)" in (
        text.stdout
    )


def test_qw_up_refuses_fewer_workers_than_partitions(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    result = qw("up", "--no-tui", "--dir", str(data), "--partitions", "4", "--workers", "2",
                cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert "--workers 2: 2 workers for 4 partitions" in result.stderr
    bad = qw("up", "--no-tui", "--dir", str(data), "--partitions", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "expected a number of partitions from 1 to 1024" in bad.stderr


def _holder_pid(location: str) -> tuple[int, int] | None:
    """A task held now in the partition at `location`, and its holder's pid."""
    state = ClaimState()
    try:
        for position, record in read_claims(location):
            state.apply(record, position)
    except (LogError, IdentityError):
        return None
    for task, lease in state.held_tasks():
        return task, int(lease.worker.split("-")[-2])
    return None


def test_a_killed_workers_partition_tasks_are_taken_over_by_lease_expiry(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    resolve_partitions(data, 2)
    up = start_up(
        tmp_path, "up", "--dir", str(data), "--workers", "4", "--tasks", "40",
        "--work-ms", "300", "--lease", "4", "--exit-when-drained", "--no-restart",
    )  # fmt: skip
    try:
        where = partition_location(data, 1, 2)
        held = wait_until(lambda: _holder_pid(where), 60, "a worker of partition 1 to hold a task")
        assert isinstance(held, tuple)
        task, pid = held
        os.kill(pid, signal.SIGKILL)
        assert up.wait(120) == 0, (tmp_path / "up.err").read_text()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    report = json.loads(qw("report", "--json", "--dir", str(data), cwd=tmp_path).stdout)
    assert report["ok"] and report["tasks_done"] == 40
    part = report["per_partition"][1]
    takeover = next(t for t in part["takeovers"] if t["task"] == task)
    assert f"-{pid}-" in takeover["victim"]
    assert f"-{pid}-" not in takeover["new_holder"]  # a survivor of that partition took it
    assert takeover["gap_after_expiry"] >= 0  # by lease expiry, never before it
    assert not psutil.pid_exists(pid)


def test_qw_task_and_why_name_a_task_partition_colon_id(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    manifest = resolve_partitions(data, 2)
    assert manifest is not None
    with PartitionedQueue(data, manifest) as queue:
        refs = queue.enqueue_many([{"n": 0}, {"n": 1}])
    name = str(refs[1])
    task = qw("task", name, "--dir", str(data), cwd=tmp_path)
    assert task.returncode == 0, task.stderr
    assert task.stdout.startswith(f"task {name}: never claimed")
    assert '{"n": 1}' in task.stdout
    why = qw("why", name, "--dir", str(data), cwd=tmp_path)
    assert why.returncode == 0, why.stderr
    assert f"p{refs[1].partition}/claims.log" in why.stdout
    assert f"task {name}: never claimed" in why.stdout  # named as the user named it
    for bad, says in (
        ("1", "holds a queue of 2 partitions; name a task PARTITION:ID"),
        ("2:0", "partition 2 does not exist: the queue has 2 (0–1)"),
        ("0:x", "got 'x'; expected a task id"),
    ):
        for command in ("task", "why"):
            result = qw(command, bad, "--dir", str(data), cwd=tmp_path)
            assert result.returncode == 2, (command, bad)
            assert says in result.stderr, (command, bad, result.stderr)
    plain = tmp_path / "plain"
    with Queue(plain) as q:
        q.enqueue({"n": 0})
    result = qw("task", "0:0", "--dir", str(plain), cwd=tmp_path)
    assert result.returncode == 2 and "has no partitions (name a task by its id)" in result.stderr


def test_commands_that_work_one_partition_name_the_partitions(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    resolve_partitions(data, 2)
    for command, says in (
        (["timeline", "--from", "@100", "--out", str(tmp_path / "t.html")],
         "--from @100: a claims position is one partition's; give a time"),
        (["report", "--at", "100"],
         f"--at: {data} holds a queue of 2 partitions and a claims position is one "
         f"partition's: give a partition's location, {data / 'p0'} to {data / 'p1'}"),
    ):  # fmt: skip
        result = qw(*command, "--dir", str(data), cwd=tmp_path)
        assert result.returncode == 2, (command, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (command, result.stderr)
        assert says in lines[0], (command, lines[0])
    assert not (tmp_path / "t.html").exists()


def test_qw_compact_compacts_every_partition(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    result = qw(
        "up", "--no-tui", "--dir", str(data), "--partitions", "2", "--workers", "2",
        "--tasks", "600", "--work-ms", "0", "--segment-bytes", "4096", "--exit-when-drained",
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    before = {p: len(list((data / p).glob("*.seg"))) for p in ("p0", "p1")}
    assert all(before.values()), before  # small segments: several files in each partition
    compact = qw(
        "compact", "--dir", str(data), "--retention", "0", "--retention-bytes", "0",
        cwd=tmp_path,
    )  # fmt: skip
    assert compact.returncode == 0, compact.stderr
    for p in ("p0", "p1"):
        removed = [line for line in compact.stdout.splitlines() if line.startswith(f"{p} claims: ")]
        assert removed and not removed[0].startswith(f"{p} claims: 0 segments"), compact.stdout
        assert len(list((data / p).glob("*.seg"))) < before[p]
    report = qw("report", "--json", "--dir", str(data), cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    body = json.loads(report.stdout)
    assert body["ok"] and body["tasks_published"] == body["tasks_done"] == 600
