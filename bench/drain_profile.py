"""Where a worker's CPU goes in a drain: one worker of a real drain, measured.

    python -m bench.drain_profile --workers 2 --tasks 5000 [--parts | --profile] [--strace]
        [--redis]

Enqueues `tasks` no-op tasks and starts `workers` worker processes as the benchmarks do
(``python -m queue_worker.process``, one interpreter each), waits for the drain, checks it
exactly-once, and prints each worker's CPU (from wait4) beside the CPU of a worker that
starts on an empty queue and exits (its start-up). Then, for worker 0:

--parts    its loop's CPU a task split by part (`bench.drain_parts`: wrapped functions
           timed by the main thread's CPU clock, the wrappers' own cost taken off);
--profile  cProfile, timed by its main thread's CPU clock (not the wall clock: on a shared
           machine a wall-clock profile charges whatever line was running with the time
           the process spent waiting for a core); ``--keep PATH`` keeps the profile;

``--redis`` runs the drain on a redis-server started for it (``?prefix=data``) instead of
a data directory. And for worker 1 (a tracer slows what it traces: another worker than
the measured one):

--strace   its system calls, counted by ``strace -c -f``;
--spy PATH its stacks sampled by py-spy (not a dependency of qw: it must be on PATH),
           summed as µs a task by function and by thread.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import io
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.common import ENV, REPO, enqueue, fleet_configs, fold_claims
from queue_worker.process import worker_command
from queue_worker.worker.config import WorkerConfig

#: py-spy samples a second
SPY_RATE = 2000


def profiled_worker(out: str, config_json: str) -> None:
    """Run one worker process's body under cProfile on this thread's CPU clock."""
    from queue_worker.process import run_worker_process

    profile = cProfile.Profile(time.thread_time)
    try:
        profile.runcall(run_worker_process, config_json)
    finally:
        profile.dump_stats(out)


def start(command: list[str], stderr: Path) -> subprocess.Popen[bytes]:
    with open(stderr, "wb") as err:  # the child has its own copy
        return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err, env=ENV, cwd=REPO)


def wait_cpu(proc: subprocess.Popen[bytes], name: str, stderr: Path) -> float:
    """Reap `proc` (wait4: its own rusage) and return its CPU seconds."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{name} exited with {proc.returncode}: {stderr.read_text()}")
    return usage.ru_utime + usage.ru_stime


def parts_worker(out: str, config_json: str) -> None:
    """Run one worker process's body with its CPU split by part (bench.drain_parts)."""
    from bench.drain_parts import install
    from queue_worker.process import run_worker_process

    install(out)
    run_worker_process(config_json)


def startup_cpu(root: Path, redis_url: str | None = None) -> float:
    """CPU seconds of a worker that starts on an empty queue and exits at once."""
    data: Path | str = root / "empty" if redis_url is None else f"{redis_url}/0?prefix=empty"
    enqueue(data, 0)
    [config] = fleet_configs(data, root / "run-empty", 1)
    command, _ = worker_command(config)
    return wait_cpu(start(command, root / "empty.stderr"), "empty", root / "empty.stderr")


def command_of(
    i: int,
    config: WorkerConfig,
    prof: Path,
    trace: Path,
    strace: bool,
    spy: Path | None,
    profile: bool,
    parts: Path | None,
) -> list[str]:
    command, _ = worker_command(config)
    if i == 0 and parts is not None:
        code = "import sys; from bench.drain_profile import parts_worker as p; p(*sys.argv[1:])"
        return [sys.executable, "-c", code, str(parts), config.to_json()]
    if i == 0 and profile:
        code = "import sys; from bench.drain_profile import profiled_worker as p; p(*sys.argv[1:])"
        return [sys.executable, "-c", code, str(prof), config.to_json()]
    if i == 1 and (
        strace or spy is not None
    ):  # its parent is the tracer: it watches whoever started it
        command, _ = worker_command(dataclasses.replace(config, parent_pid=None))
        if spy:
            sampler = ["py-spy", "record", "--nonblocking", "--threads", "--rate", str(SPY_RATE)]
            return [*sampler, "--format", "raw", "-o", str(spy), "--", *command]
        return ["strace", "-c", "-f", "-o", str(trace), *command]
    return command


def _frame_name(frame: str) -> str:
    """``Worker.step (/…/queue_worker/worker.py:326)`` → ``Worker.step (worker.py)``."""
    function, _, where = frame.rpartition(" (")
    return f"{function} ({where.rsplit('/', 1)[-1].split(':', 1)[0]})" if function else frame


