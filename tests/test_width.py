"""Every line a command prints fits the reader's width: `COLUMNS` when set, 80 when piped
without it; lines wrap between items and words and never end in spaces (real commands, piped,
on a real run's data directory)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len

QW = [sys.executable, "-m", "supervisor.cli.app"]
COMMANDS = [
    ("status",),
    ("task", "0"),
    ("task", "35"),
    ("why", "0"),
    ("why", "35"),
    ("report",),
    ("tail",),
    ("tail", "--topic", "tasks"),
    ("timeline", "--text"),
]


def run(*args: str, cwd: Path, columns: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run(
        [*QW, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A drained run of 30 tasks, then 10 more enqueued and left pending."""
    cwd = tmp_path_factory.mktemp("width")
    up = run("up", "--no-tui", "--exit-when-drained", "--dir", "qw", "--tasks", "30",
             "--workers", "2", "--work-ms", "5", cwd=cwd, columns=None)  # fmt: skip
    assert up.returncode == 0, up.stderr
    more = run("enqueue", "--dir", "qw", "--count", "10", cwd=cwd, columns=None)
    assert more.returncode == 0, more.stderr
    return cwd


def too_wide(text: str, width: int) -> list[str]:
    return [line for line in text.split("\n") if cell_len(line) > width or line != line.rstrip()]


@pytest.mark.parametrize("columns", ["80", None], ids=["COLUMNS=80", "no COLUMNS"])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_line_fits_80_columns_piped(
    data: Path, command: tuple[str, ...], columns: str | None
) -> None:
    result = run(*command, "--dir", "qw", cwd=data, columns=columns)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert too_wide(result.stdout, 80) == []


def test_wide_columns_are_used_when_given(data: Path) -> None:
    # COLUMNS is the reader's width: a wider one keeps the report's long lines whole
    result = run("report", "--dir", "qw", cwd=data, columns="200")
    assert any(cell_len(line) > 80 for line in result.stdout.split("\n"))
    assert too_wide(result.stdout, 200) == []


def test_the_status_queue_line_wraps_between_its_counts(data: Path) -> None:
    out = run("status", "--dir", "qw", cwd=data, columns="60").stdout
    lines = out.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("queue "))
    assert lines[at].split()[1:5] == ["published", "40", "pending", "10"]
    assert lines[at + 1] == " " * 13 + "dead 0  failed attempts 0"  # under the first count


@pytest.mark.parametrize("columns", ["80", None], ids=["COLUMNS=80", "no COLUMNS"])
def test_qw_up_without_a_terminal_fits_80_columns(tmp_path: Path, columns: str | None) -> None:
    # its status lines, its events (a backlog resumed: a long line) and its last word
    first = run("up", "--no-tui", "--exit-when-drained", "--dir", "qw", "--tasks", "5",
                "--work-ms", "1", cwd=tmp_path, columns=None)  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert run("enqueue", "--dir", "qw", "--count", "3", cwd=tmp_path, columns=None).returncode == 0
    result = run("up", "--no-tui", "--exit-when-drained", "--dir", "qw", "--work-ms", "500",
                 "--workers", "1", cwd=tmp_path, columns=columns)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.search(r"resuming \d pending,? (\S+ )*tasks from qw", " ".join(result.stdout.split()))
    assert too_wide(result.stdout, 80) == []
    assert result.stdout.splitlines()[-1].startswith("qw: drained (published 8,")


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A drained run of 12 tasks on a queue of 2 partitions."""
    cwd = tmp_path_factory.mktemp("width-partitions")
    up = run("up", "--no-tui", "--exit-when-drained", "--dir", "qw", "--partitions", "2",
             "--tasks", "12", "--workers", "2", "--work-ms", "5",
             cwd=cwd, columns=None)  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert too_wide(up.stdout, 80) == []
    return cwd


@pytest.mark.parametrize(
    "command",
    [("status",), ("report",), ("tail",), ("timeline", "--text"), ("why", "0:1"), ("task", "1:2")],
    ids=" ".join,
)
def test_a_partitioned_queue_fits_80_columns_piped(
    partitioned: Path, command: tuple[str, ...]
) -> None:
    result = run(*command, "--dir", "qw", cwd=partitioned, columns=None)
    assert result.returncode == 0, result.stderr
    assert too_wide(result.stdout, 80) == []
