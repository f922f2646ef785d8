"""Read-only auditing: `report`, `why`, `status`, `tail` and `task` open the logs read-only
(no lock file, no header, no repair) and work on a read-only copy; `enqueue` and `up` on a
place they cannot write, or a `--dir` naming a plain file, say so in one line (exit 2); so do
`compact` on a read-only mount or read-only files, and `status` on a run directory it may
not read.

Tests run as root, where permission bits do not stop writes: so every directory's files,
sizes, modification times and bytes are compared before and after, and where this machine
lets us make one, the same commands run on a read-only bind mount (EROFS stops even root);
permission bits are tested by running the command without root's capability to ignore them
(`setpriv`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

QW = [sys.executable, "-m", "supervisor.cli.app"]

LOOKING = [
    ["report"],
    ["why", "3"],
    ["status"],
    ["status", "--json"],
    ["tail", "--topic", "claims"],
    ["tail", "--topic", "tasks"],
    ["task", "3"],
]


def qw(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def drained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("drained")
    data = cwd / "qw"
    result = qw(
        "up", "--no-tui", "--exit-when-drained", "--dir", str(data), "--workers", "2",
        "--tasks", "8", "--work-ms", "1", cwd=cwd,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return data


def tree(directory: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under `directory`: size, mtime and a digest of its bytes."""
    found = {}
    for path in sorted(directory.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        found[str(path.relative_to(directory))] = (st.st_size, st.st_mtime_ns, digest)
    return found


def archive_of(drained: Path, to: Path, *, with_side_files: bool) -> Path:
    """A copy of the queue's logs only (an archive as someone would keep it), made
    read-only: files 0444, directory 0555."""
    to.mkdir()
    for name in ("tasks.log", "claims.log"):
        shutil.copy(drained / name, to / name)
        if with_side_files:
            for side in (".lock", ".sync"):
                shutil.copy(drained / f"{name}{side}", to / f"{name}{side}")
    for path in to.iterdir():
        path.chmod(0o444)
    to.chmod(0o555)
    return to


@pytest.mark.parametrize("side_files", [False, True], ids=["logs-only", "with-lock-and-sync"])
def test_looking_at_a_read_only_archive_works_and_writes_nothing(
    drained: Path, tmp_path: Path, side_files: bool
) -> None:
    archive = archive_of(drained, tmp_path / "archive", with_side_files=side_files)
    before = tree(archive)
    try:
        for args in LOOKING:
            result = qw(*args, "--dir", str(archive), cwd=tmp_path)
            assert result.returncode == 0, (args, result.stdout, result.stderr)
            assert "Traceback" not in result.stderr
        assert tree(archive) == before  # not a lock file, not a byte, not an mtime
    finally:
        archive.chmod(0o755)


@pytest.fixture
def read_only_mount(drained: Path, tmp_path: Path) -> Iterator[Path]:
    """The drained queue's logs behind a read-only bind mount (skipped where mounting is
    not allowed)."""
    source = archive_of(drained, tmp_path / "source", with_side_files=False)
    target = tmp_path / "mounted"
    target.mkdir()
    made = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {made.stderr.decode().strip()}")
    try:
        ro = subprocess.run(
            ["mount", "-o", "remount,ro,bind", str(target)], capture_output=True, check=False
        )
        if ro.returncode != 0:
            pytest.skip(f"cannot remount read-only: {ro.stderr.decode().strip()}")
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=False)
        source.chmod(0o755)


def test_looking_works_on_a_read_only_mount(read_only_mount: Path, tmp_path: Path) -> None:
    with pytest.raises(OSError, match="Read-only file system"):
        (read_only_mount / "probe").touch()  # the mount really is read-only, even for root
    for args in LOOKING:
        result = qw(*args, "--dir", str(read_only_mount), cwd=tmp_path)
        assert result.returncode == 0, (args, result.stdout, result.stderr)


def test_enqueue_and_up_on_a_read_only_mount_say_so_in_one_line(
    read_only_mount: Path, tmp_path: Path
) -> None:
    before = tree(read_only_mount)
    for args in (
        ["enqueue", "--count", "2"],
        ["up", "--no-tui", "--exit-when-drained", "--workers", "1"],
    ):
        result = qw(*args, "--dir", str(read_only_mount), cwd=tmp_path)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert str(read_only_mount) in lines[0]
        assert "Read-only file system" in lines[0]
    assert tree(read_only_mount) == before


@pytest.mark.parametrize(
    "args",
    [["enqueue", "--count", "2"], ["up", "--no-tui", "--exit-when-drained", "--workers", "1"]],
)
def test_a_dir_naming_a_plain_file_is_one_line(tmp_path: Path, args: list[str]) -> None:
    plain = tmp_path / "notes.txt"
    plain.write_text("not a data directory\n")
    result = qw(*args, "--dir", str(plain), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"qw: error: {plain} is not a directory (a data directory was expected)"
    )
    assert plain.read_text() == "not a data directory\n"


def test_a_read_only_open_never_creates_the_lock_or_sync_files(
    drained: Path, tmp_path: Path
) -> None:
    from queue_worker.topics import open_topics

    archive = tmp_path / "archive"
    archive.mkdir()
    for name in ("tasks.log", "claims.log"):
        shutil.copy(drained / name, archive / name)
    tasks, claims = open_topics(archive, read_only=True)
    with tasks, claims:
        assert len(list(claims.iter_from(claims.start))) > 0
        assert claims.end() > claims.start
        with pytest.raises(Exception, match="read-only"):
            claims.append(b"x")
    assert sorted(os.listdir(archive)) == ["claims.log", "tasks.log"]


def one_line_naming(result: subprocess.CompletedProcess[str], *names: str) -> str:
    """The refusal's one line of stderr, exit 2, no traceback; it names each of `names`."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


def test_compact_on_a_read_only_mount_says_so_in_one_line(
    read_only_mount: Path, tmp_path: Path
) -> None:
    before = tree(read_only_mount)
    result = qw("compact", "--retention", "0", "--dir", str(read_only_mount), cwd=tmp_path)
    one_line_naming(result, str(read_only_mount), "Read-only file system")
    assert tree(read_only_mount) == before


#: a command run as root without the capabilities that let root ignore permission bits:
#: tests run as root, where a 0444 file or directory stops nobody otherwise
UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


@pytest.fixture
def unprivileged() -> list[str]:
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv here")
    probe = subprocess.run([*UNPRIVILEGED, "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot drop capabilities here: {probe.stderr.decode().strip()}")
    return UNPRIVILEGED


def test_compact_of_read_only_files_says_so_in_one_line(
    drained: Path, tmp_path: Path, unprivileged: list[str]
) -> None:
    archive = archive_of(drained, tmp_path / "archive", with_side_files=True)
    before = tree(archive)
    try:
        result = subprocess.run(
            [*unprivileged, *QW, "compact", "--retention", "0", "--dir", str(archive)],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        one_line_naming(result, str(archive), "Permission denied")
        assert tree(archive) == before
    finally:
        archive.chmod(0o755)


@pytest.mark.parametrize("args", [["status"], ["status", "--json"]])
def test_status_with_a_run_directory_it_may_not_read_says_so_in_one_line(
    drained: Path, tmp_path: Path, unprivileged: list[str], args: list[str]
) -> None:
    copy = tmp_path / "qw"
    shutil.copytree(drained, copy)
    (copy / "run").chmod(0o444)
    try:
        result = subprocess.run(
            [*unprivileged, *QW, *args, "--dir", str(copy)],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        one_line_naming(result, str(copy / "run"), "Permission denied")
    finally:
        (copy / "run").chmod(0o755)
