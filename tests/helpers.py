"""Helpers for tests: waiting on a condition with a deadline, free ports, a racing log."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from logstore import MemoryLog
from queue_worker.waiting import WaitTimeout
from queue_worker.waiting import wait_until as _wait_until


def log_end(path: Path) -> int:
    """Where the records of the file log at `path` end: not the file's size, which counts
    the zeros a forced append writes ahead of itself (logstore.file.log, "Zeros ahead")."""
    from logstore.file.log import FileLog

    with FileLog.open(path, read_only=True) as log:
        return log.end()


def wait_until(
    condition: Callable[[], object], timeout: float = 30.0, what: str = "condition"
) -> object:
    """Poll `condition` until it returns something truthy; fail the test after `timeout`.

    This is the suite's only way to wait for something: a condition with a deadline (the
    poll loop is queue_worker.waiting's, which the demos and the benchmarks use too).
    """
    try:
        return _wait_until(condition, timeout, what)
    except WaitTimeout:
        pytest.fail(f"timed out after {timeout}s waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RacingLog(MemoryLog):
    """A claims log where another worker's record (`race`) lands just before our next
    batch: the race a worker cannot see coming, made to happen on cue."""

    def __init__(self) -> None:
        super().__init__("claims")
        self.race: bytes | None = None

    def append_many(self, records: Sequence[bytes], *, durable: bool = False) -> list[int]:
        if self.race is not None:
            race, self.race = self.race, None
            super().append_many([race])
        return super().append_many(records, durable=durable)


def redis_server_binary() -> str:
    """The redis-server to start for a test. Without one the test is skipped, unless
    QW_REQUIRE_REDIS=1 (CI sets it): then its absence fails the run, so that the Redis tests
    can never vanish from CI silently."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("QW_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server is not installed but QW_REQUIRE_REDIS=1")
        pytest.skip("redis-server is not installed")
    return binary


@contextmanager
def running_redis_server(binary: str, workdir: Path) -> Iterator[str]:
    """A redis-server without persistence on a free loopback port, its data in `workdir`;
    yields its base URL ``redis://127.0.0.1:PORT`` and stops it on the way out."""
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
         "--save", "", "--appendonly", "no", "--daemonize", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def accepting() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    try:
        wait_until(accepting, 20, "redis-server to accept connections")
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def lose_first_script_reply(log: Any, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Make the first script call of a RedisLog `log` run on the server and then lose its
    reply (a ConnectionError, as a dropped connection gives). Returns the list the lost
    reply goes into: empty while nothing was lost."""
    import redis

    real = log._run_script
    lost: list[object] = []

    def reply_lost_once(*args: Any) -> Any:
        result = real(*args)
        if not lost:
            lost.append(result)
            raise redis.exceptions.ConnectionError("Connection reset by peer (simulated)")
        return result

    monkeypatch.setattr(log, "_run_script", reply_lost_once)
    return lost
