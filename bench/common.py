"""What every benchmark section shares: starting worker processes, enqueueing, folding the
claims log to check and time a run, percentiles, and the Markdown it prints.

Times in the claims log are the records' own `at` (wall clock, µs; on Redis the server's
clock). A drain is timed from the first CLAIM's `at` to the last accepted DONE's `at`, so
the first worker's start-up is not part of it (the wall time from launch is reported beside
it); whatever the other workers' starts cost while the first one works is.

Two ways to start a drain's workers (`run_fleet(start=...)`):

- "fork", as `qw up` starts them: a fork server is started (`supervisor.run.forked.start_server`,
  a fresh interpreter that imports the worker code), told the queue so that it folds it
  (`warm_server`, as `qw up` does once it knows its queue), then each worker is forked from
  it (`supervisor.run.forked.ForkedWorker`, which `supervisor.run.forked.start_worker` returns for
  the supervisor's `_spawn`), one after another, slot 0 last as `Supervisor.start` does;
  the server is stopped once all have exited.
  Its environment (and so the workers') is `ENV`.
- "popen": each worker a fresh interpreter, ``python -m queue_worker.process``
  (`queue_worker.fleet`, as the tests start theirs, and as `qw up` does when its
  supervisor starts workers with `start_worker(..., fork=False)`), one after another.
"""

from __future__ import annotations

import math
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from logstore import open_log
from logstore.location import is_redis_url
from queue_worker.fleet import WorkerProcesses
from queue_worker.percentile import nearest_rank
from queue_worker.producer import Queue
from queue_worker.protocol.records import Claim, Done, TaskRecord, decode_task
from queue_worker.protocol.state import Lease, Verdict
from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC, ClaimsFollower
from queue_worker.waiting import WaitTimeout, wait_until
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.snapshot import WorkerSnapshot, read_snapshots

REPO = Path(__file__).resolve().parent.parent
#: worker processes import the handler (bench.noop) from the repository
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
}
NOOP = "bench.noop:noop"
#: `qw` as a user runs it: the console script beside this interpreter
QW = str(Path(sys.executable).with_name("qw"))
#: the environment of every timed launch: a user's Python writes bytecode caches, and a
#: build environment's PYTHONDONTWRITEBYTECODE would make each `qw` compile qw's sources
#: again (~0.3 s of CPU, measured): it is left out, and `warm_bytecode` writes them first
USER_ENV = {k: v for k, v in ENV.items() if k != "PYTHONDONTWRITEBYTECODE"}
#: how long any one wait of a benchmark may take before the run is declared broken
TIMEOUT_S = 300.0
#: how a benchmark starts qw's workers (module docstring); "fork" is how `qw up` does
Start = Literal["fork", "popen"]
STARTS: Final[tuple[Start, ...]] = ("fork", "popen")

T = TypeVar("T")


class BenchError(RuntimeError):
    """A benchmark run that cannot be trusted: a task lost or run twice, a worker that died."""


# -- numbers and tables ----------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of `values` (any order); NaN for none."""
    return nearest_rank(sorted(values), q) if values else float("nan")


def median(values: Iterable[float]) -> float:
    data = list(values)
    return statistics.median(data) if data else float("nan")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], right: int = 1) -> str:
    """A Markdown table; columns from index `right` on are right-aligned (numbers)."""
    align = ["---" if i < right else "---:" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def num(value: float, digits: int = 0) -> str:
    return "n/a" if value != value else f"{value:,.{digits}f}"  # NaN != NaN


def us(value: float) -> str:
    return "n/a" if value != value else f"{value:,.0f} µs"


def ms(value_us: float) -> str:
    return "n/a" if value_us != value_us else f"{value_us / 1000:,.1f} ms"


@dataclass(frozen=True)
class Target:
    """One line of the final "target / measured / met?" table."""

    what: str
    wanted: str
    measured: str
    met: bool | None  # None: not measured (the section was skipped or failed)


@dataclass
class Section:
    """The Markdown of one benchmark section and the targets it decided."""

    title: str
    body: str
    targets: list[Target] = field(default_factory=list)
    seconds: float = 0.0

    def markdown(self) -> str:
        return f"## {self.title}\n\n{self.body.rstrip()}\n\n_(section took {self.seconds:.0f} s)_\n"


# -- machine ---------------------------------------------------------------------------------


def machine_line() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cpus} CPUs (nproc), Python {platform.python_version()} "
        f"({platform.python_implementation()}), {platform.system()} {platform.release()}, "
        f"load average at start {load}"
    )


