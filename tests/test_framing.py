"""The frame format, decoded from plain bytes: round trips, torn tails, corruption."""

from __future__ import annotations

import itertools
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.base import CorruptLogError, Entry, ForeignFileError
from logstore.file.framing import (
    FILE_HEADER_SIZE,
    FRAME_HEADER_SIZE,
    MAX_RECORD,
    Decoded,
    Stop,
    Walk,
    decode_file_header,
    decode_frames,
    encode_batch,
    encode_file_header,
    encode_frame,
    peek_frame,
    scan_frames,
    walk_frames,
)
from tests.examples import examples

PATH = "/data/claims.log"
MAX = 1000

records = st.binary(max_size=40)
batches = st.lists(st.lists(records, min_size=1, max_size=3), max_size=6)


def build(batch_list: list[list[bytes]]) -> bytes:
    return encode_file_header(MAX) + b"".join(encode_batch(b) for b in batch_list)


def decode(buf: bytes, *, at_eof: bool = True, limit: int | None = None) -> Decoded:
    """Decode the frames of a whole file image (header included)."""
    return decode_frames(
        buf[FILE_HEADER_SIZE:],
        FILE_HEADER_SIZE,
        at_eof=at_eof,
        max_record=MAX,
        path=PATH,
        limit=limit,
    )


def batch_ends(batch_list: list[list[bytes]]) -> list[int]:
    """The file offset just after each batch."""
    ends, at = [], FILE_HEADER_SIZE
    for batch in batch_list:
        at += sum(FRAME_HEADER_SIZE + len(r) for r in batch)
        ends.append(at)
    return ends


def frame_starts(batch_list: list[list[bytes]]) -> list[int]:
    starts, at = [], FILE_HEADER_SIZE
    for record in itertools.chain.from_iterable(batch_list):
        starts.append(at)
        at += FRAME_HEADER_SIZE + len(record)
    return starts


def test_the_docstring_example_is_the_real_encoding() -> None:
    image = encode_file_header(MAX_RECORD, bytes(range(16)), "tasks") + encode_frame(b"hi")
    assert image == bytes.fromhex(
        "51 57 4c 4f 47 02 00 00 00 00 00 01"
        "00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f"
        "74 61 73 6b 73 00 00 00 00 00 00 00 00 00 00 00"
        "88 93 b7 31"
        "02 00 00 00 fd ff ff ff 2e 48 a5 ea 68 69"
    )
    found = decode_frames(image[48:], 48, at_eof=True, max_record=MAX_RECORD, path=PATH)
    assert [(e.position, e.next, e.data) for e in found.entries] == [(48, 62, b"hi")]


@given(batches)
def test_round_trip(batch_list: list[list[bytes]]) -> None:
    image = build(batch_list)
    found = decode(image)
    flat = list(itertools.chain.from_iterable(batch_list))
    assert [e.data for e in found.entries] == flat
    assert [e.position for e in found.entries] == frame_starts(batch_list)
    for before, after in itertools.pairwise(found.entries):
        assert before.next == after.position
    assert found.stop is Stop.CLEAN
    assert FILE_HEADER_SIZE + found.consumed == len(image)


@given(batches, st.integers(min_value=1, max_value=5))
def test_a_limit_returns_a_prefix_and_decoding_resumes_from_consumed(
    batch_list: list[list[bytes]], limit: int
) -> None:
    image = build(batch_list)
    flat = list(itertools.chain.from_iterable(batch_list))
    seen: list[bytes] = []
    at = FILE_HEADER_SIZE
    while True:
        found = decode_frames(image[at:], at, at_eof=True, max_record=MAX, path=PATH, limit=limit)
        assert len(found.entries) <= limit
        seen += [e.data for e in found.entries]
        at += found.consumed
        if not found.entries:
            break
    assert seen == flat


@settings(max_examples=examples(60))
@given(batches)
def test_every_truncation_decodes_as_a_prefix_of_whole_batches(
    batch_list: list[list[bytes]],
) -> None:
    image = build(batch_list)
    ends = batch_ends(batch_list)
    for cut in range(FILE_HEADER_SIZE, len(image) + 1):
        whole = [i for i, end in enumerate(ends) if end <= cut]
        expected = list(itertools.chain.from_iterable(batch_list[: len(whole)]))
        boundary = cut == FILE_HEADER_SIZE or cut in ends
        found = decode(image[:cut], at_eof=True)
        assert [e.data for e in found.entries] == expected
        assert found.stop is (Stop.CLEAN if boundary else Stop.TORN_TAIL)
        unread = decode(image[:cut], at_eof=False)
        assert [e.data for e in unread.entries] == expected
        assert unread.stop is (Stop.CLEAN if boundary else Stop.NEED_DATA)
        if not boundary:  # the hint asks for more than the buffer holds from `consumed`
            assert unread.needed > cut - FILE_HEADER_SIZE - unread.consumed


