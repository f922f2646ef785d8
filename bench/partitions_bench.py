"""Partitions: what splitting a queue buys (``python -m bench.partitions_bench``).

For P = 1, 2, 4, 8 partitions, 8 worker processes (slot i on partition
``slot_partitions(8, P)[i]``, as `qw up --partitions P` assigns them) drain the same
number of no-op tasks. The workers are started on the empty queue; once every one is up
they are paused (SIGSTOP), the tasks are enqueued (batches of 1000, round-robin over the
partitions), and they are resumed together: the run is timed from the resume to the last
DONE's own time. Start-up is left out, and so is the producer: left in, at 8 partitions on
Redis its round trips (two per partition and batch, each waiting for a core the workers
keep busy) made the enqueue last as long as the drain, which then measured the producer.
Measured per run, over the span from the resume until the bench saw the last task done:

- what the workers read: on the file log the bytes each worker process read
  (``read_chars`` of /proc/<pid>/io, psutil: the logs it followed, median worker); on
  Redis the bytes the server sent to clients (INFO ``total_net_output_bytes``, as
  bench.redis_bench counts them), less the replies to the bench's own INFO calls
  (`own_share`), divided by the workers: this redis-server keeps no per-client byte
  counts, and a worker's socket reads are not in read_chars;
- on Redis, the commands the server answered per task (round trips as bench.redis_bench
  counts them, and the script calls among them), from its command statistics;
- the CPU time (user + system) of the workers and of redis-server per task, and how busy
  that kept the CPUs — (workers + server) / (CPUs × the run's time) — beside the busy share
  of every CPU over the run, any process's (psutil.cpu_times, read at each poll of the
  bench: the shared machine's other work too): near 100 % the cores, not the queue, are
  the limit;
- when the first partition's last DONE came, in % of the run: from there on its workers
  are idle while the others finish;
- the exactly-once check of every partition (`load_partitioned_report` / `load_report`).

With ``--redis URL`` the same runs are made on that Redis server too (interleaved with the
file log's), each queue under a fresh ``?prefix=`` (its keys deleted after its check), in
both verdict modes: the queue's default, server verdicts (a script call finishes the
worker's tasks and claims its next ones, up to 8 a call: queue_worker/redis/server_claim.py,
claim_batch.py), and ``&verdicts=client`` (every worker folds every claims record of its
partition). The server's counts are the whole server's: give the bench a server nothing
else uses meanwhile.

Runs are interleaved over the repeats (P = 1, 2, 4, 8, 1, 2, …) and the medians kept.
Writes a Markdown section to stdout and to bench/results-partitions.md (``--out``).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

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
from bench.redis_bench import ROUND_TRIPS, SERVER_ROUND_TRIPS, server_stats
from queue_worker.partition_layout import Manifest, partition_location, slot_partitions
from queue_worker.partitions.queue import PartitionedQueue, resolve_partitions
from queue_worker.partitions.report import load_partitioned_report
from queue_worker.producer import Queue
from queue_worker.proof.report import load_report, read_claims
from queue_worker.protocol.records import Done
from queue_worker.worker.snapshot import read_snapshots

WORKERS = 8
#: longer than any stall of this shared machine: a worker paused past its lease is taken
#: over and its DONE refused, which the exactly-once check (rightly) fails — seen at load
#: 20+ on 2 cores with the default 5 s; this measures throughput, not chaos
LEASE_S = 30.0
PARTITIONS = (1, 2, 4, 8)
TASKS = 8000
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
SCRIPTS = ("evalsha", "eval")

#: what the server counted: calls by command, bytes sent to clients, its CPU seconds
ServerCounts = tuple[Counter[str], int, float]


@dataclass(frozen=True)
class Sample:
    """What the bench reads at each end of the measured span."""

    read_chars: list[int]  # per worker
    worker_cpu_s: float  # the workers' user + system, summed
    machine_busy_s: float  # every CPU's non-idle time, summed (any process)
    server: ServerCounts | None  # Redis only


def take_sample(procs: list[psutil.Process], client: Any) -> Sample:
    # The server's counts last: from their reading on, what the server sends is the
    # workers' and the replies to these INFO calls (`own_share`)
    read = [p.io_counters().read_chars for p in procs]
    cpu = sum(sum(p.cpu_times()[:2]) for p in procs)
    return Sample(read, cpu, machine_busy(), server_stats(client) if client else None)


def machine_busy() -> float:
    """Every CPU's non-idle time so far, summed (seconds; any process's)."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