def wait_for(condition: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll `condition` until it returns something truthy (queue_worker.waiting)."""
    try:
        return wait_until(condition, timeout, what, max_poll=0.02)
    except WaitTimeout:
        raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}") from None


# -- worker processes ------------------------------------------------------------------------


def worker_config(location: str | Path, run_dir: Path, name: str, **settings: Any) -> WorkerConfig:
    defaults: dict[str, Any] = {
        "handler": NOOP,
        "fsync": "none",
        "exit_when_drained": True,
        "parent_pid": os.getpid(),
    }
    defaults.update(settings)
    return WorkerConfig(str(location), str(run_dir), name=name, **defaults)


def fleet_configs(
    location: str | Path, run_dir: Path, workers: int, **settings: Any
) -> list[WorkerConfig]:
    """`workers` configs in slots 0..workers-1 of `workers` (what the supervisor hands out)."""
    return [
        worker_config(location, run_dir, f"w{i}", slot=i, slots=workers, **settings)
        for i in range(workers)
    ]


class Fleet(WorkerProcesses):
    """The benchmarks' worker processes (`queue_worker.fleet`, as the tests start theirs),
    with a wait that turns a failed or slow worker into a BenchError."""

    def __init__(self, log_dir: Path) -> None:
        super().__init__(log_dir, env=ENV, cwd=REPO)

    def wait_all(self, timeout: float = TIMEOUT_S) -> None:
        """Wait for every worker to exit; BenchError if one fails or they take too long."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise BenchError(
                    f"worker pid {proc.pid} still running after {timeout:.0f}s"
                ) from None
        failed = [p for p in self.procs if p.returncode != 0 and p.returncode != -signal.SIGKILL]
        if failed:
            proc = failed[0]
            raise BenchError(
                f"worker {self.names[proc.pid]} (pid {proc.pid}) exited with {proc.returncode}: "
                f"{self.stderr_tail(proc)}"
            )


@dataclass(frozen=True)
class FleetRun:
    """How a fleet's run went, as its starter saw it."""

    start: Start
    launched: float  # wall clock, s: the first process started (fork server or worker)
    ended: float  # wall clock, s: the last worker seen exited
    #: "fork": the fork server's pid, and its own CPU seconds (user + system: its start,
    #: imports, folds and forks; not the workers'), read just before it was stopped
    server_pid: int | None = None
    server_cpu_s: float = 0.0


