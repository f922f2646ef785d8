"""The record encoding: round trips, untrusted input, forward compatibility, bad payloads."""

from __future__ import annotations

import contextlib
import math
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_worker.protocol.records import (
    CANCEL,
    CLAIM,
    DONE,
    FAIL,
    NO_KWARGS,
    RENEW,
    SCHEMA,
    TASK,
    TASK_AFTER,
    TASK_BY_NAME,
    TASK_SCHEDULED,
    Claim,
    ClaimsRecord,
    Done,
    Fail,
    Record,
    RecordDecodeError,
    RecordEncodeError,
    Renew,
    TaskRecord,
    Unknown,
    decode,
    decode_claims,
    decode_claims_all,
    decode_task,
    encode,
)
from tests.examples import examples

FAST = settings(
    max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

KNOWN_CODES = (CLAIM, RENEW, DONE, FAIL, TASK, TASK_BY_NAME, TASK_SCHEDULED, TASK_AFTER, CANCEL)

# -- strategies --------------------------------------------------------------------------

#: every integer msgpack can carry
ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)

timestamps = st.builds(
    msgpack.Timestamp,
    seconds=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    nanoseconds=st.integers(min_value=0, max_value=999_999_999),
)
ext_types = st.builds(
    msgpack.ExtType, code=st.integers(min_value=0, max_value=127), data=st.binary(max_size=20)
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    st.floats(),  # NaN and the infinities included: msgpack carries float64 bit for bit
    st.text(max_size=20),
    st.binary(max_size=20),
    ext_types,
    timestamps,
)
map_keys = st.one_of(st.none(), st.booleans(), ints, st.floats(), st.text(max_size=10), st.binary())

#: any value a msgpack reader can give back: what a payload or a result may be
msgpack_values: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(map_keys, inner, max_size=5),
    ),
    max_leaves=20,
)

workers = st.text(max_size=30)
#: every task id a claims record may name (queue_worker.protocol.records.MAX_TASK_ID)
task_ids = st.integers(min_value=0, max_value=2**63 - 1)

