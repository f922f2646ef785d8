"""The compiled hot path (queue_worker.compiled): the same answers as the Python it is built
from, and never a build of other sources.

The differential tests load the Python files of the compiled modules a second time, under
other names, and feed both the same generated inputs: every result, and every exception's
type and message, must agree. They need a build of the current sources (`make compiled`);
without one they are skipped, unless QW_REQUIRE_COMPILED=1 (CI) makes that a failure.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queue_worker import compiled, records, state
from queue_worker.records import CLAIM, DONE, FAIL, RENEW, SCHEMA, TASK, ClaimsRecord
from tests.helpers import probe_copy
from tests.test_records import msgpack_values
from tests.test_records import records as any_records
from tests.test_state_model import claims_logs

SETTINGS = settings(max_examples=100, deadline=None)
REQUIRED = os.environ.get("QW_REQUIRE_COMPILED", "") not in ("", "0")


def _pure(name: str) -> ModuleType:
    """The Python file of compiled module `name`, loaded again as a plain module."""
    alias = "qw_pure_" + name.rsplit(".", 1)[1]
    if alias in sys.modules:
        return sys.modules[alias]
    path = compiled.PACKAGE_DIR / (name.rsplit(".", 1)[1] + ".py")
    spec = importlib.util.spec_from_file_location(alias, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module  # dataclasses look their module up while building a class
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def compiled_in_use() -> None:
    for name in compiled.COMPILED:  # in_use() lists the ones imported so far
        importlib.import_module(name)
    if compiled.in_use() != list(compiled.COMPILED):
        why = f"the compiled modules are not in use: {compiled.status()}"
        if REQUIRED:
            pytest.fail(why)
        pytest.skip(why)


# -- same answers ------------------------------------------------------------------------


def answer(call: Callable[..., Any], *args: Any) -> Any:
    """What a call gives, as plain values: comparable across the two copies' classes."""
    try:
        return ("ok", plain(call(*args)))
    except Exception as e:  # with its cause: mypyc drops `raise … from` (see records._caused)
        cause = e.__cause__
        return ("raised", type(e).__name__, str(e), type(cause).__name__, e.__suppress_context__)


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
    """Claims-topic bytes: well-formed records, near misses of the fast path (a field of
    the wrong type, too few items, an unknown code), and junk."""
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


@SETTINGS
@given(st.lists(record_bytes(), max_size=12))
def test_records_decode_as_the_python_does(datas: list[bytes]) -> None:
    pure = _pure("queue_worker.records")
    for data in datas:
        for fn in ("decode", "decode_claims", "decode_task"):
            ours, theirs = getattr(records, fn), getattr(pure, fn)
            assert answer(ours, data) == answer(theirs, data), fn
    assert answer(records.decode_claims_all, datas) == answer(pure.decode_claims_all, datas)


#: a field of any type: compiled code must not convert (True to 1) or refuse (a float where
#: `int` is declared) what the Python checks and refuses in its own words
loose = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64),
    st.booleans(),
    st.floats(),
    st.text(max_size=3),
)
loose_records = st.one_of(
    st.builds(records.Claim, loose, loose, loose, loose),
    st.builds(records.Renew, loose, loose, loose, loose, loose),
    st.builds(records.Done, loose, loose, loose, loose, loose),
    st.builds(records.Fail, loose, loose, loose, loose, loose, loose | st.none()),
    st.builds(records.TaskRecord, loose, loose),
)


@SETTINGS
@given(any_records | loose_records)
def test_records_encode_as_the_python_does(record: Any) -> None:
    pure = _pure("queue_worker.records")
    theirs = getattr(pure, type(record).__name__)(*record)  # the copy's own record classes
    assert answer(records.encode, record) == answer(pure.encode, theirs)


