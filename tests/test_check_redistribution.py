"""bin/check-redistribution.sh: the original's kill -9 scenario, run as a user runs it, with
short times; and its promise to leave no process behind, however it ends."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from tests.helpers import wait_until

SCRIPT = Path(__file__).resolve().parent.parent / "bin" / "check-redistribution.sh"


def script_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHON=sys.executable)
    qw = Path(sys.executable).parent / "qw"
    if qw.exists():
        env["QW"] = str(qw)
    return env


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live processes whose command line names `text` (a data directory)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info.get("cmdline") or []
        if process.info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        if any(text in part for part in cmdline):
            found.append(process)
    return found


def test_a_killed_holders_task_is_finished_by_a_survivor(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--lease", "1", "--work-ms", "500", "--margin", "20"],
        env=script_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "check-redistribution: OK: task" in result.stdout
    # named as people see workers (w1·11095), and the taker was running before the kill
    assert re.search(r"redistributed from w\d+·\d+ to w\d+·\d+ \(a survivor\)", result.stdout)
    assert "kill -9" in result.stdout
    assert "OK: every finished task was completed exactly once" in result.stdout  # qw report
    # its fresh data directory (under TMPDIR) is removed after a pass
    assert list(tmp_path.glob("qw-redistribution.*")) == []
    assert processes_mentioning(str(tmp_path)) == []


def test_interrupted_it_ends_every_process_it_started(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # A lease far longer than the test: the script is still waiting when it is stopped.
    script = subprocess.Popen(
        ["bash", str(SCRIPT), "--lease", "600", "--work-ms", "60000", "--dir", str(data)],
        env=script_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(
            lambda: any(
                "queue_worker.worker" in " ".join(p.info.get("cmdline") or [])
                for p in processes_mentioning(str(data))
            ),
            60,
            "the script's workers to start",
        )
        script.send_signal(signal.SIGTERM)
        output, _ = script.communicate(timeout=60)
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    assert script.returncode == 143, output
    wait_until(lambda: processes_mentioning(str(data)) == [], 30, "every process it started to end")


def test_bad_usage_is_exit_2() -> None:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--workers", "1"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "--workers is '1'; expected 2 or more" in result.stderr
