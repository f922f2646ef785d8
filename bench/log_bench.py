"""The file log's own numbers: append throughput, durable appends, wake-up latency.

Every qw figure stands beside a raw loop measured in the same run on the same disk: the
least an append under a shared lock can cost (``flock; os.write; flock(UN)`` on an
O_APPEND file: no frame, no checksum, no torn-tail check). The ratio column is qw / raw.

Wake-up latency: a reader process blocks in ``wait()``; a writer process appends a record
carrying ``time.monotonic_ns()`` taken just before ``append``; the sample is the time from
then until the reader's ``read`` has returned the record (CLOCK_MONOTONIC is one clock for
every process). The writer pauses ~1 ms between samples so that the reader is asleep.

    python -m bench.log_bench          # prints a Markdown section
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import platform
import random
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from logstore.base import Durability
from logstore.file.log import FileLog
from queue_worker.percentile import nearest_rank

CTX = multiprocessing.get_context("fork")
RECORD = b"r" * 100
STAMP = struct.Struct("<Q")
PER_PROCESS = {1: 60_000, 8: 15_000}  # plain appends per process
DURABLE_PER_PROCESS = {1: 2_000, 8: 800}
WAKE_SAMPLES = 2_000
TIMEOUT = 300.0

# Targets from the issue: qw keeps up with the raw loop, and readers wake fast.
TARGET_RATIO_1P = 0.40
TARGET_WAKE_P50_US = 150.0
TARGET_WAKE_P99_US = 1000.0

Loop = Callable[[str, int], None]


def _raw_loop(path: str, count: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    flock, write, ex, un = fcntl.flock, os.write, fcntl.LOCK_EX, fcntl.LOCK_UN
    for _ in range(count):
        flock(lock, ex)
        write(fd, RECORD)
        flock(lock, un)
    os.close(lock)
    os.close(fd)


def _raw_durable_loop(path: str, count: int) -> None:
    """The naive durable append: one fdatasync per record, under the lock."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    for _ in range(count):
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.write(fd, RECORD)
        os.fdatasync(fd)
        fcntl.flock(lock, fcntl.LOCK_UN)
    os.close(lock)
    os.close(fd)


def _qw_loop(path: str, count: int) -> None:
    with FileLog.open(path, Durability.COMMIT) as log:
        append = log.append
        for _ in range(count):
            append(RECORD)


#: the segmented rows: small segments, so that the run starts many (a roll every ~9,000 records)
SMALL_SEGMENTS = 1 << 20


def _qw_segmented_loop(path: str, count: int) -> None:
    with FileLog.open(path, Durability.COMMIT, segment_bytes=SMALL_SEGMENTS) as log:
        append = log.append
        for _ in range(count):
            append(RECORD)


def _qw_durable_loop(path: str, count: int) -> None:
    with FileLog.open(path, Durability.COMMIT) as log:
        for _ in range(count):
            log.append(RECORD, durable=True)


def _timed(loop: Loop, path: str, count: int, barrier: Barrier, out: Queue[Any]) -> None:
    if loop in (_qw_loop, _qw_durable_loop, _qw_segmented_loop):
        FileLog.open(path).close()  # creation is not part of the measurement
    barrier.wait(TIMEOUT)
    started = time.perf_counter()
    loop(path, count)
    out.put((started, time.perf_counter()))


def appends_per_second(loop: Loop, processes: int, count: int, directory: Path) -> float:
    """Total appends/s of `processes` processes running `loop` on one file at once."""
    path = str(directory / f"{loop.__name__}-{processes}-{random.getrandbits(32):08x}.log")
    if loop in (_qw_loop, _qw_durable_loop):
        FileLog.open(path).close()
    barrier = CTX.Barrier(processes)
    out: Queue[Any] = CTX.Queue()
    children = [
        CTX.Process(target=_timed, args=(loop, path, count, barrier, out)) for _ in range(processes)
    ]
    for child in children:
        child.start()
    spans: list[tuple[float, float]] = [out.get(timeout=TIMEOUT) for _ in children]
    for child in children:
        child.join(TIMEOUT)
        if child.exitcode != 0:
            raise RuntimeError(f"{loop.__name__} child exited with {child.exitcode}")
    elapsed = max(end for _, end in spans) - min(begin for begin, _ in spans)
    return processes * count / elapsed


# -- wake-up latency -------------------------------------------------------------------------


def _wake_reader(path: str, samples: int, ready: Connection, out: Queue[Any]) -> None:
    latencies: list[int] = []
    with FileLog.open(path) as log:
        position = log.end()
        ready.send(position)
        while len(latencies) < samples:
            if not log.wait(position, TIMEOUT):
                break
            entries = log.read(position)
            now = time.monotonic_ns()
            for entry in entries:
                latencies.append(now - STAMP.unpack_from(entry.data)[0])
            position = entries[-1].next if entries else position
            ready.send(position)  # tells the writer it may append the next one
    out.put(latencies)


