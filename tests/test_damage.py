"""Damage is refused, not worked around: a flipped byte anywhere in a log stops `qw up`
before any worker appends, `qw status` exits 2, and damage met at run time ends the run in
one line naming the file and the byte offset (issue 15, attack 5)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

from logstore.file.framing import encode_frame
from logstore.file.log import FileLog
from tests.helpers import log_end, wait_until

QW = [sys.executable, "-m", "supervisor.cli.app"]
EXIT_LOG_ERROR = 3


def qw(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def drained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory where `qw up` ran 30 tasks (several batches in each log)."""
    cwd = tmp_path_factory.mktemp("drained")
    data = cwd / "qw"
    for _ in range(3):  # three enqueues: three batches in the tasks log
        result = qw("enqueue", "--count", "10", "--dir", str(data), cwd=cwd)
        assert result.returncode == 0, result.stderr
    result = qw(
        "up", "--no-tui", "--exit-when-drained", "--dir", str(data), "--workers", "2",
        "--work-ms", "1", cwd=cwd,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return data


def flip_a_byte_in_the_middle(path: Path) -> int:
    """Flip one payload byte of the middle record; return that record's position."""
    with FileLog.open(path, read_only=True) as log:
        entries = list(log.iter_from(log.start))
    middle = entries[len(entries) // 2]
    at = middle.next - 1  # the record's last payload byte
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))
    return middle.position


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {
        p.name: (p.stat().st_size, p.stat().st_mtime_ns)
        for p in directory.iterdir()
        if p.suffix == ".log"
    }


@pytest.mark.parametrize("topic", ["claims", "tasks"])
def test_up_refuses_a_damaged_log_before_any_worker_appends(
    drained: Path, tmp_path: Path, topic: str
) -> None:
    data = tmp_path / "qw"
    shutil.copytree(drained, data)
    offset = flip_a_byte_in_the_middle(data / f"{topic}.log")
    before = snapshot(data)
    result = qw(
        "up", "--no-tui", "--exit-when-drained", "--dir", str(data), "--workers", "2",
        "--tasks", "5", cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip() == (
        f"qw: error: {data}/{topic}.log: corrupt record at byte offset {offset}: "
        "payload checksum mismatch"
    )
    assert snapshot(data) == before  # no demo task, no CLAIM: nothing was appended


@pytest.mark.parametrize("topic", ["claims", "tasks"])
def test_status_exits_2_on_a_damaged_log(drained: Path, tmp_path: Path, topic: str) -> None:
    data = tmp_path / "qw"
    shutil.copytree(drained, data)
    offset = flip_a_byte_in_the_middle(data / f"{topic}.log")
    result = qw("status", "--dir", str(data), cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip() == (
        f"qw: error: {data}/{topic}.log: corrupt record at byte offset {offset}: "
        "payload checksum mismatch"
    )


def damage_the_tail(path: Path) -> int:
    """Write a frame whose payload does not match its checksum, then a valid frame (so it
    is damage, not a torn tail), at the end of the records (over the zeros written ahead,
    if any); return the damaged frame's offset."""
    bad = bytearray(encode_frame(b"damaged record!"))
    bad[-1] ^= 0x01
    at = log_end(path)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes(bad) + encode_frame(b"after the damage"))
    return at


@pytest.mark.parametrize("topic", ["claims", "tasks"])
def test_damage_met_at_run_time_stops_the_run_in_one_line(tmp_path: Path, topic: str) -> None:
    data = tmp_path / "qw"
    up = subprocess.Popen(
        [*QW, "up", "--no-tui", "--dir", str(data), "--workers", "2", "--tasks", "3",
         "--work-ms", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        run_dir = data / "run"

        def workers_idle() -> bool:
            snaps = list(run_dir.glob("w*.json")) if run_dir.exists() else []
            return len(snaps) == 2 and all('"idle"' in p.read_text() for p in snaps)

        wait_until(workers_idle, 60, "both workers idle after the first tasks")
        offset = damage_the_tail(data / f"{topic}.log")
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == EXIT_LOG_ERROR, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(
        f"qw: error: stopped on a log: {data}/{topic}.log: corrupt record at byte offset "
        f"{offset}: payload checksum mismatch"
    )


def test_sigterm_ends_a_run_whose_log_is_damaged(tmp_path: Path) -> None:
    """The run stops on damage; a SIGTERM meanwhile is honoured, never ignored."""
    data = tmp_path / "qw"
    up = subprocess.Popen(
        [*QW, "up", "--no-tui", "--dir", str(data), "--workers", "1", "--tasks", "1",
         "--work-ms", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(
            lambda: any('"idle"' in p.read_text() for p in (data / "run").glob("w*.json")),
            60,
            "the worker idle",
        )
        damage_the_tail(data / "claims.log")
        for _ in range(3):
            up.send_signal(signal.SIGTERM)
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode in (EXIT_LOG_ERROR, 0, 130), err
    assert "Traceback" not in err


def test_damage_only_a_restarted_worker_meets_stops_the_run(tmp_path: Path) -> None:
    """Damage behind every reader (the monitor and both workers have read past it) is met
    by the worker that replaces a killed one: it cannot use the log, and neither could any
    restart of it, so the run stops (exit 3) naming the file and the offset, rather than
    restarting it again and again while the others carry on. (Workers started as plain
    processes: a forked one may inherit the fork server's fold, read before the damage.)"""
    data = tmp_path / "qw"
    up = subprocess.Popen(
        [sys.executable, "-m", "tests.qw_run", "--exec-workers", "--", "up", "--no-tui",
         "--dir", str(data), "--workers", "2", "--tasks", "20", "--work-ms", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        run_dir = data / "run"

        def idle_workers() -> list[dict[str, object]] | None:
            snaps = [json.loads(p.read_text()) for p in run_dir.glob("w*.json")]
            return snaps if len(snaps) == 2 and all(s["state"] == "idle" for s in snaps) else None

        snaps = cast(
            "list[dict[str, object]]",
            wait_until(idle_workers, 60, "both workers idle after the tasks"),
        )
        position = flip_a_byte_in_the_middle(data / "claims.log")
        w0 = next(s for s in snaps if s["name"] == "w0")
        os.kill(int(str(w0["pid"])), signal.SIGKILL)
        out, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == EXIT_LOG_ERROR, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    damage = f"{data}/claims.log: corrupt record at byte offset {position}"
    # Who meets the damage first depends on whether the supervisor's own fold had read past
    # the byte before it was flipped (it reads on a poll, not in step with the workers): the
    # replacement worker, or the monitor reading what the killed one wrote. Either way the
    # run stops, once, naming the file and the offset, and no worker is restarted on it.
    reader = "qw worker w0-" if "stopping: qw worker w0-" in out else ""
    assert lines[0].startswith(f"qw: error: stopped on a log: {reader}"), lines[0]
    assert damage in lines[0]
    assert f"stopping: {reader}" in out and damage in out  # the dashboard's events
    assert out.count("restarted as") <= 1, out  # the killed one's replacement, not again
