"""RQ's program for the job-queue benchmark (bench/jobs_program.py): a plain function, W
``rq worker`` processes (RQ's docs: "If you want to perform jobs concurrently, simply start
more workers"; each forks a work horse per job, RQ's default `Worker`), `q.enqueue(add, i,
i)`, each result read with RQ's blocking `job.latest_result(timeout=)` (an XREAD on the
job's result stream). The redis-server is started before the workers' launch (not timed),
without persistence, as the qw benches on Redis start theirs.

The workers are up once RQ counts them all (`Worker.count`: each registers at its birth).
"""

from __future__ import annotations

import importlib.util
import shutil
import signal
import sys
from pathlib import Path

from bench.jobs_program import JobsRun, Program, run_program

JOBS = """\
def add(a, b):
    return a + b
"""
SETUP = """\
from redis import Redis
from rq import Queue

from jobs import add

queue = Queue(connection=Redis.from_url(sys.argv[2]))"""
#: the console script beside this interpreter
RQ = str(Path(sys.executable).with_name("rq"))


def available() -> str | None:
    """Why RQ cannot run here (None: it can)."""
    if importlib.util.find_spec("rq") is None:
        return "rq is not installed (pip install -e '.[bench]')"
    return None if shutil.which("redis-server") else "redis-server is not installed"


def run(directory: Path, calls: int, workers: int) -> JobsRun:
    from redis import Redis
    from rq import Worker

    from bench.redis_bench import redis_server  # (it imports huey: the bench extra's)

    binary = shutil.which("redis-server")
    assert binary is not None, available()
    server = directory / "redis"
    server.mkdir()
    with redis_server(server, binary) as url:
        program = Program(
            tool="RQ",
            jobs=JOBS,
            setup=SETUP,
            enqueue="queue.enqueue(add, i, i)",
            result="call.latest_result(timeout=60).return_value",
            workers=[[RQ, "worker", "--url", url]] * workers,
            stop_signal=signal.SIGTERM,
        )
        with Redis.from_url(url) as client:
            return run_program(
                program,
                directory,
                calls,
                lambda: Worker.count(connection=client) >= workers,
                producer_args=[url],
            )
