"""Cancelled tasks and keys after `qw compact`, on files and on Redis: the report of the
compacted queue counts as the one before it did, and a key whose first task compaction
removed still resolves to that task (protocol §2, "key"). Real `qw up` workers, real
compactions, a real redis-server."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.test_jobs import app_dir, producer, qw

__all__ = ["app_dir"]  # (a fixture: used by name)

#: the report's fields that hold only the retained records (compacted_segments: what went)
RETAINED_ONLY = ("compacted_segments", "claims_position")


def _place(app_dir: Path, location: str) -> list[str]:
    return ["--log", location] if location.startswith("redis") else ["--dir", location]


def _up(app_dir: Path, location: str) -> None:
    env = {**os.environ, "QW_TEST_QUEUE": location}
    up = qw("up", "--no-tui", "--app", "myjobs", "--workers", "2", "--exit-when-drained",
            "--backoff", "0.01", "--segment-bytes", "4096", *_place(app_dir, location),
            cwd=app_dir, env=env)  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr


def _compact(app_dir: Path, location: str) -> None:
    done = qw("compact", "--retention", "0", *_place(app_dir, location), cwd=app_dir)
    assert done.returncode == 0, done.stdout + done.stderr


def _report(app_dir: Path, location: str) -> dict[str, Any]:
    shown = qw("report", "--json", *_place(app_dir, location), cwd=app_dir)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    report: dict[str, Any] = json.loads(shown.stdout)
    return report


def _counts(report: dict[str, Any]) -> dict[str, Any]:
    """Every count of the report, its verdict and its accounting."""
    counts = {
        name: value
        for name, value in report.items()
        if type(value) is int and name not in RETAINED_ONLY
    }
    return counts | {
        name: report[name] for name in ("lost_by_reason", "verdict", "ok", "accounting_errors")
    }


def _counts_survive_compaction(app_dir: Path, location: str) -> None:
    queue, add, always_fails, *_ = producer(location)
    with queue:
        cancelled = [add.enqueue(n, 0).id for n in range(10)]
        for task in cancelled:  # before any worker runs: dead, never claimed
            queue.cancel(task)
        for n in range(150):
            add.enqueue(n, 1)
        for n in range(5):
            always_fails.enqueue(n)  # (max_attempts=2: dead after two claims won)
    _up(app_dir, location)
    before = _report(app_dir, location)
    assert before["ok"], before["verdict"]
    assert before["cancelled_unclaimed"] == 10 and before["tasks_dead"] == 15
    assert before["tasks_done"] == 150 and before["tasks_won"] == 155
    _compact(app_dir, location)
    after = _report(app_dir, location)
    prefix = after["prefix"]
    assert prefix is not None and prefix["cancelled_unclaimed"] == 10  # (they were removed)
    assert _counts(after) == _counts(before)


def test_the_report_counts_a_compacted_file_queue_as_before(app_dir: Path) -> None:
    _counts_survive_compaction(app_dir, str(app_dir / ".qw"))


@pytest.mark.redis
def test_the_report_counts_a_compacted_redis_queue_as_before(app_dir: Path, redis_url: str) -> None:
    _counts_survive_compaction(app_dir, redis_url)
