"""Attacks on what a person sees of a failing run (issue 30, rows 4, 8, 9, 10, 12): a log
failing under a worker, a disk filling up, read-only files, clients that hang up, and a
damaged fold checkpoint of a compacted queue."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import cast

import pytest

from queue_worker.topics import open_topics
from tests.attacks.catalog import attack
from tests.attacks.harness import (
    ENV,
    QW,
    QW_EXEC_WORKERS,
    Finding,
    broken,
    degraded,
    drained_queue,
    fingerprint,
    held,
    qw,
    refusal,
)
from tests.helpers import free_port, wait_until


def _up(data: Path, work: Path, *args: str, exec_workers: bool = False) -> subprocess.Popen[str]:
    command = QW_EXEC_WORKERS if exec_workers else QW
    return subprocess.Popen(
        [*command, "up", "--no-tui", "--dir", str(data), *args],
        cwd=work, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _stopped(up: subprocess.Popen[str], timeout: float = 90) -> tuple[str, str]:
    try:
        return up.communicate(timeout=timeout)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))


def _health(port: int) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None


@attack("damage in claims.log that only a restarted worker meets")
def damage_a_restart_meets(work: Path) -> Finding:
    data = work / "q"
    up = _up(data, work, "--workers", "2", "--tasks", "20", "--work-ms", "1",
             exec_workers=True)  # fmt: skip
    run_dir = data / "run"

    def idle() -> list[dict[str, object]] | None:
        snaps = []
        for path in run_dir.glob("w*.json"):
            with contextlib.suppress(OSError, ValueError):
                snaps.append(json.loads(path.read_text()))
        return snaps if len(snaps) == 2 and all(s["state"] == "idle" for s in snaps) else None

    try:
        snaps = cast("list[dict[str, object]]", wait_until(idle, 60, "both workers idle"))
    except BaseException:
        _stopped(up, 0)
        raise
    tasks, claims = open_topics(data, read_only=True)
    with tasks, claims:
        middle = list(claims.iter_from(claims.start))[10]
    _flip(data / "claims.log", middle.next - 1)  # behind every reader
    w0 = next(s for s in snaps if s["name"] == "w0")
    os.kill(int(str(w0["pid"])), signal.SIGKILL)
    try:
        out, err = _stopped(up, 60)
    except subprocess.TimeoutExpired:
        return degraded("the run went on, restarting the worker that cannot read the log")
    said = f"claims.log: corrupt record at byte offset {middle.position}"
    if up.returncode != 3 or said not in err:
        return degraded(f"exit {up.returncode}: {err.strip()[-200:]!r}")
    if said not in out:
        return degraded("the dashboard's feed does not name the damage")
    return held(f"exit 3: {err.strip().splitlines()[-1][:120]}")


@attack("the disk fills up mid-run", fast=False)
def disk_fills_up(work: Path) -> Finding:
    disk = work / "small"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if made.returncode != 0:
        return degraded(f"not tried: cannot mount a small disk here: {made.stderr.strip()}")
    try:
        return _fill_mid_run(work, disk / "q")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill_mid_run(work: Path, data: Path) -> Finding:
    qw("enqueue", "--count", "2000", "--dir", str(data), cwd=work)
    port = free_port()
    up = _up(data, work, "--workers", "2", "--work-ms", "20", "--http", str(port))
    failed, full = "claims.log: append of", "No space left on device"
    try:
        wait_until(lambda: _health(port) is not None, 60, "the HTTP endpoint")
        with open(data.parent / "filler", "ab", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)

        def named() -> str | None:
            answer = _health(port)
            return answer[1] if answer and failed in answer[1] and full in answer[1] else None

        try:
            wait_until(named, 30, "/health to name the file")
        except pytest.fail.Exception:
            return degraded(f"/health does not name the file: {_health(port)}")
        status = qw("status", "--dir", str(data), cwd=work)
        if failed not in status.stdout or full not in status.stdout:
            return degraded(f"qw status does not name the file: {status.stdout[-300:]!r}")
        up.send_signal(signal.SIGTERM)
        out, err = _stopped(up)
    finally:
        if up.poll() is None:
            _stopped(up, 0)
    if not any(
        "log-error:" in line and failed in line and full in line for line in out.splitlines()
    ):
        return degraded("the dashboard's feed does not name the file")
    if up.returncode != 3 or failed not in err:
        return degraded(f"exit {up.returncode}: {err.strip()[-200:]!r}")
    return held("the feed, /health, qw status and exit 3 name the file and the full disk")


#: root without the capabilities that let it ignore permission bits
_UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@attack("qw compact on read-only files, qw status on a run/ it may not read")
def read_only_compact_and_status(work: Path) -> Finding:
    if shutil.which("setpriv") is None:
        return degraded("not tried: no setpriv here")
    data = work / "q"
    drained_queue(data)
    for path in data.iterdir():
        if path.is_file():
            path.chmod(0o444)
    (data / "run").chmod(0o444)
    data.chmod(0o555)
    try:
        before = fingerprint(data)
        for args, words in (
            (["compact", "--retention", "0"], ["fold.checkpoint", "Permission denied"]),
            (["status"], ["run", "Permission denied"]),
        ):
            result = subprocess.run(
                [*_UNPRIVILEGED, *QW, *args, "--dir", str(data)],
                cwd=work, env=ENV, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            found = refusal(result, *words)
            if found is not None:
                return found
        if fingerprint(data) != before:
            return broken("the logs changed")
    finally:
        data.chmod(0o755)
        (data / "run").chmod(0o755)
    return held("one line each, exit 2, nothing written")


@attack("HTTP clients that hang up (slowloris, then reset)")
def clients_hang_up(work: Path) -> Finding:
    data = work / "q"
    port = free_port()
    up = subprocess.Popen(
        [*QW, "up", "--no-tui", "--dir", str(data), "--workers", "1", "--demo",
         "--http", str(port)],
        cwd=work, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: _health(port) is not None, 60, "the HTTP endpoint")
        for request in (b"GET /metrics HTTP/1.1\r\n", b"GET /metrics HTTP/1.1\r\n\r\n") * 20:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(request)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        answer = _health(port)
        up.send_signal(signal.SIGTERM)
        _, err = _stopped(up, 60)
    finally:
        if up.poll() is None:
            _stopped(up, 0)
    if answer is None or answer[0] != 200:
        return degraded(f"/health after the hang-ups: {answer}")
    tracebacks = err.count("Traceback")
    if tracebacks:
        return degraded(f"{tracebacks} tracebacks on qw up's stderr")
    return held("no traceback; still serving")


@attack("a flipped byte in fold.checkpoint of a compacted queue")
def damaged_checkpoint(work: Path) -> Finding:
    data = work / "q"
    done = qw(
        "up", "--dir", str(data), "--no-tui", "--workers", "2", "--work-ms", "0",
        "--tasks", "300", "--segment-bytes", "4096", "--exit-when-drained", cwd=work,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"could not make a queue to attack: {done.stderr.strip()}")
    compacted = qw("compact", "--retention", "0", "--dir", str(data), cwd=work)
    if "claims: 0 segments" in compacted.stdout:
        raise RuntimeError(f"could not compact the queue: {compacted.stdout}")
    checkpoint = data / "fold.checkpoint"
    _flip(checkpoint, checkpoint.stat().st_size // 2)
    status = qw("status", "--dir", str(data), cwd=work)
    found = refusal(status, "fold.checkpoint", "qw compact --recover")
    if found is not None:
        return found
    recovered = qw("compact", "--recover", "--dir", str(data), cwd=work)
    if recovered.returncode != 0:
        return broken(f"qw compact --recover: exit {recovered.returncode}: {recovered.stderr}")
    status = qw("status", "--dir", str(data), cwd=work)
    if status.returncode != 0 or "done 300" not in status.stdout:
        return broken(f"after --recover, qw status: {status.stdout[-200:]!r} {status.stderr!r}")
    return held("refused naming qw compact --recover, which put the previous one back")
