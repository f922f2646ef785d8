"""The fork server `qw up` starts before multiprocessing is imported (supervisor.run.early_server):
multiprocessing adopts it as its own, it forks workers as before, it imports filelock only
while no fork is asked for (idle after a `warm`: tests/test_prefold.py) or once its first
worker is forked, it exits with the supervisor, and its listener's directory goes at the
supervisor's exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[1]


def report(config_json: str, log_path: str) -> None:
    """A forked worker's entry that says what it inherited, in its log."""
    with open(log_path, "w") as out:
        json.dump({"pid": os.getpid(), "filelock": "filelock" in sys.modules}, out)


PROBE = """
import json, os, sys
from pathlib import Path
from supervisor.run import early_server

started = early_server.spawn(early_server.PRELOAD)
before = "multiprocessing" in sys.modules
early_pid = early_server._started.pid
tempdir = early_server._started.tempdir
from queue_worker.worker.config import WorkerConfig
from supervisor.run import forked
from tests.test_early_server import report

pid = forked.start_server()
tmp = Path(sys.argv[1])
workers = []
for n in range(2):
    config = WorkerConfig(location=str(tmp / "nothing"), run_dir=str(tmp / "run"), name=f"w{n}")
    worker = forked.ForkedWorker(config, tmp / f"w{n}.log", entry=report)
    worker.wait(60)
    workers.append(json.loads((tmp / f"w{n}.log").read_text()))
cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\\0")[:-3]
import subprocess  # (after the server's start: what multiprocessing would have given it)
flags = subprocess._args_from_interpreter_flags()
print(json.dumps({"cmdline": cmdline, "flags": flags, "started": started,
                  "mp_before": before, "early_pid": early_pid, "server_pid": pid,
                  "tempdir": tempdir, "workers": workers,
                  "tempdir_there": os.path.isdir(tempdir)}), flush=True)
"""


def _probe(tmp_path: Path, **env: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert result.returncode == 0, result.stderr
    found: dict[str, object] = json.loads(result.stdout.splitlines()[-1])
    return found


def test_the_early_server_is_multiprocessings_and_forks_workers(tmp_path: Path) -> None:
    found = _probe(tmp_path)
    assert found["started"] is True
    flags = found["flags"]
    assert isinstance(flags, list)
    assert found["cmdline"] == [sys.executable, *flags, "-c"]
    assert found["mp_before"] is False  # started before multiprocessing was imported
    assert found["server_pid"] == found["early_pid"]  # adopted, not started again
    workers = found["workers"]
    assert isinstance(workers, list) and len(workers) == 2
    assert all(w["pid"] not in (found["server_pid"], os.getpid()) for w in workers)
    # filelock: not before the first fork (off the first claim's path), then inherited
    assert [w["filelock"] for w in workers] == [False, True]
    assert found["tempdir_there"] is True
    tempdir = found["tempdir"]
    assert isinstance(tempdir, str)
    assert not os.path.exists(tempdir)  # removed at the probe's exit
    # and the server went with the probe (its alive pipe closed)
    server_pid = found["server_pid"]
    assert isinstance(server_pid, int)
    wait_until(lambda: not psutil.pid_exists(server_pid), 30, "the fork server to exit")


def test_the_early_server_gets_the_interpreters_options(tmp_path: Path) -> None:
    # -B (here from the environment) is passed on, as multiprocessing passes it
    found = _probe(tmp_path, PYTHONDONTWRITEBYTECODE="1")
    assert found["server_pid"] == found["early_pid"]
    assert found["cmdline"] == [sys.executable, "-B", "-c"]
    workers = found["workers"]
    assert isinstance(workers, list) and [w["filelock"] for w in workers] == [False, True]


def test_qw_up_starts_the_server_before_importing_multiprocessing(tmp_path: Path) -> None:
    # The console script's path (supervisor.cli.entry): `qw up` on a queue with one task.
    data = tmp_path / "qw"
    qw = [
        sys.executable,
        "-c",
        "import sys; from supervisor.cli.entry import main; sys.exit(main())",
    ]
    subprocess.run(
        [*qw, "enqueue", "--dir", str(data), "--fsync", "none"], check=True, cwd=REPO, timeout=60
    )
    probe = (
        "import sys\n"
        "import supervisor.run.early_server as e\n"
        "spawn = e.spawn\n"
        "def checked(preload):\n"
        "    assert 'multiprocessing' not in sys.modules\n"
        "    print('early', preload, file=sys.stderr, flush=True)\n"
        "    ok = spawn(preload)\n"
        "    print('spawned', ok, file=sys.stderr, flush=True)\n"
        "    return ok\n"
        "e.spawn = checked\n"
        "from supervisor.cli.entry import main\n"
        "sys.exit(main())\n"
    )
    args = ["up", "--dir", str(data), "--workers", "2", "--work-ms", "0", "--no-tui"]
    temp = tmp_path / "t"  # where the server's listener goes (a short path: a socket's)
    temp.mkdir()
    result = subprocess.run(
        [sys.executable, "-c", probe, *args, "--exit-when-drained", "--fsync", "none"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert result.returncode == 0, result.stderr
    assert (
        "early ['supervisor.run.forkserver_init', 'supervisor.run.forkserver_ready']"
        in result.stderr
    )
    assert "spawned True" in result.stderr  # not multiprocessing's own start, the fallback
    assert "done 1" in result.stdout + result.stderr
    # qw up ends with os._exit (no atexit): the directory multiprocessing made for its
    # server's listener went too, socket and all
    assert list(temp.iterdir()) == [], list(temp.rglob("*"))


@pytest.mark.parametrize(
    ("location", "folded"),
    [
        ("qw", True),
        ("/data/qw", True),
        ("redis://127.0.0.1:6379/0", False),
        ("rediss://h/1", False),
        ("unix:///s.sock", False),
    ],
)
def test_the_supervisor_asks_for_a_fold_exactly_when_the_server_can_make_one(
    location: str, folded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a queue of files: a Redis worker reads over the network (prefold.can_prefold)
    from supervisor.run import prefold

    read_end, write_end = os.pipe()
    try:
        prefold.warm(write_end, location, 8)
        message = json.loads(os.read(read_end, 65536))
    finally:
        os.close(read_end)
        os.close(write_end)
    assert (message["location"] is not None) == folded == prefold.can_prefold(location)
    if message["location"] is not None:
        assert message == {
            "location": location, "path": os.path.abspath(location), "slots": 8, "warm": True
        }  # fmt: skip


@pytest.mark.parametrize("version", [(3, 9, 18), (3, 14, 0)])
def test_another_pythons_server_is_left_to_multiprocessing(
    version: tuple[int, int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line and the state adopted are CPython 3.10-3.13's: on any other Python
    `spawn` starts nothing and says so, and `supervisor.run.forked` starts the server itself."""
    from supervisor.run import early_server

    monkeypatch.setattr(sys, "version_info", version)
    forks: list[object] = []

    def fork_exec(*args: object) -> int:
        forks.append(args)
        return 0

    monkeypatch.setattr(early_server, "_fork_exec", fork_exec)
    assert early_server.spawn(early_server.PRELOAD) is False
    assert forks == [] and early_server.take() is None
