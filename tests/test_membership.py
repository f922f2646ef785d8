"""Membership and rebalancing: member processes on hosts "a" and "b" (as two supervisors'
workers) share a partitioned queue through its members topic; members join, one is killed
with -9, and the partitions follow — while every task is still decided by its partition's
fold, and a killed member's tasks are taken over by lease expiry only."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from logstore import Entry, MemoryLog
from queue_worker.partition_layout import Manifest, partition_location
from queue_worker.partitions.member import member_command, read_assignment
from queue_worker.partitions.membership import MemberView, encode_heartbeat, encode_leave
from queue_worker.partitions.queue import PartitionedQueue, resolve_partitions
from queue_worker.partitions.report import load_partitioned_report
from queue_worker.proof.report import read_claims
from queue_worker.protocol.state import ClaimState
from queue_worker.worker.config import WorkerConfig
from tests.helpers import wait_until

S = 1_000_000  # µs


def _view(*records: bytes, server_times: list[int] | None = None) -> MemberView:
    log = MemoryLog("members")
    for data in records:
        log.append(data)
    view = MemberView()
    entries = log.read(log.start)
    if server_times is not None:  # as the Redis log stamps them
        entries = [
            Entry(e.position, e.next, e.data, server_time_us=t)
            for e, t in zip(entries, server_times, strict=True)
        ]
    for entry in entries:
        view.apply(entry)
    return view


def test_the_view_is_judged_by_the_records_times() -> None:
    view = _view(
        encode_heartbeat("a", 0, 3 * S),
        encode_heartbeat("b", 1 * S, 3 * S),
        encode_heartbeat("a", 3 * S, 3 * S),  # b's lease ends at 4 s: alive at 3 s
    )
    assert view.alive() == ["a", "b"]
    assert view.assignment(4) == {"a": [0, 2], "b": [1, 3]}
    view = _view(
        encode_heartbeat("a", 0, 3 * S),
        encode_heartbeat("b", 1 * S, 3 * S),
        encode_heartbeat("a", 4 * S, 3 * S),  # …and gone at 4 s: a takes every partition
    )
    assert view.alive() == ["a"]
    assert view.assignment(4) == {"a": [0, 1, 2, 3]}
    left = _view(
        encode_heartbeat("a", 0, 3 * S), encode_leave("a", S), encode_heartbeat("a", S, 3 * S)
    )
    assert left.alive() == []  # a member that left stays gone, whatever comes later


def test_the_servers_clock_decides_on_redis() -> None:
    # b's own clock is an hour behind: its records' times are the server's, so it is alive
    hour = 3600 * S
    view = _view(
        encode_heartbeat("a", 10 * S, 3 * S),
        encode_heartbeat("b", 10 * S - hour, 3 * S),
        server_times=[10 * S, 10 * S + 1000],
    )
    assert view.alive() == ["a", "b"]


def test_a_record_that_does_not_decode_is_skipped() -> None:
    view = _view(b"\xc1garbage", encode_heartbeat("a", 0, 3 * S), b"\x93\x01\xa1Z\x00")
    assert view.alive() == ["a"]


# -- member processes ------------------------------------------------------------------------------


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def _start(
    started: list[subprocess.Popen[bytes]],
    data: Path,
    name: str,
    host: str,
    lease_s: float = 4.0,
) -> subprocess.Popen[bytes]:
    config = WorkerConfig(
        str(data),
        str(data / "run"),
        name=name,
        host=host,
        handler="queue_worker.worker.handlers:demo",
        work_ms=150,
        lease_s=lease_s,
        fsync="none",
        parent_pid=os.getpid(),
    )
    err = open(data.parent / f"{name}.err", "wb")  # noqa: SIM115 - the child keeps its copy
    with err:
        proc = subprocess.Popen(member_command(config), stdout=subprocess.DEVNULL, stderr=err)
    started.append(proc)
    return proc


def _pid(member: str) -> int:
    return int(member.split("-")[-2])


def _holders(data: Path, manifest: Manifest) -> dict[int, set[int]]:
    """Partition → the pids whose claims are held there now."""
    held: dict[int, set[int]] = {}
    for k in range(manifest.count):
        state = ClaimState()
        for position, record in read_claims(partition_location(data, k, manifest.count)):
            state.apply(record, position)
        held[k] = {_pid(lease.worker) for _, lease in state.held_tasks()}
    return held


# make test kills a member through test_a_member_of_two_partitions_never_outlives_its_own_claims
@pytest.mark.slow
def test_members_rebalance_on_join_and_on_kill_9(
    tmp_path: Path, members: list[subprocess.Popen[bytes]]
) -> None:
    data = tmp_path / "qw"
    manifest = resolve_partitions(data, 4)
    assert manifest is not None
    with PartitionedQueue(data, manifest) as queue:
        queue.enqueue_many([{"n": n} for n in range(240)])

    a = _start(members, data, "a0", "a")
    wait_until(lambda: len(read_assignment(data, manifest)) == 1, 60, "the first member")
    assert list(read_assignment(data, manifest).values()) == [[0, 1, 2, 3]]

    b = _start(members, data, "b0", "b")  # another host's member joins: half each
    c = _start(members, data, "b1", "b")

    def three() -> dict[str, list[int]] | None:
        given = read_assignment(data, manifest)
        return given if len(given) == 3 else None

    given = wait_until(three, 60, "three members")
    assert isinstance(given, dict)
    assert sorted(len(p) for p in given.values()) == [1, 1, 2]
    by_pid = {_pid(m): parts for m, parts in given.items()}
    assert set(by_pid) == {a.pid, b.pid, c.pid}

    # b's partitions are worked by b alone, once the others have seen the assignment
    victim_partition = by_pid[b.pid][0]
    wait_until(
        lambda: _holders(data, manifest)[victim_partition] == {b.pid},
        60,
        f"b to hold a task of partition {victim_partition}",
    )
    os.kill(b.pid, signal.SIGKILL)
    b.wait(10)

    def reassigned() -> bool:
        now = {_pid(m): p for m, p in read_assignment(data, manifest).items()}
        return set(now) == {a.pid, c.pid} and victim_partition in now[a.pid] + now[c.pid]

    wait_until(reassigned, 60, "b's partitions to be reassigned")
    survivors = {_pid(m): p for m, p in read_assignment(data, manifest).items()}
    assert sorted(p for ps in survivors.values() for p in ps) == [0, 1, 2, 3]

    def drained() -> bool:
        report = load_partitioned_report(data, manifest)
        return report.tasks_done == 240

    wait_until(drained, 180, "every task done")
    report = load_partitioned_report(data, manifest)
    assert report.ok, report.verdict
    part = report.partitions[victim_partition]
    taken = [t for t in part.takeovers if _pid(t.victim) == b.pid]
    assert taken, "b held a task there when killed: it must have been taken over"
    for takeover in taken:
        assert _pid(takeover.new_holder) in {a.pid, c.pid}
        assert takeover.gap_after_expiry >= 0  # by lease expiry, never by assignment alone

    # a clean exit: drained, a LEAVE, and the assignment forgets it at once
    for proc in (a, c):
        proc.send_signal(signal.SIGTERM)
    assert a.wait(60) == 0 and c.wait(60) == 0
    assert read_assignment(data, manifest) == {}


# make test kills a member through test_a_member_of_two_partitions_never_outlives_its_own_claims
@pytest.mark.slow
def test_two_qw_up_rebalance_share_the_partitions_and_survive_a_kill_9(tmp_path: Path) -> None:
    import psutil

    from tests.test_cli import qw, start_up

    data = tmp_path / "qw"
    common = ["--dir", str(data), "--rebalance", "--work-ms", "100", "--lease", "4",
              "--exit-when-drained"]  # fmt: skip
    a = start_up(tmp_path, "a", *common, "--partitions", "4", "--workers", "1",
                 "--tasks", "160", "--host-name", "a")  # fmt: skip
    wait_until(lambda: (data / "partitions").exists(), 60, "the queue to be created")
    b = start_up(tmp_path, "b", *common, "--workers", "2", "--host-name", "b")
    try:
        manifest = resolve_partitions(data, None)
        assert manifest is not None

        def b_members() -> set[int]:
            return {
                p.pid
                for p in psutil.Process(b.pid).children()
                if "queue_worker.partitions.member" in " ".join(p.cmdline())
            }

        def a_b_member_holds() -> int | None:
            mine = b_members()
            for pids in _holders(data, manifest).values():
                if pids & mine:
                    return next(iter(pids & mine))
            return None

        victim = wait_until(a_b_member_holds, 90, "a member of b to hold a task")
        assert isinstance(victim, int)
        os.kill(victim, signal.SIGKILL)
        assert a.wait(180) == 0, (tmp_path / "a.err").read_text()
        assert b.wait(180) == 0, (tmp_path / "b.err").read_text()
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    result = qw("report", "--dir", str(data), cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    report = load_partitioned_report(data, manifest)
    assert report.ok and report.tasks_done == 160
    hosts = {w.worker.split("@")[1].split("-")[0] for r in report.partitions for w in r.workers}
    assert hosts == {"a", "b"}  # both qw up's members worked the queue
    takeovers = [t for r in report.partitions for t in r.takeovers if _pid(t.victim) == victim]
    assert takeovers, "the killed member held a task: it must have been taken over"
    assert all(t.gap_after_expiry >= 0 and _pid(t.new_holder) != victim for t in takeovers)


def test_a_member_of_two_partitions_never_outlives_its_own_claims(
    tmp_path: Path, members: list[subprocess.Popen[bytes]]
) -> None:
    """A member steps one worker per partition in turn. A CLAIM one of them appended ahead
    with its DONE would wait out the other's long task and lapse, and the member would
    then take its own task over (seen in a dashboard: m0.p0 → m0.p0). A member's workers
    claim a task when they are about to work it."""
    data = tmp_path / "qw"
    manifest = resolve_partitions(data, 2)
    assert manifest is not None
    with PartitionedQueue(data, manifest) as queue:  # short tasks in p0, long ones in p1
        by_partition = {queue.partition_for(key): key for key in ("a", "b", "c", "d", "e")}
        payloads = [{"work_ms": 10 if n % 2 == 0 else 1500} for n in range(8)]
        keys = [by_partition[n % 2] for n in range(8)]
        refs = queue.enqueue_many(payloads, keys=keys)
    assert [r.partition for r in refs] == [n % 2 for n in range(8)]
    _start(members, data, "a0", "a", lease_s=1.0)  # (its long tasks' leases are renewed)

    def drained() -> bool:
        return load_partitioned_report(data, manifest).tasks_done == 8

    wait_until(drained, 120, "every task done")
    report = load_partitioned_report(data, manifest)
    assert report.ok, report.verdict
    assert [t for part in report.partitions for t in part.takeovers] == []