claims = st.builds(Claim, task=task_ids, worker=workers, at=ints, lease=ints)
renews = st.builds(Renew, task=task_ids, worker=workers, at=ints, claim=ints, lease=ints)
dones = st.builds(Done, task=task_ids, worker=workers, at=ints, claim=ints, result=msgpack_values)
fails = st.builds(
    Fail,
    task=task_ids,
    worker=workers,
    at=ints,
    claim=ints,
    error=st.text(max_size=50),
    retry_at=st.none() | ints,
)
payload_tasks = st.builds(
    TaskRecord,
    payload=msgpack_values,
    enqueued_at=ints,
    function=st.none(),
    args=st.just(()),
    kwargs=st.just(NO_KWARGS),
    not_before=st.just(0),
    priority=st.just(0),
    key=st.none(),
    retry_of=st.none(),
    after=st.just(()),
    resolves_to=st.none(),
)
named_tasks = st.builds(
    TaskRecord,
    payload=st.none(),
    enqueued_at=ints,
    function=st.text(max_size=20),
    args=st.lists(msgpack_values, max_size=4),
    kwargs=st.dictionaries(st.text(max_size=10), msgpack_values, max_size=4),
    not_before=st.just(0),
    priority=st.just(0),
    key=st.none(),
    retry_of=st.none(),
    after=st.just(()),
    resolves_to=st.none(),
)
scheduled_tasks = st.builds(
    TaskRecord,
    payload=st.none(),
    enqueued_at=ints,
    function=st.text(max_size=20),
    args=st.lists(msgpack_values, max_size=2),
    kwargs=st.dictionaries(st.text(max_size=10), msgpack_values, max_size=2),
    not_before=ints,
    priority=ints,
    key=st.none() | st.text(max_size=10),
    retry_of=st.none() | st.integers(min_value=0, max_value=2**63 - 1),
    after=st.just(()),
    resolves_to=st.none(),
).filter(lambda t: bool(t.not_before or t.priority or t.key is not None or t.retry_of is not None))
#: tasks with dependencies (type "A"), with or without the other options
tasks_after = st.builds(
    TaskRecord,
    payload=st.none(),
    enqueued_at=ints,
    function=st.text(max_size=20),
    args=st.lists(msgpack_values, max_size=2),
    kwargs=st.dictionaries(st.text(max_size=10), msgpack_values, max_size=2),
    not_before=st.just(0) | ints,
    priority=st.just(0),
    key=st.none() | st.text(max_size=10),
    retry_of=st.none(),
    after=st.lists(st.integers(min_value=0, max_value=2**63 - 1), min_size=1, max_size=3).map(
        tuple
    ),
    resolves_to=st.none(),
)
tasks = payload_tasks | named_tasks | scheduled_tasks | tasks_after
claims_records: st.SearchStrategy[ClaimsRecord] = st.one_of(claims, renews, dones, fails)
records: st.SearchStrategy[Record] = st.one_of(claims_records, tasks)


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (``1 == True == 1.0`` does not count),
    floats compared bit for bit so that NaN equals itself and -0.0 differs from 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack(">d", a) == struct.pack(">d", b)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        # msgpack keeps a map's order, so compare item by item
        return len(a) == len(b) and all(
            same(ka, kb) and same(va, vb)
            for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    return bool(a == b)


def same_record(a: Record, b: Record) -> bool:
    return type(a) is type(b) and all(
        same(getattr(a, name), getattr(b, name)) for name in a._fields
    )


def items_of(record: Record) -> list[Any]:
    """The wire array of a record, as msgpack gives it back."""
    items = msgpack.unpackb(encode(record), raw=False, strict_map_key=False)
    assert isinstance(items, list)
    return items


def pack(value: Any) -> bytes:
    data: bytes = msgpack.packb(value, use_bin_type=True)
    return data


def decodes_or_refuses(data: bytes) -> None:
    """The contract for untrusted bytes: a record, or RecordDecodeError, and nothing else;
    and the claims topic's batch decoder makes of them what `decode_claims` makes."""
    for decoder in (decode, decode_task):
        with contextlib.suppress(RecordDecodeError):
            decoder(data)
    try:
        alone: ClaimsRecord | None = decode_claims(data)
    except RecordDecodeError:
        alone = None
    (batched,) = decode_claims_all([data])
    if alone is None or batched is None:
        assert batched is alone
    else:
        assert same_record(batched, alone)


# -- round trips -------------------------------------------------------------------------


@FAST
@given(records)
def test_every_record_round_trips(record: Record) -> None:
    assert same_record(decode(encode(record)), record)


@FAST
@given(claims_records)
def test_claims_records_round_trip_through_decode_claims(record: ClaimsRecord) -> None:
    assert same_record(decode_claims(encode(record)), record)


@FAST
@given(st.lists(claims_records, max_size=8), st.lists(st.binary(max_size=30), max_size=3))
def test_the_batch_decoder_decodes_each_record_as_decode_claims_does(
    records_: list[ClaimsRecord], junk: list[bytes]
) -> None:
    """A read's records decoded in one loop, well-formed and junk mixed: each one is what
    `decode_claims` makes of it alone, or None where that raises."""
    datas = [encode(r) for r in records_] + junk
    datas = datas[1::2] + datas[::2]  # interleave junk and records
    for data, batched in zip(datas, decode_claims_all(datas), strict=True):
        try:
            alone = decode_claims(data)
        except RecordDecodeError:
            assert batched is None
        else:
            assert batched is not None and same_record(batched, alone)


@FAST
@given(tasks)
def test_task_records_round_trip_through_decode_task(record: TaskRecord) -> None:
    assert same_record(decode_task(encode(record)), record)


@pytest.mark.parametrize(
    ("record", "wire"),
    [
        (Claim(3, "w1", 10, 20), [SCHEMA, "C", 3, "w1", 10, 20]),
        (Renew(3, "w1", 11, 7, 20), [SCHEMA, "R", 3, "w1", 11, 7, 20]),
        (Done(3, "w1", 12, 7, {"ok": [1]}), [SCHEMA, "D", 3, "w1", 12, 7, {"ok": [1]}]),
        (Fail(3, "w1", 13, 7, "boom", 99), [SCHEMA, "F", 3, "w1", 13, 7, "boom", 99]),
        (Fail(3, "w1", 13, 7, "boom", None), [SCHEMA, "F", 3, "w1", 13, 7, "boom", None]),
        (TaskRecord(b"\x00x", 5), [SCHEMA, "T", b"\x00x", 5]),
    ],
    ids=["claim", "renew", "done", "fail-retry", "fail-dead", "task"],
)
def test_the_wire_layout_is_the_documented_one(record: Record, wire: list[Any]) -> None:
    assert same(items_of(record), wire)


#: the integers at the edges of msgpack's forms (fixint, uint 8/16/32/64) and of the ints
#: the fast encoding packs itself (below 2^62), and a microsecond time
EDGE_INTS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**62 - 1, 2**62]
EDGE_INTS += [2**63 - 1, 2**63, 2**64 - 1, -1, -32, -33, -(2**63), 1_764_000_000_000_000]
#: worker ids: msgpack's fixstr holds up to 31 bytes, str8 up to 255 (é is two bytes)
EDGE_WORKERS = ["", "w", "w0-4711-9f3a", "x" * 31, "x" * 32, "é" * 16, "y" * 255, "y" * 256]