def _wake_writer(path: str, samples: int, ready: Connection) -> None:
    rng = random.Random(7)
    pad = b"w" * 92
    with FileLog.open(path) as log:
        for _ in range(samples):
            ready.recv()
            time.sleep(0.0008 + rng.random() * 0.0004)  # let the reader fall asleep in wait()
            log.append(STAMP.pack(time.monotonic_ns()) + pad)


def wake_latencies_us(directory: Path, samples: int) -> list[float]:
    path = str(directory / "wake.log")
    FileLog.open(path).close()
    reader_end, writer_end = CTX.Pipe()
    out: Queue[Any] = CTX.Queue()
    reader = CTX.Process(target=_wake_reader, args=(path, samples, reader_end, out))
    writer = CTX.Process(target=_wake_writer, args=(path, samples, writer_end))
    reader.start()
    writer.start()
    latencies: list[int] = out.get(timeout=TIMEOUT)
    reader.join(TIMEOUT)
    writer.join(TIMEOUT)
    return sorted(ns / 1000 for ns in latencies)


# -- the report ------------------------------------------------------------------------------


def _row(what: str, ours: float, raw: float, raw_name: str) -> str:
    return f"| {what} | {ours:,.0f} | {raw:,.0f} ({raw_name}) | {ours / raw:.2f} |"


def run() -> str:
    """Measure everything and return a Markdown section."""
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="qw-log-bench-") as tmp:
        directory = Path(tmp)
        plain = {
            n: (
                appends_per_second(_qw_loop, n, PER_PROCESS[n], directory),
                appends_per_second(_raw_loop, n, PER_PROCESS[n], directory),
            )
            for n in (1, 8)
        }
        segmented = {
            n: appends_per_second(_qw_segmented_loop, n, PER_PROCESS[n], directory) for n in (1, 8)
        }
        durable = {
            n: (
                appends_per_second(_qw_durable_loop, n, DURABLE_PER_PROCESS[n], directory),
                appends_per_second(_raw_durable_loop, n, DURABLE_PER_PROCESS[n], directory),
            )
            for n in (1, 8)
        }
        wake = wake_latencies_us(directory, WAKE_SAMPLES)

    p50, p99 = nearest_rank(wake, 0.50), nearest_rank(wake, 0.99)  # wake is sorted
    ratio_1p = plain[1][0] / plain[1][1]
    lines = [
        "## File log",
        "",
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()} "
        f"{platform.release()}; files in {tempfile.gettempdir()}; load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after (other work on the machine "
        "shows in the tails). Records of 100 bytes.",
        "",
        "| appends/s | qw FileLog | raw loop | ratio |",
        "|---|---:|---:|---:|",
        _row("1 process", *plain[1], "flock + write"),
        _row("8 processes", *plain[8], "flock + write"),
        _row("1 process, 1 MiB segments", segmented[1], plain[1][1], "flock + write"),
        _row("8 processes, 1 MiB segments", segmented[8], plain[8][1], "flock + write"),
        _row("durable, 1 process", *durable[1], "flock + write + fdatasync"),
        _row("durable, 8 processes", *durable[8], "flock + write + fdatasync"),
        "",
        "Durable = `Durability.COMMIT` with `durable=True`: group commit across processes. "
        f"Segmented: a new segment file every {SMALL_SEGMENTS >> 20} MiB (the default is "
        "32 MiB, which these runs never reach); its rows compare with the rows above them.",
        "",
        f"Wake-up latency, append start → reader has the record ({len(wake)} samples): "
        f"p50 {p50:.0f} µs, p99 {p99:.0f} µs, mean {statistics.fmean(wake):.0f} µs, "
        f"max {wake[-1]:.0f} µs.",
        "",
        "| target | wanted | measured | |",
        "|---|---:|---:|---|",
        _target("1-process appends vs raw loop", f"≥ {TARGET_RATIO_1P:.2f}", ratio_1p,
                ratio_1p >= TARGET_RATIO_1P, "{:.2f}"),
        _target("wake-up p50", f"≤ {TARGET_WAKE_P50_US:.0f} µs", p50,
                p50 <= TARGET_WAKE_P50_US, "{:.0f} µs"),
        _target("wake-up p99", f"≤ {TARGET_WAKE_P99_US:.0f} µs", p99,
                p99 <= TARGET_WAKE_P99_US, "{:.0f} µs"),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def _target(what: str, wanted: str, value: float, met: bool, fmt: str) -> str:
    return f"| {what} | {wanted} | {fmt.format(value)} | {'met' if met else 'MISSED'} |"


if __name__ == "__main__":
    print(run())