@settings(max_examples=examples(60))
@given(batches, st.integers(min_value=1, max_value=40))
def test_a_truncation_padded_with_zeros_is_a_torn_tail(
    batch_list: list[list[bytes]], zeros: int
) -> None:
    # A power cut can leave the file longer than what was written, the rest zero-filled.
    image = build(batch_list)
    ends = batch_ends(batch_list)
    flat = list(itertools.chain.from_iterable(batch_list))
    for cut in range(FILE_HEADER_SIZE, len(image) + 1):
        found = decode(image[:cut] + bytes(zeros), at_eof=True)
        data = [e.data for e in found.entries]
        complete = sum(len(b) for b, end in zip(batch_list, ends, strict=True) if end <= cut)
        # zero padding may complete a record whose missing bytes were zeros: still a prefix
        assert data == flat[: len(data)]
        assert len(data) >= complete
        # CLEAN only when the zeros happened to complete the last frame exactly
        assert found.stop in (Stop.TORN_TAIL, Stop.CLEAN)


@given(
    batches.filter(lambda b: sum(map(len, b)) >= 2),
    st.data(),
)
def test_a_flipped_byte_before_the_last_frame_is_corruption_at_that_frame(
    batch_list: list[list[bytes]], data: st.DataObject
) -> None:
    image = bytearray(build(batch_list))
    starts = frame_starts(batch_list)
    victim = data.draw(st.integers(min_value=0, max_value=len(starts) - 2), label="frame")
    start, end = starts[victim], starts[victim + 1]
    offset = data.draw(st.integers(min_value=start, max_value=end - 1), label="byte")
    image[offset] ^= data.draw(st.integers(min_value=1, max_value=255), label="xor")
    at = FILE_HEADER_SIZE
    with pytest.raises(CorruptLogError) as caught:
        for _ in range(len(starts) + 1):
            found = decode_frames(
                bytes(image[at:]), at, at_eof=True, max_record=MAX, path=PATH, limit=None
            )
            assert found.stop is Stop.DAMAGED  # good records first; the next decode raises
            assert all(e.position < start for e in found.entries)
            at += found.consumed
    assert caught.value.offset == start
    assert caught.value.path == PATH
    assert f"{PATH}: corrupt record at byte offset {start}" in str(caught.value)
    with pytest.raises(CorruptLogError) as scanned:
        scan_frames(
            bytes(image[FILE_HEADER_SIZE:]),
            FILE_HEADER_SIZE,
            at_eof=True,
            max_record=MAX,
            path=PATH,
        )
    assert scanned.value.offset == start


def test_a_frame_with_a_bad_checksum_ending_at_eof_is_a_torn_tail() -> None:
    image = bytearray(build([[b"one"], [b"two"]]))
    image[-1] ^= 0xFF
    found = decode(bytes(image))
    assert [e.data for e in found.entries] == [b"one"]
    assert found.stop is Stop.TORN_TAIL
    # not known to be the end of the file: one more byte decides
    unread = decode(bytes(image), at_eof=False)
    assert unread.stop is Stop.NEED_DATA
    assert unread.needed == FRAME_HEADER_SIZE + 3 + 1
    # followed by anything non-zero it is corruption: "one" first, then the error
    damaged = decode(bytes(image) + b"\x01")
    assert [e.data for e in damaged.entries] == [b"one"]
    assert damaged.stop is Stop.DAMAGED
    second = FILE_HEADER_SIZE + damaged.consumed
    assert second == FILE_HEADER_SIZE + FRAME_HEADER_SIZE + 3
    with pytest.raises(CorruptLogError) as caught:
        decode_frames(
            bytes(image[second:]) + b"\x01", second, at_eof=True, max_record=MAX, path=PATH
        )
    assert caught.value.offset == second