def generic_bytes(code: str, *fields: Any) -> bytes:
    """A record's bytes as msgpack packs its wire array (what `encode` wrote before it built
    a CLAIM and a no-op's DONE from bytes itself)."""
    return pack([SCHEMA, code, *fields])


@pytest.mark.parametrize("worker", EDGE_WORKERS)
@pytest.mark.parametrize("value", EDGE_INTS)
def test_claim_and_done_bytes_are_msgpacks_own(value: int, worker: str) -> None:
    """The CLAIM and the DONE of a no-op, built from bytes (`records._claim_bytes`): the
    same bytes msgpack makes, each integer field at each edge of its forms."""
    task = value if 0 <= value <= 2**63 - 1 else 5  # (a task id out of range: below)
    for other in (3, 1_764_000_000_000_000):
        for claim in (Claim(task, worker, value, other), Claim(task, worker, other, value)):
            assert encode(claim) == generic_bytes(CLAIM, *claim)
        for done in (Done(task, worker, value, other), Done(task, worker, other, value)):
            assert encode(done) == generic_bytes(DONE, *done)
    assert encode(Claim(value, worker, 1, 2)) == generic_bytes(CLAIM, value, worker, 1, 2)
    assert encode(Done(value, worker, 1, 2)) == generic_bytes(DONE, value, worker, 1, 2, None)


@FAST
@given(claims)
def test_any_claim_encodes_as_msgpack_packs_it(record: Claim) -> None:
    assert encode(record) == generic_bytes(CLAIM, *record)


@FAST
@given(st.builds(Done, task=task_ids, worker=workers, at=ints, claim=ints, result=st.none()))
def test_any_done_of_none_encodes_as_msgpack_packs_it(record: Done) -> None:
    assert encode(record) == generic_bytes(DONE, *record)


def test_a_done_without_a_result_carries_none() -> None:
    assert decode(encode(Done(1, "w", 2, 0))) == Done(1, "w", 2, 0, None)


def test_fail_dead_is_retry_at_none() -> None:
    assert Fail(1, "w", 2, 0, "e", None).dead
    assert not Fail(1, "w", 2, 0, "e", 0).dead


# -- untrusted input ---------------------------------------------------------------------


@FAST
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_record_decode_error(data: bytes) -> None:
    decodes_or_refuses(data)


@FAST
@given(msgpack_values)
def test_arbitrary_msgpack_values_decode_or_raise_record_decode_error(value: Any) -> None:
    decodes_or_refuses(pack(value))


junk_versions = st.one_of(
    st.integers(min_value=-3, max_value=3), st.booleans(), st.none(), st.text(max_size=2),
    st.floats(), st.lists(ints, max_size=2),
)  # fmt: skip
junk_codes = st.one_of(
    st.sampled_from(KNOWN_CODES), st.text(max_size=2), ints, st.none(), st.binary(),
    st.booleans(),
)  # fmt: skip


@FAST
@given(junk_versions, junk_codes, st.lists(msgpack_values, max_size=10))
def test_record_shaped_junk_decodes_or_raises_record_decode_error(
    version: Any, code: Any, rest: list[Any]
) -> None:
    decodes_or_refuses(pack([version, code, *rest]))


@FAST
@given(records, st.data())
def test_damaged_encodings_decode_or_raise_record_decode_error(
    record: Record, data: st.DataObject
) -> None:
    wire = bytearray(encode(record))
    how = data.draw(st.sampled_from(["truncate", "flip", "append", "insert"]))
    if how == "truncate":
        del wire[data.draw(st.integers(0, len(wire) - 1)) :]
    elif how == "flip":
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] ^= data.draw(st.integers(1, 255))
    elif how == "append":
        wire += data.draw(st.binary(min_size=1, max_size=8))
    else:
        i = data.draw(st.integers(0, len(wire)))
        wire[i:i] = data.draw(st.binary(min_size=1, max_size=8))
    decodes_or_refuses(bytes(wire))


@FAST
@given(st.binary(min_size=1, max_size=8))
def test_trailing_bytes_after_a_record_are_refused(extra: bytes) -> None:
    with pytest.raises(RecordDecodeError):
        decode(encode(Claim(1, "w", 2, 3)) + extra)


