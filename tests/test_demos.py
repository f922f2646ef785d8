"""`qw demo …`: each teaching scenario, shortened, run as the user runs it (a real `qw`
process starting real workers). Each must exit 0, meaning it showed what it claims."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from logstore import open_log
from queue_worker.protocol.records import Claim, TaskRecord, encode
from supervisor.demos.collisions import first_collision


def qw_demo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def shown(result: subprocess.CompletedProcess[str]) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "\nshown: " in output, output
    return output


# covered in make test by the demo command: the pause and skew demos
@pytest.mark.slow
def test_collisions_shows_pick_first_losing_the_most_attempts(tmp_path: Path) -> None:
    out = shown(
        qw_demo(
            "collisions",
            "--workers",
            "6",
            "--tasks",
            "100",
            "--work-ms",
            "1",
            "--dir",
            str(tmp_path),
        )
    )
    for pick in ("first", "random", "spread"):
        assert (tmp_path / pick / "claims.log").is_file()
        assert f" {pick} " in out
    assert "pick=first lost" in out


# covered in make test by a takeover after a kill: test_check_redistribution
@pytest.mark.slow
def test_redistribution_shows_a_survivor_taking_over_a_killed_holders_task(
    tmp_path: Path,
) -> None:
    out = shown(
        qw_demo(
            "redistribution",
            "--workers",
            "2",
            "--tasks",
            "3",
            "--lease",
            "0.5",
            "--work-ms",
            "800",
            "--dir",
            str(tmp_path),
        )
    )
    assert "kill -9" in out and "took task" in out and "qw report: exit 0" in out
    assert "is restarted as pid" in out and "(a survivor;" in out


def test_pause_shows_fencing_refuse_the_frozen_workers_done(tmp_path: Path) -> None:
    out = shown(qw_demo("pause", "--lease", "0.5", "--work-ms", "1200", "--dir", str(tmp_path)))
    assert "SIGSTOP" in out and "SIGCONT" in out
    assert "verdict 'stale done'" in out
    assert "qw report: exit 1: FAIL: a task was worked twice" in out
    # and then the same run without fencing: that DONE accepted, the task completed twice
    assert "qw report --rules unfenced: the same log under unfenced rules" in out
    assert "so task 0 would have been completed twice" in " ".join(out.split())


def test_skew_shows_a_fast_clock_stealing_and_a_slow_one_not(tmp_path: Path) -> None:
    out = shown(
        qw_demo(
            "skew",
            "--lease",
            "0.3",
            "--skew",
            "0.5",
            "--work-ms",
            "3000",
            "--dir",
            str(tmp_path),
        )
    )
    assert "the fold grants a TAKEOVER" in out
    assert "and its DONE is accepted" in out and "DONE is done" not in out
    assert "both handlers were running task 0 at the same time" in out
    assert "verdict 'lost: held'" in out
    assert "qw report (it counts completions): exit 0" in out


def test_a_demo_that_cannot_show_its_point_exits_1_saying_why() -> None:
    result = qw_demo("skew", "--lease", "1", "--skew", "0.5")
    assert result.returncode == 1
    assert "NOT shown: --skew must exceed --lease" in result.stdout


def test_the_demos_are_listed() -> None:
    result = qw_demo("--help")
    assert result.returncode == 0
    for demo in ("collisions", "redistribution", "pause", "skew"):
        assert demo in result.stdout


@pytest.mark.parametrize(
    ("second_at", "said"),
    [
        (
            1_000_250,  # dated after the winner's: the plain case
            "w2·102's CLAIM @{second} for task 0 lost: w1·101's CLAIM @{first} came first in "
            "the log and holds the task (w1·101's is dated 250 µs earlier)",
        ),
        (
            999_000,  # dated before the winner's, yet after it in the log
            "w2·102's CLAIM @{second} for task 0 lost: w1·101's CLAIM @{first} came first in "
            "the log and holds the task, although w2·102's is dated 1.0 ms earlier: the order "
            "in the log decides, not the clocks",
        ),
    ],
)
def test_the_first_collision_is_one_plain_sentence(
    data_dir: Path, second_at: int, said: str
) -> None:
    with open_log(data_dir, "tasks") as tasks:
        tasks.append(encode(TaskRecord({"n": 0}, 1_000_000)))
    with open_log(data_dir, "claims") as claims:
        first = claims.append(encode(Claim(0, "w1-101-aaaa", 1_000_000, 5_000_000)))
        second = claims.append(encode(Claim(0, "w2-102-bbbb", second_at, 5_000_000)))
    assert first_collision(data_dir) == said.format(first=first, second=second)


def test_a_worker_that_exits_at_start_fails_the_demos_wait_at_once(tmp_path: Path) -> None:
    """A demo waiting for its workers to start says which one exited, and what it said,
    instead of waiting out its patience (a run that timed out said only "timed out")."""
    from supervisor.demos.fleet import DemoFailed, Fleet, wait_for

    with Fleet(tmp_path, {"handler": "qw_no_such_module:handler"}) as fleet:
        fleet.start("w0", slot=0, slots=1)
        with pytest.raises(DemoFailed, match=r"worker w0 \(pid \d+\) exited with code [1-9]"):
            wait_for(fleet.started, 120, "1 worker to start")
