"""The raw-log bound: the least work a log-coordinated drain can do, with no crash safety.

N processes share one file. Each loop: read to the end, pick a task nobody claimed, take the
flock, append a fixed 16-byte CLAIM, release; read to the end until its own record shows
whether it won (first claim of a task wins); if it did, append DONE the same way. No frames,
no checksums, no fsync, no leases, no msgpack: whatever qw does above this costs that much.
"""

from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import struct
import tempfile
import time
from pathlib import Path

RECORD = struct.Struct("<BxxxIQ")  # kind, task, worker → 16 bytes
CLAIM, DONE = 1, 2


def _worker(path: str, worker: int, workers: int, tasks: int, go: mp.Event) -> None:  # type: ignore[valid-type]
    fd = os.open(path, os.O_RDWR | os.O_APPEND)
    pos = 0
    claimed: set[int] = set()
    done = 0
    nxt = worker  # spread: start in its own part of the id space
    go.wait()  # type: ignore[attr-defined]

    def catch_up() -> list[tuple[int, int, int]]:
        nonlocal pos
        out: list[tuple[int, int, int]] = []
        while True:
            chunk = os.pread(fd, 1 << 16, pos)
            if not chunk:
                return out
            usable = len(chunk) - len(chunk) % RECORD.size
            for off in range(0, usable, RECORD.size):
                out.append(RECORD.unpack_from(chunk, off))
            pos += usable
            if usable < len(chunk):
                return out

    def absorb(records: list[tuple[int, int, int]]) -> None:
        nonlocal done
        for kind, task, _w in records:
            if kind == CLAIM:
                claimed.add(task)
            else:
                done += 1

    while done < tasks:
        absorb(catch_up())
        while nxt < tasks and nxt in claimed:
            nxt += workers
        if nxt >= tasks:
            nxt = next((t for t in range(tasks) if t not in claimed), tasks)
            if nxt >= tasks:  # everything is claimed; wait for the DONEs
                continue
        task = nxt
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, RECORD.pack(CLAIM, task, worker))
        fcntl.flock(fd, fcntl.LOCK_UN)
        won = False
        settled = False
        while not settled:
            for kind, t, w in catch_up():
                if kind == CLAIM:
                    if t == task and not settled:
                        if t not in claimed and w == worker:
                            won = True
                        if w == worker:
                            settled = True
                    claimed.add(t)
                else:
                    done += 1
        if won:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, RECORD.pack(DONE, task, worker))
            fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def drain(workers: int, tasks: int = 10_000) -> float:
    """Tasks per second for `workers` processes draining `tasks` through the raw loop."""
    with tempfile.TemporaryDirectory(prefix="qw-raw-") as d:
        path = str(Path(d) / "raw.log")
        Path(path).touch()
        ctx = mp.get_context("fork")
        go = ctx.Event()
        procs = [
            ctx.Process(target=_worker, args=(path, w, workers, tasks, go)) for w in range(workers)
        ]
        for p in procs:
            p.start()
        start = time.perf_counter()
        go.set()
        for p in procs:
            p.join()
        elapsed = time.perf_counter() - start
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError("a raw-loop worker failed")
        return tasks / elapsed


if __name__ == "__main__":
    for n in (1, 2, 4, 8):
        print(f"{n} workers: {drain(n):,.0f} tasks/s")
