"""A fold reader's span read (`FileLog.read_span` with `queue_worker.protocol.claims_span`'s loop):
the C loop (`_cdecode.c`'s `decode_claims_frames`) against its Python definition
(`claims_span.decode_claims_frames_py`) on arbitrary, torn and corrupt buffers of claims
records; the span read against `read` on real files (segments, torn tails, corruption: the
same records, positions and errors); and a follower folding the same state either way.

The C half needs the install's C build (setup.py); skipped without one (CI checks that it
was built).
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import Durability
from logstore.base import CorruptLogError, SpanDecoder, SpanLoop
from logstore.file import framing
from logstore.file.log import FileLog
from queue_worker import topics
from queue_worker.proof import log_reading
from queue_worker.protocol import claims_span, records
from queue_worker.protocol.records import (
    Claim,
    ClaimsRecord,
    Done,
    Fail,
    Renew,
    TaskRecord,
    Unknown,
    decode_claims_all,
    encode,
)
from tests.examples import examples
from tests.test_cdecode import any_payloads, plain

SETTINGS = settings(max_examples=examples(200), deadline=None)
FILE_SETTINGS = settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
C_MODULE = records._c_module()
LOOPS: dict[str, SpanLoop] = {"python": claims_span.decode_claims_frames_py}
if C_MODULE is not None:
    LOOPS["c"] = claims_span.loop()


def need_c() -> None:
    if C_MODULE is None:
        from queue_worker.protocol import cdecode

        pytest.skip(f"the C claims decoder is not in use: {cdecode.status()}")


@st.composite
def claims_buffers(draw: st.DrawFn) -> bytes:
    """Frames of claims payloads as writers leave them (batches), then damage: cut short
    (a torn tail), bytes overwritten (corruption), zeros or junk appended."""
    frames = []
    for _ in range(draw(st.integers(0, 6))):
        frames.append(framing.encode_batch(draw(st.lists(any_payloads, min_size=1, max_size=4))))
    buf = bytearray(b"".join(frames))
    damage = draw(st.sampled_from(["none", "none", "cut", "flip", "zeros", "junk"]))
    if damage == "cut" and buf:
        del buf[draw(st.integers(0, len(buf) - 1)) :]
    elif damage == "flip" and buf:
        for _ in range(draw(st.integers(1, 3))):
            buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
    elif damage == "zeros":
        buf += bytes(draw(st.integers(1, 30)))
    elif damage == "junk":
        buf += draw(st.binary(min_size=1, max_size=30))
    return bytes(buf)


def same_span(ours: Any, theirs: Any) -> None:
    assert [plain(r) for r in ours[0]] == [plain(r) for r in theirs[0]]
    assert [type(r) for r in ours[0]] == [type(r) for r in theirs[0]]
    assert ours[1:] == theirs[1:]


@SETTINGS
@given(
    claims_buffers(),
    st.sampled_from([framing.MAX_RECORD, 0, 8, 24, 64]),
    st.integers(0, 600),
    st.sampled_from([sys.maxsize, 1, 2, 3, 5]),
    st.integers(0, 2**40),
)
def test_the_c_span_loop_is_its_python_definition(
    buf: bytes, max_record: int, verified: int, limit: int, base: int
) -> None:
    need_c()
    python = claims_span.decode_claims_frames_py(buf, max_record, verified, limit, base)
    same_span(LOOPS["c"](buf, max_record, verified, limit, base), python)
    # and the definition is the frame walk, then the claims decoder
    starts, datas, *rest = framing._decode_loop(buf, max_record, verified, limit)
    assert [s + base for s in starts] == python[1]
    assert rest == list(python[2:])
    assert [plain(r) for r in python[0]] == [plain(r) for r in decode_claims_all(datas)]


@SETTINGS
@given(
    claims_buffers(),
    st.sampled_from([framing.MAX_RECORD, 24]),
    st.integers(0, 600),
    st.sampled_from([sys.maxsize, 2]),
    st.integers(0, 2**40),
    st.integers(0, 3) | st.sampled_from([127, 128, 255, 256, 2**32, records.MAX_TASK_ID]),
)
def test_the_c_span_loop_for_one_task_passes_over_only_other_records(
    buf: bytes, max_record: int, verified: int, limit: int, base: int, task: int
) -> None:
    """With a task (what `qw why` and `qw task` read: log_reading.read_claims_batches), the
    loop is its definition but that a record which is not one of the task's may be `other`,
    not decoded; a record of the task never is."""
    need_c()
    other = object()
    python = claims_span.decode_claims_frames_py(buf, max_record, verified, limit, base)
    fallback = records._claims_or_none
    ours = C_MODULE.decode_claims_frames(
        buf, max_record, verified, limit, base, Claim, Done, fallback, task, other
    )
    assert ours[1:] == python[1:]
    for mine, theirs in zip(ours[0], python[0], strict=True):
        if mine is other:
            assert theirs is None or isinstance(theirs, Unknown) or theirs.task != task
        else:
            assert (type(mine), plain(mine)) == (type(theirs), plain(theirs))


@pytest.mark.parametrize("form", ["fix", "u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64"])
def test_the_common_records_of_other_tasks_are_passed_over(form: str) -> None:
    """Every record naming another task (its id in any integer encoding) is `other`; every
    record of the task is decoded."""
    need_c()
    other = object()
    written: list[ClaimsRecord] = [
        Claim(5, "w", 1, 2),
        Renew(7, "w", 1, 2, 3),
        Done(5, "w", 1, 2, {"r": [1.5]}),
        Fail(300, "w", 1, 2, "e", None),
        Done(7, "w", 1, 2, None),
    ]
    datas = [repacked_task(encode(r), form) for r in written]
    assert [records.decode(data) for data in datas] == written
    buf = b"".join(framing.encode_frame(data) for data in datas)
    fallback = records._claims_or_none
    found = C_MODULE.decode_claims_frames(
        buf, framing.MAX_RECORD, 0, 100, 0, Claim, Done, fallback, 7, other
    )
    assert found[0] == [other, written[1], other, other, written[4]]


def repacked_task(data: bytes, form: str) -> bytes:
    """A claims record's bytes with its task id (its third item) in the integer encoding
    `form` (as another msgpack writer could pack it)."""
    items = msgpack.unpackb(data)
    rest: bytes = msgpack.packb(items[3:], use_bin_type=True)[1:]
    head = data[:4]
    assert head[0] == 0x90 | len(items)
    formats = {"u8": ">B", "u16": ">H", "u32": ">I", "u64": ">Q"}
    formats |= {"i8": ">b", "i16": ">h", "i32": ">i", "i64": ">q"}
    codes = {"u8": 0xCC, "u16": 0xCD, "u32": 0xCE, "u64": 0xCF}
    codes |= {"i8": 0xD0, "i16": 0xD1, "i32": 0xD2, "i64": 0xD3}
    task = items[2]
    if form == "fix" or (form in ("u8", "i8") and task > 127):
        packed: bytes = msgpack.packb(task)
    else:
        packed = bytes([codes[form]]) + struct.pack(formats[form], task)
    return bytes(head + packed + rest)


task_payloads = (
    st.tuples(st.none() | st.integers(0, 2**40) | st.text(max_size=5), st.integers(0, 2**62)).map(
        lambda fields: encode(TaskRecord(*fields))
    )  # (what this version writes: it begins with topics._TASK_PREFIX)
    | any_payloads
    | st.sampled_from([b"", b"\x94", b"\x94\x01\xa1", b"\x94\x01\xa1T", b"\x94\x02\xa1T"])
)


@SETTINGS
@given(
    st.lists(st.lists(task_payloads, min_size=1, max_size=4), max_size=6),
    st.sampled_from(["none", "cut", "flip"]),
    st.data(),
    st.sampled_from([framing.MAX_RECORD, 24]),
    st.integers(0, 600),
    st.sampled_from([sys.maxsize, 1, 3]),
    st.integers(0, 2**40),
)
def test_the_c_task_loop_is_its_python_definition(
    batches: list[list[bytes]],
    damage: str,
    data: st.DataObject,
    max_record: int,
    verified: int,
    limit: int,
    base: int,
) -> None:
    """`_cdecode.c`'s `task_frames` (what `qw status` counts a tasks log with) is
    `log_reading.task_frames_py`: each TASK of this schema `known`, any other payload its
    bytes, on whole, torn and damaged buffers."""
    need_c()
    buf = bytearray(b"".join(framing.encode_batch(batch) for batch in batches))
    if damage == "cut" and buf:
        del buf[data.draw(st.integers(0, len(buf) - 1)) :]
    elif damage == "flip" and buf:
        buf[data.draw(st.integers(0, len(buf) - 1))] ^= data.draw(st.integers(1, 255))
    known = object()
    args = (bytes(buf), max_record, verified, limit, base, topics._TASK_PREFIX, known)
    ours = C_MODULE.task_frames(*args)
    theirs = log_reading.task_frames_py(*args)
    assert ours == theirs
    assert [type(item) for item in ours[0]] == [type(item) for item in theirs[0]]
    assert ours[1:] == claims_span.decode_claims_frames_py(*args[:5])[1:]  # the same walk


@SETTINGS
@given(st.lists(st.sampled_from(["other", "record", "none"])), st.integers(0, 2**40))
def test_the_c_without_is_its_python_definition(kinds: list[str], base: int) -> None:
    need_c()
    other = object()
    items = [
        other if k == "other" else None if k == "none" else Claim(i, "w", 1, 2)
        for i, k in enumerate(kinds)
    ]
    positions = [base + 10 * i for i in range(len(items))]
    ours = C_MODULE.without(items, positions, other)
    assert ours == log_reading.without_py(items, positions, other)
    assert ours[0] == [item for item in items if item is not other]
    with pytest.raises(TypeError):
        C_MODULE.without(items, [*positions, 1], other)


def test_the_c_span_loop_refuses_bad_arguments() -> None:
    need_c()
    fused = C_MODULE.decode_claims_frames
    data = framing.encode_frame(encode(Claim(1, "w", 2, 3)))
    fallback = records._claims_or_none
    with pytest.raises(TypeError):
        fused(bytearray(data), 100, 0, 5, 0, Claim, Done, fallback)
    with pytest.raises(TypeError):
        fused(data, 100, 0, 5, 0, Claim, int, fallback)
    with pytest.raises(TypeError):
        fused(data, 100, 0, 5, 0, Claim, Done)
    with pytest.raises(OverflowError):
        fused(data, 2**70, 0, 5, 0, Claim, Done, fallback)
    with pytest.raises(TypeError):
        fused(data, 100, 0, 5, 0, Claim, Done, fallback, 1)  # a task and no `other`
    with pytest.raises(ValueError):
        fused(data, 100, 0, 5, 0, Claim, Done, fallback, -1, None)

    def fails(data: bytes) -> None:
        raise RuntimeError("fallback")

    with pytest.raises(RuntimeError, match="fallback"):
        fused(data + framing.encode_frame(b"\xc1"), 100, 0, 5, 0, Claim, Done, fails)


# -- on real files ---------------------------------------------------------------------------


def read_all_entries(log: FileLog, limit: int) -> tuple[list[Any], list[int], int, str | None]:
    """Records, positions, where reading stopped, and the error that stopped it (by `read`)."""
    decoded: list[Any] = []
    positions: list[int] = []
    position = log.start
    try:
        while entries := log.read(position, limit):
            decoded += decode_claims_all([e.data for e in entries])
            positions += [e.position for e in entries]
            position = entries[-1].next
    except CorruptLogError as e:
        return decoded, positions, position, f"{type(e).__name__}: {e}"
    return decoded, positions, position, None


def _no_entries(entries: list[Any]) -> list[Any]:
    raise AssertionError("a file log decodes its frames, not entries")


def read_all_spans(
    log: FileLog, limit: int, loop: SpanLoop
) -> tuple[list[Any], list[int], int, str | None]:
    decoded: list[Any] = []
    positions: list[int] = []
    position = log.start
    try:
        while found := log.read_span(position, limit, SpanDecoder(_no_entries, loop)):
            assert len(found.positions) == len(found.items) <= limit
            decoded += found.items
            positions += found.positions
            position = found.next
    except CorruptLogError as e:
        return decoded, positions, position, f"{type(e).__name__}: {e}"
    return decoded, positions, position, None


def same_reads(path: Path, limit: int, **options: Any) -> None:
    with FileLog.open(str(path), Durability.NONE, read_only=True, **options) as log:
        wanted = read_all_entries(log, limit)
    for loop in LOOPS.values():
        with FileLog.open(str(path), Durability.NONE, read_only=True, **options) as log:
            found = read_all_spans(log, limit, loop)
        assert [plain(r) for r in found[0]] == [plain(r) for r in wanted[0]]
        assert found[1:] == wanted[1:]


batches = st.lists(st.lists(any_payloads, min_size=1, max_size=5), min_size=1, max_size=12)


@FILE_SETTINGS
@given(
    batches,
    st.sampled_from(["none", "cut", "flip", "zeros", "junk"]),
    st.data(),
    st.sampled_from([1, 2, 7, 4096]),
)
def test_a_span_read_finds_what_read_finds(
    tmp_path_factory: pytest.TempPathFactory, written: list[list[bytes]], damage: str,
    data: st.DataObject, limit: int,
) -> None:  # fmt: skip
    path = tmp_path_factory.mktemp("span") / "claims.log"
    with FileLog.open(str(path), Durability.NONE) as log:
        for batch in written:
            log.append_many(batch)
    raw = bytearray(path.read_bytes())
    first = framing.FILE_HEADER_SIZE
    if damage == "cut":
        del raw[data.draw(st.integers(first, len(raw) - 1)) :]
    elif damage == "flip":
        raw[data.draw(st.integers(first, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    elif damage == "zeros":
        raw += bytes(data.draw(st.integers(1, 40)))
    elif damage == "junk":
        raw += data.draw(st.binary(min_size=1, max_size=40))
    path.write_bytes(bytes(raw))
    same_reads(path, limit)


def test_a_span_read_goes_on_across_segments(tmp_path: Path) -> None:
    path = tmp_path / "claims.log"
    with FileLog.open(str(path), Durability.NONE, segment_bytes=2048) as log:
        for task in range(400):
            log.append_many(
                [encode(Claim(task, "w1", task, 30)), encode(Done(task, "w1", task + 1, 0, None))]
            )
    with FileLog.open(str(path), Durability.NONE, read_only=True) as log:
        assert len(log.segments()) >= 10
        for loop in LOOPS.values():
            found = read_all_spans(log, 4096, loop)
            assert len(found[0]) == 800 and found[3] is None
    same_reads(path, 4096)
    same_reads(path, 3)


def test_a_corrupt_span_raises_as_read_does(tmp_path: Path) -> None:
    path = tmp_path / "claims.log"
    with FileLog.open(str(path), Durability.NONE) as log:
        positions = log.append_many([encode(Claim(t, "w", t, 5)) for t in range(20)])
    raw = bytearray(path.read_bytes())
    raw[positions[10] + 14] ^= 0xFF  # a payload byte of the 11th record, more records after
    path.write_bytes(bytes(raw))
    for loop in LOOPS.values():
        with FileLog.open(str(path), Durability.NONE, read_only=True) as log:
            found = read_all_spans(log, 4096, loop)
        # the batch is damaged whole: nothing of it is returned, and the error names the frame
        assert found[0] == [] and found[2] == positions[0]
        assert found[3] is not None and found[3].startswith("CorruptLogError")
        assert f"{positions[10]}" in found[3]
    same_reads(path, 4096)


# -- a follower ------------------------------------------------------------------------------


@FILE_SETTINGS
@given(batches)
def test_a_follower_folds_the_same_from_spans_and_from_entries(
    tmp_path_factory: pytest.TempPathFactory, written: list[list[bytes]]
) -> None:
    path = tmp_path_factory.mktemp("follow") / "claims.log"
    with FileLog.open(str(path), Durability.NONE, segment_bytes=512) as log:
        for batch in written:
            log.append_many(batch)
        spans = topics.ClaimsFollower(log.start)
        count = spans.catch_up(log)
        entries = topics.ClaimsFollower(log.start)
        while found := log.read(entries.next_position, topics.READ_BATCH):
            entries.fold_entries(found)
        end = log.end()
    assert count == sum(map(len, written))
    assert spans.next_position == entries.next_position == end
    assert (spans.malformed, spans.last_malformed) == (entries.malformed, entries.last_malformed)
    assert plain(spans.state.snapshot()) == plain(entries.state.snapshot())


def test_a_follower_on_a_file_log_reads_spans(tmp_path: Path) -> None:
    """The catch-up of a file log goes through `read_span` (not `read`), and a malformed
    record among the spans is counted with its reason, as `fold_entries` counts it."""
    path = tmp_path / "claims.log"
    with FileLog.open(str(path), Durability.NONE) as log:
        log.append_many([encode(Claim(1, "w", 1, 9)), b"\xc1", encode(Done(1, "w", 2, 48, 7))])
        calls: list[str] = []
        with pytest.MonkeyPatch.context() as patch:
            span = FileLog.read_span

            def counted(self: FileLog, *args: Any) -> Any:
                calls.append("span")
                return span(self, *args)

            patch.setattr(FileLog, "read_span", counted)
            follower = topics.ClaimsFollower(log.start)
            assert follower.catch_up(log) == 3
        assert calls and follower.next_position == log.end()
    assert follower.malformed == 1
    assert follower.last_malformed is not None
    assert follower.last_malformed.startswith("malformed claims record at position ")
    assert follower.state.done_count == 1
