"""Partitions: what splitting a queue buys (``python -m bench.partitions_bench``).

For P = 1, 2, 4, 8 partitions on the file log, 8 worker processes (slot i on partition
``slot_partitions(8, P)[i]``, as `qw up --partitions P` assigns them) drain the same
number of no-op tasks, enqueued round-robin over the partitions before the workers start.
Measured per run:

- throughput: the workers are started on the empty queue; once every one is up, the tasks
  are enqueued (batches of 1000, round-robin over the partitions) and timed until the last
  DONE's own time: the steady state, start-up left out;
- each worker's read volume: the bytes its process read (``read_chars`` of
  /proc/<pid>/io, psutil) from the moment every worker was up to the last task done —
  the logs it followed, which is what partitions are meant to cut;
- the exactly-once check of every partition (`load_partitioned_report` / `load_report`).

With ``--redis URL`` the same runs are made on that Redis server too (interleaved with the
file log's), each queue under a fresh ``?prefix=``; a worker's reads there are socket
reads, which read_chars does not count, so its read volume is given as the records of the
streams it follows (its partition's tasks and claims: it reads each at least once).

Runs are interleaved over the repeats (P = 1, 2, 4, 8, 1, 2, …) and the medians kept.
Writes a Markdown section to stdout and to bench/results-partitions.md.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.common import (
    REPO,
    BenchError,
    Fleet,
    machine_line,
    scratch,
    table,
    wait_for,
    worker_config,
)
from queue_worker.partition_report import load_partitioned_report
from queue_worker.partitioned import PartitionedQueue, resolve_partitions
from queue_worker.partitions import partition_location, slot_partitions
from queue_worker.producer import Queue
from queue_worker.records import Done
from queue_worker.report import count_tasks, load_report, read_claims
from queue_worker.snapshot import read_snapshots

WORKERS = 8
#: longer than any stall of this shared machine: a worker paused past its lease is taken
#: over and its DONE refused, which the exactly-once check (rightly) fails — seen at load
#: 20+ on 2 cores with the default 5 s; this measures throughput, not chaos
LEASE_S = 30.0
PARTITIONS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Run:
    partitions: int
    seconds: float
    read_bytes: list[int]  # per worker

    @property
    def per_second(self) -> float:
        return 0.0 if self.seconds <= 0 else TASKS / self.seconds


TASKS = 8000


def one_run(root: Path, partitions: int, tasks: int, redis_url: str | None = None) -> Run:
    with scratch(root, f"p{partitions}") as local:
        run_dir = local / "run"
        # the queue: in the scratch directory, or under a fresh prefix on the Redis server
        data: Path | str = local
        if redis_url is not None:
            sep = "&" if "?" in redis_url else "?"
            data = f"{redis_url}{sep}prefix=bench{partitions}x{secrets.token_hex(3)}"
        payloads = [{"n": n} for n in range(tasks)]
        manifest = resolve_partitions(data, partitions)
        if manifest is None:
            Queue(data, "none").close()  # the queue's logs, empty
        slots = slot_partitions(WORKERS, partitions)
        with Fleet(local / "logs") as fleet:
            for i, k in enumerate(slots):
                location = data if manifest is None else partition_location(data, k, partitions)
                mates = [j for j, other in enumerate(slots) if other == k]
                fleet.start(
                    worker_config(
                        location,
                        run_dir,
                        f"w{i}",
                        slot=mates.index(i),
                        slots=len(mates),
                        exit_when_drained=False,
                        lease_s=LEASE_S,
                    )
                )
            # Every worker up and idle on the empty queue: what it reads from here on is
            # the logs (its start-up — the interpreter, the modules — is left out).
            wait_for(lambda: len(read_snapshots(run_dir)) >= WORKERS, 120, "the workers to start")
            before = [psutil.Process(p.pid).io_counters().read_chars for p in fleet.procs]
            started = time.time()
            if manifest is None:
                with Queue(data, "none") as queue:
                    for first in range(0, tasks, 1000):
                        queue.enqueue_many(payloads[first : first + 1000])
            else:
                with PartitionedQueue(data, manifest, "none") as pq:
                    for first in range(0, tasks, 1000):
                        pq.enqueue_many(payloads[first : first + 1000])

            def finished() -> bool:
                return sum(s.finished for s in read_snapshots(run_dir)) >= tasks

            wait_for(finished, 300, f"{tasks} tasks done with {partitions} partitions")
            locations = (
                [str(data)]
                if manifest is None
                else [partition_location(data, k, partitions) for k in range(partitions)]
            )
            # the end is the last DONE's own time (the published stats lag by up to a tick)
            seconds = max(_last_done_at(where) for where in locations) / 1e6 - started
            after = [psutil.Process(p.pid).io_counters().read_chars for p in fleet.procs]
            read = [b - a for a, b in zip(before, after, strict=True)]
        if redis_url is not None:
            # Socket reads are not in read_chars: count the records each worker's partition
            # holds (it read each at least once) instead.
            followed = {where: _records(where) for where in set(locations)}
            read = [
                followed[str(data) if manifest is None else partition_location(data, k, partitions)]
                for k in slots
            ]
        if manifest is None:
            report = load_report(data)
            ok, done, verdict = report.ok, report.tasks_done, report.verdict
        else:
            whole = load_partitioned_report(data, manifest)
            ok, done, verdict = whole.ok, whole.tasks_done, whole.verdict
        if not ok or done != tasks:
            where = "the file log" if redis_url is None else "redis"
            raise BenchError(f"{partitions} partitions on {where}: {done}/{tasks} done: {verdict}")
        return Run(partitions, seconds, read)


def _records(location: str) -> int:
    return count_tasks(location) + sum(1 for _ in read_claims(location))


def _last_done_at(location: str) -> int:
    return max((r.at for _, r in read_claims(location) if isinstance(r, Done)), default=0)


def section(title: str, runs: dict[int, list[Run]], tasks: int, repeats: int, unit: str) -> str:
    base_read = statistics.median(statistics.median(r.read_bytes) for r in runs[1])
    rows = []
    for p in PARTITIONS:
        rate = statistics.median(r.per_second for r in runs[p])
        read = statistics.median(statistics.median(r.read_bytes) for r in runs[p])
        shown = f"{read / 1e6:.2f}" if unit == "MB" else f"{read:,.0f}"
        rows.append([p, f"{rate:,.0f}", shown, f"{base_read / read:.1f}×", "yes"])
    what = (
        "read volume = bytes each worker process read over the same span (median worker)"
        if unit == "MB"
        else "records = the records of the streams each worker follows (median worker; "
        "socket reads are not counted by read_chars)"
    )
    return "\n".join(
        [
            f"## Partitions: 8 workers, {title}",
            "",
            machine_line(),
            "",
            "8 worker processes (slot i on partition i mod P) started on an empty queue; then "
            f"{tasks} no-op tasks enqueued round-robin over the P partitions; throughput "
            f"from the enqueue to the last task done; {what}; medians of {repeats} "
            "interleaved runs; every run checked exactly once per partition and for the "
            "whole queue.",
            "",
            table(
                [
                    "partitions",
                    "tasks/s",
                    "MB read per worker" if unit == "MB" else "records per worker",
                    "read cut",
                    "exactly once",
                ],
                rows,
            ),
            "",
        ]
    )


def main() -> None:
    global TASKS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=TASKS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--redis", metavar="URL", help="also run on this Redis server")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results-partitions.md")
    args = parser.parse_args()
    TASKS = args.tasks
    backends: list[str | None] = [None] if args.redis is None else [None, args.redis]
    runs: dict[str | None, dict[int, list[Run]]] = {
        b: {p: [] for p in PARTITIONS} for b in backends
    }
    with tempfile.TemporaryDirectory(prefix="qw-partitions-") as tmp:
        for _ in range(args.repeats):
            for p in PARTITIONS:
                for backend in backends:
                    runs[backend][p].append(one_run(Path(tmp), p, args.tasks, backend))
    text = section("the file log", runs[None], args.tasks, args.repeats, "MB")
    if args.redis is not None:
        text += "\n" + section(
            "one local redis-server", runs[args.redis], args.tasks, args.repeats, "records"
        )
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
