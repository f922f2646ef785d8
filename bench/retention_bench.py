"""Retention (long): millions of tasks through small segments, compacted as they go.

Two data directories get the same synthetic history (`long_bench.extend`: a TASK, a CLAIM
and an accepted DONE per task, in batches): one with small segments, compacted after each
step by `queue_worker.compaction.files.compact` (retention `RETENTION_BYTES` a log), one
with a single segment per log and no compaction (the log before segments). Measured:

- the data directory's size after each compaction (every file: segments, the checkpoint),
  against the bound the segment size and the retention set;
- appending (the build's records/s), on both directories;
- reading the retained claims log (records/s), on both;
- start-up of one real worker at the end (launch → its DONE, with the fold checkpoint), on
  both, and its resident memory;
- a drain by real worker processes (`queue_bench.qw_drain`) with segments small enough to
  roll many times during it, against one file a log, interleaved, median of the repeats.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import Section, Target, median, scratch, table
from bench.long_bench import _one_worker, extend
from bench.queue_bench import qw_drain
from logstore import open_log
from logstore.file.log import FileLog
from queue_worker.compaction.files import compact
from queue_worker.compaction.settled import Retention
from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC

SEGMENT_BYTES = 4 << 20
RETENTION_BYTES = 16 << 20
UNSEGMENTED = 1 << 50
KEEP_S = 10 * 365 * 86_400.0  # the size budget, not the age, decides here
WITHIN = 0.10  # segmented figures within 10% of the unsegmented ones
#: the drain comparison: 2 workers (no more than the cores: the scheduler's noise stays out),
#: segments of 128 KiB (tens of rolls in a drain of DRAIN_TASKS)
DRAIN_TASKS = 20_000
DRAIN_WORKERS = 2
DRAIN_SEGMENT_BYTES = 128 << 10
DRAIN_REPEATS = 3


def log(message: str) -> None:
    print(f"  · {message}", file=sys.stderr, flush=True)


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@dataclass(frozen=True)
class Run:
    tasks: int
    append_rate: float  # records/s while building
    read_rate: float  # claims records/s, reading the retained log
    largest: int  # the data directory's largest size after a step (bytes)
    final: int
    checkpoint: int  # the checkpoint file's size at the end
    startup_s: float
    rss_mb: float


def _build(data: Path, tasks: int, step: int, segment_bytes: int, compacted: bool) -> Run:
    data.mkdir(parents=True)
    for topic in (TASKS_TOPIC, CLAIMS_TOPIC):
        open_log(data, topic).close()
        FileLog.open(data / f"{topic}.log", segment_bytes=segment_bytes).close()
    appended = 0
    append_s = 0.0
    largest = 0
    for first in range(0, tasks, step):
        count = min(step, tasks - first)
        started = time.perf_counter()
        extend(data, first, count)
        append_s += time.perf_counter() - started
        appended += 3 * count
        if compacted:
            compact(data, Retention(seconds=KEEP_S, bytes=RETENTION_BYTES))
        largest = max(largest, directory_bytes(data))
        log(f"retention: {first + count:,} tasks, {directory_bytes(data) >> 20} MiB on disk")
    with open_log(data, CLAIMS_TOPIC) as claims:
        started = time.perf_counter()
        records = sum(1 for _ in claims.iter_from(claims.start))
        read_rate = records / (time.perf_counter() - started)
    checkpoint = data / "fold.checkpoint"
    return Run(
        tasks,
        appended / append_s,
        read_rate,
        largest,
        directory_bytes(data),
        checkpoint.stat().st_size if checkpoint.exists() else 0,
        0.0,
        0.0,
    )


def _with_worker(run: Run, data: Path, scratch_dir: Path, label: str) -> Run:
    """One real worker started on the logs at the end (with the fold checkpoint)."""
    startup, rss, _ = _one_worker(data, scratch_dir, label)  # saves a checkpoint if none
    startup, rss, _ = _one_worker(data, scratch_dir, f"{label}-again")  # from it
    return Run(**{**run.__dict__, "startup_s": startup, "rss_mb": rss})


def retention_section(root: Path, tasks: int, step: int) -> Section:
    with scratch(root, "retention") as d:
        log(f"retention: {tasks:,} tasks in {SEGMENT_BYTES >> 20} MiB segments, compacted")
        small = _build(d / "segmented", tasks, step, SEGMENT_BYTES, compacted=True)
        small = _with_worker(small, d / "segmented", d, "seg")
        log(f"retention: the same {tasks:,} tasks in one file a log, never compacted")
        whole = _build(d / "single", tasks, step, UNSEGMENTED, compacted=False)
        whole = _with_worker(whole, d / "single", d, "single")
    log(f"retention: drains of {DRAIN_TASKS:,} tasks, segmented and one file, interleaved")
    segmented_rates: list[float] = []
    whole_rates: list[float] = []
    for _ in range(DRAIN_REPEATS):
        for rates, size in ((segmented_rates, DRAIN_SEGMENT_BYTES), (whole_rates, UNSEGMENTED)):
            rates.append(qw_drain(root, DRAIN_WORKERS, DRAIN_TASKS, segment_bytes=size).rate)
    drain_segmented, drain_whole = median(segmented_rates), median(whole_rates)
    # the bound: each log's retention, plus the segment being written and one sealed one
    # not yet compacted (a step's worth), plus the checkpoint
    bound = 2 * (RETENTION_BYTES + 2 * SEGMENT_BYTES) + (1 << 20)  # + 1 MiB: the checkpoint
    rows = [
        [
            name,
            f"{r.append_rate:,.0f}",
            f"{r.read_rate:,.0f}",
            f"{r.largest / 2**20:,.1f}",
            f"{r.final / 2**20:,.1f}",
            f"{r.checkpoint / 2**20:,.1f}",
            f"{r.startup_s:.2f}",
            f"{r.rss_mb:.1f}",
        ]
        for name, r in (("segments + compaction", small), ("one file, no compaction", whole))
    ]
    body = "\n".join(
        [
            f"{tasks:,} tasks (TASK, CLAIM, DONE each), appended {step:,} at a time; the "
            f"segmented directory uses {SEGMENT_BYTES >> 20} MiB segments and is compacted "
            f"after each step with a retention of {RETENTION_BYTES >> 20} MiB a log. "
            "Command: `make bench ARGS='--only retention'`.",
            "",
            table(
                [
                    "logs",
                    "append records/s",
                    "read claims records/s",
                    "largest dir MiB",
                    "final dir MiB",
                    "checkpoint MiB",
                    "worker start-up s",
                    "worker RSS MiB",
                ],
                rows,
            ),
            "",
            f"Drain of {DRAIN_TASKS:,} no-op tasks by {DRAIN_WORKERS} workers (first CLAIM → "
            f"last DONE, median of {DRAIN_REPEATS} interleaved runs): "
            f"{DRAIN_SEGMENT_BYTES >> 10} KiB segments {drain_segmented:,.0f} tasks/s "
            f"({', '.join(f'{r:,.0f}' for r in segmented_rates)}), one file a log "
            f"{drain_whole:,.0f} tasks/s ({', '.join(f'{r:,.0f}' for r in whole_rates)}).",
            "",
            f"Bound for the segmented directory: {bound / 2**20:,.1f} MiB (each log's "
            "retention + two segments, + 1 MiB for the checkpoint, which holds the fold of "
            "the live tasks only: the index forgets the tasks the fold closed for ever, so "
            "nothing in the directory grows with the number of tasks ever published).",
        ]
    )
    targets = [
        Target(
            "data directory under the retention bound",
            f"≤ {bound / 2**20:,.1f} MiB",
            f"{small.largest / 2**20:,.1f} MiB",
            small.largest <= bound,
        ),
        Target(
            "segmented append within 10% of one file",
            f"≥ {(1 - WITHIN) * whole.append_rate:,.0f} records/s",
            f"{small.append_rate:,.0f} records/s",
            small.append_rate >= (1 - WITHIN) * whole.append_rate,
        ),
        Target(
            "segmented drain within 10% of one file",
            f"≥ {(1 - WITHIN) * drain_whole:,.0f} tasks/s",
            f"{drain_segmented:,.0f} tasks/s",
            drain_segmented >= (1 - WITHIN) * drain_whole,
        ),
        Target(
            "segmented start-up within 10% of one file",
            f"≤ {(1 + WITHIN) * whole.startup_s:.2f} s",
            f"{small.startup_s:.2f} s",
            small.startup_s <= (1 + WITHIN) * whole.startup_s,
        ),
    ]
    return Section("Retention (long): segments and compaction", body, targets)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tasks = int(os.environ.get("QW_RETENTION_TASKS", "200000"))
        print(retention_section(Path(tmp), tasks, max(tasks // 20, 1000)).markdown())