@pytest.mark.parametrize("length", [MAX + 1, 0x7FFF_FFFF])
def test_an_invalid_length_followed_by_zeros_is_a_torn_tail(length: int) -> None:
    word = length.to_bytes(4, "little")
    bad = word + bytes(b ^ 0xFF for b in word) + b"\0\0\0\0"
    image = build([[b"ok"]]) + bad + bytes(100)
    found = decode(image)
    assert [e.data for e in found.entries] == [b"ok"]
    assert found.stop is Stop.TORN_TAIL
    assert decode(image, at_eof=False).stop is Stop.NEED_DATA
    assert decode(image, at_eof=False).needed == 0  # zeros to the end of the buffer: read it all
    with pytest.raises(CorruptLogError, match="exceeds max"):
        decode(build([]) + bad + bytes(10) + b"x")


def test_a_zero_filled_tail_is_torn_and_an_empty_record_is_valid() -> None:
    image = build([[b""], [b"", b"x"]])
    assert [e.data for e in decode(image).entries] == [b"", b"", b"x"]
    found = decode(image + bytes(FRAME_HEADER_SIZE * 3))
    assert found.stop is Stop.TORN_TAIL
    assert FILE_HEADER_SIZE + found.consumed == len(image)
    with pytest.raises(CorruptLogError, match="check word"):
        decode(build([]) + bytes(FRAME_HEADER_SIZE) + encode_frame(b"after"))


def test_an_incomplete_batch_is_not_returned() -> None:
    image = build([[b"a"], [b"b", b"c", b"d"]])
    cut = len(image) - 2  # inside the last frame of the second batch
    found = decode(image[:cut])
    assert [e.data for e in found.entries] == [b"a"]
    assert found.stop is Stop.TORN_TAIL
    assert FILE_HEADER_SIZE + found.consumed == batch_ends([[b"a"]])[0]


def test_a_limit_inside_a_batch_verifies_the_whole_batch() -> None:
    image = build([[b"a", b"b", b"c"]])
    found = decode(image, limit=2)
    assert [e.data for e in found.entries] == [b"a", b"b"]
    assert found.consumed == found.entries[-1].next - FILE_HEADER_SIZE
    assert FILE_HEADER_SIZE + found.verified == len(image)


def test_peek_and_walk_read_headers_only() -> None:
    image = build([[b"a"], [b"bb", b"ccc"], [b"dddd"]])
    frames = image[FILE_HEADER_SIZE:]
    assert peek_frame(frames, MAX) == (FRAME_HEADER_SIZE + 1, False)
    assert peek_frame(frames[13:], MAX) == (FRAME_HEADER_SIZE + 2, True)
    assert peek_frame(bytes(FRAME_HEADER_SIZE), MAX) is None
    h = FILE_HEADER_SIZE
    a, b, c, d = h, h + 13, h + 13 + 14, h + 13 + 14 + 15  # frame starts
    end = len(image)

    def walk(cut: int) -> Walk:
        return walk_frames(
            image[FILE_HEADER_SIZE:cut], FILE_HEADER_SIZE, MAX, FILE_HEADER_SIZE, FILE_HEADER_SIZE
        )

    assert walk(end) == Walk(end=end, open_batch=end, last_batch=d)
    assert walk(end - 1) == Walk(end=d, open_batch=d, last_batch=b)  # inside the last frame
    assert walk(c + 1) == Walk(end=c, open_batch=b, last_batch=a)  # inside the second batch
    # a bad payload is not noticed: walking trusts whole frames with valid headers
    damaged = bytearray(image)
    damaged[-1] ^= 1
    assert (
        walk_frames(
            bytes(damaged[FILE_HEADER_SIZE:]),
            FILE_HEADER_SIZE,
            MAX,
            FILE_HEADER_SIZE,
            FILE_HEADER_SIZE,
        ).end
        == end
    )
    # a walk resumed in the middle of a batch keeps the batch's start
    assert walk_frames(image[c:], c, MAX, b, a) == Walk(end=end, open_batch=end, last_batch=d)
    assert walk_frames(image[c:d], c, MAX, b, a) == Walk(end=d, open_batch=d, last_batch=b)


