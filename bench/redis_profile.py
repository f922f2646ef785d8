"""Where the CPU of reading a Redis queue goes: the supervisor's monitor and a worker's fold.

    python -m bench.redis_profile [--workers 8] [--tasks 10000] [--repeats 3] [--top 25]
        [--verdicts client|server] [--parsers python,hiredis] [--no-cprofile]

On a redis-server of its own (as `bench.redis_bench` starts one), for each repeat and each
client parser (redis-py's pure-Python one, and hiredis when it is installed: the same run
alternates them, in processes that cannot import hiredis or can):

1. `qw up --log …?verdicts=V --workers N --exit-when-drained` (client verdicts unless
   ``--verdicts server``) on a backlog of no-op tasks, with the
   supervisor's `Monitor.poll` (where it reads and folds both logs) run under cProfile on
   the watcher thread's CPU clock (not the wall clock: on a shared machine that would charge
   whatever ran with the time spent waiting for a core). Printed: the supervisor process's
   own CPU a task (getrusage; workers are other processes), the part of it spent in polls,
   and the profile of the polls. Every run is checked exactly once.
2. A reader of the finished claims stream, as a worker with client verdicts
   reads it: `ClaimsFollower` fed by `read` in batches (the size a worker reads), its CPU
   a record split into the read (round trip, reply parsing, entries) and the fold.

Medians over the repeats; the load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import NOOP, REPO, USER_ENV, enqueue_batch, fold_claims, median, scratch
from bench.redis_bench import redis_server
from bench.start_bench import warm_bytecode

#: the records a worker's catch-up reads at once (`queue_worker.topics`)
WORKER_BATCH = 512
#: a sitecustomize that hides hiredis from redis-py (it imports it at most once, at start)
_NO_HIREDIS = "import sys\nsys.modules['hiredis'] = None  # redis-py: HIREDIS_AVAILABLE False\n"


def profiled_up(out: str, *argv: str) -> None:
    """`qw up *argv` in this process with `Monitor.poll` profiled; writes `out` (+ .prof)."""
    from supervisor.run import monitor as monitor_module

    profile = cProfile.Profile(time.thread_time)
    profiling = os.environ.get("QW_PROFILE_POLLS", "1") == "1"
    polls = [0, 0.0]
    poll = monitor_module.Monitor.poll

    def timed_poll(self: Any) -> Any:
        started = time.thread_time()
        try:
            return profile.runcall(poll, self) if profiling else poll(self)
        finally:
            polls[0] += 1
            polls[1] += time.thread_time() - started

    pid = os.getpid()
    exit_now = os._exit

    def write() -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        profile.dump_stats(out + ".prof")
        summary = {"polls": polls[0], "poll_cpu": polls[1]}
        summary["cpu"] = usage.ru_utime + usage.ru_stime
        Path(out).write_text(json.dumps(summary))

    def exit_after_writing(code: int) -> None:  # `qw up` ends with os._exit
        if os.getpid() == pid:
            write()
        exit_now(code)

    monitor_module.Monitor.poll = timed_poll  # type: ignore[method-assign]
    os._exit = exit_after_writing  # type: ignore[assignment]
    sys.argv = ["qw", *argv]
    from supervisor.cli.entry import main

    code = main()
    write()
    sys.exit(code)


def read_claims(location: str, out: str) -> None:
    """Fold the whole claims stream as a worker does; write the CPU split to `out`."""
    from logstore import open_log
    from queue_worker.topics import CLAIMS_TOPIC, ClaimsFollower

    log = open_log(location, CLAIMS_TOPIC)
    follower = ClaimsFollower(log.start)
    read_cpu = fold_cpu = 0.0
    records = reads = 0
    while True:
        t0 = time.thread_time()
        entries = log.read(follower.next_position, WORKER_BATCH)
        t1 = time.thread_time()
        for entry in entries:
            follower.apply(entry)
        t2 = time.thread_time()
        read_cpu += t1 - t0
        fold_cpu += t2 - t1
        records += len(entries)
        reads += 1
        if len(entries) < WORKER_BATCH:
            break
    log.close()
    summary = {"records": records, "reads": reads, "read_cpu": read_cpu, "fold_cpu": fold_cpu}
    Path(out).write_text(json.dumps(summary))


def _env(no_hiredis: Path | None, cprofile: bool) -> dict[str, str]:
    # USER_ENV: with bytecode caches, as bench.redis_bench runs qw (warm_bytecode in main)
    env = {**USER_ENV, "QW_PROFILE_POLLS": "1" if cprofile else "0"}
    if no_hiredis is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(no_hiredis), USER_ENV["PYTHONPATH"]])
    return env


def _python(code: str, args: list[str], env: dict[str, str], log: Path) -> None:
    with open(log, "wb") as err:
        status = subprocess.call(
            [sys.executable, "-c", code, *args], stdout=err, stderr=subprocess.STDOUT, env=env,
            cwd=REPO,
        )  # fmt: skip
    if status != 0:
        sys.exit(f"{code} failed ({status}): {log.read_text(errors='replace')[-800:]}")


def one_run(
    root: Path,
    url: str,
    workers: int,
    tasks: int,
    prefix: str,
    no_hiredis: Path | None,
    cprofile: bool,
    verdicts: str = "client",
) -> dict[str, Any]:
    location = f"{url}/0?prefix={prefix}&verdicts={verdicts}"
    env = _env(no_hiredis, cprofile)
    with scratch(root, prefix) as d:
        enqueue_batch(location, tasks)
        out = str(d / "up.json")
        argv = ["up", "--log", location, "--dir", str(d / "run"), "--workers", str(workers),
                "--handler", NOOP, "--fsync", "none", "--no-tui",
                "--exit-when-drained"]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.time()
        code = "import sys; from bench.redis_profile import profiled_up as p; p(*sys.argv[1:])"
        _python(code, [out, *argv], env, d / "up.log")
        wall = time.time() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        all_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        up = json.loads(Path(out).read_text())
        shutil.copy(out + ".prof", root / f"{prefix}.prof")
        fold = fold_claims(location)
        fold.check_exactly_once(tasks)
        code = "import sys; from bench.redis_profile import read_claims as r; r(*sys.argv[1:])"
        _python(code, [location, str(d / "read.json")], env, d / "read.log")
        read = json.loads((d / "read.json").read_text())
    return {
        "rate": tasks / wall,
        "all_us": all_cpu * 1e6 / tasks,
        "sup_us": up["cpu"] * 1e6 / tasks,
        "poll_us": up["poll_cpu"] * 1e6 / tasks,
        "polls": up["polls"],
        "read_us": read["read_cpu"] * 1e6 / tasks,
        "fold_us": read["fold_cpu"] * 1e6 / tasks,
        "records": read["records"],
        "lost": fold.lost_total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--parsers", default="python,hiredis")
    parser.add_argument("--verdicts", choices=("client", "server"), default="client")
    parser.add_argument(
        "--no-cprofile", action="store_true", help="time the polls without profiling them"
    )
    args = parser.parse_args()
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    parsers = args.parsers.split(",")
    root = Path(tempfile.mkdtemp(prefix="qw-redis-profile-"))
    hide = root / "no-hiredis"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(_NO_HIREDIS)
    results: dict[str, list[dict[str, Any]]] = {p: [] for p in parsers}
    try:
        warm_bytecode()
        with redis_server(root, binary) as url:
            for rep in range(args.repeats):
                for parser_name in parsers:
                    no_hiredis = hide if parser_name == "python" else None
                    run = one_run(
                        root,
                        url,
                        args.workers,
                        args.tasks,
                        f"{parser_name}{rep}",
                        no_hiredis,
                        not args.no_cprofile,
                        args.verdicts,
                    )
                    print(f"  {parser_name} repeat {rep + 1}: " + json.dumps(run), flush=True)
                    results[parser_name].append(run)
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
        print(f"\n{args.workers} workers, {args.tasks} tasks; medians of {args.repeats} runs")
        keys = ["rate", "all_us", "sup_us", "poll_us", "read_us", "fold_us"]
        print("parser   " + "  ".join(f"{k:>8}" for k in keys))
        for parser_name, runs in results.items():
            row = [median(r[k] for r in runs) for k in keys]
            print(f"{parser_name:8} " + "  ".join(f"{v:8.1f}" for v in row))
        for parser_name in [] if args.no_cprofile else parsers:
            stats = pstats.Stats(str(root / f"{parser_name}0.prof"), stream=io.StringIO())
            out = io.StringIO()
            stats.stream = out  # type: ignore[attr-defined]
            print(f"\nMonitor.poll under cProfile ({parser_name}, repeat 1), by own time:")
            stats.sort_stats("tottime").print_stats(args.top)
            print(out.getvalue())
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
