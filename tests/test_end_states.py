"""Truthful end states (issue 11 item 5, issue 15 item 6).

`qw up` says "drained" only when nothing is pending or held; otherwise it names what is
left and by whom. `--exit-when-drained` is not kept waiting by an id that was never
published (a hostile claim) or a task record of a type no worker here runs. A lease that
has run out reads as expired, with how long ago (by the reader's clock), in `qw status`,
`qw task`, `qw why` and `qw report`.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from queue_worker.producer import Queue
from queue_worker.proof.report import read_claims
from queue_worker.protocol.records import MAX_TASK_ID, Claim, Done, encode
from queue_worker.protocol.state import ClaimState, Lease
from queue_worker.topics import open_topics
from supervisor.run.end_state import held_text, left_text
from supervisor.run.model import QueueView
from supervisor.run.monitor import Monitor
from tests.helpers import wait_until

QW = [sys.executable, "-m", "supervisor.cli.app"]
S = 1_000_000


def qw(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def now_us() -> int:
    return time.time_ns() // 1000


def publish(directory: Path, count: int) -> None:
    with Queue(str(directory)) as queue:
        queue.enqueue_many([{"n": n} for n in range(count)])


def append_claims(directory: Path, *records: Claim | Done) -> list[int]:
    tasks, claims = open_topics(directory)
    with tasks, claims:
        return [claims.append(encode(r)) for r in records]


def append_foreign_task(directory: Path) -> None:
    """A tasks-log record of a type this version does not know (a newer writer's)."""
    tasks, claims = open_topics(directory)
    with tasks, claims:
        tasks.append(msgpack.packb([1, "Z", {"from": "the future"}]))


def caught_up(directory: Path) -> Monitor:
    monitor = Monitor(str(directory))
    while True:
        monitor.poll()
        if monitor.caught_up:
            return monitor


# -- what counts as drained ------------------------------------------------------------------


def test_a_claim_for_an_unpublished_id_does_not_hold_the_queue(tmp_path: Path) -> None:
    d = tmp_path / ".qw"
    publish(d, 2)
    t = now_us()
    (c0, c1, _) = append_claims(
        d,
        Claim(0, "w0-1-a", t, 30 * S),
        Claim(1, "w0-1-a", t + 1, 30 * S),
        Claim(MAX_TASK_ID, "x-2-b", t, 2**62),  # hostile: held "for ever", never published
    )
    append_claims(d, Done(0, "w0-1-a", t + 2, c0), Done(1, "w0-1-a", t + 3, c1))
    monitor = caught_up(d)
    try:
        view = monitor.queue_view()
        assert (view.pending, view.held, view.done) == (0, 0, 2)
        assert monitor.is_drained()
        assert monitor.held_leases() == []
    finally:
        monitor.close()


def test_a_done_for_an_unpublished_id_does_not_drain_the_queue_early(tmp_path: Path) -> None:
    d = tmp_path / ".qw"
    publish(d, 2)
    t = now_us()
    (c0, c5) = append_claims(d, Claim(0, "w0-1-a", t, 30 * S), Claim(5, "x-2-b", t, 30 * S))
    append_claims(d, Done(0, "w0-1-a", t + 1, c0), Done(5, "x-2-b", t + 1, c5))
    monitor = caught_up(d)
    try:
        assert monitor.queue_view().pending == 1  # task 1: the DONE for 5 closes nothing here
        assert not monitor.is_drained()
    finally:
        monitor.close()


def test_a_task_of_an_unknown_type_is_not_pending(tmp_path: Path) -> None:
    d = tmp_path / ".qw"
    publish(d, 1)
    append_foreign_task(d)
    t = now_us()
    (c0,) = append_claims(d, Claim(0, "w0-1-a", t, 30 * S))
    append_claims(d, Done(0, "w0-1-a", t + 1, c0))
    monitor = caught_up(d)
    try:
        assert monitor.queue_view().published == 2
        assert monitor.queue_view().pending == 0
        assert monitor.is_drained()
    finally:
        monitor.close()


def test_exit_when_drained_exits_despite_hostile_and_foreign_records(tmp_path: Path) -> None:
    d = tmp_path / ".qw"
    publish(d, 3)
    append_foreign_task(d)
    append_claims(d, Claim(MAX_TASK_ID, "x-2-b", now_us(), 2**62))
    run = qw(
        "up", "--no-tui", "--exit-when-drained", "--workers", "2", "--work-ms", "10",
        "--dir", str(d), cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "qw: drained (published 4, done 3, dead 0, pending 0)"
    state = ClaimState()
    for position, record in read_claims(str(d)):
        state.apply(record, position)
    assert all(state.is_done(t) for t in range(3))


# -- the last line of qw up --------------------------------------------------------------------


def test_held_text_says_dead_and_how_long_ago_the_lease_expired() -> None:
    lease = Lease(claim=7, worker="w2-6975-4ede", at=100 * S, expiry=130 * S)
    assert held_text(1242, lease, 99.0, 133_100_000) == (
        "task 1242 by w2·6975 (dead, lease expired 3.10 s ago)"
    )
    assert held_text(1242, lease, None, 120 * S).startswith("task 1242 by w2·6975 (lease until ")


def test_left_text_is_none_only_when_nothing_is_left() -> None:
    lease = Lease(7, "w2-6975-4ede", 100 * S, 130 * S)
    assert left_text(QueueView(published=5, done=5), [], 0) is None
    assert left_text(QueueView(published=5, done=3, pending=2), [], 0) == "2 tasks pending"
    assert left_text(QueueView(published=5, done=4, held=1), [(4, lease, 1.0)], 140 * S) == (
        "1 task held: task 4 by w2·6975 (dead, lease expired 10.00 s ago)"
    )


def status_file(data: Path, pid: int) -> dict[str, Any] | None:
    try:
        body: dict[str, Any] = json.loads(
            (data / "run" / "supervisors" / f"{pid}.json").read_text()
        )
    except (OSError, ValueError):
        return None
    return body


def holder_of_task_0(data: Path) -> str | None:
    state = ClaimState()
    for position, record in read_claims(str(data)):
        state.apply(record, position)
    lease = state.holder(0)
    return None if lease is None else lease.worker


def test_up_stopped_with_a_dead_workers_task_held_does_not_say_drained(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    out = (tmp_path / "up.out").open("w")
    with out:
        up = subprocess.Popen(
            [*QW, "up", "--no-tui", "--dir", str(data), "--workers", "1", "--tasks", "1",
             "--work-ms", "600000", "--lease", "600"],
            cwd=tmp_path, stdout=out, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
    try:
        holder = wait_until(lambda: holder_of_task_0(data), 60, "w0 to hold task 0")
        assert isinstance(holder, str)
        pid = int(holder.split("-")[1])
        assert qw("kill", "w0", "--dir", str(data), cwd=tmp_path).returncode == 0

        def replaced() -> bool:
            body = status_file(data, up.pid)
            workers = body["workers"] if body else []
            return any(w["alive"] and w["pid"] not in (None, pid) for w in workers)

        wait_until(replaced, 60, "w0 to be restarted")
    finally:
        up.send_signal(signal.SIGTERM)
        code = up.wait(60)
    assert code == 0
    last = (tmp_path / "up.out").read_text().splitlines()[-1]
    assert last.startswith(f"qw: stopped with 1 task held: task 0 by w0·{pid} (dead, lease until ")
    assert "drained" not in last
    # and afterwards: status names the holder; no worker runs
    status = qw("status", "--dir", str(data), cwd=tmp_path).stdout
    assert "held 1" in status
    assert f"held: task 0 by w0·{pid} (not running here, lease until " in status


# -- expired leases, as the readers show them ------------------------------------------------


@pytest.fixture
def expired(tmp_path: Path) -> Path:
    """Task 0 claimed 10 s ago with a 1 s lease, by a worker that never came back."""
    d = tmp_path / ".qw"
    publish(d, 1)
    append_claims(d, Claim(0, "w2-6975-4ede", now_us() - 10 * S, 1 * S))
    return d


def test_status_shows_an_expired_lease_with_how_long_ago(tmp_path: Path, expired: Path) -> None:
    out = qw("status", "--dir", str(expired), cwd=tmp_path).stdout
    assert "held 1 (1 expired)" in out
    expired_line = r"held: task 0 by w2·6975 \(not running here, lease expired \d+\.\d\d s ago\)"
    assert re.search(expired_line, out)
    assert "by this machine's clock" in out
    body = json.loads(qw("status", "--json", "--dir", str(expired), cwd=tmp_path).stdout)
    assert body["held"][0] | {"expiry": 0} == {
        "task": 0, "worker": "w2-6975-4ede", "label": "w2·6975", "claim": body["held"][0]["claim"],
        "expiry": 0, "expired": True,
    }  # fmt: skip


@pytest.mark.parametrize("command", ["task", "why"])
def test_task_and_why_say_the_lease_expired(tmp_path: Path, expired: Path, command: str) -> None:
    out = qw(command, "0", "--dir", str(expired), cwd=tmp_path).stdout
    first = next(line for line in out.splitlines() if line.startswith("task 0: "))
    assert first.startswith("task 0: held by w2·6975 (claim @")
    assert ", but its lease expired at " in first and " s ago by this machine's clock" in first


def test_report_shows_an_expired_lease(tmp_path: Path, expired: Path) -> None:
    out = qw("report", "--dir", str(expired), cwd=tmp_path).stdout
    assert "held now                   1 (1 with an expired lease)" in out
    row = next(line for line in out.splitlines() if line.lstrip().startswith("0  w2·6975"))
    assert re.search(r"\(expired \d+\.\d\d s ago\)$", row)
    assert "expired: by this machine's clock" in out
    body = json.loads(qw("report", "--json", "--dir", str(expired), cwd=tmp_path).stdout)
    assert body["held_expired"] == [0]
