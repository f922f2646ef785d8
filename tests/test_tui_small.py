"""The dashboard on the smallest usual terminal, 80×24, after five quick kill -9s: every
slot's row without a "… more rows" line, the orphans summed up in the lines they have (the
nearest lease to lapse named), at least five event lines, every line within 80 columns.
A real `qw up` in a real tmux; the kills are the dashboard's own `k`."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tests.test_tui_tmux import (
    QW,
    REPO,
    Tmux,
    exit_status,
    feed_lines,
    keys_line_intact,
    worker_rows,
)

KILLS = 5


@pytest.fixture
def small_tmux(tmp_path: Path) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    term = Tmux(tmp_path / "tmux.sock", 80, 24)
    try:
        term.start(REPO)
        yield term
    finally:
        term.kill_server()


def orphaned(screen: str) -> int:
    """The header's count of orphaned tasks."""
    found = re.search(r"(\d+) orphaned", screen.splitlines()[0] if screen else "")
    return int(found[1]) if found else 0


def test_five_quick_kills_at_80x24_keep_the_rows_the_orphans_and_five_events(
    small_tmux: Tmux, tmp_path: Path
) -> None:
    tmux = small_tmux
    if not QW.exists():
        pytest.fail(f"{QW} is missing: install the project (make test does)")
    # long tasks and a long lease: the orphans wait for their takeover while the screen is read
    tmux.type_line(
        f"{QW} up --dir {tmp_path / 'qw'} --workers 8 --lease 120 --work-ms 600000 "
        "--tasks 100 --drain-timeout 1"
    )

    def holders() -> int:
        rows = worker_rows(tmux.screen()).values()
        return sum(1 for row in rows if "working" in row and re.search(r"#\d+", row))

    wait_until(lambda: holders() >= KILLS, 60, f"{KILLS} workers holding a task")
    for n in range(1, KILLS + 1):
        tmux.send("k")
        wait_until(lambda n=n: orphaned(tmux.screen()) >= n, 20, f"kill {n}'s orphan")  # type: ignore[misc]
    wait_until(lambda: len(worker_rows(tmux.screen())) >= 8, 60, "the slots restarted")
    screen = tmux.screen()
    lines = screen.rstrip("\n").splitlines()
    assert len(lines) == 24, screen
    assert all(len(line) <= 80 for line in lines), screen
    assert keys_line_intact(screen), screen
    assert "more rows" not in screen, screen
    slots = {int(row.split()[0]) for row in worker_rows(screen).values()}
    assert slots == set(range(8)), screen
    title = next(i for i, line in enumerate(lines) if line.startswith("── orphans"))
    panel = lines[title + 1 : title + 3]
    summary = panel[-1]
    assert re.match(
        rf"… {KILLS - 1} more · {KILLS - 1} waiting, the next lease lapses in ", summary
    ), screen
    assert len(feed_lines(screen)) >= 5, screen
    tmux.send("q")
    assert exit_status(tmux, "qw up to drain and exit") == 0, tmux.screen()
