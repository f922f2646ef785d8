"""Shared fixtures: a real redis-server for the Redis backend, helpers to wait on conditions."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from supervisor.run.supervisor import Supervisor, SupervisorOptions
from tests.examples import examples
from tests.helpers import redis_server_binary, running_redis_server
from tests.tiers import mark_slow_variants

# The properties that name no count of examples: hypothesis's 100 under `make test-all`, a
# fifth under `make test` (tests/examples.py).
settings.register_profile("qw", max_examples=examples(100))
settings.load_profile("qw")

#: the width the commands the tests run lay their output out for. Piped, a command fits the
#: reader's width (COLUMNS, else 80: supervisor.width); the tests' tmp_path names are
#: long, and most tests read whole lines, so they read at a width no line reaches.
#: tests/test_width.py reads at 80, with and without COLUMNS.
os.environ["COLUMNS"] = "400"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server on a free loopback port, data in a temporary directory.

    Yields the base URL ``redis://127.0.0.1:PORT``. Skipped when no redis-server is
    installed, unless QW_REQUIRE_REDIS=1 (CI sets it): then its absence fails the run.
    """
    with running_redis_server(redis_server_binary(), tmp_path_factory.mktemp("redis")) as url:
        yield url


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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Before `-m "not slow"` deselects: the variants tests/tiers.py leaves to make test-all."""
    mark_slow_variants(items)
