"""The drain on the Redis log: the same workers with ``location = redis://…``.

A redis-server is started for the run on a free loopback port, its data in a scratch
directory, with persistence off (``--save "" --appendonly no``: the counterpart of the file
log's `fsync none`). Each drain uses its own key prefix. The section is skipped, with a
note, when no redis-server binary is installed (or the redis client is missing).

On this backend the fold judges by the server's clock (millisecond stamps), so the drain is
timed on that clock: first CLAIM → last accepted DONE, as the server stamped them.
"""

from __future__ import annotations

import importlib.util
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.common import Section, free_port, median, num, scratch, table, wait_for
from bench.queue_bench import DrainResults, QwDrain, qw_drain


def log(message: str) -> None:
    print(f"  · {message}", file=sys.stderr, flush=True)


@contextmanager
def redis_server(directory: Path, binary: str) -> Iterator[str]:
    """A redis-server on a free loopback port; yields ``redis://127.0.0.1:PORT``."""
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
         "--save", "", "--appendonly", "no", "--daemonize", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def accepting() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    try:
        wait_for(accepting, 20, "redis-server to accept connections")
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def redis_section(
    root: Path, drains: DrainResults, tasks: int, repeats: int, workers: int = 8
) -> Section:
    title = "Redis log: the drain on redis://"
    binary = shutil.which("redis-server")
    if binary is None or importlib.util.find_spec("redis") is None:
        missing = "redis-server is not installed" if binary is None else "redis-py is missing"
        return Section(title, f"Skipped: {missing} (`apt-get install redis-server`).")
    runs: list[QwDrain] = []
    with scratch(root, "redis") as d, redis_server(d, binary) as url:
        for rep in range(repeats):
            log(f"redis drain repeat {rep + 1}/{repeats}: {workers} workers, {tasks} tasks")
            runs.append(qw_drain(root, workers, tasks, location=f"{url}/0?prefix=bench{rep}"))
    rate = median(r.rate for r in runs)
    file_rate = drains.qw_rate(workers)
    file_note = "" if drains.tasks == tasks else f" ({drains.tasks:,} tasks)"
    rows = [
        ["qw on Redis", num(rate), " / ".join(num(r.rate) for r in runs),
         num(median(r.wall_rate for r in runs)), f"{median(r.lost_pct for r in runs):.2f} %"],
        [f"qw on the file log (drain section){file_note}", num(file_rate), "",
         num(median(r.wall_rate for r in drains.qw.get(workers, []))),
         f"{median(r.lost_pct for r in drains.qw.get(workers, [])):.2f} %"],
    ]  # fmt: skip
    body = "\n".join(
        [
            f"{tasks:,} no-op tasks, {workers} workers, `fsync none`, median of {repeats}; "
            "redis-server on loopback, persistence off. Every run passed the exactly-once check.",
            "",
            table(["", "tasks/s", "runs", "wall tasks/s", "lost CLAIMs"], rows),
        ]
    )
    return Section(title, body)
