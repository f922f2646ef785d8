"""Worker processes started by a program of its own (the tests, the benchmarks): one class,
so that they start workers as the supervisor's exec fallback does (`worker_command`), keep
each one's stderr in a file of its own, and leave none running behind them.

The supervisor does not use it (it forks its workers from a fork server and restarts them:
`supervisor/run/slots.py`, `supervisor/run/forked.py`); `qw demo` wraps it with what a narrated
scenario needs (`supervisor/demos/fleet.py`).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from queue_worker.process import worker_command
from queue_worker.worker.config import WorkerConfig

_Fleet = TypeVar("_Fleet", bound="WorkerProcesses")


class WorkerProcesses:
    """`with WorkerProcesses(log_dir) as fleet:` — each `start(config)` is one worker process
    (``python -m queue_worker.process``); every one still running at the end is killed."""

    def __init__(
        self, log_dir: Path, *, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.log_dir = log_dir
        self.env = dict(env) if env is not None else None  # added to each worker's environment
        self.cwd = cwd
        self.procs: list[subprocess.Popen[bytes]] = []
        self.names: dict[int, str] = {}  # pid -> the worker's name

    def start(
        self, config: WorkerConfig, *, stdout: int | None = subprocess.DEVNULL
    ) -> subprocess.Popen[bytes]:
        """Start one worker for `config`; its stderr goes to ``<name>.<n>.stderr``."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        command, env = worker_command(config)  # a password stays off the command line
        if self.env is not None:
            env = {**(env if env is not None else os.environ), **self.env}
        with open(self.log_dir / f"{config.name}.{len(self.procs)}.stderr", "wb") as err:
            # the child has its own copy of `err`
            proc = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=self.cwd
            )
        self.procs.append(proc)
        self.names[proc.pid] = config.name
        return proc

    def stderr(self, name: str) -> str:
        """Everything the workers named `name` wrote to stderr, oldest first."""
        paths = sorted(
            self.log_dir.glob(f"{name}.*.stderr"), key=lambda p: int(p.name.split(".")[-2])
        )
        return "".join(p.read_text(errors="replace") for p in paths)

    def stderr_tail(self, proc: subprocess.Popen[bytes]) -> str:
        """The last line `proc`'s worker name wrote to stderr, or "(no stderr)"."""
        lines = self.stderr(self.names[proc.pid]).strip().splitlines()
        return lines[-1] if lines else "(no stderr)"

    def stop_all(self) -> None:
        """Kill every worker still running, and reap them all."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait(30)

    def __enter__(self: _Fleet) -> _Fleet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()
