"""What the job-queue benchmark (bench/jobs_bench.py) runs for each tool: the two files a
user writes — `jobs.py`, which defines `add(a, b)`, and `producer.py`, which enqueues
`add(i, i)` for i < N and waits for every result, checking each — and the tool's workers
launched as its users launch them, from the directory of those files.

A run: the workers are launched; once the tool says they are up (`ready`), `producer.py`
runs (a fresh interpreter, as a user's program is) and prints when it enqueued its first
call and when it read its last result (wall clock, as the launch is timed); then the
workers are stopped as a user stops them (`stop_signal`: their graceful shut-down).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.common import TIMEOUT_S, USER_ENV, BenchError, _last_line, wait_for

#: producer.py: `{setup}` imports `add` (and what else the tool's producer needs),
#: `{enqueue}` enqueues call i, `{result}` waits for the result of `call`
PRODUCER = """\
import json
import sys
import time

{setup}

calls = int(sys.argv[1])
first = time.time()
pending = [{enqueue} for i in range(calls)]
for i, call in enumerate(pending):
    got = {result}
    if got != 2 * i:
        sys.exit(f"add({{i}}, {{i}}) returned {{got!r}}, expected {{2 * i}}")
print(json.dumps({{"first_enqueue": first, "last_result": time.time()}}))
"""


@dataclass(frozen=True)
class JobsRun:
    """One tool's run of the program."""

    tool: str
    calls: int
    startup_s: float  # workers launched → the tool says they are up
    span_s: float  # first enqueue → last result read
    total_s: float  # workers launched → last result read

    @property
    def rate(self) -> float:
        return self.calls / self.span_s


@dataclass(frozen=True)
class Program:
    """One tool's program and how its users run its workers."""

    tool: str
    jobs: str  # jobs.py
    setup: str  # producer.py's lines before it enqueues (`PRODUCER`)
    enqueue: str
    result: str
    workers: Sequence[Sequence[str]]  # each worker command (run in the program's directory)
    stop_signal: signal.Signals


def run_program(
    program: Program,
    directory: Path,
    calls: int,
    ready: Callable[[], bool],
    producer_args: Sequence[str] = (),
) -> JobsRun:
    """Write the program's files into `directory` (a fresh one), launch its workers, wait
    until `ready()`, run producer.py for `calls` calls, stop the workers."""
    (directory / "jobs.py").write_text(program.jobs)
    producer = PRODUCER.format(setup=program.setup, enqueue=program.enqueue, result=program.result)
    (directory / "producer.py").write_text(producer)
    logs = [directory / f"worker{i}.log" for i in range(len(program.workers))]
    procs: list[subprocess.Popen[bytes]] = []
    launched = time.time()
    try:
        for command, log in zip(program.workers, logs, strict=True):
            with log.open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        command, cwd=directory, env=USER_ENV, stdout=out, stderr=subprocess.STDOUT
                    )
                )

        def up() -> bool:
            for command, proc, log in zip(program.workers, procs, logs, strict=True):
                if proc.poll() is not None:
                    raise BenchError(
                        f"{program.tool}: `{' '.join(command)}` exited with {proc.returncode}:"
                        f" {_last_line(log)}"
                    )
            return ready()

        wait_for(up, TIMEOUT_S, f"{program.tool}'s workers to start")
        started = time.time()
        done = subprocess.run(
            [sys.executable, "producer.py", str(calls), *producer_args],
            cwd=directory,
            env=USER_ENV,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise BenchError(f"{program.tool}: producer.py exited with {done.returncode}: {last}")
        times = json.loads(done.stdout)
    finally:
        _stop(procs, program.stop_signal)
    last_result = float(times["last_result"])
    return JobsRun(
        tool=program.tool,
        calls=calls,
        startup_s=started - launched,
        span_s=last_result - float(times["first_enqueue"]),
        total_s=last_result - launched,
    )


def _stop(procs: Sequence[subprocess.Popen[bytes]], how: signal.Signals) -> None:
    """Ask each worker process to stop (`how`), as a user does; kill what is left after 30 s."""
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, how)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