# Values of the wrong type for each kind of field. A bool is an int to Python, never to us.
not_ints = st.one_of(
    st.booleans(), st.floats(), st.text(max_size=5), st.binary(max_size=5), st.none(),
    st.lists(ints, max_size=2), st.dictionaries(ints, ints, max_size=2),
    ext_types, timestamps,
)  # fmt: skip
not_ints_nor_none = not_ints.filter(lambda v: v is not None)
not_strs = st.one_of(
    st.booleans(), ints, st.floats(), st.binary(max_size=5), st.none(),
    st.lists(st.text(max_size=2), max_size=2), ext_types,
)  # fmt: skip

# per record type: the strategy of a wrong value for each of its typed fields
# (payload and result take any value, so they have no wrong one)
WRONG: dict[str, dict[int, st.SearchStrategy[Any]]] = {
    CLAIM: {2: not_ints, 3: not_strs, 4: not_ints, 5: not_ints},
    RENEW: {2: not_ints, 3: not_strs, 4: not_ints, 5: not_ints, 6: not_ints},
    DONE: {2: not_ints, 3: not_strs, 4: not_ints, 5: not_ints},
    FAIL: {2: not_ints, 3: not_strs, 4: not_ints, 5: not_ints, 6: not_strs, 7: not_ints_nor_none},
    TASK: {3: not_ints},
    TASK_BY_NAME: {
        2: not_ints,
        3: not_strs,
        4: st.one_of(ints, st.text(max_size=3), st.none(), st.just({})),  # (not an array)
        5: st.one_of(ints, st.text(max_size=3), st.lists(ints, max_size=2), st.just({1: 2})),
    },
    TASK_SCHEDULED: {2: not_ints, 3: not_strs, 6: st.one_of(ints, st.text(max_size=3))},
    # (an "A" without "after", or with an empty or a non-id one, is malformed too)
    TASK_AFTER: {
        2: not_ints,
        6: st.one_of(
            ints,
            st.just({}),
            st.just({"after": []}),
            st.just({"after": [-1]}),
            st.just({"after": 3}),
            st.just({"after": ["x"]}),
        ),
    },
}
FIELD_COUNTS = {
    **{CLAIM: 6, RENEW: 7, DONE: 7, FAIL: 8, TASK: 4},
    **{TASK_BY_NAME: 6, TASK_SCHEDULED: 7, TASK_AFTER: 7},
}


@FAST
@given(records, st.data())
def test_a_field_of_the_wrong_type_is_refused(record: Record, data: st.DataObject) -> None:
    items = items_of(record)
    index = data.draw(st.sampled_from(sorted(WRONG[items[1]])))
    items[index] = data.draw(WRONG[items[1]][index])
    with pytest.raises(RecordDecodeError):
        decode(pack(items))


@FAST
@given(records, st.data())
def test_a_record_with_missing_fields_is_refused(record: Record, data: st.DataObject) -> None:
    items = items_of(record)
    keep = data.draw(st.integers(min_value=2, max_value=FIELD_COUNTS[items[1]] - 1))
    with pytest.raises(RecordDecodeError):
        decode(pack(items[:keep]))


@pytest.mark.parametrize(
    "value",
    [[], [1], "C", 7, None, {"type": "C"}, [True, "C", 1, "w", 2, 3], [0, "C", 1, "w", 2, 3],
     [-1, "C", 1, "w", 2, 3], [1.0, "C", 1, "w", 2, 3], ["1", "C", 1, "w", 2, 3],
     [1, 67, 1, "w", 2, 3], [1, b"C", 1, "w", 2, 3], [1, None]],
    ids=repr,
)  # fmt: skip
def test_things_that_are_not_records_are_refused(value: Any) -> None:
    with pytest.raises(RecordDecodeError):
        decode(pack(value))


def _nested(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "data",
    [
        # deeper than Python's recursion limit: quoting it in the error must not recurse
        pack([1, "C", _nested(1000), "w", 2, 3]),
        pack([1, "C", 1, _nested(1000, "w"), 2, 3]),
        pack([1, _nested(1000, "C")]),
        b"\x81\x00" * 1000 + b"\x00",  # {0: {0: ... }} a thousand deep, not an array
        b"\x91" * 100_000 + b"\x00",  # deeper than msgpack's own stack
        pack([1, "C", "x" * 1_000_000, "w", 2, 3]),  # a huge value, quoted in the message
    ],
    ids=["deep-task", "deep-worker", "deep-code", "deep-map", "deeper-than-msgpack", "huge"],
)
def test_deep_or_huge_junk_is_refused_with_a_short_message(data: bytes) -> None:
    with pytest.raises(RecordDecodeError) as caught:
        decode(data)
    assert len(str(caught.value)) < 300


