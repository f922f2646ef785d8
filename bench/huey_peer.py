"""Huey's SqliteHuey with its process consumer, draining the same no-op backlog.

Run at Huey's default durability (SQLite `synchronous` left as Huey sets it) and with sync
off (`fsync=False` → `pragma synchronous=0`). The consumer runs in a child process with
`worker_type="process"`; the clock stops when every result is stored.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from huey import SqliteHuey


def _make_huey(path: str, fsync: bool | None) -> Any:
    return SqliteHuey("bench", filename=path, fsync=fsync)


def _consume(path: str, fsync: bool | None, workers: int) -> None:
    huey = _make_huey(path, fsync)

    @huey.task(name="noop")
    def noop(i: int) -> int:
        return i

    consumer = huey.create_consumer(workers=workers, worker_type="process", periodic=False)
    consumer.run()


def drain(workers: int, fsync: bool | None, tasks: int = 10_000) -> float:
    """Tasks per second for Huey's process consumer draining `tasks` no-op tasks."""
    with tempfile.TemporaryDirectory(prefix="qw-huey-") as d:
        path = str(Path(d) / "huey.db")
        huey = _make_huey(path, fsync)

        @huey.task(name="noop")
        def noop(i: int) -> int:
            return i

        for i in range(tasks):
            noop(i)
        ctx = mp.get_context("fork")
        proc = ctx.Process(target=_consume, args=(path, fsync, workers))
        start = time.perf_counter()
        proc.start()
        try:
            while huey.storage.result_store_size() < tasks:
                time.sleep(0.005)  # a poll interval of the benchmark harness
                if not proc.is_alive():
                    raise RuntimeError("the huey consumer died")
            elapsed = time.perf_counter() - start
        finally:
            if proc.pid is not None and proc.is_alive():
                os.kill(proc.pid, signal.SIGINT)
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        return tasks / elapsed


if __name__ == "__main__":
    for n in (1, 8):
        print(f"{n} workers sync off: {drain(n, False):,.0f}/s; default: {drain(n, None):,.0f}/s")