def run_fleet(configs: Sequence[WorkerConfig], log_dir: Path, start: Start = "popen") -> FleetRun:
    """Start the workers (exit_when_drained) the `start` way and wait for them all.

    Either way every worker ends as this process's descendant that has been waited for, so
    RUSAGE_CHILDREN counts its CPU once this returns (forked: its parent, the fork server,
    reaped it, and the server is reaped here)."""
    if start == "fork":
        return _run_forked(configs, log_dir)
    with Fleet(log_dir) as fleet:
        launched = time.time()
        for config in configs:
            fleet.start(config)
        fleet.wait_all()
        return FleetRun("popen", launched, time.time())


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's waited-for descendants: after
    `run_fleet`, its workers (and their fork server) among them."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run_forked(configs: Sequence[WorkerConfig], log_dir: Path) -> FleetRun:
    """`run_fleet(start="fork")`: the order `qw up` follows (supervisor.cli.entry starts the
    server first thing, `qw up` warms it, the supervisor forks each slot's worker)."""
    from supervisor.run import forked  # (the popen benchmarks need none of it)

    log_dir.mkdir(parents=True, exist_ok=True)
    location = configs[0].location
    launched = time.time()
    # The server is a fresh interpreter with this process's environment: ENV's then (the
    # PYTHONPATH), and every worker forked from it inherits it.
    with _environment(ENV):
        server = forked.start_server(redis=is_redis_url(location))
    workers: list[forked.ForkedWorker] = []
    try:
        forked.warm_server(location, len(configs))
        # Slot 0 last, as `Supervisor.start` forks them: it saves the checkpoint at its exit,
        # with filelock, which the server imports once its first worker is forked.
        order = [*configs[1:], *configs[:1]]
        for config in order:
            # what start_worker returns for Supervisor._spawn (the class itself: with
            # fork=False it would make this start a popen one)
            workers.append(forked.ForkedWorker(config, log_dir / f"{config.name}.log"))
        deadline = time.monotonic() + TIMEOUT_S
        for worker in workers:
            worker.wait(max(0.1, deadline - time.monotonic()))
        ended = time.time()
        running = [w.pid for w in workers if w.poll() is None]
        if running:
            raise BenchError(f"workers {running} still running after {TIMEOUT_S:.0f}s")
        failed = [(c, w) for c, w in zip(order, workers, strict=True) if w.poll() != 0]
        if failed:
            config, worker = failed[0]
            raise BenchError(
                f"worker {config.name} (pid {worker.pid}) exited with {worker.poll()}: "
                f"{_last_line(log_dir / f'{config.name}.log')}"
            )
        return FleetRun("fork", launched, ended, server, _own_cpu_s(server))
    finally:
        for worker in workers:
            if worker.poll() is None:
                os.kill(worker.pid, signal.SIGKILL)  # in its own session: never us
                worker.wait(30)
        forked.stop_server()  # it reaps nothing more; we reap it (and its children's CPU)


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """os.environ is `env` meanwhile (what a process started meanwhile inherits)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _own_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the running process `pid` itself (not its children);
    NaN where it cannot be read."""
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return math.nan
    return float(times.user + times.system)


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"


# -- producing -------------------------------------------------------------------------------


def up_command(data: Path, workers: int, fsync: str = "none") -> list[str]:
    """`qw up` on the file log in `data`: `workers` workers on the no-op handler, no
    dashboard, exiting once the queue is drained."""
    command = [QW, "up", "--dir", str(data), "--workers", str(workers), "--handler", NOOP]
    return [*command, "--fsync", fsync, "--no-tui", "--exit-when-drained"]


def run_timed(command: Sequence[str], **kwargs: Any) -> tuple[int, float]:
    """Run `command` (USER_ENV); return its exit code and the user + system CPU seconds of
    it and of every process under it that was waited for (the fork server reaps the
    workers, the supervisor reaps the fork server): on a loaded machine the CPU a start
    costs is a steadier figure than its wall time."""
    process = subprocess.Popen(command, env=USER_ENV, **kwargs)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_utime + usage.ru_stime


def enqueue(location: str | Path, count: int, payload: Any = None, fsync: str = "none") -> None:
    """Enqueue `count` tasks the way a producer that enqueues as work arrives does: one
    `Queue.enqueue` (one append) each. (One `enqueue_many` batch of them all is measured
    on its own in the drain section: it has a cost of its own.)"""
    with Queue(location, fsync=fsync) as queue:
        for _ in range(count):
            queue.enqueue(payload)


def enqueue_batch(location: str | Path, count: int, payload: Any = None) -> None:
    """Enqueue `count` tasks in one `Queue.enqueue_many` call (one contiguous batch)."""
    with Queue(location, fsync="none") as queue:
        queue.enqueue_many([payload] * count)


# -- folding the claims log ------------------------------------------------------------------


