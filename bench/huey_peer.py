"""Huey's SqliteHuey with its process consumer, draining the same no-op backlog as qw.

Two durabilities: Huey's default (`fsync=None`: SQLite's own `synchronous` setting, FULL,
with Huey's WAL journal) and sync off (`fsync=False` → ``pragma synchronous=0``).

How it is timed, to compare with qw's drain (first CLAIM's `at` → last accepted DONE's `at`):
each task returns its handler's (start, end) wall-clock timestamps, which Huey stores as the
task's result; the drain is timed from the earliest start to the latest end (consumer and
worker-process start-up excluded, as for qw). The wall time from launching the consumer to
the last result being stored is reported beside it: the consumer is launched as a user
launches `huey_consumer`, a fresh interpreter that imports Huey and the task module (as
`qw up` is a fresh interpreter), with bytecode caches written as a user's Python writes
them. The backlog is enqueued beforehand with
sync off whatever the mode (the setting is per connection, and enqueueing is not measured).

    python -m bench.huey_peer
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huey import SqliteHuey

REPO = Path(__file__).resolve().parent.parent
#: the consumer's environment: this package importable, bytecode caches written (a build
#: environment's PYTHONDONTWRITEBYTECODE would make it compile its modules at every launch)
CONSUMER_ENV = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
}
TIMEOUT_S = 300.0
#: no new result for this long, with results missing: a result was lost (see `drain`)
STALL_S = 10.0


class HueyStalled(RuntimeError):
    """Huey stopped storing results short of the backlog."""


@dataclass(frozen=True)
class HueyDrain:
    tasks: int
    span_s: float  # first task start → last task end
    wall_s: float  # consumer start → every result stored
    #: CPU of the consumer and its workers, start to exit (None: not measured)
    consumer_cpu_s: float | None = None
    #: CPU of redis-server meanwhile (RedisHuey; None: not measured)
    server_cpu_s: float | None = None

    @property
    def rate(self) -> float:
        return self.tasks / self.span_s

    @property
    def wall_rate(self) -> float:
        return self.tasks / self.wall_s


def _noop(i: int) -> tuple[float, float]:
    """The task: does nothing, and says when it started and ended (wall clock, seconds)."""
    started = time.time()
    return started, time.time()


def _make_huey(path: str, fsync: bool | None) -> tuple[Any, Any]:
    """The Huey instance and its registered no-op task."""
    huey = SqliteHuey("bench", filename=path, fsync=fsync)
    return huey, huey.task(name="noop")(_noop)


def _consume(path: str, fsync: bool | None, workers: int) -> None:
    huey, _ = _make_huey(path, fsync)
    consumer = huey.create_consumer(workers=workers, worker_type="process", periodic=False)
    consumer.run()


def drain(workers: int, fsync: bool | None, tasks: int = 10_000) -> HueyDrain:
    """Huey's process consumer with `workers` workers draining `tasks` no-op tasks."""
    with tempfile.TemporaryDirectory(prefix="qw-huey-") as d:
        path = str(Path(d) / "huey.db")
        producer, noop = _make_huey(path, False)
        for i in range(tasks):
            noop(i)
        producer.storage.close()
        huey, _ = _make_huey(path, fsync)
        code = f"from bench.huey_peer import _consume; _consume({path!r}, {fsync!r}, {workers})"
        start = time.time()
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            env=CONSUMER_ENV,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + TIMEOUT_S
            stored, moved = 0, time.monotonic()
            while (now_stored := huey.storage.result_store_size()) < tasks:
                time.sleep(0.002)  # a poll interval of the benchmark harness
                if proc.poll() is not None:
                    raise RuntimeError(f"the huey consumer exited with {proc.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"huey did not drain {tasks} tasks in {TIMEOUT_S:.0f}s")
                if now_stored != stored:
                    stored, moved = now_stored, time.monotonic()
                elif time.monotonic() - moved > STALL_S:
                    # Huey loses a result now and then on a busy machine ("database is
                    # locked" after the task ran): the count never reaches `tasks`.
                    raise HueyStalled(f"huey stalled at {stored} of {tasks} results")
            wall = time.time() - start
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        spans = [huey.serializer.deserialize(v) for v in huey.storage.result_items().values()]
        huey.storage.close()
        if len(spans) != tasks:
            raise RuntimeError(f"huey stored {len(spans)} results for {tasks} tasks")
        first = min(s for s, _ in spans)
        last = max(e for _, e in spans)
        return HueyDrain(tasks, last - first, wall)


if __name__ == "__main__":
    for n in (1, 8):
        off, default = drain(n, False), drain(n, None)
        print(f"{n} workers sync off: {off.rate:,.0f}/s; default: {default.rate:,.0f}/s")
