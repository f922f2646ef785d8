"""Draining a backlog: qw worker processes beside Huey's SqliteHuey and the raw-log loop;
lost claim attempts per pick strategy; the durable drain.

qw: `tasks` no-op tasks (bench.noop) are enqueued first, one `Queue.enqueue` each; then
N worker processes (exit_when_drained, pick spread in slots 0..N-1 of N) drain them,
configured and started as `qw up --exit-when-drained` configures and starts its workers
(`start="fork"`, the default: a fork server that has imported the worker code and folded
the queue forks them one after another, slot 0 last; bench.common; idle_poll_s as the
supervisor sets it) or, to compare, each as a fresh interpreter (`start="popen"`:
``python -m queue_worker.process``, ~0.1 s of CPU each before its first claim, against
~0.015 s for a forked one).
Rate = tasks / (last accepted DONE's `at` − first CLAIM's `at`), read from the claims log:
the window opens when the first worker claims, so its own start is outside it, but the
other workers' starts that overlap its work (forks, or interpreter start-ups on the same
cores) are inside it, as in a `qw up`. The rate over the wall time from the launch (the
fork server's start, or the first worker's) to the last worker's exit is shown beside it.
After every qw drain the claims log is folded with the protocol's own fold and every task
must have been done exactly once (one accepted DONE, no stale DONE), or the run fails.

Huey: see bench/huey_peer.py (first task start → last task end; wall beside it).
Raw loop: see bench/raw_loop.py (the least a log-coordinated drain can cost).

The runs of one repeat are interleaved (qw, Huey sync off, Huey default, raw at 1 worker,
then at 2, …) so that a change in the machine's load hits every system alike; each figure
is the median of the repeats.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bench import raw_loop
from bench.common import (
    Section,
    Start,
    Target,
    children_cpu_s,
    enqueue,
    enqueue_batch,
    fleet_configs,
    fold_claims,
    median,
    num,
    run_fleet,
    scratch,
    snapshots,
    table,
)
from queue_worker.worker.config import PICK_STRATEGIES
from queue_worker.worker.snapshot import WorkerSnapshot
from supervisor.run.supervisor import DRAINED_IDLE_POLL_S

if TYPE_CHECKING:
    from bench import huey_peer  # huey is the bench extra's: qw_drain's tests run without it

TARGET_RAW_RATIO = 0.50
TARGET_HUEY_OFF_RATIO = 1.8
TARGET_DURABLE_RATIO = 2.0
TARGET_SPREAD_LOST_PCT = 1.0


#: how each start starts the workers, in the sections' text
STARTED: dict[str, str] = {
    "fork": "forked one after another from a fork server that has imported the worker code "
    "and folded the queue, as `qw up` starts them (launch = the server's start)",
    "popen": "started one after another each as a fresh interpreter (`python -m "
    "queue_worker.process`, as `start_worker(..., fork=False)` starts one)",
}


def log(message: str) -> None:
    print(f"  · {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class QwDrain:
    workers: int
    tasks: int
    span_s: float  # first CLAIM `at` → last accepted DONE `at`
    wall_s: float  # launch (the fork server's, or the first worker's) → exit of the last
    startup_s: float  # launch → first CLAIM `at`
    ramp_s: float  # first CLAIM `at` → the last worker's first CLAIM `at` (inside the span)
    claims: int
    lost: int
    snapshots: list[WorkerSnapshot] = field(repr=False)
    start: Start = "fork"
    #: CPU seconds of the workers and, "fork", of their fork server, start-ups included
    cpu_s: float = float("nan")
    #: of which the fork server's own (its start, imports, folds and forks); 0 for "popen"
    server_cpu_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.tasks / self.span_s if self.span_s > 0 else float("nan")

    @property
    def wall_rate(self) -> float:
        return self.tasks / self.wall_s

    @property
    def cpu_us_per_task(self) -> float:
        return self.cpu_s / self.tasks * 1e6

    @property
    def lost_pct(self) -> float:
        return 100.0 * self.lost / self.claims if self.claims else float("nan")


def qw_drain(
    root: Path,
    workers: int,
    tasks: int,
    *,
    fsync: str = "none",
    pick: str = "spread",
    location: str | None = None,
    batch: bool = False,
    segment_bytes: int | None = None,
    start: Start = "fork",
) -> QwDrain:
    """One drain of `tasks` no-op tasks by `workers` worker processes, checked exactly-once.

    `location` (a redis:// URL) replaces the file log in a scratch directory; `batch`
    enqueues the backlog as one `enqueue_many` instead of one enqueue per task;
    `segment_bytes`: the file logs' segment size (as `qw up --segment-bytes` sets it);
    `start`: how the workers are started (module docstring; "fork" as `qw up`).
    """
    with scratch(root, f"drain-{workers}-{pick}-{fsync}-{start}") as d:
        data: str | Path = location if location is not None else d / "data"
        if segment_bytes is not None:
            from logstore import open_log
            from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC, TOPICS

            Path(data).mkdir(parents=True, exist_ok=True)
            for topic in (TASKS_TOPIC, CLAIMS_TOPIC):
                open_log(data, topic, family=TOPICS, segment_bytes=segment_bytes).close()
        if batch:
            enqueue_batch(data, tasks)
        else:
            enqueue(data, tasks, fsync=fsync)
        # idle_poll_s as `qw up --exit-when-drained` sets it (SupervisorOptions.worker_config)
        configs = fleet_configs(
            data, d / "run", workers, fsync=fsync, pick=pick, idle_poll_s=DRAINED_IDLE_POLL_S
        )
        cpu_before = children_cpu_s()
        run = run_fleet(configs, d / "logs", start)
        cpu = children_cpu_s() - cpu_before
        fold = fold_claims(data)
        fold.check_exactly_once(tasks)
        assert fold.first_claim_at is not None
        return QwDrain(
            workers=workers,
            tasks=tasks,
            span_s=fold.span_us / 1e6,
            wall_s=run.ended - run.launched,
            startup_s=fold.first_claim_at / 1e6 - run.launched,
            ramp_s=fold.ramp_us / 1e6,
            claims=fold.claims,
            lost=fold.lost_total,
            snapshots=snapshots(d / "run"),
            start=start,
            cpu_s=cpu,
            server_cpu_s=run.server_cpu_s,
        )


# -- the drain section ---------------------------------------------------------------------


@dataclass
class DrainResults:
    """Every drain of the section, by worker count; later sections reuse them."""

    tasks: int
    repeats: int
    start: Start = "fork"  # how qw's workers were started (module docstring)
    qw: dict[int, list[QwDrain]] = field(default_factory=dict)
    huey_off: dict[int, list[huey_peer.HueyDrain]] = field(default_factory=dict)
    huey_default: dict[int, list[huey_peer.HueyDrain]] = field(default_factory=dict)
    raw: dict[int, list[float]] = field(default_factory=dict)
    #: qw with fsync commit, at the largest worker count (for the durable section)
    qw_durable: dict[int, list[QwDrain]] = field(default_factory=dict)
    batch: tuple[float, float] | None = None  # 1 worker: (one enqueue each, one batch)

    def qw_rate(self, n: int) -> float:
        return median(r.rate for r in self.qw.get(n, []))

    def huey_rate(self, n: int, default: bool) -> float:
        runs = (self.huey_default if default else self.huey_off).get(n, [])
        return median(r.rate for r in runs)

    def raw_rate(self, n: int) -> float:
        return median(self.raw.get(n, []))


def _runs(values: Sequence[float]) -> str:
    return " / ".join(num(v) for v in values)


def run_drains(
    root: Path,
    counts: Sequence[int],
    tasks: int,
    repeats: int,
    batch_tasks: int = 0,
    durable: bool = False,
    start: Start = "fork",
) -> DrainResults:
    """Every drain, interleaved; `durable` adds qw with fsync commit at the largest count;
    `start`: how qw's workers are started ("fork": as `qw up` starts them)."""
    results = DrainResults(tasks, repeats, start)
    for rep in range(repeats):
        for n in counts:
            if durable and n == max(counts):
                log(f"drain repeat {rep + 1}/{repeats}, {n} workers: qw fsync commit")
                results.qw_durable.setdefault(n, []).append(
                    qw_drain(root, n, tasks, fsync="commit", start=start)
                )
            log(f"drain repeat {rep + 1}/{repeats}, {n} workers: qw ({start})")
            results.qw.setdefault(n, []).append(qw_drain(root, n, tasks, start=start))
            log(f"drain repeat {rep + 1}/{repeats}, {n} workers: huey sync off")
            from bench import huey_peer

            results.huey_off.setdefault(n, []).append(huey_peer.drain(n, False, tasks))
            log(f"drain repeat {rep + 1}/{repeats}, {n} workers: huey default")
            results.huey_default.setdefault(n, []).append(huey_peer.drain(n, None, tasks))
            results.raw.setdefault(n, []).append(raw_loop.drain(n, tasks))
    if batch_tasks:
        log(f"drain: {batch_tasks} tasks, 1 worker, one enqueue each vs one enqueue_many")
        single = qw_drain(root, 1, batch_tasks, start=start).rate
        batched = qw_drain(root, 1, batch_tasks, batch=True, start=start).rate
        results.batch = (single, batched)
    return results


def drain_section(results: DrainResults) -> Section:
    counts = sorted(results.qw)
    rows = []
    for n in counts:
        qw = results.qw[n]
        rate, raw = results.qw_rate(n), results.raw_rate(n)
        off, default = results.huey_rate(n, False), results.huey_rate(n, True)
        rows.append(
            [
                str(n),
                num(rate),
                _runs([r.rate for r in qw]),
                num(median(r.wall_rate for r in qw)),
                num(median(r.startup_s for r in qw), 2),
                num(median(r.ramp_s * 1e3 for r in qw)),
                num(median(r.cpu_us_per_task for r in qw)),
                num(off),
                num(default),
                num(raw),
                f"{rate / raw:.2f}",
                f"{rate / off:.2f}",
            ]
        )
    huey_rows = [
        [
            str(n),
            _runs([r.rate for r in results.huey_off[n]]),
            num(median(r.wall_rate for r in results.huey_off[n])),
            _runs([r.rate for r in results.huey_default[n]]),
            num(median(r.wall_rate for r in results.huey_default[n])),
            _runs(results.raw[n]),
        ]
        for n in counts
    ]
    drains = sum(len(v) for v in results.qw.values())
    claims = sum(r.claims for v in results.qw.values() for r in v)
    lines = [
        f"{results.tasks:,} no-op tasks enqueued beforehand; median of {results.repeats} "
        f"interleaved runs. qw: `fsync none`, pick spread, one slot per worker, workers "
        f"{STARTED[results.start]}; tasks/s from the first CLAIM's `at` to the last accepted "
        "DONE's `at` (the first worker's start is outside that window; the other workers' "
        "starts, as far as they overlap its work, are inside it); *wall* is tasks / (launch → "
        "last exit); *start-up* is launch → first CLAIM; *ramp*: first CLAIM → the last "
        "worker's first CLAIM (the part of the window the workers were still starting in); "
        "*CPU* is the workers' (and their "
        "fork server's) user + system time over the tasks, start-ups included. Huey: SqliteHuey, "
        "process consumer, tasks/s from the first task's start to the last task's end. Raw "
        "loop: bench/raw_loop.py, pre-forked processes timed from their release to the last "
        "exit.",
        "",
        table(
            [
                "workers",
                "qw tasks/s",
                "qw runs",
                "qw wall tasks/s",
                "qw start-up s",
                "qw ramp ms",
                "qw CPU µs/task",
                "Huey sync off",
                "Huey default",
                "raw loop",
                "qw / raw",
                "qw / Huey off",
            ],
            rows,
        ),
        "",
        "Every run (tasks/s):",
        "",
        table(
            [
                "workers",
                "Huey sync off",
                "Huey off wall",
                "Huey default",
                "Huey default wall",
                "raw loop",
            ],
            huey_rows,
        ),
        "",
        f"Exactly-once check: after each of the {drains} qw drains the claims log was folded "
        f"({claims:,} CLAIMs in all): every task had exactly one accepted DONE and no stale DONE.",
    ]
    if results.batch is not None:
        single, batched = results.batch
        lines += [
            "",
            "Enqueue shape (1 worker, same task count, tasks/s): one `enqueue` per task "
            f"**{num(single)}**, the whole backlog as one `enqueue_many` batch **{num(batched)}**.",
        ]
    targets = []
    n = max(counts)
    rate, raw, off = results.qw_rate(n), results.raw_rate(n), results.huey_rate(n, False)
    targets.append(
        Target(
            f"drain, {n} workers, no fsync, vs raw-log loop",
            f"≥ {TARGET_RAW_RATIO:.0%} of raw",
            f"{rate / raw:.1%} ({num(rate)} vs {num(raw)}/s)",
            rate / raw >= TARGET_RAW_RATIO,
        )
    )
    targets.append(
        Target(
            f"drain, {n} workers, no fsync, vs Huey sync off",
            f"≥ {TARGET_HUEY_OFF_RATIO}× Huey",
            f"{rate / off:.2f}× ({num(rate)} vs {num(off)}/s)",
            rate / off >= TARGET_HUEY_OFF_RATIO,
        )
    )
    return Section("Drain: qw vs Huey vs the raw-log loop", "\n".join(lines), targets)


# -- collisions ------------------------------------------------------------------------------


def collisions_section(root: Path, backlog: int, workers: int = 8) -> Section:
    rows = []
    spread_pct = float("nan")
    for pick in PICK_STRATEGIES:
        log(f"collisions: pick {pick}, {workers} workers, {backlog} tasks")
        run = qw_drain(root, workers, backlog, pick=pick)
        rows.append(
            [pick, f"{run.claims:,}", f"{run.lost:,}", f"{run.lost_pct:.2f} %", num(run.rate)]
        )
        if pick == "spread":
            spread_pct = run.lost_pct
    body = "\n".join(
        [
            f"{workers} workers (forked from a preloaded fork server, as `qw up` starts them) "
            f"drain a backlog of {backlog:,} no-op tasks; lost attempts are "
            "the CLAIMs the fold judged lost (held, done, …), over all CLAIMs in the log. "
            "Every run passed the exactly-once check.",
            "",
            table(["pick", "CLAIMs", "lost", "lost %", "tasks/s"], rows),
        ]
    )
    target = Target(
        "spread pick, lost attempts (8 workers, backlog)",
        f"≤ {TARGET_SPREAD_LOST_PCT:.0f} %",
        f"{spread_pct:.2f} %",
        spread_pct <= TARGET_SPREAD_LOST_PCT,
    )
    return Section("Collisions: lost claim attempts per pick strategy", body, [target])


# -- durable ---------------------------------------------------------------------------------


def durable_section(root: Path, drains: DrainResults | None, tasks: int, repeats: int) -> Section:
    """From the drain section's runs when it made them; otherwise runs its own (qw fsync
    commit and Huey default, interleaved, 8 workers)."""
    if drains is not None and drains.qw_durable:
        workers = max(drains.qw_durable)
        runs = drains.qw_durable[workers]
        huey_runs = drains.huey_default[workers]
        nosync = drains.qw_rate(workers)
        tasks, repeats = drains.tasks, drains.repeats
        how = "interleaved with the drain section's runs"
    else:
        from bench import huey_peer

        workers = 8
        runs, huey_runs = [], []
        for rep in range(repeats):
            log(f"durable drain repeat {rep + 1}/{repeats}: qw fsync commit, Huey default")
            runs.append(qw_drain(root, workers, tasks, fsync="commit"))
            huey_runs.append(huey_peer.drain(workers, None, tasks))
        nosync = float("nan")
        how = "qw and Huey interleaved"
    rate = median(r.rate for r in runs)
    huey = median(r.rate for r in huey_runs)
    rows = [
        ["qw, fsync commit", num(rate), _runs([r.rate for r in runs]),
         num(median(r.wall_rate for r in runs))],
        ["Huey default (SQLite WAL, synchronous FULL)", num(huey),
         _runs([r.rate for r in huey_runs]), num(median(r.wall_rate for r in huey_runs))],
        ["qw, fsync none (drain section)", num(nosync), "", ""],
    ]  # fmt: skip
    body = "\n".join(
        [
            f"{tasks:,} no-op tasks, {workers} workers, median of {repeats} ({how}). "
            "qw `fsync commit`: "
            "enqueued tasks and DONE/FAIL records are forced to disk (fdatasync, grouped across "
            "processes) before the append returns; CLAIM/RENEW are not (a claim lost in a power "
            "cut is only a lease nobody holds). Huey's default: every transaction committed to "
            "the WAL with SQLite's synchronous=FULL.",
            "",
            table(["", "tasks/s", "runs", "wall tasks/s"], rows),
        ]
    )
    target = Target(
        f"durable drain, {workers} workers, vs Huey default",
        f"≥ {TARGET_DURABLE_RATIO:.0f}× Huey",
        f"{rate / huey:.2f}× ({num(rate)} vs {num(huey)}/s)",
        rate / huey >= TARGET_DURABLE_RATIO,
    )
    return Section("Durable drain: fsync commit vs Huey's default", body, [target])
