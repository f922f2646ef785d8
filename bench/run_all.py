"""Every benchmark in one run: ``make bench`` (``python -m bench.run_all``).

Prints a Markdown section per benchmark as it finishes, then a "target / measured / met?"
table, and writes it all to bench/results.md (``--quick``: a smoke run with small sizes and
one repeat, written to bench/results-quick.md unless ``--out`` says otherwise).

The machine this runs on may be shared: absolute figures move with its load, so each
comparison is made between figures measured in the same run (runs interleaved, medians
of repeats), and the header records the load average at the start.

    python -m bench.run_all                    # everything, ~20 minutes
    python -m bench.run_all --quick            # a smoke run, ~2 minutes
    python -m bench.run_all --only drain,latency
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench import (
    fold_bench,
    jobs_bench,
    latency_bench,
    long_bench,
    memory_bench,
    queue_bench,
    redis_bench,
    redistribution_bench,
    retention_bench,
    start_bench,
)
from bench.common import REPO, Section, Target, machine_line, table
from bench.queue_bench import DrainResults

SECTIONS = (
    "e2e",
    "jobs",
    "start",
    "drain",
    "latency",
    "collisions",
    "redistribution",
    "long",
    "retention",
    "memory",
    "fold",
    "durable",
    "redis",
    "log",
    "dashboard",
)


@dataclass(frozen=True)
class Sizes:
    drain_tasks: int
    repeats: int
    worker_counts: tuple[int, ...]
    batch_tasks: int
    backlog: int
    wake_samples: int
    rounds: int
    long_stages: tuple[int, int, int]
    memory_tasks: int  # the memory section's run (a long one: minutes per million)
    redis_repeats: int
    retention_tasks: int = 3_000_000


FULL = Sizes(
    drain_tasks=10_000,
    repeats=3,
    worker_counts=(1, 2, 4, 8),
    batch_tasks=2_000,
    backlog=5_000,
    wake_samples=300,
    rounds=15,
    long_stages=(100_000, 500_000, 1_000_000),
    memory_tasks=3_000_000,
    redis_repeats=3,
)
QUICK = Sizes(
    drain_tasks=2_000,
    repeats=1,
    worker_counts=(1, 2, 4, 8),
    batch_tasks=500,
    backlog=1_000,
    wake_samples=50,
    rounds=4,
    long_stages=(10_000, 50_000, 100_000),
    memory_tasks=200_000,
    redis_repeats=1,
    retention_tasks=100_000,
)


def progress(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _log_section(quick: bool) -> Section:
    from bench import log_bench

    if quick:  # the file log bench's own sizes, cut for a smoke run
        log_bench.PER_PROCESS = {1: 10_000, 8: 2_000}
        log_bench.DURABLE_PER_PROCESS = {1: 300, 8: 100}
        log_bench.WAKE_SAMPLES = 300
    return _from_markdown(log_bench.run(), "File log")


def _dashboard_section() -> Section:
    from bench import dashboard_bench

    return _from_markdown(dashboard_bench.run(), "Dashboard")


def _from_markdown(text: str, fallback: str) -> Section:
    """A section from another bench's Markdown (its own "## title" line first)."""
    first, _, body = text.strip().partition("\n")
    if first.startswith("#"):
        return Section(first.lstrip("#").strip() or fallback, body.strip())
    return Section(fallback, text.strip())


