"""A worker's instructions a task, counted by valgrind: a figure the machine's load leaves alone.

    python -m bench.drain_instructions [--small 200] [--large 1200] [--workers 1]

One worker (``python -m queue_worker.process``, as the benchmarks start it) drains `small`
no-op tasks under ``valgrind --tool=callgrind``, then another drains `large`; the main
thread's instructions of the second less those of the first, over `large - small`, is its
instructions a task, start-up cancelled out. With ``--workers N`` (slots 0..N-1, as the
drain benchmarks run them), N workers each under valgrind drain the queue together and
their main threads are summed: what a task costs the fleet, the others' records folded
included (workers slowed by valgrind catch up more often, as a task takes longer than
the worker's fresh-fold window: the figure is for comparing trees, not an absolute).

On a shared machine the CPU a task from wait4 moves with the neighbours' load (±15%
between runs of the same tree); an instruction count does not. The other threads are left
out (`--separate-threads=yes`, the main thread's file): the stats writer's work follows
the wall clock, which valgrind and the load stretch.

Run it in two trees one after the other to compare them (valgrind must be on PATH; a run
takes ~20 s of valgrind per 1,000 tasks).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import ENV, REPO, enqueue, fleet_configs
from queue_worker.process import worker_command


def main_thread_instructions(root: Path, tasks: int, workers: int = 1) -> int:
    """The instructions of the main threads of `workers` workers draining `tasks` no-op
    tasks together."""
    data = root / f"data-{tasks}"
    enqueue(data, tasks)
    valgrind = ["valgrind", "--tool=callgrind", "--separate-threads=yes"]
    outs: list[Path] = []
    procs = []
    for i, config in enumerate(fleet_configs(data, root / f"run-{tasks}", workers)):
        command, _ = worker_command(config)
        out = root / f"callgrind-{tasks}-w{i}.out"
        outs.append(Path(f"{out}-01"))  # thread 1: the main thread
        procs.append(
            subprocess.Popen(
                [*valgrind, f"--callgrind-out-file={out}", *command],
                env=ENV,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"a worker under valgrind exited with {proc.returncode}: {err[-2000:]}")
    return sum(_summary(main) for main in outs)


def _summary(main: Path) -> int:
    for line in main.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    sys.exit(f"{main}: no summary line")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--small", type=int, default=200, help="tasks of the first drain")
    parser.add_argument("--large", type=int, default=1200, help="tasks of the second drain")
    parser.add_argument("--workers", type=int, default=1, help="workers draining together")
    args = parser.parse_args()
    if args.workers < 1:
        parser.error(f"--workers {args.workers}: expected at least 1")
    if not 0 <= args.small < args.large:
        parser.error(f"--small {args.small} and --large {args.large}: expected 0 <= small < large")
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed")
    root = Path(tempfile.mkdtemp(prefix="qw-drain-instructions-"))
    try:
        small = main_thread_instructions(root, args.small, args.workers)
        large = main_thread_instructions(root, args.large, args.workers)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per_task = (large - small) / (args.large - args.small)
    print(
        f"{REPO.name}: {small:,} instructions ({args.small} tasks), {large:,} ({args.large}): "
        f"{per_task / 1e3:.1f}k instructions a task "
        f"({'main thread' if args.workers == 1 else f'{args.workers} workers, main threads'})"
    )


if __name__ == "__main__":
    main()
