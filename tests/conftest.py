"""Shared fixtures: a real redis-server for the Redis backend, helpers to wait on conditions."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.supervisor import Supervisor, SupervisorOptions
from tests.helpers import free_port, redis_server_binary, wait_until


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server on a free loopback port, data in a temporary directory.

    Yields the base URL ``redis://127.0.0.1:PORT``. Skipped when no redis-server is
    installed, unless QW_REQUIRE_REDIS=1 (CI sets it): then its absence fails the run.
    """
    binary = redis_server_binary()
    workdir = tmp_path_factory.mktemp("redis")
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(workdir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def accepting() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return proc.poll() is not None  # stop waiting if it died; checked below

    wait_until(accepting, 20, "redis-server to accept connections")
    if proc.poll() is not None:
        pytest.fail(f"redis-server exited with {proc.returncode}")
    try:
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """A clean Redis database URL for one test (the database is flushed before use)."""
    import redis

    url = f"{redis_server}/0"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    yield url


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A fresh qw data directory inside the test's tmp_path."""
    d = tmp_path / "qw"
    d.mkdir()
    return d


@pytest.fixture
def make_supervisor(tmp_path: Path) -> Iterator[Any]:
    """Builds supervisors on tmp_path/qw; kills whatever still runs at the end."""
    made: list[Supervisor] = []

    def make(**kwargs: Any) -> Supervisor:
        data = tmp_path / "qw"
        sup = Supervisor(SupervisorOptions(data_dir=data, location=str(data), **kwargs))
        made.append(sup)
        return sup

    yield make
    for sup in made:
        if sup.started_at and not sup.finished:
            sup.stop_now()
            sup.wait(30)
