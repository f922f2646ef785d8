"""Long logs: replay speed, worker start-up, and a worker's memory as the logs grow.

The logs are built synthetically, fast: task records and, for every task, a CLAIM and an
accepted DONE (eight worker ids in turn) packed straight into the documented wire format
and appended with `append_many` in batches of 1,000 records. The queue is built in stages
(e.g. 100k tasks, then 500k, then 1M); after each stage one real task is enqueued and one
real worker process (no-op handler) is started on the logs:

- start-up time: launch → the `at` of its DONE of that task (imports, opening the logs,
  replaying both logs, claiming, running the no-op), first with no fold checkpoint (the
  file is removed: a full replay), then — one more task enqueued — with the checkpoint the
  first worker saved when it went idle (slot 0 saves one: see `queue_worker.history.checkpoint`).
- resident memory (psutil RSS) once it has done that task and sits idle (caught up).

Replay speed is measured in this process on the stage whose claims log holds 1M records:
`ClaimsFollower.catch_up` from the start (what a starting worker does), and, to show where
the time goes, the same log only read (`Log.iter_from`: frames, checksums) and read +
decoded (`decode_claims`).
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import msgpack
import psutil

from bench.common import (
    TIMEOUT_S,
    BenchError,
    Fleet,
    Section,
    Target,
    num,
    scratch,
    snapshots,
    table,
    wait_for,
    worker_config,
)
from logstore import Durability, Log, open_log
from logstore.file.framing import FRAME_HEADER_SIZE
from queue_worker.history.checkpoint import CHECKPOINT_NAME
from queue_worker.producer import Queue
from queue_worker.protocol.records import CLAIM, DONE, SCHEMA, TASK, Claim, Done, decode_claims
from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC, ClaimsFollower
from queue_worker.worker.snapshot import WorkerState

BATCH = 1_000
LEASE_US = 30_000_000
TARGET_REPLAY = 1_000_000  # records/s


def log(message: str) -> None:
    print(f"  · {message}", file=sys.stderr, flush=True)


# -- building ---------------------------------------------------------------------------------


def extend(data: Path, first_task: int, count: int) -> None:
    """Append tasks first_task .. first_task+count-1, each claimed and done, to both logs."""
    pack = msgpack.Packer(use_bin_type=True).pack
    at0 = time.time_ns() // 1000 - 86_400_000_000  # a day ago: every lease long expired
    workers = [f"w{i}-{1000 + i}-beef" for i in range(8)]
    with (
        open_log(data, TASKS_TOPIC, Durability.NONE) as tasks,
        open_log(data, CLAIMS_TOPIC, Durability.NONE) as claims,
    ):
        position = claims.end()  # the file log appends exactly there (we are the only writer)
        for begin in range(first_task, first_task + count, BATCH // 2):
            end = min(begin + BATCH // 2, first_task + count)
            task_records: list[bytes] = []
            claim_records: list[bytes] = []
            expected: list[int] = []
            for task in range(begin, end):
                at = at0 + task * 10
                worker = workers[task % 8]
                task_records.append(pack([SCHEMA, TASK, None, at]))
                claim = pack([SCHEMA, CLAIM, task, worker, at, LEASE_US])
                done = pack([SCHEMA, DONE, task, worker, at + 5, position, None])
                claim_records += (claim, done)
                expected += (position, position + FRAME_HEADER_SIZE + len(claim))
                position = expected[-1] + FRAME_HEADER_SIZE + len(done)
            tasks.append_many(task_records)
            if claims.append_many(claim_records) != expected:
                raise BenchError("synthetic claims did not land where the DONEs say they did")
    _check_format(data)


def _check_format(data: Path) -> None:
    """The synthetic bytes decode as the records they are meant to be."""
    with open_log(data, CLAIMS_TOPIC) as claims:
        entries = claims.read(claims.start, 2)
    first, second = (decode_claims(e.data) for e in entries)
    if not (isinstance(first, Claim) and isinstance(second, Done)):
        raise BenchError(f"synthetic records decode as {first!r}, {second!r}")


def _tasks_in(data: Path) -> int:
    with open_log(data, TASKS_TOPIC) as tasks:
        return count_records(tasks)


def count_records(log_: Log) -> int:
    return sum(1 for _ in log_.iter_from(log_.start))


# -- one worker on the logs ------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerRun:
    tasks: int
    claims_records: int
    startup_s: float
    rss_mb: float
    claim_lag_s: float  # the DONE's `at` − the CLAIM's `at` of the one (no-op) task
    checkpoint_startup_s: float  # the same with the checkpoint the first worker saved


def worker_on(data: Path, scratch_dir: Path, tasks: int, claims_records: int) -> WorkerRun:
    """A worker with no checkpoint (a full replay), then one from the checkpoint it saved."""
    (data / CHECKPOINT_NAME).unlink(missing_ok=True)
    full = _one_worker(data, scratch_dir, f"{tasks}")
    if not (data / CHECKPOINT_NAME).exists():
        raise BenchError("the worker in slot 0 saved no fold checkpoint")
    restored = _one_worker(data, scratch_dir, f"{tasks}-checkpoint")
    return WorkerRun(tasks, claims_records, full[0], full[1], full[2], restored[0])


def _one_worker(data: Path, scratch_dir: Path, label: str) -> tuple[float, float, float]:
    """Enqueue one real task, start one worker, time its claim, measure its RSS when idle:
    (start-up s, RSS MiB, CLAIM → DONE s)."""
    with open_log(data, CLAIMS_TOPIC) as claims:
        tail = claims.end()
    with Queue(data, fsync="none") as queue:
        task = queue.enqueue(None)
    run_dir = scratch_dir / f"run-{label}"
    config = worker_config(data, run_dir, f"long{label}", exit_when_drained=False)
    with Fleet(scratch_dir / "logs") as fleet:
        launched = time.time()
        proc = fleet.start(config)
        claim_at, done_at = wait_for(
            lambda: _times(data, tail, task), TIMEOUT_S, "the worker's DONE"
        )

        def idle_after_done() -> bool:
            snaps = snapshots(run_dir)
            if proc.poll() is not None:
                raise BenchError(f"the worker exited with {proc.returncode}")
            return bool(snaps) and snaps[0].finished == 1 and snaps[0].state == WorkerState.IDLE

        wait_for(idle_after_done, TIMEOUT_S, "the worker to finish the task and go idle")
        rss = psutil.Process(proc.pid).memory_info().rss / 2**20
        proc.send_signal(signal.SIGTERM)
        fleet.wait_all()
    return done_at / 1e6 - launched, rss, (done_at - claim_at) / 1e6


def _times(data: Path, tail: int, task: int) -> tuple[int, int] | None:
    """(CLAIM `at`, DONE `at`) of `task` once its DONE is in the log."""
    claim_at: int | None = None
    with open_log(data, CLAIMS_TOPIC) as claims:
        for entry in claims.iter_from(tail):
            record = decode_claims(entry.data)
            if isinstance(record, Claim) and record.task == task and claim_at is None:
                claim_at = record.at
            if isinstance(record, Done) and record.task == task and claim_at is not None:
                return claim_at, record.at
    return None


# -- replay ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    records: int
    read_s: float
    decode_s: float
    fold_s: float

    def rate(self, seconds: float) -> float:
        return self.records / seconds


def replay(data: Path) -> Replay:
    with open_log(data, CLAIMS_TOPIC) as claims:
        started = time.perf_counter()
        records = sum(1 for _ in claims.iter_from(claims.start))
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        for entry in claims.iter_from(claims.start):
            decode_claims(entry.data)
        decode_s = time.perf_counter() - started
        follower = ClaimsFollower(claims.start)
        started = time.perf_counter()
        folded = follower.catch_up(claims)
        fold_s = time.perf_counter() - started
    if folded != records:
        raise BenchError(f"replay folded {folded} records of {records}")
    return Replay(records, read_s, decode_s, fold_s)


# -- the section -----------------------------------------------------------------------------


def long_section(root: Path, stages: tuple[int, int, int]) -> Section:
    """`stages`: task counts; the middle one is where replay is timed (2 records per task)."""
    runs: list[WorkerRun] = []
    with scratch(root, "long") as d:
        data = d / "data"
        log("long: a worker on an empty queue (the start-up floor)")
        runs.append(worker_on(data, d, 0, 0))
        have = _tasks_in(data)  # the real ones just done (one per worker started)
        result: Replay | None = None
        for size in stages:
            started = time.perf_counter()
            extend(data, have, size - have)
            log(f"long: built {size:,} tasks in {time.perf_counter() - started:.1f} s")
            with open_log(data, CLAIMS_TOPIC) as claims:
                records = count_records(claims)
            if size == stages[1]:
                log(f"long: replaying {records:,} claims records in this process")
                result = replay(data)
            log(f"long: a worker on {size:,} tasks / {records:,} claims records")
            runs.append(worker_on(data, d, size, records))
            have = _tasks_in(data)
    assert result is not None
    fold_rate = result.rate(result.fold_s)
    replay_rows = [
        ["read (frames, checksums)", num(result.rate(result.read_s)), f"{result.read_s:.2f}"],
        ["read + decode (msgpack → records)", num(result.rate(result.decode_s)),
         f"{result.decode_s:.2f}"],
        ["read + decode + fold (`ClaimsFollower.catch_up`)", num(fold_rate),
         f"{result.fold_s:.2f}"],
    ]  # fmt: skip
    worker_rows = [
        [
            f"{r.tasks:,}",
            f"{r.claims_records:,}",
            f"{r.startup_s:.2f}",
            f"{r.checkpoint_startup_s:.2f}",
            f"{r.rss_mb:.1f}",
            f"{r.claim_lag_s:.3f}",
        ]
        for r in runs
    ]
    body = "\n".join(
        [
            f"Replay of a claims log of {result.records:,} records (CLAIM + DONE per task), in "
            "this process, each line from the start of the log:",
            "",
            table(["replay", "records/s", "seconds"], replay_rows),
            "",
            "One worker process started on the logs with one more (real) task enqueued: "
            "start-up = launch → its DONE's `at` (replay included); RSS once that task is "
            "done and it idles. *From a checkpoint*: a second worker, one more task "
            "enqueued, started with the fold checkpoint the first one saved (it replays "
            "only the records after it).",
            "",
            table(
                [
                    "tasks in the log",
                    "claims records",
                    "start-up s",
                    "from a checkpoint, s",
                    "RSS MiB",
                    "CLAIM `at` → DONE `at`, s",
                ],
                worker_rows,
            ),
            "",
            "The last column is how old the CLAIM's timestamp was when the no-op task was "
            "done: a worker reads its clock after catching up, so however long the replay, "
            "its CLAIM's lease starts when the claim is made.",
        ]
    )
    target = Target(
        "claims-log replay (fold from the start)",
        f"≥ {TARGET_REPLAY:,} records/s",
        f"{num(fold_rate)} records/s",
        fold_rate >= TARGET_REPLAY,
    )
    return Section("Long runs: replay, start-up, memory", body, [target])
