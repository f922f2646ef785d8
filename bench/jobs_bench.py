"""The job queue end to end, as its users write it: define `add(a, b)`, enqueue N calls
`add(i, i)`, wait for every result — qw against Huey (bench/jobs_huey.py) and RQ
(bench/jobs_rq.py), the same program in each (bench/jobs_program.py).

qw's program: a module with ``queue = Queue(".qw")`` and ``@queue.task def add``, its
workers ``qw up --app jobs --workers W --no-tui`` (up once each worker has published its
first stats snapshot), each call ``add.enqueue(i, i)`` and its result
``handle.result(timeout=60)``. Every tool runs on its defaults (qw ``--fsync commit``,
SqliteHuey's own; RQ's redis-server keeps nothing on disk).

Timed: the producer's first enqueue → its last result read, and beside it the workers'
launch → the last result read (their start-up, the producer's interpreter start, its
run). Runs interleaved (qw, Huey, RQ, qw, …), medians of the repeats; × = the other
tool's time / qw's. Writes the table to bench/results-jobs.md (``--out``).

    python -m bench.jobs_bench [--calls N] [--workers W] [--repeats R]
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import jobs_huey, jobs_rq
from bench.common import QW, REPO, BenchError, Section, machine_line, median, num, scratch, table
from bench.jobs_program import JobsRun, Program, run_program
from queue_worker.worker.snapshot import read_snapshots

JOBS = """\
from queue_worker import Queue

queue = Queue(".qw")


@queue.task
def add(a, b):
    return a + b
"""
#: the workers of each tool (`--workers`'s default, and `make bench`'s)
WORKERS = 2


def qw_program(workers: int) -> Program:
    return Program(
        tool="qw",
        jobs=JOBS,
        setup="from jobs import add",
        enqueue="add.enqueue(i, i)",
        result="call.result(timeout=60)",
        workers=[[QW, "up", "--app", "jobs", "--workers", str(workers), "--no-tui"]],
        stop_signal=signal.SIGINT,
    )


def run_qw(directory: Path, calls: int, workers: int) -> JobsRun:
    run_dir = directory / ".qw" / "run"
    up = lambda: len(read_snapshots(run_dir)) >= workers  # noqa: E731
    return run_program(qw_program(workers), directory, calls, up)


#: each tool's run, and its durability as the table names it
TOOLS: dict[str, tuple[Callable[[Path, int, int], JobsRun], str]] = {
    "qw": (run_qw, "`--fsync commit`"),
    "Huey": (jobs_huey.run, "SqliteHuey, its defaults"),
    "RQ": (jobs_rq.run, "redis-server, no persistence"),
}


def run_all(
    root: Path, calls: int, workers: int, repeats: int
) -> tuple[dict[str, list[JobsRun]], list[str]]:
    """Every tool's runs, interleaved, and a line for each run that failed or tool that
    cannot run here (left out of the medians)."""
    from bench.start_bench import log, warm_bytecode  # (it imports huey: the bench extra's)

    notes: list[str] = []
    tools = dict(TOOLS)
    if (why := jobs_rq.available()) is not None:
        del tools["RQ"]
        notes.append(f"RQ not run: {why}.")
    warm_bytecode()
    runs: dict[str, list[JobsRun]] = {name: [] for name in tools}
    for repeat in range(repeats):
        for name, (run, _) in tools.items():
            log(f"{name}: {calls:,} calls, {workers} workers (run {repeat + 1} of {repeats})")
            with scratch(root, f"jobs-{name}") as directory:
                try:
                    runs[name].append(run(directory, calls, workers))
                except (BenchError, subprocess.TimeoutExpired) as e:
                    notes.append(f"{name}, run {repeat + 1}: failed ({e}).")
    return runs, notes


def jobs_section(root: Path, calls: int, workers: int, repeats: int) -> Section:
    runs, notes = run_all(root, calls, workers, repeats)
    return Section(
        f"The job queue end to end: {calls:,} calls `add(i, i)`, {workers} workers",
        jobs_table(runs, notes),
    )


def jobs_table(runs: dict[str, list[JobsRun]], notes: Sequence[str]) -> str:
    done = {name: r for name, r in runs.items() if r}
    span = {name: median(x.span_s for x in r) for name, r in done.items()}
    total = {name: median(x.total_s for x in r) for name, r in done.items()}

    def times_qw(figures: dict[str, float], name: str) -> str:
        if name == "qw" or "qw" not in figures:
            return "—"
        return f"{figures[name] / figures['qw']:.2f}×"

    rows = [
        [
            f"{name} ({TOOLS[name][1]})",
            f"{span[name]:.2f} s",
            num(median(x.rate for x in r)),
            times_qw(span, name),
            f"{total[name]:.2f} s",
            times_qw(total, name),
            f"{median(x.startup_s for x in r):.2f} s",
        ]
        for name, r in done.items()
    ]
    headers = ["tool", "enqueue → last result", "calls/s", "×", "with start-up", "×", "start-up"]
    each = "; ".join(
        f"{name} " + ", ".join(f"{x.span_s:.2f}" for x in r) + " s" for name, r in done.items()
    )
    repeats = max((len(r) for r in runs.values()), default=0)
    lines = [
        table(headers, rows),
        "",
        f"Medians of {repeats} interleaved run(s); × = the tool's time / qw's. "
        "enqueue → last result: the producer's first enqueue to its last result read; "
        "with start-up: the workers' launch to the last result read (start-up: launch until "
        "the tool reports its workers up; then the producer's interpreter starts).",
        "",
        f"Each run, enqueue → last result: {each}.",
        *(["", *notes] if notes else []),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m bench.jobs_bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--calls", type=int, default=10_000, help="calls enqueued (10,000)")
    parser.add_argument(
        "--workers", type=int, default=WORKERS, help=f"worker processes ({WORKERS})"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each tool (3)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results-jobs.md")
    args = parser.parse_args(argv)
    for flag, value in (("--calls", args.calls), ("--workers", args.workers),
                        ("--repeats", args.repeats)):  # fmt: skip
        if value < 1:
            parser.error(f"{flag} {value}: expected a whole number of at least 1")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    header = [
        "# The job queue end to end: qw, Huey, RQ",
        "",
        f"- command: `{' '.join(['python -m bench.jobs_bench', *map(shlex.quote, argv)])}`",
        f"- commit: {commit or 'unknown'}",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {machine_line()}",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="qw-jobs-") as tmp:
        section = jobs_section(Path(tmp), args.calls, args.workers, args.repeats)
    text = "\n".join(header) + "\n" + f"## {section.title}\n\n{section.body}\n"
    print(text, flush=True)
    args.out.write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
