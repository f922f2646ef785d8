"""The claims records' C decoder (queue_worker/protocol/_cdecode.c, loaded by
queue_worker.protocol.cdecode)
against the Python loop it replaces (`records.decode_claims_py`), on generated, hand-packed,
truncated and hostile payloads: the same records, of the same types, and for a malformed one
the same None (and so the same error from `decode_claims`, which callers ask for the reason).

Needs the install's C build (setup.py); skipped without one (CI checks that it was built).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore import Entry
from queue_worker import topics
from queue_worker.protocol import cdecode, records
from queue_worker.protocol.records import (
    CLAIM,
    DONE,
    FAIL,
    RENEW,
    SCHEMA,
    TASK,
    Claim,
    ClaimsRecord,
    Done,
    decode_claims_py,
    encode,
)
from tests.examples import examples
from tests.test_records import msgpack_values
from tests.test_records import records as any_records

SETTINGS = settings(max_examples=examples(300), deadline=None)
C_MODULE = records._c_module()
C_DECODE: records.ClaimsDecoder | None = None if C_MODULE is None else C_MODULE.decode_claims_all
C_ENTRIES: records.EntriesDecoder | None = (
    None if C_MODULE is None else C_MODULE.decode_claims_entries
)


def plain(value: Any) -> Any:
    """Records, outcomes, leases, snapshots as (class name, fields); enums by value."""
    if hasattr(value, "_fields"):
        return (type(value).__name__, *(plain(v) for v in value))
    if isinstance(value, list | tuple):
        return (type(value).__name__, *(plain(v) for v in value))
    if hasattr(value, "value") and type(value).__name__ == "Verdict":
        return ("Verdict", value.value)
    # by repr: a NaN (or a map keyed by one) equals itself, and 1, 1.0 and True differ
    return (type(value).__name__, repr(value))


def record_bytes() -> st.SearchStrategy[bytes]:
    """Claims-topic bytes: well-formed records, near misses of the C decoder's common
    records (a field of the wrong type, too few items, an unknown code), and junk."""
    code = st.sampled_from([CLAIM, DONE, RENEW, FAIL, TASK, "X", 7])
    field = st.one_of(
        st.integers(min_value=-(2**63), max_value=2**64 - 1),  # what msgpack packs
        st.booleans(),
        st.text(max_size=4),
        st.none(),
        msgpack_values,
    )
    near = st.builds(
        lambda version, c, fields: [version, c, *fields],
        st.sampled_from([SCHEMA, SCHEMA, 0, 2, True, "1"]),
        code,
        st.lists(field, max_size=9),
    )
    return st.one_of(any_records.map(packed), near.map(packed), st.binary(max_size=40))


def packed(value: Any) -> bytes:
    """A record's or a list's bytes (b"" for the few values msgpack refuses)."""
    try:
        if hasattr(value, "_fields"):
            return records.encode(value)
        data: bytes = msgpack.packb(value, use_bin_type=True)
        return data
    except (records.RecordEncodeError, ValueError, TypeError, OverflowError):
        return b""


@pytest.fixture(autouse=True)
def c_decoder_built() -> None:
    if C_DECODE is None:
        pytest.skip(f"the C claims decoder is not in use: {cdecode.status()}")


def c_decode(
    datas: Any, fallback: Callable[[bytes], ClaimsRecord | None] | None = None
) -> list[ClaimsRecord | None]:
    assert C_DECODE is not None
    return C_DECODE(datas, Claim, Done, fallback or records._claims_or_none)


def same(datas: list[bytes]) -> None:
    """The C decoder and the Python loop agree on `datas`, value and type of every field."""
    ours, theirs = c_decode(datas), decode_claims_py(datas)
    assert [plain(r) for r in ours] == [plain(r) for r in theirs]
    assert [type(r) for r in ours] == [type(r) for r in theirs]


# -- hand-packed msgpack: every encoding of every field, not only the minimal one -----------


def packed_int(value: int, form: str) -> bytes:
    """`value` in the msgpack integer encoding `form`, or the minimal one if it does not fit."""
    forms = {
        "u8": (0xCC, ">B"),
        "u16": (0xCD, ">H"),
        "u32": (0xCE, ">I"),
        "u64": (0xCF, ">Q"),
        "i8": (0xD0, ">b"),
        "i16": (0xD1, ">h"),
        "i32": (0xD2, ">i"),
        "i64": (0xD3, ">q"),
    }
    if form in forms:
        head, fmt = forms[form]
        try:
            return bytes([head]) + struct.pack(fmt, value)
        except struct.error:
            pass
    data: bytes = msgpack.packb(value)
    return data


def packed_str(raw: bytes, form: str) -> bytes:
    """`raw` as an msgpack str (UTF-8 or not) in `form`, or as bin."""
    n = len(raw)
    if form == "fix" and n < 32:
        return bytes([0xA0 | n]) + raw
    if form == "8" and n < 256:
        return bytes([0xD9, n]) + raw
    if form == "16":
        return b"\xda" + struct.pack(">H", n) + raw
    if form == "bin":
        return bytes([0xC4, n]) + raw if n < 256 else b"\xc0"
    return b"\xdb" + struct.pack(">I", n) + raw


int_forms = st.sampled_from(["min", "min", "u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64"])
str_forms = st.sampled_from(["fix", "fix", "8", "16", "32", "bin"])
ints = st.one_of(
    st.integers(-40, 300),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, -(2**63), -1, 0, 127, 128]),
)
worker_bytes = st.one_of(
    st.text(max_size=40).map(lambda s: s.encode()),
    st.text(max_size=300).map(lambda s: s.encode()),
    st.binary(max_size=8),  # often not UTF-8
    st.sampled_from([b"w0-1000-beef", b"w1-1001-beef", b"\xed\xa0\x80", b"\xc3"]),
)


@st.composite
def int_field(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 20)) == 0:  # now and then not an integer at all
        return draw(st.sampled_from([b"\xc3", b"\xc0", b"\xa11", b"\xcb" + bytes(8)]))
    return packed_int(draw(ints), draw(int_forms))


@st.composite
def result_field(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return packed_int(draw(ints), draw(int_forms))
    if kind == 1:
        return packed_str(draw(worker_bytes), draw(str_forms))
    if kind == 2:
        single = draw(st.floats(width=32))
        return b"\xca" + struct.pack(">f", single)
    value = draw(st.one_of(st.none(), st.booleans(), st.floats(), msgpack_values))
    try:
        data: bytes = msgpack.packb(value, use_bin_type=True)
    except (ValueError, TypeError, OverflowError):
        return b"\xc0"
    return data


@st.composite
def hand_packed(draw: st.DrawFn) -> bytes:
    """A well-formed CLAIM or DONE, each field in any of its encodings, with up to two
    changes that make it another record, a near miss or junk (cut short, bytes after it, a
    byte overwritten)."""
    code = draw(st.sampled_from(["C", "D"]))
    count = 6 if code == "C" else 7
    version, version_form, code_form, head = 1, "min", "fix", "fix"
    changes = draw(
        st.sets(
            st.sampled_from(["version", "code", "count", "code form", "head", "damage"]),
            max_size=2,
        )
    )
    if "version" in changes:
        version = draw(st.sampled_from([0, 2, 127, 128, -1, 1]))
        version_form = draw(int_forms)
    if "code" in changes:
        code = draw(
            st.sampled_from(["R", "F", "T", "X", "CD", "", "c", "D" if code == "C" else "C"])
        )
    if "count" in changes:
        count = draw(st.sampled_from([0, 2, 5, 6, 7, 8]))
    if "code form" in changes:
        code_form = draw(str_forms)
    if "head" in changes:
        head = "16"
    fields = [
        packed_int(version, version_form),
        packed_str(code.encode(), code_form),
        draw(int_field()),
        packed_str(draw(worker_bytes), draw(str_forms)),
        draw(int_field()),
        draw(int_field()),
        draw(result_field()),
        draw(result_field()),
    ][:count]
    count = min(count, len(fields))
    prefix = bytes([0x90 | count]) if head == "fix" else b"\xdc" + struct.pack(">H", count)
    data = bytearray(prefix + b"".join(fields))
    if "damage" in changes:
        damage = draw(st.sampled_from(["cut", "extra", "flip"]))
        if damage == "cut":
            del data[draw(st.integers(0, len(data) - 1)) :]
        elif damage == "extra":
            data += draw(st.binary(min_size=1, max_size=4))
        else:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


@SETTINGS
@given(st.lists(hand_packed(), max_size=12))
def test_hand_packed_records_decode_as_the_python_does(datas: list[bytes]) -> None:
    same(datas)


@SETTINGS
@given(st.lists(record_bytes(), max_size=12))
def test_generated_records_and_junk_decode_as_the_python_does(datas: list[bytes]) -> None:
    same(datas)


@SETTINGS
@given(st.lists(record_bytes() | hand_packed(), min_size=1, max_size=6), st.data())
def test_every_truncation_decodes_as_the_python_does(datas: list[bytes], data: Any) -> None:
    whole = data.draw(st.sampled_from(datas))
    same([whole[:cut] for cut in range(len(whole) + 1)])


# -- the fast path is taken, and nothing it keeps outlives what it points into ----------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(),
    st.text(max_size=300),
)
workers = st.text(min_size=0, max_size=300)
task_ids = st.integers(0, records.MAX_TASK_ID)
times = st.integers(min_value=-(2**63), max_value=2**64 - 1)
common = st.one_of(
    st.builds(Claim, task_ids, workers, times, times),
    st.builds(Done, task_ids, workers, times, times, scalars),
)


@SETTINGS
@given(st.lists(common, max_size=20))
def test_the_common_records_never_reach_the_python(written: list[ClaimsRecord]) -> None:
    """A well-formed CLAIM or DONE with a scalar result, as `encode` writes it, is built in C
    (the fallback is never called) and equals what was written."""
    handed_back: list[bytes] = []

    def fallback(data: bytes) -> ClaimsRecord | None:
        handed_back.append(data)
        return records._claims_or_none(data)

    decoded = c_decode([encode(r) for r in written], fallback)
    assert handed_back == []
    assert [plain(r) for r in decoded] == [plain(r) for r in written]
    assert [type(r) for r in decoded] == [type(r) for r in written]


#: results as msgpack's defaults decode them (maps keyed by str or bin, no ext)
plain_results = st.recursive(
    st.one_of(scalars, st.binary(max_size=20)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.text(max_size=10) | st.binary(max_size=4), inner, max_size=5),
    ),
    max_leaves=20,
)


@SETTINGS
@given(st.lists(st.builds(Done, task_ids, workers, times, times, plain_results), max_size=10))
def test_a_done_of_any_plain_result_never_reaches_the_python(written: list[Done]) -> None:
    """A DONE whose result is lists, maps keyed by str or bin and scalars (a drain's
    `{"task": 0, "worked_ms": 0}`) is built in C too, and equals what was written."""
    handed_back: list[bytes] = []

    def fallback(data: bytes) -> ClaimsRecord | None:
        handed_back.append(data)
        return records._claims_or_none(data)

    blobs = [encode(r) for r in written]
    decoded = c_decode(blobs, fallback)
    assert handed_back == []
    assert [plain(r) for r in decoded] == [plain(r) for r in written]
    assert [plain(r) for r in decoded] == [plain(r) for r in decode_claims_py(blobs)]


@pytest.mark.parametrize(
    "result",
    [
        {1: "int key"},  # msgpack's strict_map_key refuses it: the Python decodes it again
        {"a": msgpack.ExtType(5, b"x")},
        [msgpack.Timestamp(1, 2)],
        "nested",  # 40 levels deep (below)
        [b"\xff" * 3, {"k": b"bin"}],
    ],
)
def test_a_result_the_c_does_not_build_is_the_pythons(result: Any) -> None:
    if result == "nested":
        for _ in range(40):
            result = [result]
    data = msgpack.packb([1, "D", 3, "w", 4, 5, result], use_bin_type=True)
    cut = [data[:n] for n in range(len(data))]
    same([data, *cut])


def test_payloads_freed_while_decoding_and_many_workers() -> None:
    """Each payload a fresh object dropped after its record is built, 40 workers (more than
    the C decoder's cache of worker names holds), each seen many times."""
    written = [
        Claim(i, f"w{i % 40}-é-{i % 40 * 7}", i, 5) if i % 2 else Done(i, f"w{i % 40}", i, 3, "ok")
        for i in range(4000)
    ]
    blobs = [encode(r) for r in written]

    def fresh() -> Iterator[bytes]:
        for blob in blobs:
            yield bytes(bytearray(blob))  # a new bytes object, released once decoded

    assert c_decode(fresh()) == written
    assert c_decode(fresh()) == decode_claims_py(blobs)


def test_bad_arguments_are_refused() -> None:
    assert C_DECODE is not None
    with pytest.raises(TypeError):
        C_DECODE([], int, Done, records._claims_or_none)
    with pytest.raises(TypeError):
        C_DECODE([], Claim, Done, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        C_DECODE(5, Claim, Done, records._claims_or_none)  # type: ignore[arg-type]


def test_an_error_in_the_fallback_propagates() -> None:
    def fallback(data: bytes) -> ClaimsRecord | None:
        raise KeyError(data)

    with pytest.raises(KeyError):
        c_decode([encode(Claim(1, "w", 2, 3)), b"\xc1"], fallback)


# -- entries: records, positions, server times in one pass ------------------------------------

any_payloads = record_bytes() | hand_packed() | common.map(encode)


@st.composite
def entry_lists(draw: st.DrawFn) -> list[Entry]:
    """A read's entries: any payloads, increasing positions, now and then a server time."""
    datas = draw(st.lists(any_payloads, max_size=20))
    stamped = draw(st.booleans())
    times = st.none() | st.integers(0, 2**62) if stamped else st.none()
    position = draw(st.integers(0, 2**62))
    entries = []
    for data in datas:
        step = draw(st.integers(1, 2**20))
        entries.append(Entry(position, position + step, data, draw(times)))
        position += step
    return entries


@SETTINGS
@given(entry_lists())
def test_entries_decode_as_the_python_does(entries: list[Entry]) -> None:
    assert C_ENTRIES is not None
    ours = C_ENTRIES(entries, Claim, Done, records._claims_or_none)
    theirs = records.decode_claims_entries_py(entries)
    assert [plain(r) for r in ours[0]] == [plain(r) for r in theirs[0]]
    assert [type(r) for r in ours[0]] == [type(r) for r in theirs[0]]
    assert ours[1:] == theirs[1:]
    # (by `plain`: a DONE's result may be a NaN, which equals nothing, itself included)
    assert plain(records.decode_claims_entries(entries)) == plain(ours)


def test_entries_of_the_wrong_shape_are_refused() -> None:
    assert C_ENTRIES is not None
    data = encode(Claim(1, "w", 2, 3))
    with pytest.raises(TypeError):
        C_ENTRIES((Entry(0, 1, data),), Claim, Done, records._claims_or_none)
    with pytest.raises(TypeError):
        C_ENTRIES([Entry(0, 1, data), (0, 1, data)], Claim, Done, records._claims_or_none)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        C_ENTRIES([Entry(0, 1, data)], Claim, int, records._claims_or_none)


# -- a follower folds the same with either decoder --------------------------------------------


@SETTINGS
@given(entry_lists())
def test_a_follower_folds_the_same_with_either_decoder(entries: list[Entry]) -> None:
    # The C decoders' module taken away in place: a compiled follower calls the compiled
    # `decode_claims_entries` directly, not through the module attribute a patch replaces.
    loaded = records._C_LOADED[:]
    records._C_LOADED[:] = [None]
    try:
        python = topics.ClaimsFollower(0)
        python.fold_entries(entries)
    finally:
        records._C_LOADED[:] = loaded
    ours = topics.ClaimsFollower(0)
    ours.fold_entries(entries)
    assert (ours.malformed, ours.last_malformed) == (python.malformed, python.last_malformed)
    assert plain(ours.state.snapshot()) == plain(python.state.snapshot())
