"""`qw` as the tests run it when they need what no user asks for: ``python -m tests.qw_run
[--exec-workers] [--clock-offset S] [--kill-compaction-at STEP] -- <qw arguments>``.

--exec-workers          every worker a plain subprocess (`start_worker(..., fork=False)`),
                        inheriting nothing from the fork server
--clock-offset S        every worker reads a wall clock off by S seconds
                        (`WorkerConfig.clock_offset_s`), as on a machine whose clock is wrong
--kill-compaction-at S  the process kills itself with SIGKILL when a compaction reaches the
                        step S (`queue_worker.compaction.files.STEPS`), the first time

Each is a patch of this process's modules, made before the command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import signal
import sys

from queue_worker.worker.config import WorkerConfig


def exec_workers() -> None:
    from supervisor.run import forked, supervisor

    vars(supervisor)["start_worker"] = functools.partial(forked.start_worker, fork=False)


def offset_clocks(seconds: float) -> None:
    from supervisor.run.supervisor import SupervisorOptions

    made = SupervisorOptions.worker_config

    def worker_config(self: SupervisorOptions, name: str, slot: int, slots: int) -> WorkerConfig:
        return dataclasses.replace(made(self, name, slot, slots), clock_offset_s=seconds)

    SupervisorOptions.worker_config = worker_config  # type: ignore[method-assign]


def kill_compaction_at(step: str) -> None:
    """Make this process kill itself when a compaction (of files or on Redis) reaches `step`."""
    from queue_worker.compaction import files as compaction
    from queue_worker.compaction import redis_streams as redis_compaction

    if step not in compaction.STEPS:
        raise SystemExit(f"--kill-compaction-at {step!r}: expected one of {compaction.STEPS}")

    def stop_at(reached: str) -> None:
        if reached == step:
            os.kill(os.getpid(), signal.SIGKILL)

    for module in (compaction, redis_compaction):  # (each calls its own name for it)
        vars(module)["stop_at"] = stop_at


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.qw_run")
    parser.add_argument("--exec-workers", action="store_true")
    parser.add_argument("--clock-offset", type=float, metavar="S")
    parser.add_argument("--kill-compaction-at", metavar="STEP")
    parser.add_argument("qw", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    if options.exec_workers:
        exec_workers()
    if options.clock_offset is not None:
        offset_clocks(options.clock_offset)
    if options.kill_compaction_at is not None:
        kill_compaction_at(options.kill_compaction_at)
    args = options.qw[1:] if options.qw[:1] == ["--"] else options.qw
    from supervisor.cli.app import main as qw

    return qw(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
