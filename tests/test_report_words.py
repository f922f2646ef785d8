"""The words `qw report` uses for how a run ended, on real `qw up` runs: a run stopped with a
backlog says pending (not lost), a drained run says every task done exactly once, a run whose
every task failed says dead with the attempts used (not ok)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import wait_until

QW = [sys.executable, "-m", "supervisor.cli.app"]


def qw(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def finished(data: Path) -> int:
    """Tasks the workers of `data` have finished, from their status files."""
    total = 0
    for path in (data / "run").glob("w*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):  # being written, or gone
            total += int(json.loads(path.read_text())["finished"])
    return total


def summary_of(report: str) -> str:
    (line,) = [line for line in report.splitlines() if line.startswith("total-queue check:")]
    return line


def test_a_stopped_run_reports_its_backlog_pending_not_lost(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    with (tmp_path / "up.out").open("w") as out:
        up = subprocess.Popen(
            [*QW, "up", "--no-tui", "--dir", str(data), "--workers", "1", "--tasks", "60",
             "--work-ms", "100"],
            cwd=tmp_path, stdout=out, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
    try:
        wait_until(lambda: finished(data) >= 2, 60, "two tasks finished")
    finally:
        up.send_signal(signal.SIGTERM)  # as `q` does: drain the tasks in hand, keep the rest
        assert up.wait(60) == 0
    result = qw("report", "--dir", str(data), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data_json = json.loads(qw("report", "--dir", str(data), "--json", cwd=tmp_path).stdout)
    checks = data_json["checks"]
    pending = checks["pending"]
    assert 0 < pending < 60 and checks["ok"] + pending == 60
    assert checks["lost"] == 0 and checks["valid"] is True
    assert summary_of(result.stdout) == (
        f"total-queue check: VALID: {pending} pending (unfinished, not lost: a worker runs "
        "them, the next qw up if none runs)"
    )
    assert re.search(
        rf"^pending +{pending} \(not run yet: the next qw up runs them", result.stdout, re.M
    )
    assert " lost" not in summary_of(result.stdout).split("(")[0]


def test_a_drained_run_reports_every_task_done_exactly_once(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    up = qw("up", "--no-tui", "--exit-when-drained", "--dir", str(data), "--workers", "2",
            "--tasks", "20", "--work-ms", "5", cwd=tmp_path)  # fmt: skip
    assert up.returncode == 0, up.stderr
    result = qw("report", "--dir", str(data), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert summary_of(result.stdout) == (
        "total-queue check: VALID: every task done exactly once (20)"
    )
    assert "ok: 20 of 20 published tasks done exactly once" in result.stdout
    assert re.search(r"^pending +0$", result.stdout, re.M)


def test_an_all_dead_run_reports_dead_with_the_attempts_used(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    up = qw("up", "--no-tui", "--exit-when-drained", "--dir", str(data), "--workers", "2",
            "--tasks", "6", "--handler", "tests.poison_handlers:always_fails",
            "--max-attempts", "2", "--backoff", "0.01", cwd=tmp_path)  # fmt: skip
    assert up.returncode == 0, up.stderr
    result = qw("report", "--dir", str(data), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert summary_of(result.stdout) == (
        "total-queue check: VALID: 6 dead (attempts used up: 2 each)"
    )
    assert "every task" not in result.stdout
    assert "ok: 0 of 6 published tasks done exactly once" in result.stdout
    assert re.search(r"^dead +6 \(attempts used up: 2 each\)$", result.stdout, re.M)
