"""A damaged fold checkpoint of a compacted queue is recoverable: the last one that opened
whole is kept beside it (`fold.checkpoint.previous`, listing every segment removed), the
refusal names `qw compact --recover`, which puts it back (protocol §7, §10)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.attacks.harness import fingerprint

QW = [sys.executable, "-m", "supervisor.cli.app"]


def qw(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A drained queue of 300 tasks whose claims log lost its settled segments."""
    cwd = tmp_path_factory.mktemp("compacted")
    data = cwd / "qw"
    up = qw(
        "up", "--no-tui", "--exit-when-drained", "--dir", str(data), "--workers", "2",
        "--tasks", "300", "--work-ms", "0", "--segment-bytes", "4096", cwd=cwd,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    done = qw("compact", "--retention", "0", "--dir", str(data), cwd=cwd)
    assert done.returncode == 0 and "claims: 0 segments" not in done.stdout, done.stdout
    return data


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    with open(path, "r+b") as f:  # in place, as the disk would
        f.write(data)


def files(data: Path) -> dict[str, str]:
    """The logs' bytes and both checkpoints', hashed: what a refusal must leave as it was."""
    kept = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in data.glob("fold.*")}
    return {**fingerprint(data), **kept}


def a_copy(compacted: Path, to: Path) -> Path:
    shutil.copytree(compacted, to, symlinks=True)
    return to


@pytest.mark.parametrize("after", ["compaction", "a worker's save"])
def test_a_damaged_checkpoint_is_refused_naming_the_command_that_puts_the_previous_back(
    compacted: Path, tmp_path: Path, after: str
) -> None:
    data = a_copy(compacted, tmp_path / "qw")
    if after == "a worker's save":  # the previous one is then compaction's, this the save's
        more = qw("up", "--no-tui", "--exit-when-drained", "--dir", str(data), "--workers", "1",
                  "--tasks", "20", "--work-ms", "0", cwd=tmp_path)  # fmt: skip
        assert more.returncode == 0, more.stderr
    published = "published 320" if after == "a worker's save" else "published 300"
    flip_a_byte(data / "fold.checkpoint")
    command = f"qw compact --recover --dir {data}"
    for args in (["status"], ["up", "--no-tui", "--exit-when-drained", "--workers", "1"]):
        before = files(data)
        refused = qw(*args, "--dir", str(data), cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, refused.stderr
        assert f"{data}/fold.checkpoint: damaged" in lines[0] and command in lines[0], lines[0]
        assert files(data) == before
    recovered = qw("compact", "--recover", "--dir", str(data), cwd=tmp_path)
    assert recovered.returncode == 0, recovered.stderr
    assert f"put back from {data}/fold.checkpoint.previous" in recovered.stdout
    status = qw("status", "--dir", str(data), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert f"{published}  pending 0  held 0" in status.stdout, status.stdout
    up = qw("up", "--no-tui", "--exit-when-drained", "--dir", str(data), "--workers", "1",
            "--tasks", "5", "--work-ms", "0", cwd=tmp_path)  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert "pending 0" in up.stdout


def test_recover_with_both_checkpoints_damaged_says_what_is_lost_and_changes_nothing(
    compacted: Path, tmp_path: Path
) -> None:
    data = a_copy(compacted, tmp_path / "qw")
    flip_a_byte(data / "fold.checkpoint")
    flip_a_byte(data / "fold.checkpoint.previous")
    refused = qw("status", "--dir", str(data), cwd=tmp_path)
    assert refused.returncode == 2 and "--recover" not in refused.stderr, refused.stderr
    before = files(data)
    result = qw("compact", "--recover", "--dir", str(data), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"{data}/fold.checkpoint: damaged" in lines[0]
    assert f"{data}/fold.checkpoint.previous: damaged" in lines[0]
    assert "the history of the removed segments is in no checkpoint" in lines[0]
    assert files(data) == before