def test_file_header_round_trip_and_foreign_files() -> None:
    queue = bytes(range(16))
    assert decode_file_header(encode_file_header(1234, queue, "claims"), PATH) == (
        1234,
        queue,
        "claims",
    )
    good = encode_file_header(MAX)
    with pytest.raises(ForeignFileError, match="is not a qw log"):
        decode_file_header(b"hello world, this is text", PATH)
    with pytest.raises(ForeignFileError, match="shorter than"):
        decode_file_header(good[:10], PATH)
    with pytest.raises(ForeignFileError, match="checksum"):
        decode_file_header(good[:9] + b"\x77" + good[10:], PATH)
    newer = bytearray(good[:44])
    newer[5] = 3
    with pytest.raises(ForeignFileError, match="version 3; this code reads version 2"):
        decode_file_header(bytes(newer) + zlib.crc32(newer).to_bytes(4, "little"), PATH)
    # the 16-byte header of version 1 (no identity): refused, naming both versions
    older = bytearray(good[:12])
    older[5] = 1
    with pytest.raises(
        ForeignFileError, match=f"{PATH}: qw log format version 1 .*reads version 2"
    ):
        decode_file_header(bytes(older) + zlib.crc32(older).to_bytes(4, "little"), PATH)
    with pytest.raises(ValueError, match="out of range"):
        encode_file_header(-1)


# -- a prefix the reader has verified before --------------------------------------------------


def frame_ends(batch_list: list[list[bytes]]) -> list[int]:
    """The file offset just after each frame."""
    ends, at = [], FILE_HEADER_SIZE
    for record in itertools.chain.from_iterable(batch_list):
        at += FRAME_HEADER_SIZE + len(record)
        ends.append(at)
    return ends


@settings(max_examples=examples(60))
@given(batches.filter(bool), st.data())
def test_frames_before_the_verified_offset_come_back_without_the_rest_of_their_batch(
    batch_list: list[list[bytes]], data: st.DataObject
) -> None:
    # The reader vouches for whole batches up to `verified` (a batch boundary): a frame that
    # ends there or before is returned as soon as it is in the buffer; past it, a batch is
    # returned only when it is whole, as without `verified`.
    image = build(batch_list)
    flat = list(itertools.chain.from_iterable(batch_list))
    ends = frame_ends(batch_list)
    batch_of_frame = [i for i, batch in enumerate(batch_list) for _ in batch]
    bends = batch_ends(batch_list)
    verified = data.draw(st.sampled_from([FILE_HEADER_SIZE, *bends]), label="verified")
    cut = data.draw(st.integers(FILE_HEADER_SIZE, len(image)), label="cut")
    limit = data.draw(st.none() | st.integers(1, 8), label="limit")
    found = decode_frames(
        image[FILE_HEADER_SIZE:cut],
        FILE_HEADER_SIZE,
        at_eof=False,
        max_record=MAX,
        path=PATH,
        limit=limit,
        verified=verified - FILE_HEADER_SIZE,
    )
    returnable = [
        i
        for i, end in enumerate(ends)
        if end <= cut and (end <= verified or bends[batch_of_frame[i]] <= cut)
    ]
    expected = returnable if limit is None else returnable[:limit]
    assert [e.data for e in found.entries] == [flat[i] for i in expected]
    assert [e.next for e in found.entries] == [ends[i] for i in expected]
    at = found.entries[-1].next if found.entries else FILE_HEADER_SIZE
    assert FILE_HEADER_SIZE + found.consumed == at
    assert found.stop in (Stop.CLEAN, Stop.NEED_DATA)
    if found.stop is Stop.NEED_DATA:  # and it asks for more than the buffer holds
        assert found.needed > cut - at


def test_a_verified_batch_is_returned_a_frame_at_a_time_from_a_buffer_cut_inside_it() -> None:
    image = build([[b"one", b"two", b"three", b"four"]])
    frames = image[FILE_HEADER_SIZE:]
    cut = 3 * FRAME_HEADER_SIZE + len(b"one") + len(b"two") + 2  # inside "three"
    # not verified: nothing of the batch until all of it is there
    assert decode(image[: FILE_HEADER_SIZE + cut], at_eof=False).entries == []
    found = decode_frames(
        frames[:cut],
        FILE_HEADER_SIZE,
        at_eof=False,
        max_record=MAX,
        path=PATH,
        verified=len(frames),
    )
    assert [e.data for e in found.entries] == [b"one", b"two"]
    assert found.stop is Stop.NEED_DATA
    assert found.consumed == found.verified == 2 * FRAME_HEADER_SIZE + 6
    assert found.needed == FRAME_HEADER_SIZE + len(b"three")  # only the frame it is in
    one = decode_frames(
        frames, FILE_HEADER_SIZE, at_eof=True, max_record=MAX, path=PATH, limit=1, verified=999
    )
    assert [e.data for e in one.entries] == [b"one"]
    assert one.consumed == one.verified == FRAME_HEADER_SIZE + 3  # decoded no further


