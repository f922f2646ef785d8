"""The Redis log against a real redis-server: ids as positions, the server's clock,
contiguous batches under concurrent writers, waking, errors that name the URL, reconnecting.

The contract every backend keeps is in test_log_contract.py; this file is what is special
to Redis.
"""

from __future__ import annotations

import importlib.metadata
import json
import multiprocessing
import random
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

import logstore.redis.log as redis_log
from logstore import open_log
from logstore.base import (
    AppendError,
    CorruptLogError,
    ForeignFileError,
    LogClosedError,
    LogError,
    RecordTooLargeError,
)
from logstore.redis.log import (
    SEQ_BITS,
    SEQ_LIMIT,
    RedisLog,
    after_id,
    format_id,
    pack_id,
    parse_id,
    unpack_position,
)
from tests.helpers import free_port, lose_first_script_reply, redis_server_binary, wait_until

pytestmark = pytest.mark.redis

T = TypeVar("T")
U64_MAX = (1 << 64) - 1

ms_values = st.integers(min_value=0, max_value=(1 << 43) - 1)
seq_values = st.integers(min_value=0, max_value=SEQ_LIMIT - 1)


def raw_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


@pytest.fixture
def log(redis_url: str) -> Iterator[RedisLog]:
    handle = RedisLog.open(redis_url, "t")
    try:
        yield handle
    finally:
        handle.close()


# -- ids and positions (no server) --------------------------------------------------


@given(ms_values, seq_values)
def test_id_packing_round_trips(ms: int, seq: int) -> None:
    position = pack_id(ms, seq)
    assert 0 <= position < 1 << 63
    assert unpack_position(position) == (ms, seq)
    assert parse_id(format_id(ms, seq).encode()) == (ms, seq)
    assert parse_id(format_id(ms, seq)) == (ms, seq)


@given(ms_values, seq_values, ms_values, seq_values)
def test_packing_keeps_the_order_of_ids(ms1: int, seq1: int, ms2: int, seq2: int) -> None:
    assert ((ms1, seq1) < (ms2, seq2)) == (pack_id(ms1, seq1) < pack_id(ms2, seq2))
    assert ((ms1, seq1) == (ms2, seq2)) == (pack_id(ms1, seq1) == pack_id(ms2, seq2))


@given(ms_values, seq_values)
def test_next_is_the_least_id_after_the_entry(ms: int, seq: int) -> None:
    following = unpack_position(pack_id(ms, seq) + 1)
    assert following == ((ms, seq + 1) if seq + 1 < SEQ_LIMIT else (ms + 1, 0))


@given(
    st.integers(min_value=0, max_value=(1 << 63) - 1),
    ms_values,
    st.one_of(seq_values, st.integers(min_value=0, max_value=U64_MAX)),
)
def test_after_id_makes_xread_start_at_the_position(position: int, ms: int, seq: int) -> None:
    """XREAD returns ids strictly greater than the one it is given: exactly the ids at or
    after the position (for every id an entry can have: any but 0-0)."""
    if (ms, seq) == (0, 0):
        return
    bound = parse_id(after_id(position))
    assert ((ms, seq) > bound) == ((ms, seq) >= unpack_position(position))


def test_a_sequence_the_packing_cannot_hold_is_a_clear_error() -> None:
    with pytest.raises(LogError, match="sequence number"):
        pack_id(1_700_000_000_000, SEQ_LIMIT)
    with pytest.raises(ValueError, match="negative"):
        unpack_position(-1)
    with pytest.raises(LogError, match="not a stream entry id"):
        parse_id(b"12")


# -- basics ------------------------------------------------------------------------


_ARG = st.one_of(st.binary(max_size=40), st.text(max_size=20), st.integers())


