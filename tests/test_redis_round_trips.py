"""The Redis log's one-round-trip paths: an append that reads back in the same call, reads
answered by a script as one string, and the key names built in one place."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore.base import CorruptLogError
from logstore.redis.log import RedisLog, redis_key
from tests.examples import examples
from tests.helpers import lose_first_script_reply

pytestmark = pytest.mark.redis


@pytest.fixture
def log(redis_url: str) -> Iterator[RedisLog]:
    handle = RedisLog.open(redis_url, "t")
    try:
        yield handle
    finally:
        handle.close()


def test_every_key_name_comes_from_one_function() -> None:
    assert redis_key("", "tasks") == "qw:tasks"
    assert redis_key("run1", "queue") == "run1:qw:queue"
    assert redis_key("run1", "claims", "w", "ab12") == "run1:qw:claims:w:ab12"


def test_a_handle_names_its_keys_through_it(redis_url: str) -> None:
    with RedisLog.open(f"{redis_url}?prefix=p7", "claims") as handle:
        assert isinstance(handle, RedisLog)
        assert handle.key == redis_key("p7", "claims")
        assert handle.id_key == redis_key("p7", "queue")
        handle.append(b"x")
        client = redis.Redis.from_url(redis_url)
        try:
            writers = client.keys(redis_key("p7", "claims", "w", "*"))
        finally:
            client.close()
        assert len(writers) == 1  # the append's retry record, named by the same function


@settings(
    max_examples=examples(15),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    others=st.lists(st.binary(max_size=40), max_size=12),
    mine=st.lists(st.binary(max_size=40), min_size=1, max_size=4),
    skip=st.integers(min_value=0, max_value=3),
)
def test_append_and_read_returns_what_read_would(
    redis_url: str, others: list[bytes], mine: list[bytes], skip: int
) -> None:
    """The entries an append reads back are those `read` gives from the same position:
    other writers' records first, then ours, byte for byte (newlines, spaces and empty
    records included: the reply is length-prefixed)."""
    url = f"{redis_url}?prefix={uuid.uuid4().hex}"  # a stream of its own per example
    with RedisLog.open(url, "rt") as reader, RedisLog.open(url, "rt") as other:
        before = reader.append_many([b"old\n1 2", b""])
        start = before[-1] + 1 if skip % 2 else before[0]
        for data in others:
            other.append(data)
        positions, entries = reader.append_and_read(mine, start, max_records=4096)
        assert [e.position for e in entries][-len(mine) :] == positions
        assert entries == reader.read(start)
        head = [] if skip % 2 else [b"old\n1 2", b""]
        assert [e.data for e in entries] == head + others + mine


def test_append_and_read_stops_at_max_records(log: RedisLog) -> None:
    first = log.append_many([b"a", b"b", b"c"])
    positions, entries = log.append_and_read([b"d"], first[0], max_records=2)
    assert [e.data for e in entries] == [b"a", b"b"]  # a prefix: the caller reads on
    assert [e.position for e in log.read(first[0])][-1] == positions[0]


def test_a_retried_append_and_read_answers_as_the_first_attempt(
    log: RedisLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply of the append was lost: the retry adds nothing and reads the same."""
    start = log.append(b"before")
    lost = lose_first_script_reply(log, monkeypatch)
    positions, entries = log.append_and_read([b"x", b"y"], start, max_records=100)
    assert lost, "the simulated failure did not happen"
    assert [e.data for e in entries] == [b"before", b"x", b"y"]
    assert [e.position for e in entries[1:]] == positions
    assert len(log.read(log.start)) == 3


def test_a_server_that_refuses_scripts_is_read_with_xrange(
    log: RedisLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ACL user without EVALSHA can still read (`qw report` with read rights only)."""
    positions = log.append_many([b"a", b"b"])

    def refused(*args: Any) -> Any:
        raise redis.exceptions.ResponseError("NOPERM this user has no permissions to run 'evalsha'")

    monkeypatch.setattr(log, "_run_script", refused)
    entries = log.read(log.start)
    assert [(e.position, e.data) for e in entries] == list(
        zip(positions, [b"a", b"b"], strict=True)
    )
    assert log._script_reads is False


def test_an_entry_without_the_data_field_is_damage_on_the_script_path(
    log: RedisLog, redis_url: str
) -> None:
    log.append(b"a")
    client = redis.Redis.from_url(redis_url)
    try:
        client.xadd("qw:t", {"x": b"no d"})
    finally:
        client.close()
    with pytest.raises(CorruptLogError, match="has no 'd' field"):
        log.read(log.start)
