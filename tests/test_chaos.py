"""Chaos: `qw up` with restarts on, while workers that hold tasks are killed with -9 again
and again (real processes, real signals, real files). Afterwards the claims log must prove:

- every task was done exactly once, and `qw report` exits 0;
- the original's invariants on every prefix of the log, i.e. for every reader: tasks done ≤
  tasks won ≤ done + held (counting distinct tasks: a takeover keeps its task held), and a
  reader further along never sees fewer tasks done — checked on the log's prefixes and on
  the workers' own published views (each worker's done count at its own log position);
- never two holders at any point: a claim wins a held task only when the holder's lease —
  as its own CLAIM and RENEW records set it — had run out by the new claim's timestamp.

The short run is part of the normal suite; QW_CHAOS=long runs a longer, wider one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from queue_worker.proof.report import load_report, read_claims
from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Fail, Renew
from queue_worker.protocol.state import ClaimState, Verdict
from queue_worker.worker.snapshot import parse_snapshot
from queue_worker.worker.stats import read_all
from supervisor.demos.fleet import ClaimsTail
from supervisor.run.supervisor import is_running_worker
from tests.helpers import wait_until

pytestmark = pytest.mark.chaos

LONG = os.environ.get("QW_CHAOS") == "long"


@dataclass(frozen=True)
class Plan:
    workers: int
    tasks: int
    work_ms: int
    lease_s: float
    tasks_between_kills: int  # progress the queue makes between two kills


SHORT = Plan(workers=4, tasks=150, work_ms=60, lease_s=1.5, tasks_between_kills=12)
WIDE = Plan(workers=8, tasks=3000, work_ms=60, lease_s=1.5, tasks_between_kills=30)

#: The supervisor gives up on a slot restarted 5 times within 30 s (a crash loop); the test
#: kills one slot at most this often within that window, so its workers keep coming back.
KILLS_PER_SLOT_PER_WINDOW = 3
STORM_WINDOW_S = 30.0


@dataclass
class Chaos:
    """The kills so far, by slot name, with when they happened (monotonic seconds)."""

    kills: dict[str, list[float]] = field(default_factory=dict)
    views: set[tuple[int, int]] = field(default_factory=set)  # (consumed_up_to, done_tasks)

    def may_kill(self, slot: str, now: float) -> bool:
        recent = [t for t in self.kills.get(slot, []) if now - t < STORM_WINDOW_S]
        return len(recent) < KILLS_PER_SLOT_PER_WINDOW

    def kill_a_holder(self, data_dir: Path, tail: ClaimsTail) -> str | None:
        """kill -9 a running worker that holds a task (as the log says): its task must be
        taken over. Returns the worker id, or None if no holder may be killed now."""
        running = {
            str(s["worker"]): s
            for s in read_all(data_dir / "run")
            if is_running_worker(parse_snapshot(s))
        }
        self.views.update(
            (int(s["consumed_up_to"]), int(s["done_tasks"])) for s in running.values()
        )
        tail.poll()
        now = time.monotonic()
        for _, lease in tail.follower.state.held_tasks():
            snapshot = running.get(lease.worker)
            if snapshot is None or not self.may_kill(str(snapshot["name"]), now):
                continue
            try:
                os.kill(int(snapshot["pid"]), signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.kills.setdefault(str(snapshot["name"]), []).append(now)
            return lease.worker
        return None


def check_log(records: list[tuple[int, ClaimsRecord]]) -> tuple[int, list[int]]:
    """Replay the claims log, checking the invariants after every record. Returns the
    number of takeovers and, for each record, how many tasks were done after it."""
    state = ClaimState()
    # Kept apart from the fold, from the records themselves: each task's winning claim
    # (position, worker) and the expiry its own CLAIM/RENEW records give it.
    holder: dict[int, tuple[int, str, int]] = {}
    won: set[int] = set()
    done: set[int] = set()
    done_after: list[int] = []
    takeovers = 0
    for position, record in records:
        outcome = state.apply(record, position)
        verdict = outcome.verdict
        assert not isinstance(record, Fail), f"no task fails in this run: @{position}"
        assert verdict is not Verdict.STALE_DONE, f"a task was worked twice: @{position}"
        if isinstance(record, Claim) and verdict.won:
            assert record.task not in done, f"@{position} won a task already done"
            current = holder.get(record.task)
            if current is not None:
                # Never two holders: the previous lease had run out by this claim's clock.
                assert verdict is Verdict.TAKEOVER and record.at >= current[2], (
                    f"@{position} took task {record.task} from claim @{current[0]} before "
                    f"its lease ran out ({record.at} < {current[2]})"
                )
                takeovers += 1
            else:
                assert verdict is Verdict.WON
            holder[record.task] = (position, record.worker, record.at + record.lease)
            won.add(record.task)
        elif isinstance(record, Renew) and verdict is Verdict.RENEWED:
            assert holder[record.task][:2] == (record.claim, record.worker)
            holder[record.task] = (record.claim, record.worker, record.at + record.lease)
        elif isinstance(record, Done) and verdict is Verdict.DONE:
            assert holder[record.task][:2] == (record.claim, record.worker)
            assert record.task not in done, f"task {record.task} completed twice"
            done.add(record.task)
            del holder[record.task]
        assert (state.done_count, state.held_count) == (len(done), len(holder))
        # The original's invariants, on distinct tasks.
        assert len(done) <= len(won) <= len(done) + len(holder)
        assert not done_after or len(done) >= done_after[-1]  # never fewer done further on
        done_after.append(len(done))
    return takeovers, done_after


def test_kill_9_again_and_again_and_every_task_is_done_exactly_once(data_dir: Path) -> None:
    plan = WIDE if LONG else SHORT
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervisor.cli.app",
            "up",
            "--dir",
            str(data_dir),
            "--workers",
            str(plan.workers),
            "--tasks",
            str(plan.tasks),
            "--work-ms",
            str(plan.work_ms),
            "--lease",
            str(plan.lease_s),
            "--pick",
            "random",
            # A worker killed holding a task uses one of its attempts; the kills must not
            # use up a task's attempts (it would be dead, not done).
            "--max-attempts",
            "1000",
            "--exit-when-drained",
            "--no-tui",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    chaos = Chaos()
    try:
        wait_until(lambda: (data_dir / "claims.log").exists(), 60, "qw up to create its logs")
        with ClaimsTail(data_dir) as tail:

            def done() -> int:
                tail.poll()
                return tail.follower.state.done_count

            def progressed(target: int) -> Callable[[], bool]:
                return lambda: done() >= target or supervisor.poll() is not None

            while done() < plan.tasks and supervisor.poll() is None:
                target = min(plan.tasks, done() + plan.tasks_between_kills)
                chaos.kill_a_holder(data_dir, tail)
                wait_until(progressed(target), 60, f"{target} tasks done amid the kills")
        output, _ = supervisor.communicate(timeout=120)
    finally:
        if supervisor.poll() is None:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.send_signal(signal.SIGTERM)  # the second one kills the workers now
            supervisor.wait(30)

    assert supervisor.returncode == 0, output
    kills = sum(len(times) for times in chaos.kills.values())
    assert kills >= 3, f"only {kills} kills: the run was too short to be chaos"

    check_the_run(str(data_dir), plan, chaos.views, ["--dir", str(data_dir)], dict(os.environ))


def check_the_run(
    location: str,
    plan: Plan,
    views: set[tuple[int, int]],
    report_args: list[str],
    env: dict[str, str],
) -> None:
    """What every chaos run must show afterwards, on any log backend."""
    records = list(read_claims(location))
    takeovers, done_after = check_log(records)
    assert takeovers >= 1
    assert done_after[-1] == plan.tasks

    # Readers at different points of the log (the workers' published views) agree with the
    # fold of the same prefix: a reader further along never sees fewer tasks done.
    positions = [position for position, _ in records]
    for consumed_up_to, done_tasks in sorted(views):
        prefix = sum(1 for p in positions if p < consumed_up_to)
        assert done_tasks == (done_after[prefix - 1] if prefix else 0)

    report = load_report(location)
    assert report.ok, report.verdict
    assert report.tasks_published == report.tasks_done == report.completions_accepted
    assert report.tasks_done == plan.tasks
    assert report.worked_twice == ()
    assert len(report.takeovers) == takeovers
    result = subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", "report", *report_args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
