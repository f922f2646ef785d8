"""A survivor, not the victim's replacement, takes over a killed holder's task: `qw up` as
`make up` runs it (restart on, the default pick, the default lease and work), real kill -9.

Each kill: a worker that holds a task (as the log says) is killed; the supervisor restarts
its slot as a new worker id. The CLAIM that takes the orphaned task over must come from a
worker id that was running before the kill — never the victim's replacement (the pick rules
"orphans first" and "not by the heir", queue_worker/worker/pick.py). Three kills in the normal
suite; QW_CHAOS=long makes ten. Run with -s to see each takeover's delay after the lapse.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from queue_worker.names import worker_label
from queue_worker.proof.report import load_report
from queue_worker.protocol.records import Claim, Done
from queue_worker.protocol.state import Lease, Verdict
from queue_worker.worker.pick import lineage
from queue_worker.worker.snapshot import parse_snapshot
from queue_worker.worker.stats import read_all
from supervisor.demos.fleet import ClaimsTail, Seen
from supervisor.run.supervisor import is_running_worker
from tests.helpers import wait_until

pytestmark = pytest.mark.chaos

KILLS = 10 if os.environ.get("QW_CHAOS") == "long" else 3
WORKERS = 4
LEASE_S = 5.0  # qw up's default lease and work time: what `make up` runs
#: a slot killed again sooner than this restarts after a longer backoff (the supervisor's
#: healthy_after_s): the test kills each slot at most this often, as a user pressing `k` does
SLOT_REST_S = 11.0


@dataclass(frozen=True)
class Kill:
    victim: str
    task: int
    running_before: frozenset[str]  # the worker ids running when the victim was killed


def running_workers(data_dir: Path) -> dict[str, int]:
    """worker id -> pid of every running worker, from the stats snapshots."""
    return {
        str(s["worker"]): int(s["pid"])
        for s in read_all(data_dir / "run")
        if is_running_worker(parse_snapshot(s))
    }


def kill_a_holder(
    data_dir: Path, tail: ClaimsTail, rested: dict[str, float], tasks_killed: set[int]
) -> Kill | None:
    """kill -9 a running worker that holds a task, in a slot not killed lately: the one
    that claimed last (a worker busy with fresh backlog, as a user pressing `k` finds)."""
    running = running_workers(data_dir)
    tail.poll()
    now = time.monotonic()
    holders: list[tuple[int, Lease]] = list(tail.follower.state.held_tasks())
    holders.sort(key=lambda held: held[1].claim, reverse=True)
    for task, lease in holders:
        pid = running.get(lease.worker)
        if pid is None or now - rested.get(lineage(lease.worker), -SLOT_REST_S) < SLOT_REST_S:
            continue
        if task in tasks_killed:
            continue  # each kill orphans a new task
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        rested[lineage(lease.worker)] = now
        tasks_killed.add(task)
        if done_under(tail, lease.claim) is not None:
            return None  # it finished just before the kill landed: nothing to take over
        return Kill(lease.worker, task, frozenset(running))
    return None


def done_under(tail: ClaimsTail, claim: int) -> Seen | None:
    return tail.find(lambda s: isinstance(s.record, Done) and s.record.claim == claim)


def takeover_of(tail: ClaimsTail, victim: str, task: int) -> Seen | None:
    return tail.find(
        lambda s: (
            s.verdict is Verdict.TAKEOVER
            and s.outcome.task == task
            and s.outcome.previous is not None
            and s.outcome.previous.worker == victim
        )
    )


# make test covers the kill -9 takeover in test_worker_processes, test_tui_tmux and
# test_check_redistribution
@pytest.mark.slow
def test_a_survivor_takes_over_a_killed_holders_task(data_dir: Path) -> None:
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervisor.cli.app",
            "up",
            "--dir",
            str(data_dir),
            "--workers",
            str(WORKERS),
            "--tasks",
            "5000",
            "--no-tui",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    rested: dict[str, float] = {}
    tasks_killed: set[int] = set()
    taken: list[tuple[Kill, Seen]] = []
    try:
        wait_until(lambda: len(running_workers(data_dir)) == WORKERS, 120, "every worker to start")
        with ClaimsTail(data_dir) as tail:
            while len(taken) < KILLS:
                kill = wait_until(
                    lambda: kill_a_holder(data_dir, tail, rested, tasks_killed),
                    120,
                    "a holder to kill",
                )
                assert isinstance(kill, Kill)
                takeover = wait_until(
                    lambda k=kill: takeover_of(tail, k.victim, k.task),  # type: ignore[misc]
                    LEASE_S + 60,
                    f"task {kill.task} to be taken over",
                )
                assert isinstance(takeover, Seen)
                taken.append((kill, takeover))
    finally:
        supervisor.send_signal(signal.SIGTERM)
        supervisor.send_signal(signal.SIGTERM)  # the second one ends the workers now
        supervisor.communicate(timeout=60)

    for kill, takeover in taken:
        taker = takeover.outcome.worker or ""
        previous = takeover.outcome.previous
        assert previous is not None and isinstance(takeover.record, Claim)
        late_ms = (takeover.record.at - previous.expiry) / 1000
        print(
            f"task {kill.task}: {worker_label(kill.victim)} -> {worker_label(taker)}, "
            f"{late_ms:.0f} ms after the lease lapsed"
        )
        assert taker != kill.victim
        assert taker in kill.running_before, (
            f"task {kill.task} was taken over by {taker}, which was not running when "
            f"{kill.victim} was killed (its replacement: {lineage(taker) == lineage(kill.victim)})"
        )
    assert load_report(data_dir).ok
