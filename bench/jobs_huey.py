"""Huey's program for the job-queue benchmark (bench/jobs_program.py): a SqliteHuey (its
defaults: SQLite's own `synchronous`, FULL, with Huey's WAL journal), `@huey.task()`, and
its process consumer as its users start it, ``huey_consumer jobs.huey -k process -w W``;
each result read with `Result.get(blocking=True)`.

The consumer is up once it logs its start: it forks its worker processes right after.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from bench.jobs_program import JobsRun, Program, run_program

JOBS = """\
from huey import SqliteHuey

huey = SqliteHuey(filename="jobs.db")


@huey.task()
def add(a, b):
    return a + b
"""
#: the console script beside this interpreter
HUEY_CONSUMER = str(Path(sys.executable).with_name("huey_consumer"))


def run(directory: Path, calls: int, workers: int) -> JobsRun:
    program = Program(
        tool="Huey",
        jobs=JOBS,
        setup="from jobs import add",
        enqueue="add(i, i)",
        result="call.get(blocking=True, timeout=60)",
        workers=[[HUEY_CONSUMER, "jobs.huey", "-k", "process", "-w", str(workers)]],
        stop_signal=signal.SIGINT,
    )
    log = directory / "worker0.log"
    return run_program(
        program, directory, calls, lambda: "Huey consumer started" in log.read_text()
    )