@dataclass(frozen=True)
class Run:
    partitions: int
    seconds: float  # the workers' resume → the last DONE
    #: over the span (the resume → the bench saw the last task done): per worker,
    #: read_chars (file log); the workers' CPU; on Redis the server's counts (the bench's
    #: share taken out)
    read_bytes: list[int]
    worker_cpu_s: float
    #: every CPU's non-idle time from the resume to the bench's first poll after the last
    #: DONE (20 ms at most), and that time
    machine_busy_s: float
    machine_s: float
    enqueue_s: float  # the enqueue's own time (the workers paused: not in the run)
    drained_s: list[float]  # each partition's last DONE, after the resume
    server: ServerCounts | None = None

    @property
    def per_second(self) -> float:
        return 0.0 if self.seconds <= 0 else TASKS / self.seconds

    @property
    def server_cpu_s(self) -> float:
        return 0.0 if self.server is None else self.server[2]

    @property
    def read_per_worker(self) -> float:
        """Bytes a worker read over the span: the median worker's read_chars on the file
        log, the server's bytes sent over the workers on Redis."""
        if self.server is None:
            return statistics.median(self.read_bytes)
        return self.server[1] / WORKERS

    @property
    def cores_busy(self) -> float:
        """Over the run's time, not the span's: its end is idle time (the bench sees the
        last DONE up to a publish tick late), the CPU spent in it next to none."""
        return (self.worker_cpu_s + self.server_cpu_s) / (CPUS * self.seconds)

    @property
    def machine_busy(self) -> float:
        return self.machine_busy_s / (CPUS * self.machine_s)

    def calls_per_task(self, commands: tuple[str, ...]) -> float:
        assert self.server is not None
        return sum(self.server[0][c] for c in commands) / TASKS


# -- a queue: where, created, enqueued, checked, dropped -------------------------------------


def fresh_location(local: Path, backend: str | None, partitions: int) -> Path | str:
    """The scratch directory, or a fresh prefix on the Redis server."""
    if backend is None:
        return local
    sep = "&" if "?" in backend else "?"
    return f"{backend}{sep}prefix=bench{partitions}x{secrets.token_hex(3)}"


def create(data: Path | str, partitions: int) -> Manifest | None:
    manifest = resolve_partitions(data, partitions)
    if manifest is None:
        Queue(data, "none").close()  # the queue's logs, empty
    return manifest


def enqueue(data: Path | str, manifest: Manifest | None, payloads: list[dict[str, int]]) -> None:
    if manifest is None:
        with Queue(data, "none") as queue:
            for first in range(0, len(payloads), 1000):
                queue.enqueue_many(payloads[first : first + 1000])
    else:
        with PartitionedQueue(data, manifest, "none") as pq:
            for first in range(0, len(payloads), 1000):
                pq.enqueue_many(payloads[first : first + 1000])


def locations(data: Path | str, partitions: int) -> list[str]:
    if partitions == 1:
        return [str(data)]
    return [partition_location(data, k, partitions) for k in range(partitions)]


def redis_client(url: str) -> Any:
    """A redis-py client of the server at `url` (qw's query parameters left out)."""
    import redis

    return redis.Redis.from_url(urlunsplit(urlsplit(url)._replace(query="")))


def drop(client: Any, data: str) -> None:
    """Delete the keys of the queue under `data`'s prefix (every partition's)."""
    prefix = dict(parse_qsl(urlsplit(data).query))["prefix"]
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for first in range(0, len(keys), 500):
        client.unlink(*keys[first : first + 500])


