"""Latencies: claim latency with busy workers, and wake-up latency of an idle queue.

Claim latency (append start → verdict known) is what each worker measures itself and
publishes in its stats file (``<run_dir>/<worker id>.json``, ``claim_latency_micros``: p50,
p90, p99 over its last 2,048 attempts, which covers every attempt of a drain here). The
drain section's runs are reused: their workers were busy for the whole run. The workers'
figures are pooled without the raw samples: p50 is the sample-weighted median of the
workers' p50s; p99 is the largest worker p99, an upper bound of the pooled p99 (at that
value every worker, hence the pool, has ≥ 99 % of its samples below).

Wake-up latency: 8 worker processes sit idle on an empty queue; the harness enqueues one
task, waits (on the claims log) for its DONE, pauses 10–30 ms so that every worker is
asleep again, and repeats. A sample is the task's `enqueued_at` (taken by the producer
just before its append) to the winning CLAIM's `at` (taken by the worker as it starts the
step that claims): both wall clocks of this machine.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    TIMEOUT_S,
    BenchError,
    Fleet,
    Section,
    Target,
    enqueued_at,
    fleet_configs,
    fold_claims,
    median,
    percentile,
    scratch,
    snapshots,
    table,
    us,
    wait_for,
)
from bench.queue_bench import DrainResults, QwDrain
from logstore import open_log
from queue_worker.producer import Queue
from queue_worker.protocol.records import Done
from queue_worker.topics import CLAIMS_TOPIC, ClaimsFollower
from queue_worker.worker.snapshot import WorkerSnapshot, WorkerState
from queue_worker.worker.stats import LATENCY_WINDOW

TARGET_CLAIM_P50_US = 100
TARGET_CLAIM_P99_US = 1000
TARGET_WAKE_P50_US = 200


def log(message: str) -> None:
    print(f"  · {message}", file=sys.stderr, flush=True)


# -- claim latency ---------------------------------------------------------------------------


def _weighted_median(pairs: Sequence[tuple[float, int]]) -> float:
    """The median of values each counted `weight` times."""
    ordered = sorted(pairs)
    total = sum(w for _, w in ordered)
    if total == 0:
        return float("nan")
    seen = 0
    for value, weight in ordered:
        seen += weight
        if seen * 2 >= total:
            return value
    return ordered[-1][0]


def pooled_latency(snaps: Sequence[WorkerSnapshot]) -> tuple[float, float, float, int]:
    """(p50, median worker p99, max worker p99, samples) over the workers of one run."""
    figures = [s.claim_latency_micros for s in snaps if s.claim_latency_micros.samples]
    if not figures:
        return float("nan"), float("nan"), float("nan"), 0
    p50 = _weighted_median([(f.p50, min(f.samples, LATENCY_WINDOW)) for f in figures])
    p99s = [float(f.p99) for f in figures]
    return p50, median(p99s), max(p99s), sum(f.samples for f in figures)


def claim_latency(runs: Sequence[QwDrain]) -> tuple[float, float, float, int]:
    """Median over runs of each pooled figure."""
    pooled = [pooled_latency(r.snapshots) for r in runs]
    return (
        median(p[0] for p in pooled),
        median(p[1] for p in pooled),
        median(p[2] for p in pooled),
        sum(p[3] for p in pooled),
    )


# -- wake-up latency -------------------------------------------------------------------------


@dataclass(frozen=True)
class Wake:
    samples_us: list[float]  # enqueued_at → winning CLAIM's `at`
    lost: int  # CLAIMs that lost (idle workers racing for the one task)


def wake_latencies(root: Path, samples: int, workers: int = 8) -> Wake:
    """Wake-up samples of `workers` idle workers, one task at a time."""
    rng = random.Random(1)
    with scratch(root, "wake") as d:
        data = d / "data"
        run_dir = d / "run"
        with Queue(data, fsync="none") as queue, Fleet(d / "logs") as fleet:
            for config in fleet_configs(data, run_dir, workers, exit_when_drained=False):
                fleet.start(config)

            def all_idle() -> bool:
                snaps = snapshots(run_dir)
                return len(snaps) == workers and all(s.state == WorkerState.IDLE for s in snaps)

            wait_for(all_idle, TIMEOUT_S, f"{workers} idle workers")
            with open_log(data, CLAIMS_TOPIC) as claims:
                follower = ClaimsFollower(claims.start)
                for _ in range(samples):
                    time.sleep(rng.uniform(0.010, 0.030))  # every worker asleep again
                    task = queue.enqueue(None)
                    _wait_done(claims, follower, task)
            for proc in fleet.procs:
                proc.send_signal(signal.SIGTERM)
            fleet.wait_all()
        fold = fold_claims(data)
        fold.check_exactly_once(samples)
        enqueued = enqueued_at(data)
    return Wake([float(fold.won_at[t] - enqueued[t]) for t in range(samples)], fold.lost_total)


def _wait_done(claims: Any, follower: ClaimsFollower, task: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        while entries := claims.read(follower.next_position):
            for entry in entries:
                _, record = follower.apply(entry)
                if isinstance(record, Done) and record.task == task:
                    return
        if time.monotonic() > deadline:
            raise BenchError(f"task {task} was not done within {TIMEOUT_S:.0f}s")
        claims.wait(follower.next_position, 1.0)


# -- the section -----------------------------------------------------------------------------


def latency_section(root: Path, drains: DrainResults, wake_samples: int) -> Section:
    rows = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    for n in sorted(drains.qw):
        p50, p99_med, p99_max, count = claim_latency(drains.qw[n])
        fits = "≤ cores" if n <= cores else "> cores"
        rows.append([str(n), fits, us(p50), us(p99_med), us(p99_max), f"{count:,}"])
    # More busy workers than cores: a worker is descheduled between its append and its read
    # of the verdict now and then, and that time is in its claim latency. Reported apart.
    within = [n for n in drains.qw if n <= cores]
    beyond = [n for n in drains.qw if n > cores]
    n = max(within or drains.qw)
    p50, _, p99, _ = claim_latency(drains.qw[n])
    log(f"wake-up latency: {wake_samples} samples, 8 idle workers")
    result = wake_latencies(root, wake_samples)
    wake = result.samples_us
    w50, w99 = percentile(wake, 0.50), percentile(wake, 0.99)
    body = "\n".join(
        [
            "Claim latency, CLAIM append start → verdict settled, as the workers of the drain "
            "section published it (busy workers, no fsync). p50: sample-weighted median of the "
            "workers' p50s; p99: the median worker's p99, and the largest (an upper bound of "
            f"the pooled p99); median over the repeats. This machine has {cores} cores: "
            "with more busy workers than cores, a worker is now and then descheduled between "
            "its append and its read of the verdict, and the p99 shows it.",
            "",
            table(
                [
                    "workers",
                    "vs cores",
                    "p50",
                    "p99 (median worker)",
                    "p99 (max worker)",
                    "samples",
                ],
                rows,
            ),
            "",
            f"Wake-up latency, 8 idle workers, {len(wake)} tasks enqueued one at a time 10–30 ms "
            "apart (each after the previous one's DONE): `enqueued_at` → winning CLAIM's `at`.",
            "",
            table(
                ["p50", "p90", "p99", "max", "lost CLAIMs per task"],
                [
                    [
                        us(w50),
                        us(percentile(wake, 0.90)),
                        us(w99),
                        us(max(wake)),
                        f"{result.lost / len(wake):.2f}",
                    ]
                ],
                right=0,
            ),
        ]
    )
    targets = [
        Target(f"claim latency p50, {n} busy workers", f"≤ {TARGET_CLAIM_P50_US} µs", us(p50),
               p50 <= TARGET_CLAIM_P50_US),
        Target(f"claim latency p99, {n} busy workers (≤ {cores} cores)",
               f"≤ {TARGET_CLAIM_P99_US:,} µs", f"{us(p99)} (max worker)",
               p99 <= TARGET_CLAIM_P99_US),
        *[
            Target(f"claim latency p99, {m} busy workers (> {cores} cores)",
                   f"≤ {TARGET_CLAIM_P99_US:,} µs", f"{us(p99_m)} (max worker)",
                   p99_m <= TARGET_CLAIM_P99_US)
            for m in beyond[-1:]
            for p99_m in [claim_latency(drains.qw[m])[2]]
        ],
        Target("wake-up p50, 8 idle workers", f"≤ {TARGET_WAKE_P50_US} µs", us(w50),
               w50 <= TARGET_WAKE_P50_US),
    ]  # fmt: skip
    return Section("Latency: claim and wake-up", body, targets)