def spy_summary(path: Path, tasks: int, top: int, rate: int = SPY_RATE) -> str:
    """py-spy's raw samples as µs a task: inclusive by function, and by thread. Samples
    with no Python frame (the thread waiting in C, or idle) are left out."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if len(frames) < 2:
            continue
        n = int(count)
        threads[frames[0].split(": ", 1)[-1] if ": " in frames[0] else "(unnamed)"] += n
        names = [_frame_name(f) for f in frames[1:]]
        own[names[-1]] += n
        for name in set(names):
            inclusive[name] += n
    us = 1e6 / rate / max(tasks, 1)
    lines = [f"py-spy, w1 ({tasks} tasks), µs of CPU a task (one sample = {1e6 / rate:.0f} µs):"]
    lines += [f"  thread {name}: {n * us:.1f}" for name, n in threads.most_common()]
    lines.append("inclusive:")
    lines += [f"  {n * us:7.1f}  {name}" for name, n in inclusive.most_common(top)]
    lines.append("own:")
    lines += [f"  {n * us:7.1f}  {name}" for name, n in own.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--strace", action="store_true", help="count worker 1's syscalls")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--profile", action="store_true", help="run worker 0 under cProfile")
    parser.add_argument("--parts", action="store_true", help="worker 0's CPU by part of its loop")
    parser.add_argument("--keep", type=Path, help="with --profile: copy the profile here")
    parser.add_argument("--spy", type=Path, help="sample worker 1 with py-spy into this file")
    parser.add_argument(
        "--redis", action="store_true", help="the queue on a redis-server started for the run"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="qw-drain-profile-"))
    try:
        with contextlib.ExitStack() as stack:
            redis_url = None
            if args.redis:
                from bench.redis_bench import redis_server

                binary = shutil.which("redis-server")
                if binary is None:
                    sys.exit("--redis: redis-server is not installed")
                redis_url = stack.enter_context(redis_server(root, binary))
            run(args, root, redis_url)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(args: argparse.Namespace, root: Path, redis_url: str | None) -> None:
    """One drain of `args.tasks` tasks, measured as `main` describes."""
    empty = startup_cpu(root, redis_url)
    data: Path | str = root / "data" if redis_url is None else f"{redis_url}/0?prefix=data"
    enqueue(data, args.tasks)
    configs = fleet_configs(data, root / "run", args.workers)
    prof, trace = root / "w0.prof", root / "strace.txt"
    parts = root / "parts.json" if args.parts else None
    procs = [
        (
            c.name,
            start(
                command_of(i, c, prof, trace, args.strace, args.spy, args.profile, parts),
                root / f"{c.name}.err",
            ),
        )
        for i, c in enumerate(configs)
    ]
    cpu = {name: wait_cpu(proc, name, root / f"{name}.err") for name, proc in procs}
    fold = fold_claims(data)
    fold.check_exactly_once(args.tasks)
    done: dict[str, int] = {}
    for holder in fold.holders.values():
        name = holder.split("-", 1)[0].split("@", 1)[0]  # w0@box-4711-9f3a → w0
        done[name] = done.get(name, 0) + 1
    print(
        f"{args.workers} workers, {args.tasks} tasks; claims {fold.claims}, lost {fold.lost_total}"
    )
    print(f"start-up alone (a worker on an empty queue): {empty * 1e3:.0f} ms CPU")
    watched = {"w0": "cProfile" if args.profile else "parts" if args.parts else ""}
    watched["w1"] = "strace" if args.strace else "py-spy" if args.spy is not None else ""
    for name, seconds in cpu.items():
        n = done.get(name, 0)
        note = f" ({watched[name]})" if watched.get(name) else ""
        per = (seconds - empty) * 1e6 / n if n else float("nan")
        print(
            f"  {name}{note}: {n} tasks, {seconds * 1e3:.0f} ms CPU, "
            f"{per:.0f} µs a task past start-up"
        )
    if args.profile:
        stats = pstats.Stats(str(prof), stream=io.StringIO())
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)
        print(out.getvalue())
        print(f"w0 did {done.get('w0', 0)} tasks (times above: its main thread's CPU)")
        if args.keep is not None:
            shutil.copy(prof, args.keep)
    if parts is not None:
        from bench.drain_parts import summary

        print(summary(parts))
    if args.strace:
        print(trace.read_text())
        print(f"w1 did {done.get('w1', 0)} tasks")
    if args.spy is not None:
        print(spy_summary(args.spy, done.get("w1", 0), args.top))


if __name__ == "__main__":
    main()