@given(
    st.text(min_size=1, max_size=8),
    st.lists(st.text(max_size=30), max_size=6),
    st.lists(_ARG, max_size=20),
    st.lists(_ARG, max_size=20),
)
def test_a_script_call_packed_with_its_kept_head_is_the_whole_command_packed(
    sha: str, keys: list[str], args: list[bytes | int | str], other: list[bytes | int | str]
) -> None:
    """`_pack_evalsha` keeps the head (script and keys) of a call and its text arguments
    packed: a second call with other arguments, or after the kept parts were cleared, is
    still exactly the command."""
    whole = redis_log._pack  # the reference: every part packed at every call
    for arguments in (args, other, args):
        packed = redis_log._pack_evalsha(sha, keys, arguments)
        assert packed == whole(b"EVALSHA", sha, len(keys), *keys, *arguments)
    redis_log._heads.clear()
    redis_log._texts.clear()
    assert redis_log._pack_evalsha(sha, keys, other) == whole(
        b"EVALSHA", sha, len(keys), *keys, *other
    )


def test_the_kept_text_arguments_stay_bounded_and_exact() -> None:
    """A process that sends many different texts (entry ids, errors) keeps at most
    `_TEXTS_KEPT` of them packed, and every call is still exactly the command."""
    texts = [f"{n}-0" for n in range(redis_log._TEXTS_KEPT + 10)] + ["é", "w0-1-abcd", ""]
    for text in texts + texts:
        args: list[bytes | int | str] = [text, 7, b"\x00raw", text]
        packed = redis_log._pack_evalsha("sha", ["k"], args)
        assert packed == redis_log._pack(b"EVALSHA", "sha", 1, "k", *args)
        assert len(redis_log._texts) <= redis_log._TEXTS_KEPT


def test_open_log_gives_a_redis_log_on_the_stream_qw_topic(redis_url: str) -> None:
    with open_log(redis_url, "tasks") as handle:
        assert isinstance(handle, RedisLog)
        assert handle.name == f"{redis_url} qw:tasks"
        assert handle.start == 0
        assert handle.end() == handle.start
        assert handle.read(handle.start) == []
        position = handle.append(b"hello")
    client = raw_client(redis_url)
    try:
        assert client.type("qw:tasks") == b"stream"
        stored = client.xrange("qw:tasks")
        assert stored is not None
        [(raw_id, fields)] = stored
        assert fields == {b"d": b"hello"}
        assert isinstance(raw_id, bytes)
        assert pack_id(*parse_id(raw_id)) == position
    finally:
        client.close()


def test_every_connection_names_the_client_as_redis_py_would_once_resolved(
    redis_url: str,
) -> None:
    """The client's name and version for CLIENT SETINFO are what redis-py resolves by
    itself (its name, its installed version), resolved once for every handle's clients."""
    driver_info = pytest.importorskip("redis.driver_info")
    first, second = RedisLog.open(redis_url, "t"), RedisLog.open(redis_url, "u")
    try:
        first.append(b"x")  # a connection made with them
        given = [
            client.connection_pool.connection_kwargs["driver_info"]
            for log in (first, second)
            for client in (log._client, log._blocking)
        ]
        assert first._conn is not None and first._conn.driver_info is given[0]
    finally:
        first.close()
        second.close()
    own = driver_info.resolve_driver_info()  # what redis-py makes when given none
    assert own is not None and given[0] is not None
    assert all(info is given[0] for info in given)
    assert (given[0].formatted_name, given[0].lib_version) == (own.formatted_name, own.lib_version)
    assert given[0].lib_version == importlib.metadata.version("redis")


def test_append_read_and_end(log: RedisLog) -> None:
    first = log.append(b"a")
    rest = log.append_many([b"b", b"", b"d" * 1000])
    positions = [first, *rest]
    assert positions == sorted(positions) and len(set(positions)) == 4
    entries = log.read(log.start)
    assert [e.position for e in entries] == positions
    assert [e.data for e in entries] == [b"a", b"b", b"", b"d" * 1000]
    assert all(e.next == e.position + 1 for e in entries)
    assert log.end() == entries[-1].next
    assert log.read(log.end()) == []
    assert log.read(entries[1].next) == entries[2:]
    assert log.read(positions[1]) == entries[1:]
    assert log.read(log.start, 2) == entries[:2]
    assert log.read(entries[1].next, 1) == entries[2:3]
    assert log.read(log.start, 0) == []
    assert list(log.iter_from(log.start, batch=3)) == entries
    assert log.append_many([]) == []


