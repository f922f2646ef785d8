"""A holder frozen with SIGSTOP until its lease lapses: fencing, with real processes.

The frozen worker is taken over (observed in the log, not guessed from a clock); resumed
with SIGCONT, its handler either ignores the lost lease and completes — its DONE is refused
as stale and the report names the task as worked twice — or honours `ctx.cancelled` and
writes nothing, so the report stays clean.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from queue_worker.names import worker_label
from queue_worker.producer import Queue
from queue_worker.proof.report import EXIT_WORKED_TWICE, load_report
from queue_worker.protocol.clock import now_us
from queue_worker.protocol.records import Claim, Done
from queue_worker.protocol.state import Lease, Verdict
from queue_worker.worker.stats import read_all
from supervisor.demos.fleet import ClaimsTail, DemoFailed, Fleet, Seen
from supervisor.demos.pause import PauseOptions, run_scenario
from tests.helpers import wait_until

LEASE_S = 0.5
PATIENCE_S = 30.0  # a deadline for conditions that normally take well under a second


def qw_report(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", "report", "--dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_resumed_holder_that_ignores_its_lost_lease_is_refused_and_reported(
    data_dir: Path,
) -> None:
    try:
        run = run_scenario(data_dir, PauseOptions(lease_s=LEASE_S, work_ms=1500, taker_work_ms=100))
    except DemoFailed as e:
        pytest.fail(str(e))

    assert run.takeover.verdict is Verdict.TAKEOVER
    assert run.takeover.outcome.worker != run.victim
    assert run.stale_done.verdict is Verdict.STALE_DONE
    assert run.stale_done.outcome.worker == run.victim
    assert run.taker_done.verdict is Verdict.DONE
    assert run.taker_done.outcome.worker == run.takeover.outcome.worker

    report = load_report(data_dir)
    assert [w.task for w in report.worked_twice] == [run.task]
    assert report.tasks_done == 1 and report.completions_accepted == 1  # done once
    assert report.completions == 2 and report.completions_stale == 1
    assert [t.position for t in report.takeovers] == [run.takeover.position]

    result = qw_report(data_dir)
    assert result.returncode == EXIT_WORKED_TWICE, result.stdout + result.stderr
    assert f"FAIL: a task was worked twice: {run.task}" in result.stdout
    victim = worker_label(run.victim)
    assert f"DONE @{run.stale_done.position} by {victim} (stale done)" in result.stdout


def _holder(tail: ClaimsTail) -> Lease | None:
    tail.poll()
    return next((lease for _, lease in tail.follower.state.held_tasks()), None)


# make test runs the same path in
# test_a_resumed_holder_that_ignores_its_lost_lease_is_refused_and_reported
@pytest.mark.slow
def test_a_resumed_holder_that_honours_cancellation_writes_nothing(data_dir: Path) -> None:
    # The demo handler stops as soon as the lease is lost (ctx.sleep). Its task is long
    # enough that it is still sleeping when the worker wakes: the worker's lease keeper,
    # whose renewal is overdue, looks at the log first, finds the takeover and cancels it.
    with (
        Fleet(data_dir, {"lease_s": LEASE_S, "idle_poll_s": 0.05}) as fleet,
        ClaimsTail(data_dir) as tail,
        Queue(data_dir) as queue,
    ):
        victim = fleet.start("w1", work_ms=60_000)
        task = queue.enqueue({"test": "cooperative"})
        lease = wait_until(lambda: _holder(tail), PATIENCE_S, "w1 to hold the task")
        assert isinstance(lease, Lease)
        fleet.pause(victim)
        fleet.start("w2", work_ms=100)

        def taken_over() -> Seen | None:
            return tail.find(
                lambda s: (
                    s.verdict is Verdict.TAKEOVER
                    and s.outcome.previous is not None
                    and s.outcome.previous.claim == lease.claim
                )
            )

        wait_until(taken_over, PATIENCE_S, "w2 to take the task over")
        fleet.resume(victim)
        done = wait_until(
            lambda: tail.find(lambda s: s.verdict is Verdict.DONE and s.outcome.task == task),
            PATIENCE_S,
            "w2 to finish the task",
        )
        wait_until(
            lambda: any(
                s.get("cancelled") == 1 for s in read_all(fleet.run_dir) if s["pid"] == victim.pid
            ),
            PATIENCE_S,
            "the resumed w1 to cancel its handler (its stats count it)",
        )
    assert isinstance(done, Seen) and done.outcome.worker != lease.worker
    late = [s for s in tail.seen if isinstance(s.record, Done) and s.record.claim == lease.claim]
    assert late == []
    report = load_report(data_dir)
    assert report.ok and report.worked_twice == () and report.tasks_done == 1
    assert qw_report(data_dir).returncode == 0


WORK_MS = 1500  # longer than the lease: the pause outlasts both


def _victim_snapshot(fleet: Fleet, pid: int) -> dict[str, Any] | None:
    return next((s for s in read_all(fleet.run_dir) if s.get("pid") == pid), None)


def _claim_of(tail: ClaimsTail, lease: Lease) -> Claim:
    seen = tail.find(lambda s: s.position == lease.claim)
    assert seen is not None and isinstance(seen.record, Claim)
    return seen.record


# covered in make test by test_a_lease_lapsed_while_paused_is_dropped_and_says_so
@pytest.mark.slow
def test_a_handler_whose_sleep_ran_out_while_stopped_is_cancelled(data_dir: Path) -> None:
    """The default handler's ctx.sleep ends while the worker is stopped (work < pause), and
    another worker has taken the task over. Resumed, the sleep reports cancellation instead
    of returning: no DONE, and `qw report` exits 0."""
    with (
        Fleet(data_dir, {"lease_s": LEASE_S, "idle_poll_s": 0.05}) as fleet,
        ClaimsTail(data_dir) as tail,
        Queue(data_dir) as queue,
    ):
        victim = fleet.start("w1", work_ms=WORK_MS)
        task = queue.enqueue({"test": "sleep ran out while stopped"})
        lease = wait_until(lambda: _holder(tail), PATIENCE_S, "w1 to hold the task")
        assert isinstance(lease, Lease)
        fleet.pause(victim)
        if tail.find(lambda s: isinstance(s.record, Done) and s.record.claim == lease.claim):
            pytest.skip("the task finished before the pause landed")
        fleet.start("w2", work_ms=100)
        wait_until(
            lambda: tail.find(
                lambda s: (
                    s.verdict is Verdict.TAKEOVER
                    and s.outcome.previous is not None
                    and s.outcome.previous.claim == lease.claim
                )
            ),
            PATIENCE_S,
            "w2 to take the task over",
        )
        work_ends = _claim_of(tail, lease).at + WORK_MS * 1000
        wait_until(lambda: now_us() > work_ends, PATIENCE_S, "the handler's time to run out")
        fleet.resume(victim)
        wait_until(
            lambda: (_victim_snapshot(fleet, victim.pid) or {}).get("cancelled") == 1,
            PATIENCE_S,
            "the resumed w1 to cancel its handler",
        )
        wait_until(
            lambda: tail.find(lambda s: s.verdict is Verdict.DONE and s.outcome.task == task),
            PATIENCE_S,
            "w2 to finish the task",
        )
    late = [s for s in tail.seen if isinstance(s.record, Done) and s.record.claim == lease.claim]
    assert late == []
    result = qw_report(data_dir)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_lease_lapsed_while_paused_is_dropped_and_says_so(data_dir: Path) -> None:
    """Alone, paused past its lease: nobody took the task, but the worker cannot vouch for
    the lease, so it drops it (no RENEW, no DONE under that claim), counts `leases_lapsed`
    and says why; the task is then an orphan, which it claims again and finishes."""
    with (
        Fleet(data_dir, {"lease_s": LEASE_S, "idle_poll_s": 0.05}) as fleet,
        ClaimsTail(data_dir) as tail,
        Queue(data_dir) as queue,
    ):
        victim = fleet.start("w1", work_ms=WORK_MS)
        task = queue.enqueue({"test": "lapsed while paused"})
        lease = wait_until(lambda: _holder(tail), PATIENCE_S, "w1 to hold the task")
        assert isinstance(lease, Lease)
        fleet.pause(victim)
        if tail.find(lambda s: isinstance(s.record, Done) and s.record.claim == lease.claim):
            pytest.skip("the task finished before the pause landed")
        work_ends = _claim_of(tail, lease).at + WORK_MS * 1000
        wait_until(lambda: now_us() > work_ends, PATIENCE_S, "the paused lease to lapse")
        fleet.resume(victim)
        snapshot = wait_until(
            lambda: (
                (s := _victim_snapshot(fleet, victim.pid)) and s.get("leases_lapsed") == 1 and s
            ),
            PATIENCE_S,
            "w1 to count the lapsed lease",
        )
        assert isinstance(snapshot, dict)
        assert f"task {task}:" in str(snapshot["last_error"])
        assert "lapsed while paused" in str(snapshot["last_error"])
        done = wait_until(
            lambda: tail.find(lambda s: s.verdict is Verdict.DONE and s.outcome.task == task),
            PATIENCE_S,
            "the task to be done under a new claim",
        )
    assert isinstance(done, Seen) and isinstance(done.record, Done)
    assert done.record.claim != lease.claim
    written = [
        type(s.record).__name__
        for s in tail.seen
        if getattr(s.record, "claim", None) == lease.claim
    ]
    assert written == []  # neither RENEW nor DONE under the lapsed claim
    assert qw_report(data_dir).returncode == 0