def test_record_decode_error_chains_the_msgpack_error() -> None:
    with pytest.raises(RecordDecodeError) as caught:
        decode(b"\xc1")  # a byte msgpack never uses
    assert caught.value.__cause__ is not None
    assert isinstance(caught.value, ValueError)


# -- forward compatibility ---------------------------------------------------------------

unknown_codes = st.text(min_size=0, max_size=4).filter(lambda c: c not in KNOWN_CODES)


@FAST
@given(
    st.integers(min_value=1, max_value=2**32), unknown_codes, st.lists(msgpack_values, max_size=6)
)
def test_an_unknown_type_decodes_as_unknown(version: int, code: str, rest: list[Any]) -> None:
    data = pack([version, code, *rest])
    assert decode(data) == Unknown(code)
    assert decode_claims(data) == Unknown(code)
    assert decode_task(data) == Unknown(code)


@FAST
@given(records, st.lists(msgpack_values, min_size=1, max_size=5), st.integers(1, 1000))
def test_extra_trailing_fields_are_ignored(record: Record, extra: list[Any], version: int) -> None:
    items = items_of(record)
    items[0] = version  # a later schema that appended fields
    assert same_record(decode(pack(items + extra)), record)


# -- encoding errors ---------------------------------------------------------------------


def _self_containing() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


UNENCODABLE = [
    pytest.param(object(), id="object"),
    pytest.param({1, 2}, id="set"),
    pytest.param(1j, id="complex"),
    pytest.param(2**64, id="int-too-big"),
    pytest.param(-(2**63) - 1, id="int-too-small"),
    pytest.param(_self_containing(), id="self-containing-list"),
    pytest.param(_nested(2000), id="too-deep"),
    pytest.param("\ud800", id="lone-surrogate"),
    pytest.param(memoryview(b"abcdef")[::2], id="non-contiguous-buffer"),
    # packs, but a map keyed by an array cannot be decoded: it would stop every reader
    pytest.param({(1, 2): "x"}, id="tuple-key"),
    pytest.param([{"a": {(1,): 1}}], id="nested-tuple-key"),
]


@pytest.mark.parametrize("payload", UNENCODABLE)
def test_an_unencodable_payload_raises_record_encode_error(payload: Any) -> None:
    with pytest.raises(RecordEncodeError):
        encode(TaskRecord(payload, 0))


@pytest.mark.parametrize("result", UNENCODABLE)
def test_an_unencodable_result_raises_record_encode_error(result: Any) -> None:
    with pytest.raises(RecordEncodeError):
        encode(Done(0, "w", 1, 0, result))


@pytest.mark.parametrize(
    "record",
    [Claim(True, "w", 1, 2), Claim(1, "w", 2**64, 2), Fail(1, "w", 2, 0, "e", False)],
    ids=["bool-task", "at-too-big", "bool-retry-at"],
)
def test_fields_that_would_not_decode_back_raise_record_encode_error(record: Record) -> None:
    with pytest.raises(RecordEncodeError):
        encode(record)


def test_record_encode_error_is_a_value_error_with_its_cause() -> None:
    with pytest.raises(RecordEncodeError) as caught:
        encode(TaskRecord(object(), 0))
    assert isinstance(caught.value, ValueError)
    assert caught.value.__cause__ is not None


def test_a_tuple_payload_comes_back_as_a_list() -> None:
    # msgpack has one array type: documented lossy mapping, not an error
    decoded = decode(encode(TaskRecord((1, 2), 0)))
    assert isinstance(decoded, TaskRecord)
    assert same(decoded.payload, [1, 2])


# -- the topic-specific decoders -----------------------------------------------------------


def test_decode_claims_rejects_a_task() -> None:
    with pytest.raises(RecordDecodeError, match="TASK"):
        decode_claims(encode(TaskRecord("payload", 1)))


@pytest.mark.parametrize(
    "record",
    [Claim(1, "w", 2, 3), Renew(1, "w", 2, 0, 3), Done(1, "w", 2, 0), Fail(1, "w", 2, 0, "e", 5)],
    ids=["claim", "renew", "done", "fail"],
)
def test_decode_task_rejects_a_claims_record(record: ClaimsRecord) -> None:
    with pytest.raises(RecordDecodeError, match=type(record).__name__):
        decode_task(encode(record))


def test_floats_round_trip_bit_for_bit() -> None:
    for value in (math.nan, -0.0, math.inf, 5e-324):
        decoded = decode(encode(TaskRecord(value, 0)))
        assert isinstance(decoded, TaskRecord)
        assert same(decoded.payload, value)