def test_records_that_look_like_the_replys_header_read_back_exactly(log: RedisLog) -> None:
    """A read's reply is a header of ids and lengths, then the records' bytes: records made
    of the header's own characters (digits, '-', spaces, newlines) or of nothing come back
    byte for byte, by `read` and by `append_and_read`, with the ids the server gave them."""
    tricky = [b"12-3 4 ", b"\n", b"", b" -1 ", b"5\n6-7 8\n", bytes(range(256)), b"x" * 70_000]
    positions = log.append_many(tricky)
    entries = log.read(log.start)
    assert [e.data for e in entries] == tricky
    assert [e.position for e in entries] == positions
    assert all(e.server_time_us == (e.position >> SEQ_BITS) * 1000 for e in entries)
    more = [b"9-9 9", b""]
    added, read_back = log.append_and_read(more, entries[-1].next, max_records=10)
    assert [e.data for e in read_back] == more
    assert [e.position for e in read_back] == added
    assert log.read(positions[2], 3) == entries[2:5]


def test_positions_are_the_servers_ids_at_millisecond_edges(log: RedisLog, redis_url: str) -> None:
    """Entries placed by hand at known ids: reading and waiting from each position, including
    a sequence number of 0 (XREAD then starts after the previous millisecond's last id)."""
    client = raw_client(redis_url)
    try:
        for entry_id in ("5-0", "5-1", "6-0", "7-1048575", "8-0"):
            client.xadd("qw:t", {"d": entry_id.encode()}, id=entry_id)
    finally:
        client.close()
    ids = [(5, 0), (5, 1), (6, 0), (7, SEQ_LIMIT - 1), (8, 0)]
    entries = log.read(log.start)
    assert [e.position for e in entries] == [pack_id(*i) for i in ids]
    assert [e.server_time_us for e in entries] == [5000, 5000, 6000, 7000, 8000]
    for k, entry in enumerate(entries):
        assert log.read(entry.position) == entries[k:]
        assert log.read(entry.next) == entries[k + 1 :]
        assert log.wait(entry.position, 0) is True
        assert log.wait(entry.next, 0) is (k + 1 < len(entries))
    assert entries[3].next == pack_id(8, 0)
    assert log.read(pack_id(5, 2)) == entries[2:]
    assert log.end() == pack_id(8, 1)


def test_server_time_is_the_servers_clock_and_never_goes_back(
    log: RedisLog, redis_url: str
) -> None:
    client = raw_client(redis_url)
    try:
        sec, usec = client.time()
        before_us = sec * 1_000_000 + usec
        for i in range(50):
            log.append(b"x%d" % i)
        log.append_many([b"batch"] * 20)
        sec, usec = client.time()
        after_us = sec * 1_000_000 + usec
    finally:
        client.close()
    entries = log.read(log.start)
    stamps = [e.server_time_us for e in entries]
    assert all(isinstance(s, int) for s in stamps)
    times = [s for s in stamps if s is not None]
    assert times == sorted(times)
    assert before_us // 1000 * 1000 <= times[0] and times[-1] <= after_us
    assert all(t == (e.position >> 20) * 1000 for t, e in zip(times, entries, strict=True))


def test_a_record_too_large_is_refused_and_nothing_is_written(redis_url: str) -> None:
    with RedisLog.open(redis_url, "t") as default:
        assert isinstance(default, RedisLog)
        assert default.max_record == 16 * 1024 * 1024
        with pytest.raises(RecordTooLargeError) as info:
            default.append(b"\0" * (16 * 1024 * 1024 + 1))
        assert info.value.limit == 16 * 1024 * 1024
    with RedisLog.open(f"{redis_url}?max_record=10", "t") as small:
        small.append(b"0123456789")
        with pytest.raises(RecordTooLargeError):
            small.append_many([b"ok", b"01234567890", b"ok"])
        assert [e.data for e in small.read(small.start)] == [b"0123456789"]


