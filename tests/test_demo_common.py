"""What the demos share: `data_dir` removes a demo's temporary directory once the demo has
shown what it claims, and keeps it — named — when it failed (its logs explain the
failure); `Fleet.pause` never stops a worker inside an append."""

from __future__ import annotations

import fcntl
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from queue_worker.worker.config import WorkerConfig
from supervisor.demos.common import DemoResult, Narrator, data_dir
from supervisor.demos.fleet import Fleet, WorkerProcess


@pytest.fixture
def narrator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Narrator:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # mkdtemp makes them here
    return Narrator(Console(file=io.StringIO(), width=200, color_system=None))


def said(say: Narrator) -> str:
    out = say.console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def test_a_shown_demo_removes_its_directory(narrator: Narrator) -> None:
    with data_dir(None, False, narrator) as location:
        (location / "claims.log").write_bytes(b"x")
        narrator.result(DemoResult(True, "it worked"))
    assert not location.exists()
    assert "data kept" not in said(narrator)


def test_a_failed_demo_keeps_its_directory_and_names_it(narrator: Narrator) -> None:
    with data_dir(None, False, narrator) as location:
        (location / "claims.log").write_bytes(b"x")
        narrator.result(DemoResult(False, "timed out"))
    assert (location / "claims.log").exists()
    assert f"data kept in {location}" in said(narrator)


def test_a_verdict_given_after_the_block_decides_then(narrator: Narrator) -> None:
    with data_dir(None, False, narrator) as location:
        pass
    assert location.exists()  # not judged yet
    narrator.result(DemoResult(False, "the report was not clean"))
    assert location.exists() and f"data kept in {location}" in said(narrator)

    another = Narrator(narrator.console)  # one narrator per demo run
    with data_dir(None, False, another) as shown_later:
        pass
    another.result(DemoResult(True, "fine"))
    assert not shown_later.exists()


def test_a_demo_that_raised_keeps_its_directory(narrator: Narrator) -> None:
    with pytest.raises(RuntimeError), data_dir(None, False, narrator) as location:
        raise RuntimeError("boom")
    assert location.exists() and f"data kept in {location}" in said(narrator)


def test_keep_keeps_a_shown_demos_directory(narrator: Narrator) -> None:
    with data_dir(None, True, narrator) as location:
        narrator.result(DemoResult(True, "it worked"))
    assert location.exists()


LOCK_CYCLER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
print("ready", flush=True)
while True:  # an appender: half of its time inside the lock
    fcntl.flock(fd, fcntl.LOCK_EX)
    time.sleep(0.02)
    fcntl.flock(fd, fcntl.LOCK_UN)
    time.sleep(0.02)
"""


def test_fleet_pause_never_stops_a_process_inside_a_log_lock(tmp_path: Path) -> None:
    """A writer stopped while it holds `<log>.lock` would stall every other writer: the
    pause demo's flake. Fleet.pause stops it only outside the lock (old code: half the
    pauses landed inside)."""
    lock = tmp_path / "claims.log.lock"
    cycler = subprocess.Popen(
        [sys.executable, "-c", LOCK_CYCLER, str(lock)], stdout=subprocess.PIPE
    )
    try:
        assert cycler.stdout is not None and cycler.stdout.readline() == b"ready\n"
        config = WorkerConfig(location=str(tmp_path), run_dir=str(tmp_path / "run"))
        worker = WorkerProcess("cycler", config, cycler)
        fleet = Fleet(tmp_path)
        for _ in range(12):
            fleet.pause(worker)
            assert psutil.Process(cycler.pid).status() == psutil.STATUS_STOPPED
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if the lock is held
            finally:
                os.close(fd)
            fleet.resume(worker)
    finally:
        cycler.kill()
        cycler.wait()
