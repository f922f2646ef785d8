"""Where a queue's logs live and how a message shows it (logstore.location): the one answer
to "is it Redis?", "which file?" and "how is it shown?"."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.location import is_redis_url, log_file, shown


@pytest.mark.parametrize(
    ("location", "redis"),
    [
        ("redis://localhost:6379/0", True),
        ("rediss://h/1", True),
        ("unix:///tmp/redis.sock", True),
        (".qw", False),
        ("/data/redis://x", False),
        ("http://example.org", False),
    ],
)
def test_is_redis_url(location: str, redis: bool) -> None:
    assert is_redis_url(location) is redis
    assert (log_file(location, "claims") is None) is redis


def test_a_directory_holds_one_file_per_topic(tmp_path: Path) -> None:
    assert log_file(tmp_path, "claims") == tmp_path / "claims.log"
    assert log_file(str(tmp_path), "tasks") == tmp_path / "tasks.log"


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        (".qw", ".qw"),
        ("redis://localhost:6379/2", "redis://localhost:6379/2"),
        ("redis://:s3cret@localhost:6379/2", "redis://:***@localhost:6379/2"),
        ("redis://me:s3cret@[::1]:6379/0?prefix=a", "redis://me:***@[::1]:6379/0?prefix=a"),
        ("rediss://me:s3cret@host/0", "rediss://me:***@host/0"),
        ("redis://me:s3cret@host:notaport/0", "redis://…"),  # unparsable: nothing of it
    ],
)
def test_shown_never_shows_a_password(location: str, expected: str) -> None:
    assert shown(location) == expected
    assert "s3cret" not in shown(location)