def test_append_many_is_all_or_nothing_when_an_id_cannot_be_packed(
    log: RedisLog, redis_url: str
) -> None:
    """An entry placed (by hand) at the last sequence number of a millisecond makes the
    next XADD take a sequence the packing cannot hold: the batch is undone."""
    log.append(b"before")
    client = raw_client(redis_url)
    try:
        client.xadd("qw:t", {"d": b"edge"}, id=format_id(99_999_999_999_999, SEQ_LIMIT - 1))
        with pytest.raises(AppendError, match="one millisecond"):
            log.append_many([b"x", b"y", b"z"])
        assert client.xlen("qw:t") == 2
    finally:
        client.close()
    assert [e.data for e in log.read(log.start)] == [b"before", b"edge"]


def test_a_retried_append_whose_reply_was_lost_is_not_added_twice(
    log: RedisLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server did the append but the reply never came: the retry returns the same
    positions and adds nothing."""
    lost = lose_first_script_reply(log, monkeypatch)
    positions = log.append_many([b"a", b"b", b"c"])
    assert lost, "the simulated failure did not happen"
    assert [e.position for e in log.read(log.start)] == positions
    assert [e.data for e in log.read(log.start)] == [b"a", b"b", b"c"]
    # and the next call is a new append, not mistaken for the retry of the last one
    assert log.append(b"d") > positions[-1]
    assert len(log.read(log.start)) == 4


def test_an_append_whose_every_reply_is_lost_says_it_may_have_been_made(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one outcome a networked append cannot settle: the error says so, and the records
    are then in the log once (the retries did not add them again)."""
    with RedisLog.open(f"{redis_url}?retries=2", "t") as handle:
        assert isinstance(handle, RedisLog)
        real = handle._run_script

        def reply_always_lost(*args: Any) -> Any:
            real(*args)
            raise redis.exceptions.ConnectionError("Connection reset by peer (simulated)")

        monkeypatch.setattr(handle, "_run_script", reply_always_lost)
        with pytest.raises(AppendError, match="may still have been made") as info:
            handle.append_many([b"a", b"b"])
        assert "3 attempts" in str(info.value)
        monkeypatch.undo()
        assert [e.data for e in handle.read(handle.start)] == [b"a", b"b"]


def test_prefix_keeps_queues_apart(redis_url: str) -> None:
    with (
        RedisLog.open(f"{redis_url}?prefix=run1", "t") as one,
        RedisLog.open(f"{redis_url}?prefix=run2", "t") as two,
    ):
        assert isinstance(one, RedisLog)
        assert one.key == "run1:qw:t"
        one.append(b"1")
        two.append(b"2")
        assert [e.data for e in one.read(one.start)] == [b"1"]
        assert [e.data for e in two.read(two.start)] == [b"2"]


def test_a_key_that_is_not_a_stream_is_refused(redis_url: str) -> None:
    client = raw_client(redis_url)
    try:
        client.set("qw:t", b"something else")
    finally:
        client.close()
    with pytest.raises(ForeignFileError, match="not a stream"):
        RedisLog.open(redis_url, "t")


def test_an_entry_without_data_is_reported_as_damage(log: RedisLog, redis_url: str) -> None:
    log.append(b"ok")
    client = raw_client(redis_url)
    try:
        bad = client.xadd("qw:t", {"other": b"x"})
    finally:
        client.close()
    with pytest.raises(CorruptLogError, match="no 'd' field") as raised:
        log.read(log.start)
    assert raised.value.offset == pack_id(*parse_id(bad))


def test_check_finds_the_damage_read_finds_without_reading_the_records(
    log: RedisLog, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check` looks on the server (RedisLog.check): its batches' edges (CHECK_BATCH) are
    crossed, the end it returns is `read`'s, and an entry without data is damage at its
    position, as `read` says."""
    monkeypatch.setattr(redis_log, "CHECK_BATCH", 3)
    positions = log.append_many([b"%d" % n for n in range(7)])
    monkeypatch.setattr(RedisLog, "read", lambda *a, **k: pytest.fail("check read records"))
    assert log.check() == positions[-1] + 1
    client = raw_client(redis_url)
    try:
        bad = client.xadd("qw:t", {"other": b"x"})
        client.xadd("qw:t", {"d": b"after it"})
    finally:
        client.close()
    with pytest.raises(CorruptLogError, match="no 'd' field") as raised:
        log.check()
    assert raised.value.offset == pack_id(*parse_id(bad))


def test_check_of_an_empty_stream_is_its_start(log: RedisLog) -> None:
    assert log.check() == log.start


def test_close_is_idempotent_and_final(redis_url: str) -> None:
    handle = RedisLog.open(redis_url, "t")
    position = handle.append(b"x")
    handle.close()
    handle.close()
    for call in (
        lambda: handle.append(b"y"),
        lambda: handle.append_many([b"y"]),
        lambda: handle.read(position),
        lambda: handle.wait(position, 0),
        handle.end,
    ):
        with pytest.raises(LogClosedError):
            call()
    client = raw_client(redis_url)
    try:  # the handle's last-append record goes with it
        assert client.keys("qw:t:w:*") == []
    finally:
        client.close()


# -- waiting -----------------------------------------------------------------------


def _append_once_blocked(url: str, topic: str, waiter: str) -> None:
    """In another process: wait until the client named `waiter` is blocked on XREAD, then
    append one record."""
    client = raw_client(url)

    def waiter_blocked() -> bool:
        for info in client.client_list():
            if info.get("name") == waiter and "b" in info.get("flags", ""):
                return True
        return False

    try:
        wait_until(waiter_blocked, 60, "the waiting handle to block")
    finally:
        client.close()
    with RedisLog.open(url, topic) as other:
        other.append(b"wake up")


def test_wait_wakes_on_an_append_from_another_process(redis_url: str) -> None:
    waiter = f"waiter-{uuid.uuid4().hex}"
    with RedisLog.open(f"{redis_url}?client_name={waiter}", "t") as handle:
        position = handle.end()
        child = multiprocessing.get_context("spawn").Process(
            target=_append_once_blocked, args=(redis_url, "t", waiter)
        )
        child.start()
        try:
            # the timeout is far off: True here can only be the append waking it
            assert handle.wait(position, 120) is True
            [entry] = handle.read(position)
            assert entry.data == b"wake up"
        finally:
            child.join(60)
            if child.is_alive():
                child.kill()
        assert child.exitcode == 0


def test_wait_times_out_and_sees_what_is_there(
    log: RedisLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert log.wait(log.start, 0) is False
    assert log.wait(log.start, 0.05) is False
    position = log.append(b"x")
    assert log.wait(log.start, 0) is True
    assert log.wait(position, 0) is True
    assert log.wait(position, 5) is True
    assert log.wait(log.end(), 0) is False
    assert log.wait(log.end(), -1) is False
    # a wait longer than one XREAD BLOCK blocks again until its own timeout
    monkeypatch.setattr(redis_log, "BLOCK_CHUNK_S", 0.01)
    assert log.wait(log.end(), 0.1) is False
    assert log.wait(position, 0.1) is True


# -- many processes ----------------------------------------------------------------


def _writer(url: str, topic: str, wid: int, count: int, out: str) -> None:
    rng = random.Random(wid)
    batches: list[list[int]] = []
    with RedisLog.open(url, topic) as handle:
        i = 0
        while i < count:
            k = min(rng.randint(1, 16), count - i)
            records = [f"{wid}:{j}".encode() for j in range(i, i + k)]
            batches.append(handle.append_many(records) if k > 1 else [handle.append(records[0])])
            i += k
    Path(out).write_text(json.dumps(batches))


def _reader(url: str, topic: str, total: int, out: str) -> None:
    seen: list[tuple[int, str]] = []
    with RedisLog.open(url, topic) as handle:
        position = handle.start
        while len(seen) < total:
            entries = handle.read(position, 500)
            if not entries:
                handle.wait(position, 30)
                continue
            seen.extend((e.position, e.data.decode()) for e in entries)
            position = entries[-1].next
    Path(out).write_text(json.dumps(seen))


def test_concurrent_appenders_get_contiguous_batches_and_readers_agree(
    redis_url: str, tmp_path: Path
) -> None:
    writers, per_writer, readers = 4, 2000, 2
    total = writers * per_writer
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_reader, args=(redis_url, "t", total, str(tmp_path / f"r{i}")))
        for i in range(readers)
    ] + [
        ctx.Process(target=_writer, args=(redis_url, "t", w, per_writer, str(tmp_path / f"w{w}")))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(240)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * len(procs)

    with RedisLog.open(redis_url, "t") as handle:
        full = [(e.position, e.data.decode()) for e in handle.read(handle.start)]
    assert len(full) == total
    assert len({d for _, d in full}) == total  # every record once
    positions = [p for p, _ in full]
    assert positions == sorted(positions) and len(set(positions)) == total
    index = {p: i for i, p in enumerate(positions)}
    data = dict(full)
    for w in range(writers):
        batches: list[list[int]] = json.loads((tmp_path / f"w{w}").read_text())
        mine = [p for batch in batches for p in batch]
        assert [data[p] for p in mine] == [f"{w}:{j}" for j in range(per_writer)]
        for batch in batches:  # no other writer's record inside a batch
            assert [index[p] for p in batch] == list(
                range(index[batch[0]], index[batch[0]] + len(batch))
            )
    for r in range(readers):
        seen = [tuple(x) for x in json.loads((tmp_path / f"r{r}").read_text())]
        assert seen == full


# -- errors and reconnecting ---------------------------------------------------------


def test_connection_refused_is_a_clear_error_naming_the_url() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(LogError) as info:
        RedisLog.open(url, "t")
    assert str(info.value).startswith(f"cannot reach redis at {url}: Connection refused")
    assert not isinstance(info.value, redis.exceptions.RedisError)


def test_a_password_never_appears_in_a_message() -> None:
    url = f"redis://user:hunter2@127.0.0.1:{free_port()}/0?retries=0"
    with pytest.raises(LogError) as info:
        RedisLog.open(url, "t")
    assert "hunter2" not in str(info.value)
    assert "user:***@127.0.0.1" in str(info.value)


class OwnRedis:
    """A redis-server of this test's own (AOF on, fsync on every write), to kill -9."""

    def __init__(self, directory: Path) -> None:
        self.binary = redis_server_binary()
        self.directory = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc = self.proc

        def accepting() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return True
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"redis-server exited with {proc.returncode}")
                return False

        wait_until(accepting, 20, "the test's redis-server to accept connections")

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


def _succeeds(call: Callable[[], T]) -> Callable[[], bool]:
    def attempt() -> bool:
        try:
            call()
        except LogError:
            return False
        return True

    return attempt


def test_a_handle_reconnects_after_a_restart_and_resumes_from_its_position(
    tmp_path: Path,
) -> None:
    server = OwnRedis(tmp_path)
    server.start()
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        # few retries, so that the calls made while the server is down fail quickly
        handle = RedisLog.open(f"{url}?retries=1", "t")
        before = handle.append_many([b"a", b"b", b"c"])
        read = handle.read(handle.start)
        assert [e.position for e in read] == before
        position = read[-1].next

        server.kill9()
        with pytest.raises(LogError, match=f"cannot reach redis at {url}"):
            handle.read(position)
        with pytest.raises(AppendError, match=f"cannot reach redis at {url}.*Connection refused"):
            handle.append(b"refused")
        with pytest.raises(AppendError) as refused:  # never sent: it certainly did not happen
            handle.append(b"refused")
        assert "may still" not in str(refused.value)
        with pytest.raises(LogError, match=f"cannot reach redis at {url}"):
            handle.wait(position, 0.5)

        server.start()  # the same port and directory: the AOF brings the records back
        wait_until(_succeeds(lambda: handle.read(position)), 30, "the handle to reconnect")
        assert handle.read(position) == []  # nothing already read comes again
        assert handle.wait(position, 0) is False
        after = handle.append(b"d")
        assert after > before[-1]
        [entry] = handle.read(position)
        assert (entry.position, entry.data) == (after, b"d")
        assert handle.wait(position, 0) is True
        everything = handle.read(handle.start)
        assert [e.data for e in everything] == [b"a", b"b", b"c", b"d"]
        assert [e.position for e in everything] == [*before, after]
        handle.close()
    finally:
        server.kill9()
