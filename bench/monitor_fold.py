"""The supervisor's monitor catching up on a drained queue: its CPU, all of it in `poll`.

    python -m bench.monitor_fold [--tasks 10000] [--runs 7]

Drains `tasks` no-op tasks with ``qw up --workers 2``, removes the fold checkpoint (so
that the monitor folds the whole claims log, as it does while a run goes), then times
`Monitor.poll` until caught up, every record after the monitor's start (as in a live
run, where each is looked at for an event), on this thread's CPU clock: median and least
of `runs` fresh monitors.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import USER_ENV, enqueue, up_command
from supervisor.run.monitor import Monitor


def poll_all(location: Path) -> tuple[float, int]:
    """CPU seconds of one fresh monitor's polls to the end of both logs, and records read."""
    monitor = Monitor(str(location))
    monitor._events_from = 0  # every record looked at for an event, as while a run goes
    began = time.thread_time()
    while True:
        monitor.poll()
        if monitor.caught_up:
            break
    spent = time.thread_time() - began
    records = monitor._records
    monitor.close()
    return spent, records


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    if args.tasks < 1 or args.runs < 1:
        parser.error("--tasks and --runs: expected at least 1 each")
    root = Path(tempfile.mkdtemp(prefix="qw-monitor-fold-"))
    try:
        data = root / "data"
        enqueue(data, args.tasks)
        subprocess.run(up_command(data, 2), env=USER_ENV, check=True, capture_output=True)
        (data / "fold.checkpoint").unlink(missing_ok=True)
        runs = [poll_all(data) for _ in range(args.runs)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    times = [spent for spent, _ in runs]
    print(
        f"monitor, {runs[0][1]:,} records: {statistics.median(times) * 1e3:.1f} ms CPU "
        f"(least {min(times) * 1e3:.1f} ms), {statistics.median(times) / runs[0][1] * 1e6:.2f} "
        "µs a record"
    )


if __name__ == "__main__":
    main()
