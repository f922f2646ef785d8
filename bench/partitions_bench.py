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

Runs are interleaved over the repeats (P = 1, 2, 4, 8, 1, 2, …) and the medians kept.
Writes a Markdown section to stdout and to bench/results-partitions.md.
"""

from __future__ import annotations

import argparse
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
from queue_worker.report import load_report, read_claims
from queue_worker.snapshot import read_snapshots

WORKERS = 8
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


def one_run(root: Path, partitions: int, tasks: int) -> Run:
    with scratch(root, f"p{partitions}") as data:
        run_dir = data / "run"
        payloads = [{"n": n} for n in range(tasks)]
        manifest = resolve_partitions(data, partitions)
        if manifest is None:
            Queue(data, "none").close()  # the queue's logs, empty
        slots = slot_partitions(WORKERS, partitions)
        with Fleet(data / "logs") as fleet:
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
        if manifest is None:
            report = load_report(data)
            ok, done = report.ok, report.tasks_done
        else:
            whole = load_partitioned_report(data, manifest)
            ok, done = whole.ok, whole.tasks_done
        if not ok or done != tasks:
            raise BenchError(f"{partitions} partitions: not exactly once ({done}/{tasks} done)")
        return Run(partitions, seconds, read)


def _last_done_at(location: str) -> int:
    return max((r.at for _, r in read_claims(location) if isinstance(r, Done)), default=0)


def main() -> None:
    global TASKS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=TASKS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results-partitions.md")
    args = parser.parse_args()
    TASKS = args.tasks
    runs: dict[int, list[Run]] = {p: [] for p in PARTITIONS}
    with tempfile.TemporaryDirectory(prefix="qw-partitions-") as tmp:
        for _ in range(args.repeats):
            for p in PARTITIONS:
                runs[p].append(one_run(Path(tmp), p, args.tasks))
    base_read = statistics.median(statistics.median(r.read_bytes) for r in runs[1])
    rows = []
    for p in PARTITIONS:
        rate = statistics.median(r.per_second for r in runs[p])
        read = statistics.median(statistics.median(r.read_bytes) for r in runs[p])
        rows.append(
            [
                p,
                f"{rate:,.0f}",
                f"{read / 1e6:.2f}",
                f"{base_read / read:.1f}×",
                "yes",
            ]
        )
    text = "\n".join(
        [
            "## Partitions: 8 workers, the file log",
            "",
            machine_line(),
            "",
            "8 worker processes (slot i on partition i mod P) started on an empty queue; then "
            f"{args.tasks} no-op tasks enqueued round-robin over the P partitions; throughput "
            "from the enqueue to the last task done; read volume = bytes each worker process "
            f"read over the same span (median worker); medians of "
            f"{args.repeats} interleaved runs; every run checked exactly once per partition "
            "and for the whole queue.",
            "",
            table(
                ["partitions", "tasks/s", "MB read per worker", "read cut", "exactly once"],
                rows,
            ),
            "",
        ]
    )
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
