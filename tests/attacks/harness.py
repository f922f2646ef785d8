"""What every attack needs: run `qw` as a user does, make a small finished queue, look at
files before and after, and the three verdicts."""

from __future__ import annotations

import enum
import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QW = [sys.executable, "-m", "supervisor.cli.app"]
#: qw with its workers started as plain subprocesses (tests/qw_run.py)
QW_EXEC_WORKERS = [sys.executable, "-m", "tests.qw_run", "--exec-workers", "--"]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "400"}


class Verdict(enum.Enum):
    HELD = "held"
    DEGRADED = "degraded"
    BROKEN = "broken"


@dataclass(frozen=True)
class Finding:
    verdict: Verdict
    detail: str


def held(detail: str) -> Finding:
    return Finding(Verdict.HELD, detail)


def degraded(detail: str) -> Finding:
    return Finding(Verdict.DEGRADED, detail)


def broken(detail: str) -> Finding:
    return Finding(Verdict.BROKEN, detail)


def qw(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """One `qw` command, as a user runs it. A hang past `timeout` raises TimeoutExpired."""
    return subprocess.run(
        [*QW, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout
    )


def drained_queue(data: Path, tasks: int = 6) -> None:
    """A small queue whose tasks were all run: the starting point of most attacks."""
    done = qw(
        "up", "--dir", str(data), "--no-tui", "--workers", "2", "--work-ms", "0",
        "--tasks", str(tasks), "--exit-when-drained", cwd=data.parent,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"could not make a queue to attack: {done.stderr.strip()}")


def fingerprint(directory: Path) -> dict[str, str]:
    """Every log file's bytes, hashed: to show that an attack changed nothing."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.glob("*.log"))
        if p.is_file()
    }


def refusal(result: subprocess.CompletedProcess[str], *words: str) -> Finding | None:
    """None when `result` is the promised refusal (exit 2, one line on stderr that says
    each of `words`, no traceback); otherwise the finding that says what it was."""
    err = result.stderr.strip()
    if "Traceback" in err:
        return degraded(f"traceback (exit {result.returncode}): {err.splitlines()[-1]}")
    if result.returncode != 2:
        return degraded(f"exit {result.returncode}, not 2: {err[:200]!r}")
    lines = err.splitlines()
    if len(lines) != 1:
        return degraded(f"{len(lines)} lines of error, not one: {err[:200]!r}")
    missing = [w for w in words if w.lower() not in err.lower()]
    if missing:
        return degraded(f"the error does not name {missing}: {err!r}")
    return None