def run(args: argparse.Namespace) -> int:
    sizes = QUICK if args.quick else FULL
    if args.tasks:
        sizes = Sizes(**{**sizes.__dict__, "drain_tasks": args.tasks})
    if args.repeats:
        sizes = Sizes(**{**sizes.__dict__, "repeats": args.repeats, "redis_repeats": args.repeats})
    wanted = SECTIONS if not args.only else tuple(s.strip() for s in args.only.split(","))
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown:
        print(f"unknown section {unknown[0]!r}; expected some of: {', '.join(SECTIONS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    out = (
        Path(args.out)
        if args.out
        else REPO / "bench" / ("results-quick.md" if args.quick else "results.md")
    )

    began = time.time()
    header = [
        "# qw benchmarks",
        "",
        f"- command: `{' '.join(['python -m bench.run_all', *map(shlex.quote, args.argv)])}`"
        + (" (via `make bench`)" if not args.argv else ""),
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {machine_line()}",
        f"- sizes: {sizes.drain_tasks:,} tasks per drain, {sizes.repeats} repeat(s), "
        f"{'quick smoke run' if args.quick else 'full run'}",
        "",
        "Absolute figures move with the machine's load; compare figures of one run. "
        "Targets are checked at the end.",
        "",
    ]
    print("\n".join(header), flush=True)
    sections: list[Section] = []
    failed: list[str] = []
    drains: DrainResults | None = None

    with tempfile.TemporaryDirectory(prefix="qw-bench-") as tmp:
        root = Path(tmp)

        def need_drains() -> DrainResults:
            nonlocal drains
            if drains is None:
                progress("running the drains (needed by a later section)")
                drains = queue_bench.run_drains(
                    root, sizes.worker_counts, sizes.drain_tasks, sizes.repeats
                )
            return drains

        def drain() -> Section:
            nonlocal drains
            drains = queue_bench.run_drains(
                root,
                sizes.worker_counts,
                sizes.drain_tasks,
                sizes.repeats,
                sizes.batch_tasks,
                durable="durable" in wanted,
            )
            return queue_bench.drain_section(drains)

        steps: dict[str, Callable[[], Section]] = {
            "e2e": lambda: start_bench.e2e_section(
                start_bench.run_end_to_end(
                    root, sizes.worker_counts, sizes.drain_tasks, sizes.repeats
                )
            ),
            "jobs": lambda: jobs_bench.jobs_section(
                root, sizes.drain_tasks, jobs_bench.WORKERS, sizes.repeats
            ),
            "start": lambda: start_bench.start_section(root, sizes.drain_tasks, sizes.repeats),
            "drain": drain,
            "latency": lambda: latency_bench.latency_section(
                root, need_drains(), sizes.wake_samples
            ),
            "collisions": lambda: queue_bench.collisions_section(root, sizes.backlog),
            "redistribution": lambda: redistribution_bench.redistribution_section(
                root, sizes.rounds
            ),
            "long": lambda: long_bench.long_section(root, sizes.long_stages),
            "retention": lambda: retention_bench.retention_section(
                root, sizes.retention_tasks, max(sizes.retention_tasks // 30, 1_000)
            ),
            "memory": lambda: memory_bench.memory_section(root, sizes.memory_tasks),
            "fold": lambda: fold_bench.fold_section(
                root, 2 * sizes.long_stages[1], sizes.drain_tasks, sizes.repeats
            ),
            "durable": lambda: queue_bench.durable_section(
                root, drains, sizes.drain_tasks, sizes.repeats
            ),
            "redis": lambda: redis_bench.redis_section(
                root, sizes.worker_counts, sizes.drain_tasks, sizes.redis_repeats
            ),
            "log": lambda: _log_section(args.quick),
            "dashboard": _dashboard_section,
        }
        for name in SECTIONS:
            if name not in wanted:
                continue
            progress(f"section {name}")
            started = time.perf_counter()
            try:
                section = steps[name]()
            except Exception as e:  # one broken section must not hide the others' results
                traceback.print_exc()
                failed.append(name)
                section = Section(f"{name}: FAILED", f"**The section failed:** `{e!r}`")
            section.seconds = time.perf_counter() - started
            sections.append(section)
            print(section.markdown(), flush=True)

    targets: list[Target] = [t for s in sections for t in s.targets]
    verdict = {True: "met", False: "**missed**", None: "not measured"}
    summary = [
        "## Targets",
        "",
        table(
            ["target", "wanted", "measured", "met?"],
            [[t.what, t.wanted, t.measured, verdict[t.met]] for t in targets],
            right=4,
        ),
        "",
        f"{sum(t.met is True for t in targets)} of {len(targets)} targets met"
        + ("" if "log" not in wanted else " (the file log's own targets are in its section)")
        + f". Whole run: {time.time() - began:.0f} s."
        + (f" FAILED sections: {', '.join(failed)}." if failed else ""),
        "",
    ]
    print("\n".join(summary), flush=True)
    text = "\n".join(header) + "\n" + "\n".join(s.markdown() for s in sections) + "\n"
    out.write_text(text + "\n".join(summary))
    progress(f"wrote {out}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m bench.run_all", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, one repeat")
    parser.add_argument("--only", help=f"comma-separated sections of: {', '.join(SECTIONS)}")
    parser.add_argument("--tasks", type=int, help="tasks per drain (default 10,000; quick 2,000)")
    parser.add_argument("--repeats", type=int, help="repeats of each drain (default 3; quick 1)")
    parser.add_argument("--out", help="where to write the Markdown (default bench/results.md)")
    args = parser.parse_args(argv)
    args.argv = argv
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
