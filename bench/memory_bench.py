"""Memory over a long run: a worker's and the supervisor's RSS do not grow with history.

`qw up --workers 2 --handler bench.noop:noop --fsync none --no-tui` runs while this process
enqueues no-op tasks in batches of BATCH, keeping at most 2 × BATCH published and not yet
done: the live tasks stay few however many pass, so what grows with the count of tasks
ever published (not with the live ones) shows as growth in RSS. At 100k tasks done, at
each million, and at the end (every task done, the workers idle and caught up), it reads
the resident memory (psutil RSS) of the supervisor process and of each worker, and the
task positions each worker's index holds (`indexed_tasks` in its stats). The target: RSS
at the end within 10% of RSS at 100k, for the supervisor and for the largest worker.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.common import (
    ENV,
    NOOP,
    QW,
    REPO,
    TIMEOUT_S,
    BenchError,
    Section,
    Target,
    scratch,
    snapshots,
    table,
    wait_for,
)
from queue_worker.producer import Queue
from queue_worker.worker.snapshot import WorkerState

WORKERS = 2
BATCH = 20_000
FIRST_POINT = 100_000
FLAT = 1.10  # the end's RSS / the RSS at FIRST_POINT


def log(message: str) -> None:
    print(f"  · {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Point:
    done: int
    supervisor_mib: float
    worker_mib: float  # the largest worker's RSS
    indexed: int  # the most task positions a worker's index holds
    seconds: float  # since launch


def _rss_mib(pid: int) -> float:
    rss: int = psutil.Process(pid).memory_info().rss
    return rss / 2**20


def _done(run_dir: Path) -> int:
    """Tasks done, as the workers' folds see the queue (the furthest one)."""
    return max((s.done_tasks for s in snapshots(run_dir)), default=0)


def _point(up: subprocess.Popen[bytes], run_dir: Path, done: int, launched: float) -> Point:
    snaps = [s for s in snapshots(run_dir) if s.pid is not None and s.exit_reason is None]
    if len(snaps) != WORKERS:
        raise BenchError(f"{len(snaps)} live worker snapshots; expected {WORKERS}")
    return Point(
        done,
        _rss_mib(up.pid),
        max(_rss_mib(s.pid) for s in snaps if s.pid is not None),
        max(s.indexed_tasks for s in snaps),
        time.monotonic() - launched,
    )


def memory_run(data: Path, out: Path, total: int) -> list[Point]:
    run_dir = data / "run"
    command = [QW, "up", "--dir", str(data), "--workers", str(WORKERS), "--handler", NOOP]
    command += ["--fsync", "none", "--no-tui"]
    points: list[Point] = []
    with Queue(data, fsync="none") as queue, open(out, "wb") as up_out:
        queue.enqueue_many([None] * BATCH)
        published = BATCH
        launched = time.monotonic()
        up = subprocess.Popen(command, stdout=up_out, stderr=subprocess.STDOUT, env=ENV, cwd=REPO)
        try:
            wanted = [FIRST_POINT, *range(1_000_000, total, 1_000_000)]
            while True:
                if up.poll() is not None:
                    raise BenchError(f"qw up exited with {up.returncode}: {_tail(out)}")
                done = _done(run_dir)
                if wanted and done >= wanted[0]:
                    points.append(_point(up, run_dir, done, launched))
                    log(f"memory: {done:,} done: {points[-1]}")
                    wanted.pop(0)
                if published < total and published - done < 2 * BATCH:
                    count = min(BATCH, total - published)
                    queue.enqueue_many([None] * count)
                    published += count
                elif published >= total and done >= total:
                    break
                else:
                    time.sleep(0.05)

            def settled() -> bool:
                snaps = snapshots(run_dir)
                return len(snaps) == WORKERS and all(
                    s.done_tasks == total and s.state is WorkerState.IDLE for s in snaps
                )

            wait_for(settled, TIMEOUT_S, "every worker idle with every task done")
            time.sleep(1.0)  # a supervisor frame or two at the end, as at the other points
            points.append(_point(up, run_dir, total, launched))
            log(f"memory: the end: {points[-1]}")
        finally:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(TIMEOUT_S)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
    return points


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-600:]


def memory_section(root: Path, total: int) -> Section:
    with scratch(root, "memory") as d:
        points = memory_run(d / "data", d / "up.out", total)
    first, last = points[0], points[-1]
    rows = [
        [
            f"{p.done:,}",
            f"{p.seconds:.0f}",
            f"{p.supervisor_mib:.1f}",
            f"{p.worker_mib:.1f}",
            f"{p.indexed:,}",
        ]
        for p in points
    ]
    body = "\n".join(
        [
            f"`qw up --workers {WORKERS} --handler {NOOP} --fsync none --no-tui` while "
            f"{total:,} no-op tasks are enqueued in batches of {BATCH:,} (at most "
            f"{2 * BATCH:,} not yet done at any time); resident memory when the workers' "
            "folds had seen that many tasks done (the last row: all done, the workers idle).",
            "",
            table(
                [
                    "tasks done",
                    "s since launch",
                    "supervisor RSS MiB",
                    "largest worker RSS MiB",
                    "task positions indexed (most of a worker)",
                ],
                rows,
            ),
        ]
    )
    sup_ratio = last.supervisor_mib / first.supervisor_mib
    worker_ratio = last.worker_mib / first.worker_mib
    targets = [
        Target(
            f"worker RSS, {total:,} tasks vs {first.done:,}",
            f"≤ {FLAT:.2f}×",
            f"{worker_ratio:.2f}× ({first.worker_mib:.1f} → {last.worker_mib:.1f} MiB)",
            worker_ratio <= FLAT,
        ),
        Target(
            f"supervisor RSS, {total:,} tasks vs {first.done:,}",
            f"≤ {FLAT:.2f}×",
            f"{sup_ratio:.2f}× ({first.supervisor_mib:.1f} → {last.supervisor_mib:.1f} MiB)",
            sup_ratio <= FLAT,
        ),
    ]
    return Section("Long run: memory against history", body, targets)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="qw-bench-") as tmp:
        section = memory_section(Path(tmp), int(sys.argv[1]) if len(sys.argv) > 1 else 3_000_000)
        print(section.markdown())
        for target in section.targets:
            print(target)