@SETTINGS
@given(claims_logs())
def test_the_fold_gives_the_python_verdicts(log: list[ClaimsRecord]) -> None:
    """Record by record (`apply`) and in one go (`apply_all`): the same outcomes, the same
    state, the same answers to the queries."""
    pure = _pure("queue_worker.state")
    ours, theirs = state.ClaimState(), pure.ClaimState()
    for position, record in enumerate(log):
        assert answer(ours.apply, record, position) == answer(theirs.apply, record, position)
    batch_ours, batch_theirs = state.ClaimState(), pure.ClaimState()
    positions = list(range(len(log)))
    assert answer(batch_ours.apply_all, log, positions) == answer(
        batch_theirs.apply_all, log, positions
    )
    for a, b in ((ours, theirs), (batch_ours, batch_theirs)):
        assert plain(a.snapshot()) == plain(b.snapshot())
        assert a.held_count == b.held_count
        assert a.next_change(0) == b.next_change(0)
        assert list(a.claimable(50_000, 5)) == list(b.claimable(50_000, 5))
    snap = ours.snapshot()
    assert plain(state.ClaimState.restore(snap).snapshot()) == plain(snap)


def test_a_bad_snapshot_is_refused_with_the_same_words() -> None:
    pure = _pure("queue_worker.state")
    bad = state.ClaimSnapshot(-5, 0, 0, 0, 0, (), (), ())
    ours = answer(state.ClaimState.restore, bad)
    assert ours == answer(pure.ClaimState.restore, bad)
    assert ours[0] == "raised"


# -- never stale -------------------------------------------------------------------------


@pytest.fixture
def package_copy(tmp_path: Path) -> Iterator[Path]:
    """A copy of the package with its compiled build, importable from tmp_path/src (with
    logstore beside it: the key covers modules of both)."""
    source = compiled.PACKAGE_DIR
    copy = tmp_path / "src" / "queue_worker"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        source.parent / "logstore",
        copy.parent / "logstore",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    yield copy


def which_code(copy: Path, **env: str) -> list[str]:
    """Import the copy's fold in a fresh interpreter: where state came from, the status line,
    and the copy's EDITED marker (None when the code lacks it)."""
    probe = (
        "import queue_worker.state as s, queue_worker.records as r\n"
        "from queue_worker import compiled\n"
        "print(s.__file__); print(r.__file__); print(compiled.status())\n"
        "print(getattr(s, 'EDITED', None), getattr(r, 'EDITED', None))\n"
    )
    return probe_copy(copy, probe, **env)


def test_the_build_runs_for_its_own_sources(package_copy: Path) -> None:
    state_file, records_file, status, marks = which_code(package_copy)
    assert state_file.startswith(str(package_copy / "_compiled"))
    assert records_file.startswith(str(package_copy / "_compiled"))
    assert status.startswith("compiled (mypyc")
    assert marks == "None None"


@pytest.mark.parametrize(
    "edited",
    # compiled modules, and modules they import (of the package, and of logstore beside it)
    ["state.py", "records.py", "worker.py", "errors.py", "topics.py", "../logstore/__init__.py"],
)
def test_an_edited_source_runs_as_edited_never_the_old_build(
    package_copy: Path, edited: str
) -> None:
    """Edit a compiled module (or one it imports): the next import runs the edited Python,
    and says so, however the build directory looks."""
    with (package_copy / edited).open("a") as f:
        f.write("\nEDITED = 'yes'\n")
    state_file, records_file, status, marks = which_code(package_copy)
    assert state_file == str(package_copy / "state.py")
    assert records_file == str(package_copy / "records.py")
    assert status.startswith("pure Python (the compiled build is of other sources"), status
    if edited in ("state.py", "records.py"):
        assert "yes" in marks.split()


def test_qw_pure_forces_the_python_modules(package_copy: Path) -> None:
    state_file, _records_file, status, _marks = which_code(package_copy, QW_PURE="1")
    assert state_file == str(package_copy / "state.py")
    assert status.startswith("pure Python (QW_PURE=1)")


def test_without_a_build_the_python_modules_run(package_copy: Path) -> None:
    shutil.rmtree(package_copy / "_compiled")
    state_file, _records_file, status, _marks = which_code(package_copy)
    assert state_file == str(package_copy / "state.py")
    assert status.startswith("pure Python (not built")


