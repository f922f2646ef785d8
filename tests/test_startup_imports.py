"""What the small commands import: only what each needs (the start figures in bench/start_bench.py).

Each probe runs `supervisor.cli.app.main` in a fresh interpreter on a queue that already exists
and reports which of the modules named here it loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _loaded_after(tmp_path: Path, args: list[str], modules: list[str]) -> dict[str, bool]:
    probe = (
        "import json, sys\n"
        "from supervisor.cli.app import main\n"
        f"code = main({args!r})\n"
        f"loaded = {{m: m in sys.modules for m in {modules!r}}}\n"
        "print(json.dumps([code, loaded]), file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )
    code, loaded = json.loads(result.stderr.splitlines()[-1])
    assert code == 0, result.stderr
    return dict(loaded)


@pytest.fixture
def queue(tmp_path: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", "enqueue", "--fsync", "none"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    return tmp_path


@pytest.mark.parametrize("args", [["--help"], ["status"], ["task", "0"], ["why", "0"]])
def test_a_reader_of_an_existing_queue_does_not_import_filelock(
    queue: Path, args: list[str]
) -> None:
    assert _loaded_after(queue, args, ["filelock"]) == {"filelock": False}


def test_creating_a_queue_still_takes_the_maintenance_lock(tmp_path: Path) -> None:
    # The lock that keeps two creators from racing is filelock's: creating imports it.
    assert _loaded_after(tmp_path, ["enqueue", "--fsync", "none"], ["filelock"]) == {
        "filelock": True
    }


def test_the_supervisor_imports_psutil_only_once_it_has_forked() -> None:
    # psutil (~20-30 ms of CPU) is first used on a forked worker: `qw up` imports it after
    # its first fork, not with the modules it needs before (supervisor/run/supervisor.py).
    probe = (
        "import sys, supervisor.cli.app, supervisor.run.supervisor, supervisor.run.slots, "
        "supervisor.run.pausing; print('psutil' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.split() == ["False"]


@pytest.mark.parametrize("args", [["status"], ["kill", "w0"]])
def test_status_and_kill_do_not_import_the_supervisor(queue: Path, args: list[str]) -> None:
    # which supervisors and workers run is supervisor.run.run_files' question, not the
    # supervisor's (`qw kill w0` finds no running w0 here: exit 2, after that question)
    probe = (
        "import sys\n"
        "from supervisor.cli.app import main\n"
        f"code = main({args!r})\n"
        "print([m in sys.modules"
        " for m in ('supervisor.run.run_files', 'supervisor.run.supervisor')],"
        " file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=queue, capture_output=True, text=True, timeout=60
    )
    assert result.stderr.splitlines()[-1] == "[True, False]", result.stderr


#: what a command that waits for no append (ctypes, for inotify) must not pay for at its start
UNUSED_BY_READERS = ["ctypes"]


@pytest.mark.parametrize(
    ("args", "absent"),
    [
        (["status"], ["queue_worker.proof.report", *UNUSED_BY_READERS]),
        # status counts without the supervisor's monitor and model
        (
            ["status"],
            [
                "supervisor.run.monitor",
                "supervisor.run.model",
                "supervisor.cli.partition_status",  # (a queue of one partition)
                "queue_worker.worker.snapshot",
            ],
        ),
        (["status", "--json"], ["supervisor.run.monitor", "queue_worker.worker.snapshot"]),
        (
            ["task", "0"],
            ["queue_worker.proof.report", "queue_worker.history.checkpoint", *UNUSED_BY_READERS],
        ),
        (["why", "0"], ["queue_worker.proof.report", "rich", *UNUSED_BY_READERS]),
        (["enqueue", "--fsync", "none"], ["supervisor.run.supervisor", *UNUSED_BY_READERS]),
    ],
)
def test_the_qw_script_runs_the_small_commands_on_what_they_use(
    queue: Path, args: list[str], absent: list[str]
) -> None:
    # The readers of the logs do without the report's replay and, on logs never compacted,
    # without the checkpoint's modules. `qw why` piped prints its table without rich
    # (supervisor.story_text).
    probe = (
        "import sys\n"
        "from supervisor.cli.entry import main\n"
        f"sys.argv = ['qw', *{args!r}]\n"
        "code = main()\n"
        f"loaded = [m for m in {absent!r} if m in sys.modules]\n"
        "import json\n"
        "print(json.dumps([code, loaded]), file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=queue, capture_output=True, text=True, timeout=60
    )
    assert json.loads(result.stderr.splitlines()[-1]) == [0, []], result.stderr


def test_status_asks_psutil_only_about_processes_that_exist(queue: Path) -> None:
    # the stats and status files of workers and supervisors that have exited (most of a
    # run directory's): no such pid, known without psutil (~25 ms of CPU to import)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run = queue / ".qw" / "run"
    (run / "supervisors").mkdir(parents=True)
    stats = {"worker": f"w0-{gone.pid}-a", "name": "w0", "pid": gone.pid, "state": "idle"}
    (run / "w0.json").write_text(json.dumps({**stats, "started_at": 1.0}))
    (run / "supervisors" / "s.json").write_text(json.dumps({"pid": gone.pid, "started_at": 1.0}))
    probe = (
        "import sys\n"
        "from supervisor.cli.entry import main\n"
        "sys.argv = ['qw', 'status']\n"
        "code = main()\n"
        "print(code, 'psutil' in sys.modules, file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=queue, capture_output=True, text=True, timeout=60
    )
    assert result.stderr.splitlines()[-1] == "0 False", result.stderr
    assert "workers      0 running, 1 stopped" in result.stdout
