"""`qw up --fresh`: start on an empty queue by removing the one a data directory holds.

A stopped run leaves its backlog in the logs, and the next `qw up` works it (that is what a
durable queue is for). `--fresh` is the one word for "not this time": it removes the files
qw writes in the data directory (the logs and their segments, the fold checkpoint, the
locks, `run/`, a partitioned queue's manifest and partition directories, the default
timeline page), says how many, and leaves every other file where it is. It refuses while
any `qw up` runs on the directory, and on a `--log` queue (that one lives on its server).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Final

from supervisor.run.run_files import read_status_files

#: the names qw gives the files at the top of a data directory (and of each partition's)
QW_FILE: Final = re.compile(
    r"(tasks|claims|ops)(\.log|\.\d{20}\.seg)(\.lock|\.sync)?"
    r"|(tasks|claims|ops)\.log\.\d+(\.stub)?\.tmp"
    r"|fold\.checkpoint(\.previous|\.lock)?|fold\.checkpoint\.\d+\.tmp"
    r"|queue\.lock|partitions(\.lock)?|timeline\.html"
)
#: the directories qw makes there: the run state, and a partitioned queue's partitions
QW_DIRECTORY: Final = re.compile(r"run|p\d+")


class FreshRefused(Exception):
    """`--fresh` cannot start clean here; the message says why, in one line."""


def qw_entries(data_dir: Path) -> list[Path]:
    """What qw wrote at the top of `data_dir`, in name order (nothing when it is missing)."""
    if not data_dir.is_dir():
        return []
    return sorted(
        entry
        for entry in data_dir.iterdir()
        if (entry.is_dir() and not entry.is_symlink() and QW_DIRECTORY.fullmatch(entry.name))
        or (not entry.is_dir() and QW_FILE.fullmatch(entry.name))
    )


def start_fresh(data_dir: Path) -> str:
    """Remove the queue in `data_dir`; what was removed (and kept), in one line."""
    running = read_status_files(data_dir / "run")
    if running:
        pids = ", ".join(str(s.get("pid")) for s in running)
        raise FreshRefused(
            f"--fresh: {len(running)} qw up still run on {data_dir} (pid {pids}); stop "
            "them first (q, Ctrl-C) or start on another --dir"
        )
    entries = qw_entries(data_dir)
    if not entries:
        return f"qw: --fresh: no queue in {data_dir}: starting on an empty one"
    files = 0
    for entry in entries:
        if entry.is_dir():
            files += sum(1 for p in entry.rglob("*") if not p.is_dir())
            shutil.rmtree(entry)
        else:
            files += 1
            entry.unlink()
    others = sorted(p.name for p in data_dir.iterdir())
    kept = f"; kept what qw did not write: {', '.join(others)}" if others else ""
    return (
        f"qw: --fresh: removed the queue in {data_dir} (its logs, checkpoint and run "
        f"files: {files} files){kept}"
    )
