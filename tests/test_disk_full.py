"""A full disk is visible, and a drain under it ends (issue 15, attack 8).

The disk is filled the way tests/test_file_log.py does it: RLIMIT_FSIZE on the processes
of `qw up` (inherited by its workers), so that the claims log cannot grow past a limit and
every append fails ("File too large") as it would on a full disk.
"""

from __future__ import annotations

import contextlib
import json
import resource
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port, log_end, wait_until

QW = [sys.executable, "-m", "supervisor.cli.app"]


def qw(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def limit_file_size(limit: int) -> Any:
    def before_exec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (python ignores it too)
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))

    return before_exec


def worker_snapshots(data: Path) -> list[dict[str, Any]]:
    found = []
    for path in (data / "run").glob("w*.json"):
        with contextlib.suppress(OSError, ValueError):  # being replaced: read again
            found.append(json.loads(path.read_text()))
    return found


def health(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# make test runs the same path in
# test_a_disk_filling_up_mid_run_is_named_by_the_events_health_status_and_exit_code
@pytest.mark.slow
def test_a_full_disk_shows_in_stats_health_and_status_and_a_drain_still_ends(
    tmp_path: Path,
) -> None:
    data = tmp_path / "qw"
    assert qw("enqueue", "--count", "200", "--dir", str(data), cwd=tmp_path).returncode == 0
    claims = data / "claims.log"
    limit = claims.stat().st_size + 1500  # room for a few tasks' CLAIM and DONE records
    port = free_port()
    up = subprocess.Popen(
        [*QW, "up", "--no-tui", "--dir", str(data), "--workers", "1", "--work-ms", "20",
         "--lease", "2", "--http", str(port)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=limit_file_size(limit),
    )  # fmt: skip
    try:

        def log_error() -> str | None:
            for snap in worker_snapshots(data):
                if snap.get("log_error") and snap.get("state") != "exited":
                    return str(snap["log_error"])
            return None

        error = str(wait_until(log_error, 60, "a worker's stats to show the log error"))
        assert f"{claims}: append of" in error
        assert "File too large" in error

        def unhealthy() -> str | None:
            code, body = health(port)
            return body if code == 503 else None

        # the supervisor reads the workers' stats every so often: wait for it to have
        body = str(wait_until(unhealthy, 30, "/health to say 503"))
        assert f"{claims}: append of" in body

        status = qw("status", "--dir", str(data), cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert f"log error: {claims}: append of" in status.stdout

        up.send_signal(signal.SIGTERM)  # a drain with the disk still full
        up.communicate(timeout=90)  # ends: the DONE in hand is given up once its lease lapses
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode is not None


def test_creating_a_queue_on_a_full_disk_names_the_file(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    result = subprocess.run(
        [*QW, "enqueue", "--count", "1", "--dir", str(data)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        preexec_fn=limit_file_size(20),  # not even a 48-byte header fits
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(data) in lines[0]
    assert ".log" in lines[0]
    assert "Traceback" not in result.stderr


def fill(disk: Path) -> None:
    """Write to a file on `disk` until ENOSPC."""
    with open(disk / "filler", "ab", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs of the test's own (skipped where mounting is not allowed)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def test_a_really_full_disk_is_named_by_enqueue_and_status(
    small_disk: Path, tmp_path: Path
) -> None:
    data = small_disk / "qw"
    assert qw("enqueue", "--count", "10", "--dir", str(data), cwd=small_disk).returncode == 0
    fill(small_disk)
    big = tmp_path / "big.jsonl"  # more than is left (and the file is elsewhere)
    big.write_text("".join(json.dumps("x" * 5000) + "\n" for _ in range(100)))
    result = qw("enqueue", "--file", str(big), "--dir", str(data), cwd=small_disk)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"{data}/tasks.log: append of" in lines[0]
    assert "No space left on device" in lines[0]
    # The failed append was cut off, and with it the zeros the first enqueue wrote ahead
    # of itself (logstore.file.log, "Zeros ahead"): that room is free again; fill it too.
    assert log_end(data / "tasks.log") == (data / "tasks.log").stat().st_size
    fill(small_disk)
    status = qw("status", "--dir", str(data), cwd=small_disk)
    assert status.returncode == 0, status.stderr
    assert f"disk         {data}: the device is full" in status.stdout
    (small_disk / "filler").unlink()
    status = qw("status", "--dir", str(data), cwd=small_disk)
    assert "the device is full" not in status.stdout


def test_a_disk_filling_up_mid_run_is_named_by_the_events_health_status_and_exit_code(
    small_disk: Path, tmp_path: Path
) -> None:
    """The disk fills while the workers run: their appends fail, and so would a new stats
    file; the dashboard's feed, /health and `qw status` still name the log file and the
    cause, and the run ends (drained under the full disk) with exit 3 saying so."""
    data = small_disk / "qw"
    assert qw("enqueue", "--count", "2000", "--dir", str(data), cwd=tmp_path).returncode == 0
    port = free_port()
    out = tmp_path / "up.out"
    with out.open("w") as stdout:
        up = subprocess.Popen(
            [*QW, "up", "--no-tui", "--dir", str(data), "--workers", "2", "--work-ms", "20",
             "--http", str(port)],
            cwd=tmp_path, stdout=stdout, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    try:
        wait_until(lambda: len(worker_snapshots(data)) == 2, 60, "both workers' stats")
        fill(small_disk)
        failed = f"{data}/claims.log: append of"
        full = "No space left on device"

        def fed() -> bool:
            feed = [line for line in out.read_text().splitlines() if "log-error:" in line]
            return any(failed in line and full in line for line in feed)

        wait_until(fed, 30, "the feed to name the log file and the full disk")

        def unhealthy() -> str | None:
            code, body = health(port)
            return body if code == 503 and failed in body and full in body else None

        wait_until(unhealthy, 30, "/health to name the log file and the full disk")
        status = qw("status", "--dir", str(data), cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert f"log error: {failed}" in status.stdout and full in status.stdout
        up.send_signal(signal.SIGTERM)
        _, err = up.communicate(timeout=90)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 3, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("qw: error: stopped on a log: w") and failed in last and full in last


# make test runs the same path in
# test_a_disk_filling_up_mid_run_is_named_by_the_events_health_status_and_exit_code
@pytest.mark.slow
def test_a_disk_freed_again_is_said_and_the_run_ends_cleanly(
    small_disk: Path, tmp_path: Path
) -> None:
    data = small_disk / "qw"
    assert qw("enqueue", "--count", "2000", "--dir", str(data), cwd=tmp_path).returncode == 0
    out = tmp_path / "up.out"
    with out.open("w") as stdout:
        up = subprocess.Popen(
            [*QW, "up", "--no-tui", "--dir", str(data), "--workers", "1", "--work-ms", "20"],
            cwd=tmp_path, stdout=stdout, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    try:
        wait_until(lambda: worker_snapshots(data), 60, "the worker's stats")
        fill(small_disk)
        wait_until(lambda: "log-error:" in out.read_text(), 30, "the feed to say the log fails")
        (small_disk / "filler").unlink()
        wait_until(lambda: "the log answers again" in out.read_text(), 30, "the feed to say so")
        up.send_signal(signal.SIGTERM)
        _, err = up.communicate(timeout=90)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 0, err  # the log failed, and answered again before the end
