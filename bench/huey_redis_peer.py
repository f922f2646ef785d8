"""Huey's RedisHuey with its process consumer, draining a no-op backlog from a redis-server:
the Redis queue people use, against which qw on Redis is measured (bench/redis_bench.py).

The backlog is enqueued beforehand (not measured). Timed like `qw up` end to end: from
starting the consumer to the last result stored (``HLEN`` of Huey's result hash, polled
every 2 ms); the steady state beside it, from the first task's start to the last task's
end (each task returns its handler's wall-clock start and end, as in bench/huey_peer.py).
Huey's defaults otherwise: blocking reads (``BRPOP``), results kept.

    python -m bench.huey_redis_peer redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import signal
import sys
import time
from typing import Any

from huey import RedisHuey

from bench.huey_peer import STALL_S, TIMEOUT_S, HueyDrain, HueyStalled, _noop


def _make_huey(url: str, name: str) -> tuple[Any, Any]:
    """The Huey instance on `url` (queue `name`) and its registered no-op task."""
    huey = RedisHuey(name, url=url)
    return huey, huey.task(name="noop")(_noop)


def _consume(url: str, name: str, workers: int) -> None:
    huey, _ = _make_huey(url, name)
    consumer = huey.create_consumer(workers=workers, worker_type="process", periodic=False)
    consumer.run()


def drain(url: str, workers: int, tasks: int, name: str = "bench") -> HueyDrain:
    """RedisHuey's process consumer with `workers` workers draining `tasks` no-op tasks from
    the queue `name` at `url` (emptied first)."""
    producer, noop = _make_huey(url, name)
    producer.flush()
    pipe = producer.storage.conn.pipeline(transaction=False)
    message = producer.serialize_task
    for i in range(tasks):  # enqueued in one pipeline: the backlog is not what is timed
        pipe.lpush(producer.storage.queue_key, message(noop.s(i)))
    pipe.execute()
    server_cpu = _server_cpu(producer.storage.conn)
    # the consumer's CPU and its workers' (it waits for them): the children's rusage of
    # this process once the consumer is joined, as bench.redis_bench measures `qw up`
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    ctx = mp.get_context("fork")
    proc = ctx.Process(target=_consume, args=(url, name, workers))
    start = time.time()
    proc.start()
    storage = producer.storage
    try:
        deadline = time.monotonic() + TIMEOUT_S
        stored, moved = 0, time.monotonic()
        while (now_stored := storage.result_store_size()) < tasks:
            time.sleep(0.002)  # a poll interval of the benchmark harness
            if not proc.is_alive():
                raise RuntimeError("the huey consumer died")
            if time.monotonic() > deadline:
                raise RuntimeError(f"huey did not drain {tasks} tasks in {TIMEOUT_S:.0f}s")
            if now_stored != stored:
                stored, moved = now_stored, time.monotonic()
            elif time.monotonic() - moved > STALL_S:
                raise HueyStalled(f"huey stalled at {stored} of {tasks} results")
        wall = time.time() - start
    finally:
        if proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signal.SIGINT)
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_cpu = _server_cpu(producer.storage.conn) - server_cpu
    spans = [producer.serializer.deserialize(v) for v in storage.result_items().values()]
    producer.flush()
    if len(spans) != tasks:
        raise RuntimeError(f"huey stored {len(spans)} results for {tasks} tasks")
    first = min(s for s, _ in spans)
    last = max(e for _, e in spans)
    consumer_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return HueyDrain(tasks, last - first, wall, consumer_cpu, server_cpu)


def _server_cpu(conn: Any) -> float:
    """redis-server's CPU seconds so far (user + system)."""
    cpu = conn.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


if __name__ == "__main__":
    for n in (1, 8):
        run = drain(sys.argv[1], n, 10_000)
        print(f"{n} workers: {run.wall_rate:,.0f}/s end to end, {run.rate:,.0f}/s steady")
