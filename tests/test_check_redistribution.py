"""bin/check-redistribution.sh: the original's kill -9 scenario, run as a user runs it, with
short times; and its promise to leave no process behind, however it ends."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from queue_worker.worker.stats import read_all
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
        wait_until(lambda: running_workers(data / "run"), 60, "the script's workers to start")
        # everything it started: qw up, its fork server, the workers forked from it…
        started = psutil.Process(script.pid).children(recursive=True)
        assert {p.pid for p in running_workers(data / "run")} <= {p.pid for p in started}
        script.send_signal(signal.SIGTERM)
        output, _ = script.communicate(timeout=60)
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()
    assert script.returncode == 143, output
    wait_until(lambda: processes_mentioning(str(data)) == [], 30, "every process it started to end")
    wait_until(lambda: not any(alive(p) for p in started), 30, "every process it started to end")


def running_workers(run_dir: Path) -> list[psutil.Process]:
    """The worker processes that have published stats in `run_dir` and still run (forked
    workers carry their fork server's command line: their stats name them)."""
    found = []
    for snapshot in read_all(run_dir):
        pid = snapshot.get("pid")
        if isinstance(pid, int) and alive(pid):
            with contextlib.suppress(psutil.NoSuchProcess):  # it may end right now
                found.append(psutil.Process(pid))
    return found


def alive(process: psutil.Process | int) -> bool:
    try:
        p = process if isinstance(process, psutil.Process) else psutil.Process(process)
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def test_bad_usage_is_exit_2() -> None:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--workers", "1"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "--workers is '1'; expected 2 or more" in result.stderr
