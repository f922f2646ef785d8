"""What `qw up` says about the queue it starts on: the backlog a stopped run left (said on the
first screen), `--fresh` to start on an empty queue instead, and the enqueue hint in the
words of the qw that runs (`.venv/bin/qw` when that is not the one on PATH). Real `qw up`
runs on real files."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.helpers import wait_until

REPO = Path(__file__).resolve().parent.parent
VENV_QW = Path(sys.executable).with_name("qw")
QW = [sys.executable, "-m", "supervisor.cli.app"]


def env_without_venv() -> dict[str, str]:
    """The environment with the venv's bin off PATH: qw is not a command there."""
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != VENV_QW.parent]
    return {**os.environ, "PATH": os.pathsep.join(path)}


def up(*args: str, cwd: Path, command: list[str] | None = None, env: dict[str, str] | None = None
       ) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [*(command or QW), "up", "--no-tui", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def supervisor_running(data: Path) -> bool:
    return any((data / "run" / "supervisors").glob("*.json"))


def stopped_with_a_backlog(tmp_path: Path) -> tuple[Path, int]:
    """A run of 40 slow tasks stopped (SIGTERM, as `q`) after its first task: the data
    directory and how many tasks it left pending."""
    data = tmp_path / "qw"
    with (tmp_path / "first.out").open("w") as out:
        run = subprocess.Popen(
            [*QW, "up", "--no-tui", "--dir", str(data), "--workers", "1", "--tasks", "40",
             "--work-ms", "200"],
            cwd=tmp_path, stdout=out, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
    try:
        wait_until(lambda: "done 1" in (tmp_path / "first.out").read_text(), 60, "a task done")
    finally:
        run.send_signal(signal.SIGTERM)
        assert run.wait(60) == 0
    last = (tmp_path / "first.out").read_text().splitlines()[-1]
    found = re.search(r"stopped with (\d+) tasks? pending", last)
    assert found is not None, last
    return data, int(found[1])


def test_the_next_run_says_it_resumes_the_backlog_and_fresh_starts_clean(tmp_path: Path) -> None:
    data, left = stopped_with_a_backlog(tmp_path)
    (data / "notes.txt").write_text("mine")
    again = up("--dir", str(data), "--exit-when-drained", "--work-ms", "1", "--workers", "2",
               cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr
    said = re.search(
        rf"info: resuming (\d+) pending(?:, (\d+) held)? tasks from {re.escape(str(data))}, "
        r"left by an earlier run \((.+) up --fresh starts on an empty queue\)",
        again.stdout,
    )
    assert said is not None, again.stdout
    assert 0 < int(said[1]) + int(said[2] or 0) <= left
    # the queue is drained now; a stop with a backlog again, then --fresh
    fresh = up("--dir", str(data), "--fresh", "--exit-when-drained", "--tasks", "2",
               "--work-ms", "1", cwd=tmp_path)  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stderr.startswith(f"qw: --fresh: removed the queue in {data} (its logs")
    assert fresh.stderr.rstrip().endswith("kept what qw did not write: notes.txt")
    assert "resuming" not in fresh.stdout
    assert (data / "notes.txt").read_text() == "mine"
    status = subprocess.run([*QW, "status", "--dir", str(data), "--json"], capture_output=True,
                            text=True, timeout=60, check=True)  # fmt: skip
    assert json.loads(status.stdout)["queue"]["published"] == 2  # the new queue's only


def test_fresh_refuses_while_a_qw_up_runs_and_removes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    with (tmp_path / "up.out").open("w") as out:
        running = subprocess.Popen(
            [*QW, "up", "--no-tui", "--dir", str(data), "--workers", "1"],
            cwd=tmp_path, stdout=out, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
    try:
        wait_until(lambda: supervisor_running(data), 60, "the supervisor's status file")
        before = sorted(p.name for p in data.iterdir())
        refused = up("--dir", str(data), "--fresh", cwd=tmp_path)
        assert refused.returncode == 2
        assert refused.stderr == (
            f"qw: error: --fresh: 1 qw up still run on {data} (pid {running.pid}); stop them "
            "first (q, Ctrl-C) or start on another --dir\n"
        )
        assert sorted(p.name for p in data.iterdir()) == before
    finally:
        running.send_signal(signal.SIGTERM)
        assert running.wait(60) == 0


def test_fresh_on_a_redis_log_is_one_line(tmp_path: Path) -> None:
    result = up("--fresh", "--log", "redis://127.0.0.1:1/0", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "qw: error: --fresh removes a data directory's queue, not one on redis://127.0.0.1:1/0\n"
    )


def test_the_enqueue_hint_names_the_qw_that_runs(tmp_path: Path) -> None:
    args = ("--dir", str(tmp_path / "qw"), "--exit-when-drained")
    hint = "info: no demo tasks: {0} enqueue adds yours ({0} up --demo adds some)"
    off_path = up(*args, cwd=REPO, command=[".venv/bin/qw"], env=env_without_venv())
    assert off_path.returncode == 0, off_path.stderr
    assert hint.format(".venv/bin/qw") in off_path.stdout  # as typed after `make up`
    elsewhere = up(*args, cwd=tmp_path, command=[str(VENV_QW)], env=env_without_venv())
    assert hint.format(str(VENV_QW)) in elsewhere.stdout
    on_path = {**os.environ, "PATH": f"{VENV_QW.parent}{os.pathsep}{os.environ['PATH']}"}
    assert hint.format("qw") in up(*args, cwd=tmp_path, command=["qw"], env=on_path).stdout
