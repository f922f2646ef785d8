"""The frame-decoding loop in C (logstore/_cframes.c, loaded by logstore.native) against the
Python loop it copies (`framing._decode_loop`), on arbitrary, torn and corrupt buffers; and
its loader, which uses a build only for the exact sources it was built from.

Needs a build of the current sources (`make compiled`); skipped without one, unless
QW_REQUIRE_COMPILED=1 (CI) makes that a failure.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore import Entry, file_log, framing, native
from logstore.base import LogError, RecordTooLargeError
from tests.helpers import probe_copy

REQUIRED = os.environ.get("QW_REQUIRE_COMPILED", "") not in ("", "0")
SETTINGS = settings(max_examples=300, deadline=None)
C_LOOP = framing._c_loop
C_ENTRIES = framing._entries_loop if C_LOOP is not None else None
C_WALK = framing._walk_loop if C_LOOP is not None else None


@pytest.fixture(autouse=True)
def c_loop_built() -> None:
    if C_LOOP is None:
        why = f"the C frame loop is not in use: {framing.frames_loop_status()}"
        if REQUIRED:
            pytest.fail(why)
        pytest.skip(why)


@st.composite
def buffers(draw: st.DrawFn) -> bytes:
    """Frames as writers leave them (batches, CONTINUED frames), then damage: cut short
    (a torn tail), bytes overwritten (corruption), zeros or junk appended."""
    frames = []
    for _ in range(draw(st.integers(0, 8))):
        batch = draw(st.lists(st.binary(max_size=40), min_size=1, max_size=4))
        frames.append(framing.encode_batch(batch))
    buf = bytearray(b"".join(frames))
    damage = draw(st.sampled_from(["none", "cut", "flip", "zeros", "junk", "random"]))
    if damage == "cut" and buf:
        del buf[draw(st.integers(0, len(buf) - 1)) :]
    elif damage == "flip" and buf:
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] = draw(st.integers(0, 255))
    elif damage == "zeros":
        buf += bytes(draw(st.integers(1, 30)))
    elif damage == "junk":
        buf += draw(st.binary(min_size=1, max_size=30))
    elif damage == "random":
        buf = bytearray(draw(st.binary(max_size=120)))
    return bytes(buf)


limits = st.sampled_from([sys.maxsize, 1, 2, 3, 5])
max_records = st.sampled_from([framing.MAX_RECORD, 0, 3, 16, 40])


@SETTINGS
@given(buffers(), max_records, st.integers(0, 400), limits)
def test_the_c_loop_walks_frames_as_the_python_loop(
    buf: bytes, max_record: int, verified: int, limit: int
) -> None:
    assert C_LOOP is not None
    assert C_LOOP(buf, max_record, verified, limit) == framing._decode_loop(
        buf, max_record, verified, limit
    )


@SETTINGS
@given(buffers(), max_records, st.integers(0, 400), limits, st.sampled_from([0, 48, 2**40]))
def test_the_c_entries_loop_answers_as_the_python_one(
    buf: bytes, max_record: int, verified: int, limit: int, base: int
) -> None:
    """decode_entries in C against framing._decode_entries (on the Python loop): the same
    entries (each an Entry, its fields of the same types), the same walk."""
    assert C_ENTRIES is not None and C_ENTRIES is not framing._decode_entries
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(framing, "_frames_loop", framing._decode_loop)
        python = framing._decode_entries(buf, max_record, verified, limit, base, Entry)
    ours = C_ENTRIES(buf, max_record, verified, limit, base, Entry)
    assert ours == python
    assert [type(e) for e in ours[0]] == [Entry] * len(python[0])
    assert [tuple(map(type, e)) for e in ours[0]] == [tuple(map(type, e)) for e in python[0]]


@SETTINGS
@given(
    buffers(),
    max_records,
    st.sampled_from([0, 48, 2**40]),
    st.integers(0, 100),
    st.integers(0, 100),
    st.booleans(),
    st.sampled_from(["bytes", "memoryview", "bytearray"]),
)
def test_the_c_walk_answers_as_the_python_one(
    buf: bytes, max_record: int, base: int, open_batch: int, last_batch: int, check: bool, form: str
) -> None:
    """walk_frames in C against framing._walk_frames: the same end and batches, checksums
    read only with `check`, on any buffer a read hands it (a memoryview of a reused buffer
    too)."""
    assert C_WALK is not None and C_WALK is not framing._walk_frames
    given_buf: Any = {"bytes": buf, "memoryview": memoryview(buf), "bytearray": bytearray(buf)}[
        form
    ]
    args = (base, max_record, open_batch, last_batch, check)
    assert C_WALK(given_buf, *args) == framing._walk_frames(given_buf, *args)
    walk = framing.walk_frames(given_buf, *args[:-1], check=check)
    assert type(walk) is framing.Walk and walk == framing._walk_frames(buf, *args)


def test_the_c_walk_reads_checksums_only_when_asked() -> None:
    """A frame whose payload was overwritten stops a checking walk, not a header walk."""
    assert C_WALK is not None
    good, bad = framing.encode_frame(b"abc"), bytearray(framing.encode_frame(b"xyz"))
    bad[-1] ^= 0xFF
    buf = good + bytes(bad)
    assert C_WALK(buf, 0, 100, 0, 0, False) == (len(buf), len(buf), len(good))
    assert C_WALK(buf, 0, 100, 0, 0, True) == (len(good), len(good), 0)


def decoded(buf: bytes, at_eof: bool, limit: int | None, verified: int) -> Any:
    try:
        return framing.decode_frames(
            buf, 48, at_eof=at_eof, max_record=40, path="x.log", limit=limit, verified=verified
        )
    except LogError as e:
        return (type(e).__name__, str(e))


@SETTINGS
@given(buffers(), st.booleans(), st.none() | limits, st.integers(0, 400))
def test_decode_frames_answers_the_same_with_either_loop(
    buf: bytes, at_eof: bool, limit: int | None, verified: int
) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(framing, "_frames_loop", framing._decode_loop)
        patch.setattr(framing, "_entries_loop", framing._decode_entries)
        python = decoded(buf, at_eof, limit, verified)
    assert framing._frames_loop is C_LOOP and framing._entries_loop is C_ENTRIES
    assert decoded(buf, at_eof, limit, verified) == python


@SETTINGS
@given(
    st.lists(st.binary(max_size=60), max_size=6),
    st.sampled_from([framing.MAX_RECORD, 0, 3, 16, 40]),
    st.booleans(),
)
def test_the_c_batch_framing_answers_as_the_python_one(
    records: list[bytes], max_record: int, as_tuple: bool
) -> None:
    batch = file_log._FRAME_BATCH
    assert batch is not None
    given = tuple(records) if as_tuple else records
    try:
        expected: tuple[bytes, list[int]] | None = file_log._frame_batch_py(given, max_record)
    except RecordTooLargeError:
        expected = None  # the C one says None; the Python then raises
    assert batch(given, max_record) == expected
    if expected is not None and records:
        # the frames decode back to the records, as one batch
        found = framing.decode_frames(
            expected[0], 0, at_eof=True, max_record=framing.MAX_RECORD, path="-"
        )
        assert [e.data for e in found.entries] == records
        assert expected[0] == framing.encode_batch(records)


def test_the_c_batch_framing_leaves_other_types_to_the_python() -> None:
    batch = file_log._FRAME_BATCH
    assert batch is not None
    for other in (bytearray(b"b"), memoryview(b"b")):
        records: list[Any] = [b"a", other]  # (append_many's Python takes any buffer)
        assert batch(records, framing.MAX_RECORD) is None
    with pytest.raises(TypeError):
        batch(5, framing.MAX_RECORD)  # type: ignore[arg-type]


def test_a_buffer_that_is_not_bytes_is_refused_not_misread() -> None:
    assert C_LOOP is not None
    with pytest.raises(TypeError):
        C_LOOP(bytearray(framing.encode_frame(b"x")), 10, 0, 1)  # type: ignore[arg-type]
    assert C_ENTRIES is not None
    with pytest.raises(TypeError):
        C_ENTRIES(bytearray(framing.encode_frame(b"x")), 10, 0, 1, 0, Entry)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        C_ENTRIES(framing.encode_frame(b"x"), 10, 0, 1, 0, int)  # type: ignore[arg-type]


# -- never stale -------------------------------------------------------------------------


def frames_status(tmp_path: Path, edit: str | None = None, **env: str) -> list[str]:
    """A copy of logstore with its build, `edit` (a file name) edited: which loop runs."""
    copy = tmp_path / "src" / "logstore"
    shutil.copytree(native.PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    if edit is not None:
        with (copy / edit).open("a") as f:
            f.write("\n/* edited */\n" if edit.endswith(".c") else "\nEDITED = 'yes'\n")
    probe = (
        "import logstore.framing as f\n"
        "print(f.__file__); print(f.frames_loop_status()); print(getattr(f, 'EDITED', None))\n"
    )
    lines = probe_copy(copy, probe, **env)
    assert lines[0] == str(copy / "framing.py")
    return lines[1:]


def test_the_build_runs_for_its_own_sources(tmp_path: Path) -> None:
    assert frames_status(tmp_path) == ["C (logstore/_cframes.c)", "None"]


@pytest.mark.parametrize("edited", ["framing.py", "_cframes.c"])
def test_an_edited_source_runs_the_python_loop(tmp_path: Path, edited: str) -> None:
    status, marker = frames_status(tmp_path, edited)
    assert status == "Python (no build of these sources (`make compiled`))"
    assert marker == ("yes" if edited == "framing.py" else "None")


def test_qw_pure_forces_the_python_loop(tmp_path: Path) -> None:
    assert frames_status(tmp_path, QW_PURE="1") == ["Python (QW_PURE=1)", "None"]