def test_a_damaged_frame_before_the_verified_offset_is_still_damage() -> None:
    # Vouching spares reading to the end of a batch, not the checksum of a frame returned.
    image = bytearray(build([[b"aaa", b"bbb", b"ccc", b"ddd"]]))
    second = FILE_HEADER_SIZE + FRAME_HEADER_SIZE + 3
    image[second + FRAME_HEADER_SIZE] ^= 0x20  # a payload byte of "bbb"
    frames = bytes(image[FILE_HEADER_SIZE:])
    found = decode_frames(
        frames, FILE_HEADER_SIZE, at_eof=True, max_record=MAX, path=PATH, verified=len(frames)
    )
    assert [e.data for e in found.entries] == [b"aaa"]
    assert found.stop is Stop.DAMAGED
    with pytest.raises(CorruptLogError, match="payload checksum mismatch") as caught:
        decode_frames(
            frames[found.consumed :],
            second,
            at_eof=True,
            max_record=MAX,
            path=PATH,
            verified=len(frames) - found.consumed,
        )
    assert caught.value.offset == second


def test_walk_with_check_stops_at_a_bad_checksum() -> None:
    image = bytearray(build([[b"a"], [b"bb", b"ccc"], [b"dddd"]]))
    h = FILE_HEADER_SIZE
    a, b, c, d = h, h + 13, h + 13 + 14, h + 13 + 14 + 15
    assert walk_frames(
        bytes(image[FILE_HEADER_SIZE:]),
        FILE_HEADER_SIZE,
        MAX,
        FILE_HEADER_SIZE,
        FILE_HEADER_SIZE,
        check=True,
    ) == Walk(end=len(image), open_batch=len(image), last_batch=d)
    image[c + FRAME_HEADER_SIZE] ^= 1  # "ccc": the batch [bb, ccc] is not verified
    walk = walk_frames(
        bytes(image[FILE_HEADER_SIZE:]),
        FILE_HEADER_SIZE,
        MAX,
        FILE_HEADER_SIZE,
        FILE_HEADER_SIZE,
        check=True,
    )
    assert walk == Walk(end=c, open_batch=b, last_batch=a)
    assert (
        walk_frames(
            memoryview(image)[FILE_HEADER_SIZE:],
            FILE_HEADER_SIZE,
            MAX,
            FILE_HEADER_SIZE,
            FILE_HEADER_SIZE,
            check=True,
        )
        == walk
    )
    assert walk_frames(
        bytes(image[FILE_HEADER_SIZE:]), FILE_HEADER_SIZE, MAX, FILE_HEADER_SIZE, FILE_HEADER_SIZE
    ).end == len(image)  # headers only


def test_decoded_entries_are_ordinary_entries() -> None:
    # Entries are built by map (framing._make_entries): they must be indistinguishable from
    # constructed ones.
    batch_list = [[b"x"], [b"", b"yz"]] * 4
    found = decode(build(batch_list))
    expected, at = [], FILE_HEADER_SIZE
    for data in itertools.chain.from_iterable(batch_list):
        expected.append(Entry(at, at + FRAME_HEADER_SIZE + len(data), data))
        at = expected[-1].next
    assert found.entries == expected
    assert [hash(e) for e in found.entries] == [hash(e) for e in expected]
    assert [repr(e) for e in found.entries] == [repr(e) for e in expected]
    assert all(type(e) is Entry and e.server_time_us is None for e in found.entries)
    assert all(type(e.data) is bytes for e in found.entries)
    with pytest.raises(AttributeError):
        found.entries[0].data = b"changed"  # type: ignore[misc]


def test_decoding_accepts_bytearray_and_memoryview() -> None:
    image = build([[b"one"], [b"two", b"three"]])
    for buf in (bytearray(image[FILE_HEADER_SIZE:]), memoryview(image)[FILE_HEADER_SIZE:]):
        found = decode_frames(buf, FILE_HEADER_SIZE, at_eof=True, max_record=MAX, path=PATH)
        assert [e.data for e in found.entries] == [b"one", b"two", b"three"]
        assert all(type(e.data) is bytes for e in found.entries)
        assert scan_frames(
            buf, FILE_HEADER_SIZE, at_eof=True, max_record=MAX, path=PATH
        ).consumed == len(buf)
