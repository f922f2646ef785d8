"""The total-queue classes (Jepsen's lost / duplicated / unexpected / recovered), from the
fold's verdicts, and `qw report` stating them (text, --json, --timeline)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from logstore import open_log
from queue_worker.proof.checker import QueueChecker
from queue_worker.proof.report import build_report
from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Fail, TaskRecord, encode
from queue_worker.protocol.state import Outcome, Verdict

A, B = "w1-11-aaaa", "w2-22-bbbb"
LEASE = 1_000


def run_records() -> list[tuple[int, ClaimsRecord]]:
    return [
        (0, Claim(0, A, 0, LEASE)),
        (1, Done(0, A, 10, 0)),  # task 0: ok
        (2, Claim(1, A, 20, LEASE)),  # A's lease on task 1 lapses at 1020
        (3, Claim(1, B, 2_000, LEASE)),  # takeover
        (4, Done(1, A, 2_100, 2)),  # A finishes anyway: refused (ran to completion twice)
        (5, Done(1, B, 2_200, 3)),  # task 1: recovered
        (6, Claim(3, B, 3_000, LEASE)),  # task 3: held
        (7, Claim(4, B, 3_100, LEASE)),
        (8, Fail(4, B, 3_200, 7, "boom", 9_000)),  # task 4: waiting for its retry
        (9, Claim(5, A, 3_300, LEASE)),
        (10, Fail(5, A, 3_400, 9, "boom", None)),  # task 5: dead
        (11, Done(9, B, 3_500, 6)),  # task 9 was never published: unexpected
    ]  # task 2: never claimed, so pending


def test_each_task_lands_in_its_class() -> None:
    checks = build_report(6, run_records()).checks
    assert (checks.ok, checks.lost, checks.duplicated) == (2, 0, 0)
    assert (checks.pending, checks.pending_tasks, checks.retrying) == (2, (2, 4), 1)
    assert (checks.held, checks.held_tasks) == (1, (3,))
    assert (checks.dead, checks.dead_tasks, checks.dead_attempts) == (1, (5,), (1, 1))
    assert (checks.unexpected, checks.unexpected_tasks) == (1, (9,))
    assert (checks.recovered, checks.recovered_tasks) == (1, (1,))
    assert (checks.run_again, checks.ran_to_completion_twice) == (1, 1)
    assert not checks.valid  # the unexpected DONE
    assert checks.summary == (
        "total-queue check: INVALID: 1 unexpected, 1 dead (attempts used up: 1 each), "
        "1 held, 2 pending (unfinished, not lost: a worker runs them, the next qw up if none "
        "runs), 1 recovered"
    )


def test_two_accepted_dones_are_duplicated_and_invalid() -> None:
    # The fold never accepts two DONEs for a task; a checker must still say so if it did.
    checker = QueueChecker()
    checker.apply(Claim(0, A, 0, LEASE), Outcome(Verdict.WON, 0, 0, A))
    checker.apply(Done(0, A, 1, 0), Outcome(Verdict.DONE, 1, 0, A))
    checker.apply(Done(0, A, 2, 0), Outcome(Verdict.DONE, 2, 0, A))
    checks = checker.result(1)
    assert (checks.duplicated, checks.duplicated_tasks, checks.ok) == (1, (0,), 0)
    assert not checks.valid
    assert "duplicated (completed twice, never allowed): 1 (task 0)" in checks.lines()


def test_a_clean_run_is_valid() -> None:
    records: list[tuple[int, ClaimsRecord]] = [(0, Claim(0, A, 0, LEASE)), (1, Done(0, A, 5, 0))]
    checks = build_report(1, records).checks
    assert checks.valid
    assert checks.summary == "total-queue check: VALID: every task done exactly once (1)"


def qw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def write_run(directory: Path) -> dict[int, int]:
    """The run above in real logs; returns its index -> the record's real log position (the
    claims that RENEW/DONE/FAIL name are renumbered to match)."""
    with open_log(directory, "tasks") as tasks:
        for n in range(6):
            tasks.append(encode(TaskRecord({"n": n}, 0)))
    at: dict[int, int] = {}
    with open_log(directory, "claims") as claims:
        for index, record in run_records():
            if isinstance(record, Done | Fail):
                record = record._replace(claim=at[record.claim])
            at[index] = claims.append(encode(record))
    return at


def test_qw_report_states_the_classes_and_writes_a_timeline(tmp_path: Path) -> None:
    at = write_run(tmp_path / "q")
    text = qw("report", "--dir", str(tmp_path / "q"))
    assert (
        "total-queue check: INVALID: 1 unexpected, 1 dead (attempts used up: 1 each), "
        "1 held, 2 pending (unfinished, not lost: a worker runs them, the next qw up if none "
        "runs), 1 recovered"
    ) in text.stdout
    assert "run again after a lease lapsed (at-least-once, allowed): 1" in text.stdout
    page = tmp_path / "out" / "t.html"
    result = qw("report", "--dir", str(tmp_path / "q"), "--json", "--timeline", str(page))
    data = json.loads(result.stdout)  # the page is named on stderr: stdout stays JSON
    assert data["checks"]["pending_tasks"] == [2, 4] and data["checks"]["valid"] is False
    assert result.stderr.strip() == f"qw: timeline: {page}"
    assert f'id="takeover-{at[3]}"' in page.read_text(encoding="utf-8")


def test_a_claimed_task_whose_record_is_gone_is_lost_and_invalid() -> None:
    # task 5 was claimed (so published once), but the tasks log holds only tasks 0 and 1
    records: list[tuple[int, ClaimsRecord]] = [
        (0, Claim(0, A, 0, LEASE)),
        (1, Done(0, A, 5, 0)),
        (2, Claim(5, B, 10, LEASE)),
    ]
    checks = build_report(2, records).checks
    assert (checks.lost, checks.lost_tasks, checks.pending, checks.held) == (1, (5,), 1, 0)
    assert not checks.valid
    assert checks.summary == (
        "total-queue check: INVALID: 1 lost, 1 pending (unfinished, not lost: a worker runs "
        "them, the next qw up if none runs)"
    )
