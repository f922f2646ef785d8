"""`qw up` of this checkout against another's, interleaved: the CPU of all its processes.

    python -m bench.up_cpu --before /work/wt/speed-base/.venv/bin/qw --workers 8 --runs 7

Each round runs ``qw up --workers N --handler bench.noop:noop --exit-when-drained --no-tui``
once with each `qw` (in turn, the order swapped every round, so that a burst of load hits
both alike) on its own copy of one backlog of no-op tasks, and takes from wait4 the user +
system time of the supervisor and of every process under it (the fork server reaps the
workers, the supervisor reaps the fork server), and the wall time, launch to exit. On a
machine shared with other work the wall time moves with the neighbours; the CPU a run
costs moves much less, and on two cores it is what the wall time of eight workers follows.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from time import perf_counter

from bench.common import NOOP, enqueue
from bench.small_commands import USER_ENV


def run_up(qw: str, data: Path, workers: int, fsync: str) -> tuple[float, float]:
    """One `qw up` drain of `data`: (wall seconds, CPU seconds of all its processes)."""
    command = [qw, "up", "--dir", str(data), "--workers", str(workers), "--handler", NOOP]
    command += ["--fsync", fsync, "--no-tui", "--exit-when-drained"]
    checkout = Path(qw).absolute().parent.parent.parent  # (its venv's bin/qw)
    env = {**USER_ENV, "PYTHONPATH": str(checkout)}  # the handler, bench.noop, of that checkout
    began = perf_counter()
    process = subprocess.Popen(
        command, env=env, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(process.pid, 0)
    wall = perf_counter() - began
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{qw} up exited with {os.waitstatus_to_exitcode(status)}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--before", required=True, help="the other checkout's qw")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--fsync", choices=["none", "commit"], default="none")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    if args.workers < 1 or args.runs < 1 or args.tasks < 1:
        parser.error("--workers, --runs and --tasks: expected at least 1 each")
    after = str(Path(sys.executable).with_name("qw"))
    sides = {"before": args.before, "after": after}
    walls: dict[str, list[float]] = {side: [] for side in sides}
    cpus: dict[str, list[float]] = {side: [] for side in sides}
    root = Path(tempfile.mkdtemp(prefix="qw-up-cpu-"))
    try:
        backlog = root / "backlog"
        enqueue(backlog, args.tasks)
        for round_ in range(args.runs):
            order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
            for side in order:
                data = root / f"{side}-{round_}"
                shutil.copytree(backlog, data)
                wall, cpu = run_up(sides[side], data, args.workers, args.fsync)
                walls[side].append(wall)
                cpus[side].append(cpu)
                shutil.rmtree(data)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"qw up, {args.workers} workers, {args.tasks} tasks, --fsync {args.fsync}, medians:")
    for side, qw in sides.items():
        runs = " ".join(f"{cpu:.2f}" for cpu in cpus[side])
        print(
            f"  {side:6} CPU {statistics.median(cpus[side]):.3f} s, wall "
            f"{statistics.median(walls[side]):.3f} s  (CPU run by run: {runs})  {qw}"
        )


if __name__ == "__main__":
    main()
