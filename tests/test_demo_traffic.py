"""Demo traffic only when asked: plain `qw up` works the queue it is given; `--demo` and
`--rate R` add demo tasks while running, and the dashboard says so.

Real `qw up` processes on real files; every wait is a condition with a deadline.
"""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from queue_worker.proof.report import count_tasks
from supervisor.run.model import QueueView, SupervisorSnapshot
from supervisor.tui.dashboard import header
from tests.helpers import wait_until

QW = [sys.executable, "-m", "supervisor.cli.app"]


class Up:
    """`qw up --no-tui …` in the background, its stdout in a file read as it grows."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.data = tmp_path / "qw"
        self.out_path = tmp_path / "up.out"
        with self.out_path.open("w") as out:
            self.proc = subprocess.Popen(
                [*QW, "up", "--no-tui", "--dir", str(self.data), *args],
                cwd=tmp_path,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )

    def out(self) -> str:
        return self.out_path.read_text()

    def uptime_at_least(self, seconds: int) -> bool:
        # the status line, once a second: "12:00:05 up 5s · workers 2/2 · published …"
        ups = [int(s) for s in re.findall(r" up (\d+)s · ", self.out())]
        return bool(ups) and max(ups) >= seconds

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def test_plain_up_adds_no_task_of_its_own(tmp_path: Path) -> None:
    up = Up(tmp_path, "--workers", "2", "--work-ms", "50")
    try:
        # two seconds of uptime: a demo publisher (16/s here) would have added ~30 tasks
        wait_until(lambda: up.uptime_at_least(2), 60, "two seconds of `qw up`")
        assert count_tasks(str(up.data)) == 0
        assert "no demo tasks: qw enqueue adds yours (qw up --demo adds some)" in up.out()
        assert "publishing" not in up.out()
    finally:
        up.stop()
    assert up.proc.returncode == 0
    assert up.out().splitlines()[-1] == "qw: drained (published 0, done 0, dead 0, pending 0)"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--demo"], "publishing 16 demo tasks/s"),  # 80% of 1 worker at 50 ms a task
        (["--rate", "3"], "publishing 3 demo tasks/s"),  # --rate implies --demo
    ],
)
def test_demo_and_rate_add_demo_tasks_and_say_so(
    tmp_path: Path, args: list[str], said: str
) -> None:
    up = Up(tmp_path, "--workers", "1", "--work-ms", "50", *args)
    try:
        wait_until(lambda: said in up.out(), 60, f"qw up to say {said!r}")
        wait_until(lambda: count_tasks(str(up.data)) > 0, 60, "a demo task in the log")
    finally:
        up.stop()


def header_text(demo_rate: float) -> str:
    snapshot = SupervisorSnapshot(
        location=".qw", workers=[], queue=QueueView(), events=[], demo_rate=demo_rate
    )
    out = io.StringIO()
    Console(file=out, width=100, color_system=None).print(header(snapshot, now=0.0))
    return out.getvalue()


def test_the_dashboard_header_labels_demo_traffic() -> None:
    assert "demo traffic 16/s" in header_text(16.0)
    assert "demo" not in header_text(0.0)