def own_share(backend: str) -> ServerCounts:
    """What the bench's own calls in a run's span cost the server: the replies to the INFO
    commands of its first sample (two samples back to back)."""
    client = redis_client(backend)
    try:
        before, after = server_stats(client), server_stats(client)
    finally:
        client.close()
    return after[0] - before[0], after[1] - before[1], after[2] - before[2]


# -- one run ---------------------------------------------------------------------------------


def one_run(
    root: Path,
    partitions: int,
    tasks: int,
    backend: str | None = None,
    share: ServerCounts | None = None,
) -> Run:
    """8 workers on `partitions` partitions drain `tasks` tasks (on the file log, or the
    Redis server at `backend`, whose counts are given less `share`: `own_share`)."""
    client = None if backend is None else redis_client(backend)
    try:
        with scratch(root, f"p{partitions}") as local:
            return _run(local, partitions, tasks, backend, client, share)
    finally:
        if client is not None:
            client.close()


def _run(
    local: Path,
    partitions: int,
    tasks: int,
    backend: str | None,
    client: Any,
    share: ServerCounts | None,
) -> Run:
    run_dir = local / "run"
    data = fresh_location(local, backend, partitions)
    payloads = [{"n": n} for n in range(tasks)]
    manifest = create(data, partitions)
    slots = slot_partitions(WORKERS, partitions)
    where = locations(data, partitions)
    with Fleet(local / "logs") as fleet:
        for i, k in enumerate(slots):
            mates = [j for j, other in enumerate(slots) if other == k]
            fleet.start(
                worker_config(
                    where[k],
                    run_dir,
                    f"w{i}",
                    slot=mates.index(i),
                    slots=len(mates),
                    exit_when_drained=False,
                    lease_s=LEASE_S,
                )
            )
        # Every worker up and idle on the empty queue (its start-up — the interpreter, the
        # modules — left out), then paused while the tasks are enqueued, and resumed
        # together: what it reads and spends from there on is the queue's, and the
        # producer is out of the measurement (left in, its round trips — two per partition
        # and batch, slowed by the busy cores — were the limit at 8 partitions on Redis).
        wait_for(lambda: len(read_snapshots(run_dir)) >= WORKERS, 120, "the workers to start")
        procs = [psutil.Process(p.pid) for p in fleet.procs]
        for proc in procs:
            proc.suspend()
        began = time.monotonic()
        try:
            enqueue(data, manifest, payloads)
        except BaseException:
            for proc in procs:  # (for the fleet to stop them)
                proc.resume()
            raise
        enqueued = time.monotonic() - began
        before = take_sample(procs, client)
        started = time.time()
        for proc in procs:
            proc.resume()

        polls: list[tuple[float, float]] = []  # (time, machine_busy()) at each poll

        def finished() -> bool:
            polls.append((time.time(), machine_busy()))
            return sum(s.finished for s in read_snapshots(run_dir)) >= tasks

        wait_for(finished, 300, f"{tasks} tasks done with {partitions} partitions")
        after = take_sample(procs, client)
    # the end is the last DONE's own time (the published stats lag by up to a tick)
    drained = [_last_done_at(w) / 1e6 - started for w in where]
    # the machine's busy time up to the first poll after the last DONE, not to the bench's
    # sight of it (a stats publication later: up to 0.25 s of idle workers)
    end = next(((t, busy) for t, busy in polls if t >= started + max(drained)), polls[-1])
    server = None
    if before.server is not None and after.server is not None:
        calls, sent = after.server[0] - before.server[0], after.server[1] - before.server[1]
        cpu = after.server[2] - before.server[2]
        if share is not None:
            calls, sent, cpu = calls - share[0], sent - share[1], cpu - share[2]
        server = (calls, sent, cpu)
    if manifest is None:
        report = load_report(data)
        ok, done, verdict = report.ok, report.tasks_done, report.verdict
    else:
        whole = load_partitioned_report(data, manifest)
        ok, done, verdict = whole.ok, whole.tasks_done, whole.verdict
    if not ok or done != tasks:
        name = "the file log" if backend is None else backend
        raise BenchError(f"{partitions} partitions on {name}: {done}/{tasks} done: {verdict}")
    if client is not None:
        drop(client, str(data))
    return Run(
        partitions,
        max(drained),
        [b - a for a, b in zip(before.read_chars, after.read_chars, strict=True)],
        after.worker_cpu_s - before.worker_cpu_s,
        end[1] - before.machine_busy_s,
        end[0] - started,
        enqueued,
        drained,
        server,
    )