@dataclass
class Fold:
    """What a run wrote to the claims log, as the protocol's own fold judges it."""

    records: int = 0
    claims: int = 0
    wins: int = 0
    takeovers: int = 0
    lost: Counter[str] = field(default_factory=Counter)
    done: Counter[int] = field(default_factory=Counter)  # task -> accepted DONEs
    stale_done: int = 0
    failed: int = 0
    first_claim_at: int | None = None
    last_done_at: int | None = None
    #: worker id -> `at` of its first CLAIM (how long the workers took to all be claiming)
    first_claim_by: dict[str, int] = field(default_factory=dict)
    #: task -> `at` of its first winning CLAIM
    won_at: dict[int, int] = field(default_factory=dict)
    #: task -> the worker id of its latest winning CLAIM
    holders: dict[int, str] = field(default_factory=dict)
    #: (takeover CLAIM, the expired lease it replaced)
    takeover_list: list[tuple[Claim, Lease]] = field(default_factory=list)

    @property
    def ramp_us(self) -> int:
        """The first CLAIM → the first CLAIM of the last worker to make one."""
        if self.first_claim_at is None:
            return 0
        return max(self.first_claim_by.values()) - self.first_claim_at

    @property
    def lost_total(self) -> int:
        return sum(self.lost.values())

    @property
    def span_us(self) -> int:
        if self.first_claim_at is None or self.last_done_at is None:
            return 0
        return self.last_done_at - self.first_claim_at

    def check_exactly_once(self, tasks: int) -> None:
        """Every task 0..tasks-1 done exactly once, nothing else done, nothing stale."""
        missing = [t for t in range(tasks) if self.done[t] == 0]
        twice = [t for t, n in self.done.items() if n > 1]
        extra = [t for t in self.done if not 0 <= t < tasks]
        problems = []
        if missing:
            problems.append(f"{len(missing)} tasks never done (first: {missing[:5]})")
        if twice:
            problems.append(f"{len(twice)} tasks done more than once (first: {twice[:5]})")
        if extra:
            problems.append(f"{len(extra)} unknown tasks done")
        if self.stale_done:
            problems.append(f"{self.stale_done} stale DONE records (work done twice)")
        if problems:
            raise BenchError("exactly-once check failed: " + "; ".join(problems))


def fold_claims(location: str | Path) -> Fold:
    """Fold the whole claims log at `location` with the protocol's `ClaimsFollower`."""
    fold = Fold()
    with open_log(location, CLAIMS_TOPIC) as log:
        follower = ClaimsFollower(log.start)
        for entry in log.iter_from(log.start):
            outcome, record = follower.apply(entry)
            fold.records += 1
            verdict = outcome.verdict
            if isinstance(record, Claim):
                fold.claims += 1
                if fold.first_claim_at is None:
                    fold.first_claim_at = record.at
                fold.first_claim_by.setdefault(record.worker, record.at)
                if verdict.won:
                    fold.wins += 1
                    fold.won_at.setdefault(record.task, record.at)
                    fold.holders[record.task] = record.worker
                    if verdict is Verdict.TAKEOVER:
                        fold.takeovers += 1
                        assert outcome.previous is not None
                        fold.takeover_list.append((record, outcome.previous))
                else:
                    fold.lost[verdict.value] += 1
            elif isinstance(record, Done):
                if verdict is Verdict.DONE:
                    fold.done[record.task] += 1
                    fold.last_done_at = record.at
                else:
                    fold.stale_done += 1
            elif verdict in (Verdict.RELEASED, Verdict.DEAD):
                fold.failed += 1
    return fold


def enqueued_at(location: str | Path) -> list[int]:
    """Each task's enqueue time (µs), by task id."""
    out: list[int] = []
    with open_log(location, TASKS_TOPIC) as log:
        for entry in log.iter_from(log.start):
            record = decode_task(entry.data)
            out.append(record.enqueued_at if isinstance(record, TaskRecord) else -1)
    return out


def snapshots(run_dir: Path) -> list[WorkerSnapshot]:
    return read_snapshots(run_dir)


# -- small utilities -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def scratch(root: Path, name: str) -> Iterator[Path]:
    """A fresh directory under `root`, removed afterwards."""
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
