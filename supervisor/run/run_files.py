"""Which supervisors and workers of a data directory are still running, by their status
files and their processes.

Its own module so that `qw status` and `qw kill` ask it without importing the supervisor:
that import (multiprocessing, the monitor, the worker's process module…) was ~40 ms of the
~335 ms of CPU `qw status` took on the bench machine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from queue_worker.worker.snapshot import WorkerSnapshot


def read_status_files(run_dir: Path) -> list[dict[str, Any]]:
    """The status of every supervisor running on a data directory (stale files of
    supervisors that were killed are skipped)."""
    statuses: list[dict[str, Any]] = []
    for path in sorted((run_dir / "supervisors").glob("*.json")):
        try:
            status = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        pid = status.get("pid") if isinstance(status, dict) else None
        if isinstance(pid, int) and _running_since(pid, status.get("started_at")):
            statuses.append(status)
    return statuses


def _running_since(pid: int, started_at: object) -> bool:
    """Is `pid` alive and the same process that started at `started_at` (not a reused pid)?"""
    if pid > 0:
        # No such process: not running, known without psutil (~25 ms of CPU to import, and
        # most files in a run directory are those of workers that have exited)
        try:
            os.kill(pid, 0)  # signal 0: only asks whether the process exists
        except ProcessLookupError:
            return False
        except OSError:  # another user's process, say: psutil tells
            pass
    import psutil

    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        created = process.create_time()
    except psutil.Error:
        return False
    return not isinstance(started_at, (int, float)) or created <= started_at + 1.0


def is_running_worker(snapshot: WorkerSnapshot) -> bool:
    """Is the worker that published `snapshot` still running?"""
    # (WorkerState is a str: its EXITED is the word; not imported, for `qw status`)
    if snapshot.pid is None or snapshot.state == "exited":
        return False
    return _running_since(snapshot.pid, snapshot.started_at)


def is_running(stats: Mapping[str, Any]) -> bool:
    """`is_running_worker` for stats read as plain values (queue_worker.worker.stats_file)."""
    pid = stats["pid"]
    if pid is None or stats["state"] == "exited":
        return False
    return _running_since(pid, stats["started_at"])


__all__ = ["is_running", "is_running_worker", "read_status_files"]
