"""A supervisor's status file: what `qw status` reads of a running `qw up` (its pid, when it
started, its --http address, whether it drains, its processes), in ``run/supervisors/``.

`supervisor.run.run_files.read_status_files` reads them back (and skips those of processes
that are gone); `supervisor.cli.supervisor_lines` says them.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["remove_status", "status_path", "write_status"]


def status_path(run_dir: Path) -> Path:
    """This process's status file in `run_dir`."""
    return run_dir / "supervisors" / f"{os.getpid()}.json"


def write_status(path: Path, status: dict[str, Any]) -> None:
    """Replace the file whole (a reader never sees half of it); a full disk costs `qw
    status`, not the run."""
    tmp = path.with_suffix(".tmp")
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(status))
        os.replace(tmp, path)


def remove_status(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