def test_the_key_covers_every_module_the_compiled_ones_import() -> None:
    """mypyc compiles against the types (and inlines the Final constants) of what a compiled
    module imports from the package: each such module must be in the key (DEPENDS), so that
    an edit to it also sends the compiled modules back to their Python."""
    keyed = {*compiled.COMPILED, *compiled.DEPENDS}
    for name in compiled.COMPILED:
        tree = ast.parse((compiled.PACKAGE_DIR / (name.rsplit(".", 1)[1] + ".py")).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module is not None:
                imported = [node.module]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                continue
            for module in imported:
                if module.split(".")[0] in ("queue_worker", "logstore", "supervisor"):
                    assert module in keyed, f"{name} imports {module}, which is not in the key"


# -- the stamp: the key without hashing, for sources that stat as stamped ------------------


def _sources(directory: Path) -> list[Path]:
    files = []
    for name, text in (("a.py", "A = 1\n"), ("b.py", "B = 2\n")):
        (directory / name).write_text(text)
        files.append(directory / name)
    return files


def _built(root: Path, files: list[Path]) -> str:
    """A build directory for the files' key (as `build` leaves one), its key."""
    key = compiled.source_key(files)
    (root / key).mkdir(parents=True)
    return key


def _later() -> int:
    """A clock late enough that the files just written are old enough to be stamped."""
    return time.time_ns() + compiled.STAMP_MARGIN_NS + 1


def test_a_stamped_build_gives_its_key_without_hashing(tmp_path: Path) -> None:
    files, root = _sources(tmp_path), tmp_path / "_compiled"
    key = _built(root, files)
    assert compiled.find_key(files, root, _later()) == (key, False)  # hashed, then stamped
    assert (root / key / compiled.STAMP_FILE).is_file()
    assert compiled.find_key(files, root, _later()) == (key, True)


def test_young_sources_are_not_stamped(tmp_path: Path) -> None:
    """A source written less than STAMP_MARGIN_NS ago could be written again within the same
    tick of the file system's clock, and stat as stamped: no stamp then."""
    files, root = _sources(tmp_path), tmp_path / "_compiled"
    key = _built(root, files)
    assert compiled.find_key(files, root) == (key, False)
    assert compiled.find_key(files, root) == (key, False)
    assert not (root / key / compiled.STAMP_FILE).exists()


def _rewrite_same_size(path: Path) -> None:
    text = path.read_text()
    path.write_text(text.replace("1", "7").replace("2", "8"))
    assert len(path.read_text()) == len(text)


def test_a_same_size_edit_with_a_new_mtime_is_hashed(tmp_path: Path) -> None:
    files, root = _sources(tmp_path), tmp_path / "_compiled"
    key = _built(root, files)
    compiled.find_key(files, root, _later())
    _rewrite_same_size(files[0])
    stat = files[0].stat()
    os.utime(files[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    new_key, stamped = compiled.find_key(files, root, _later())
    assert not stamped
    assert new_key == compiled.source_key(files) != key


def test_a_same_size_edit_with_its_mtime_set_back_is_hashed(tmp_path: Path) -> None:
    """A write changes the ctime, which cannot be set back as the mtime can: the stamp
    differs, the sources are hashed, and the edit is seen."""
    files, root = _sources(tmp_path), tmp_path / "_compiled"
    key = _built(root, files)
    compiled.find_key(files, root, _later())
    before = files[1].stat()
    _rewrite_same_size(files[1])
    os.utime(files[1], ns=(before.st_atime_ns, before.st_mtime_ns))
    after = files[1].stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    new_key, stamped = compiled.find_key(files, root, _later())
    assert not stamped
    assert new_key == compiled.source_key(files) != key


def test_an_edit_after_a_stamp_runs_as_edited(package_copy: Path) -> None:
    """End to end: the copy's build stamped, a compiled source edited to the same size with
    its mtime set back: the next import runs the edited Python."""
    files = [compiled.source_file(name, package_copy) for name in compiled.COMPILED]
    files += [compiled.source_file(name, package_copy) for name in compiled.DEPENDS]
    key, _ = compiled.find_key(files, package_copy / "_compiled", _later())
    assert (package_copy / "_compiled" / key / compiled.STAMP_FILE).is_file()
    probe = (
        "import queue_worker.state as s\n"
        "from queue_worker import compiled\n"
        "print(s.__file__); print(compiled._choice.stamped)\n"
    )
    assert probe_copy(package_copy, probe) == [
        str(package_copy / "_compiled" / key / ("state" + compiled.EXT_SUFFIX)),
        "True",
    ]
    state = package_copy / "state.py"
    before = state.stat()
    text = state.read_text()
    state.write_text(text.replace('"""', "'''", 1).replace('"""', "'''", 1))
    os.utime(state, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert state.stat().st_size == before.st_size
    assert probe_copy(package_copy, probe) == [str(state), "False"]