def _last_done_at(location: str) -> int:
    return max((r.at for _, r in read_claims(location) if isinstance(r, Done)), default=0)


# -- the Markdown ----------------------------------------------------------------------------


FILE_COLUMNS = (
    "partitions", "tasks/s", "MB read per worker", "read cut", "worker CPU µs / task",
    "CPUs busy (qw)", "CPUs busy (all)", "first partition drained", "exactly once",
)  # fmt: skip
REDIS_COLUMNS = (
    "verdicts", "partitions", "tasks/s", "kB read per worker", "read cut",
    "bytes / task / worker", "round trips / task", "script calls / task",
    "worker CPU µs / task", "redis-server CPU µs / task", "CPUs busy (qw)", "CPUs busy (all)",
    "first partition drained", "exactly once",
)  # fmt: skip


def _med(runs: list[Run], value: Callable[[Run], float]) -> float:
    return float(statistics.median(value(r) for r in runs))


def _calls(runs: list[Run], commands: tuple[str, ...]) -> float:
    return _med(runs, lambda r: r.calls_per_task(commands))


def _drained(runs: list[Run]) -> str:
    """When the first partition drained, in % of the run (median)."""
    if runs[0].partitions == 1:
        return "—"
    return f"{_med(runs, lambda r: min(r.drained_s) / r.seconds * 100):.0f} %"


def _cost_cells(runs: list[Run]) -> list[str]:
    """CPU µs a task of the workers (and of redis-server), and how busy the CPUs were."""
    cells = [f"{_med(runs, lambda r: r.worker_cpu_s / TASKS * 1e6):,.0f}"]
    if runs[0].server is not None:
        cells.append(f"{_med(runs, lambda r: r.server_cpu_s / TASKS * 1e6):,.0f}")
    cells += [
        f"{_med(runs, lambda r: r.cores_busy) * 100:.0f} %",
        f"{_med(runs, lambda r: r.machine_busy) * 100:.0f} %",
        _drained(runs),
    ]
    return cells


def file_section(runs: dict[int, list[Run]], tasks: int, repeats: int) -> str:
    base = _med(runs[1], lambda r: r.read_per_worker)
    rows = []
    for p in PARTITIONS:
        read = _med(runs[p], lambda r: r.read_per_worker)
        rows.append(
            [p, f"{_med(runs[p], lambda r: r.per_second):,.0f}", f"{read / 1e6:.2f}",
             f"{base / read:.1f}×", *_cost_cells(runs[p]), "yes"]
        )  # fmt: skip
    return "\n".join(
        [
            "## Partitions: 8 workers, the file log",
            "",
            machine_line(),
            "",
            _intro(tasks, repeats, runs),
            " MB read per worker: the bytes each worker process read over the span "
            "(read_chars of /proc/<pid>/io: the logs it followed), median worker.",
            "",
            table(FILE_COLUMNS, rows),
            "",
            _columns(redis=False),
            "",
        ]
    )


def redis_section(
    modes: dict[str, dict[int, list[Run]]], share: ServerCounts, tasks: int, repeats: int
) -> str:
    rows = []
    for mode, runs in modes.items():
        base = _med(runs[1], lambda r: r.read_per_worker)
        trips = ROUND_TRIPS if mode == "client" else SERVER_ROUND_TRIPS
        for p in PARTITIONS:
            read = _med(runs[p], lambda r: r.read_per_worker)
            rows.append(
                [mode, p, f"{_med(runs[p], lambda r: r.per_second):,.0f}", f"{read / 1e3:,.0f}",
                 f"{base / read:.1f}×", f"{read / tasks:,.0f}",
                 f"{_calls(runs[p], trips):.2f}", f"{_calls(runs[p], SCRIPTS):.2f}",
                 *_cost_cells(runs[p]), "yes"]
            )  # fmt: skip
    return "\n".join(
        [
            "## Partitions: 8 workers, one local redis-server",
            "",
            machine_line(),
            "",
            _intro(tasks, repeats, modes["server"]),
            " Both verdict modes: `server` (the queue's default: a script call finishes a "
            "worker's tasks and claims its next ones, up to 8 a call, "
            "queue_worker/redis/server_claim.py and claim_batch.py; a worker reads no claims "
            "stream) and `client` (`&verdicts=client`: every worker reads and folds every "
            "claims record of its partition). kB read per worker: the bytes the server "
            "sent to clients over the span (INFO `total_net_output_bytes`, as "
            "bench/redis_bench.py counts them) less the replies to the bench's own INFO "
            f"calls ({share[1] / 1e3:.1f} kB, measured), divided by the 8 workers: a mean "
            "(this redis-server keeps no per-client byte counts); bytes / task / worker: "
            "the same over the tasks. Round trips (EVALSHA, EVAL, XREAD, TYPE, XLEN, and "
            "XREVRANGE with client verdicts, as bench/redis_bench.py counts them) and the "
            "script calls among them: the server's command statistics over the span, per "
            "task.",
            "",
            table(REDIS_COLUMNS, rows, right=2),
            "",
            _columns(redis=True),
            "",
        ]
    )


def _intro(tasks: int, repeats: int, runs: dict[int, list[Run]]) -> str:
    enqueue = " / ".join(f"{_med(runs[p], lambda r: r.enqueue_s) * 1e3:,.0f}" for p in PARTITIONS)
    return (
        "8 worker processes (slot i on partition i mod P) started on an empty queue and "
        f"paused; {tasks} no-op tasks enqueued round-robin over the P partitions (taking "
        f"{enqueue} ms for P = {' / '.join(map(str, PARTITIONS))}: not in the run); the "
        "workers resumed together; throughput from the resume to the last task's DONE; "
        "reads and CPU over the span from the resume to the last task seen done; medians "
        f"of {repeats} interleaved runs; every run checked exactly once per partition and "
        "for the whole queue."
    )


def _columns(*, redis: bool) -> str:
    server = " + redis-server" if redis else ""
    return (
        f"CPUs busy (qw): (the workers'{server} CPU time over the span) / ({CPUS} CPUs × "
        "the run's time: after the last DONE they idle); CPUs busy (all): the non-idle "
        "time of every CPU from the resume to the bench's first poll after the last DONE "
        "(20 ms at most), any process's (psutil.cpu_times: this machine's other work too), "
        "over the CPUs × that time — near 100 % the cores are the limit; first partition "
        "drained: when the first partition's last DONE came, in % of the run (the last "
        "partition's is at 100 %): from there on its workers are idle."
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
    backends: dict[str, str | None] = {"file": None}
    if args.redis is not None:
        sep = "&" if "?" in args.redis else "?"
        backends |= {"server": args.redis, "client": f"{args.redis}{sep}verdicts=client"}
    share = None if args.redis is None else own_share(args.redis)
    runs: dict[str, dict[int, list[Run]]] = {b: {p: [] for p in PARTITIONS} for b in backends}
    with tempfile.TemporaryDirectory(prefix="qw-partitions-") as tmp:
        for _ in range(args.repeats):
            for p in PARTITIONS:
                for name, url in backends.items():
                    kept = None if url is None else share
                    runs[name][p].append(one_run(Path(tmp), p, args.tasks, url, kept))
    text = file_section(runs["file"], args.tasks, args.repeats)
    if share is not None:
        modes = {m: runs[m] for m in ("server", "client")}
        text += "\n" + redis_section(modes, share, args.tasks, args.repeats)
    print(text)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
