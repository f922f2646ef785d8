"""What a user waits for: `qw up` end to end against Huey, start-up and shut-down, and the
start of the small commands.

End to end (`e2e_section`, the first table of `make bench`): ``qw up --workers N
--handler bench.noop:noop --exit-when-drained --no-tui`` on a backlog, from its launch to
its exit, against Huey's process consumer from its launch to its last stored result
(bench/huey_peer.py), 1/2/4/8 workers, runs interleaved; the steady-state rates (first
CLAIM → last DONE, first task start → last task end) beside them.

Start and stop (`start_section`):
  - spawn: the fork server forking a worker for the supervisor (`ForkedWorker`, 8 in a
    row, the server already running), ms each;
  - replacement: a worker killed with kill -9 under a supervisor with no restart backoff,
    from the kill to its replacement forked, and to the replacement's first stats snapshot;
  - the timeline of one `qw up` (8 workers, the backlog): launch → first CLAIM, first
    CLAIM → last DONE, last DONE → exit;
  - `qw --help`, `status`, `enqueue`, `task`, `why`: wall time, median of 5, against
    `python -c pass` and `python -c "import typer"`;
  - `qw up`'s launch → first CLAIM and `qw status` on a queue with a long history
    (bench/history_start.py).

    python -m bench.start_bench [--tasks N] [--repeats R]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import history_start, huey_peer
from bench.common import (
    NOOP,
    QW,
    REPO,
    USER_ENV,
    BenchError,
    Section,
    Target,
    enqueue,
    fold_claims,
    median,
    num,
    run_timed,
    scratch,
    table,
    up_command,
)

COMMAND_RUNS = 5
#: tasks done before the start the history rows time (bench/history_start.py)
HISTORY = 200_000


def warm_bytecode() -> None:
    """Write the bytecode caches of qw and the bench, as a first run would."""
    packages = ["logstore", "queue_worker", "supervisor", "bench"]
    subprocess.check_call(
        [sys.executable, "-m", "compileall", "-q", *packages], cwd=REPO, env=USER_ENV
    )


def log(message: str) -> None:
    print(f"  · {message}", file=sys.stderr, flush=True)


# -- qw up, launch to exit ---------------------------------------------------------------------


@dataclass(frozen=True)
class UpRun:
    workers: int
    tasks: int
    wall_s: float  # launch → exit
    startup_s: float  # launch → first CLAIM `at`
    span_s: float  # first CLAIM → last accepted DONE
    shutdown_s: float  # last accepted DONE → exit
    cpu_s: float  # user + system CPU of qw up and every process under it (`run_timed`)

    @property
    def rate(self) -> float:
        return self.tasks / self.span_s


def qw_up(root: Path, workers: int, tasks: int, fsync: str = "none") -> UpRun:
    """`qw up … --exit-when-drained` on a backlog of `tasks` no-op tasks, timed from outside."""
    with scratch(root, f"up-{workers}-{fsync}") as d:
        data = d / "qw"
        enqueue(data, tasks, fsync="none")
        command = up_command(data, workers, fsync)
        with open(d / "up.out", "wb") as out:
            launched = time.time()
            code, cpu = run_timed(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
            ended = time.time()
        if code != 0:
            tail = (d / "up.out").read_text(errors="replace")[-600:]
            raise BenchError(f"qw up exited with {code}: {tail}")
        fold = fold_claims(data)
        fold.check_exactly_once(tasks)
        assert fold.first_claim_at is not None and fold.last_done_at is not None
        return UpRun(
            workers=workers,
            tasks=tasks,
            wall_s=ended - launched,
            startup_s=fold.first_claim_at / 1e6 - launched,
            span_s=fold.span_us / 1e6,
            shutdown_s=ended - fold.last_done_at / 1e6,
            cpu_s=cpu,
        )


@dataclass(frozen=True)
class FirstClaims:
    first_s: float  # launch → the first CLAIM in the claims log
    first_cpu_s: float  # user + system CPU of `qw up` and every process under it, then
    load: float  # the 1-minute load average at the first CLAIM


def first_claims(root: Path, workers: int, tasks: int) -> FirstClaims:
    """`qw up … --exit-when-drained` on a backlog: the CPU of all its processes
    (supervisor, fork server, workers) sampled as the first CLAIM appears: what a start
    costs the machine, steadier than its wall time under load. (The poll, every 0.5 ms, is
    one more process on the cores: these runs are not the timed ones. /proc's CPU times
    are kept in clock ticks: a worker's own few milliseconds are not measured this way.)"""
    import psutil

    from logstore.file.segments import FIRST_BASE

    def cpu_of(process: psutil.Process) -> float:
        times = process.cpu_times()
        return float(times.user + times.system)

    def cpu_of_tree(pid: int) -> float:
        total = 0.0
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(pid)
            for p in [parent, *parent.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += cpu_of(p)
        return total

    with scratch(root, f"first-claims-{workers}") as d:
        data = d / "qw"
        enqueue(data, tasks, fsync="none")
        command = up_command(data, workers)
        claims_path = data / "claims.log"
        with open(d / "up.out", "wb") as out:
            launched = time.perf_counter()
            process = subprocess.Popen(
                command, env=USER_ENV, stdout=out, stderr=subprocess.STDOUT, cwd=REPO
            )
            while claims_path.stat().st_size <= FIRST_BASE and process.poll() is None:
                time.sleep(0.0005)
            first, first_cpu = time.perf_counter() - launched, cpu_of_tree(process.pid)
            load = os.getloadavg()[0]
            if process.wait(120) != 0:
                raise BenchError(f"qw up exited with {process.returncode}")
        return FirstClaims(first, first_cpu, load)


# -- end to end against Huey ---------------------------------------------------------------------


@dataclass
class EndToEnd:
    tasks: int
    qw: dict[int, list[UpRun]] = field(default_factory=dict)
    qw_durable: dict[int, list[UpRun]] = field(default_factory=dict)
    huey_off: dict[int, list[huey_peer.HueyDrain]] = field(default_factory=dict)
    huey_default: dict[int, list[huey_peer.HueyDrain]] = field(default_factory=dict)
    #: Huey runs left out because Huey lost a result in each of their tries (see `_huey`)
    huey_lost: int = 0


def run_end_to_end(root: Path, counts: Sequence[int], tasks: int, repeats: int) -> EndToEnd:
    warm_bytecode()
    results = EndToEnd(tasks)
    for rep in range(repeats):
        for n in counts:
            log(f"end to end, repeat {rep + 1}/{repeats}, {n} workers: qw up, fsync none")
            results.qw.setdefault(n, []).append(qw_up(root, n, tasks))
            log(f"end to end, repeat {rep + 1}/{repeats}, {n} workers: huey sync off")
            _add_huey(results, results.huey_off.setdefault(n, []), n, False)
            log(f"end to end, repeat {rep + 1}/{repeats}, {n} workers: qw up, fsync commit")
            results.qw_durable.setdefault(n, []).append(qw_up(root, n, tasks, "commit"))
            log(f"end to end, repeat {rep + 1}/{repeats}, {n} workers: huey default")
            _add_huey(results, results.huey_default.setdefault(n, []), n, None)
    return results


def _add_huey(
    results: EndToEnd, runs: list[huey_peer.HueyDrain], workers: int, fsync: bool | None
) -> None:
    """One Huey drain, run again when Huey loses a result (up to 3 tries); on a loaded
    machine Huey may lose one in every try: the run is then left out (and counted), not
    the whole table."""
    for attempt in range(3):
        try:
            runs.append(huey_peer.drain(workers, fsync, results.tasks))
            return
        except huey_peer.HueyStalled as e:
            log(f"{e}; running it again ({attempt + 1}/3)")
    results.huey_lost += 1


def e2e_section(results: EndToEnd) -> Section:
    rows = []
    ratio_off: dict[int, float] = {}
    ratio_durable: dict[int, float] = {}
    for n in sorted(results.qw):
        qw = median(r.wall_s for r in results.qw[n])
        durable = median(r.wall_s for r in results.qw_durable[n])
        off_runs, default_runs = results.huey_off.get(n, []), results.huey_default.get(n, [])
        off = median(r.wall_s for r in off_runs) if off_runs else None
        default = median(r.wall_s for r in default_runs) if default_runs else None
        if off is not None:
            ratio_off[n] = off / qw
        if default is not None:
            ratio_durable[n] = default / durable
        rows.append(
            [
                n,
                f"{qw:.2f} s",
                "—" if off is None else f"{off:.2f} s",
                f"{ratio_off[n]:.2f}×" if n in ratio_off else "—",
                f"{durable:.2f} s",
                "—" if default is None else f"{default:.2f} s",
                f"{ratio_durable[n]:.2f}×" if n in ratio_durable else "—",
                num(median(r.rate for r in results.qw[n])),
                num(median(r.rate for r in off_runs)) if off_runs else "—",
                f"{median(r.startup_s for r in results.qw[n]):.2f} s",
                f"{median(r.shutdown_s for r in results.qw[n]):.2f} s",
                f"{median(r.cpu_s for r in results.qw[n]):.2f} s",
            ]
        )
    body = "\n".join(
        [
            f"What a user waits for: {results.tasks:,} no-op tasks already enqueued, then "
            "`qw up --workers N --handler bench.noop:noop --exit-when-drained --no-tui` from "
            "its launch to its exit, against Huey's process consumer (SqliteHuey) from its "
            "launch to its last stored result, each a fresh interpreter as a user launches "
            "it (bytecode caches written). qw with `--fsync none` against Huey with sync "
            "off; qw with `--fsync commit` (durable: the default) against Huey's default "
            "(SQLite synchronous FULL). Medians of "
            f"{len(next(iter(results.qw.values()), []))} interleaved run(s); × = Huey's "
            "time / qw's (higher is better for qw). Steady state beside it: tasks/s from the "
            "first CLAIM to the last DONE (qw, fsync none) and from the first task start to "
            "the last task end (Huey, sync off); qw's start-up (launch → first CLAIM), "
            "shut-down (last DONE → exit), and the CPU time (user + system) of all its "
            "processes, launch to exit (fsync none)."
            + (
                f" Huey runs left out (Huey lost a result in each of 3 tries): {results.huey_lost}."
                if results.huey_lost
                else ""
            ),
            "",
            table(
                [
                    "workers",
                    "qw up (none)",
                    "Huey (sync off)",
                    "×",
                    "qw up (commit)",
                    "Huey (default)",
                    "×",
                    "qw steady /s",
                    "Huey steady /s",
                    "qw start-up",
                    "qw shut-down",
                    "qw CPU",
                ],
                rows,
            ),
        ]
    )
    targets = []
    for n, wanted in ((8, 1.8), (2, 2.0), (4, 2.0)):
        if n in ratio_off:
            targets.append(
                Target(
                    f"end to end, {n} workers, vs Huey sync off",
                    f"≥ {wanted}×",
                    f"{ratio_off[n]:.2f}×",
                    ratio_off[n] >= wanted,
                )
            )
    if ratio_durable:
        n = max(ratio_durable)
        targets.append(
            Target(
                f"end to end durable (fsync commit), {n} workers, vs Huey default",
                "≥ 2×",
                f"{ratio_durable[n]:.2f}×",
                ratio_durable[n] >= 2.0,
            )
        )
    return Section("End to end: qw up against Huey, launch to exit", body, targets)


# -- spawn and replacement -------------------------------------------------------------------------


def spawn_times(root: Path, workers: int = 8) -> list[float]:
    """Seconds for the fork server to fork each of `workers` workers (the server warm)."""
    from queue_worker.worker.config import WorkerConfig
    from supervisor.run.forked import ForkedWorker, start_server, stop_server

    with scratch(root, "spawn") as d:
        data = d / "qw"
        start_server()
        config = WorkerConfig(
            str(data), str(d / "run"), name="warm", handler=NOOP, exit_when_drained=True
        )
        first = ForkedWorker(config, d / "warm.log")  # waits for the server's imports
        first.wait(60)
        times, started = [], []
        for i in range(workers):
            began = time.perf_counter()
            worker = ForkedWorker(
                WorkerConfig(
                    str(data), str(d / "run"), name=f"w{i}", handler=NOOP, exit_when_drained=True
                ),
                d / f"w{i}.log",
            )
            times.append(time.perf_counter() - began)
            started.append(worker)
        for worker in started:
            if worker.wait(60) != 0:
                raise BenchError(f"a forked worker exited with {worker.poll()}")
        del first, started
        stop_server()
        return times


@dataclass(frozen=True)
class Replacement:
    forked_s: float  # kill -9 → the replacement forked (its pid in the slot)
    running_s: float  # kill -9 → the replacement's first stats snapshot


def replacement_times(root: Path, rounds: int = 5) -> list[Replacement]:
    """kill -9 of a worker → its replacement, under a supervisor with no restart backoff."""
    from supervisor.run.supervisor import RestartPolicy, Supervisor, SupervisorOptions

    with scratch(root, "replace") as d:
        data = d / "qw"
        run_dir = data / "run"
        policy = RestartPolicy(backoff_s=0.0, backoff_max_s=0.0, storm_limit=rounds + 1)
        sup = Supervisor(
            SupervisorOptions(data_dir=data, location=str(data), workers=1, restart=policy)
        )
        sup.start()
        try:
            out = [_kill_and_replace(sup, run_dir) for _ in range(rounds)]
        finally:
            sup.request_stop()
            if not sup.wait(60):
                sup.stop_now()
                sup.wait(30)
    return out


def _kill_and_replace(sup: Any, run_dir: Path) -> Replacement:
    old_pid = _poll(lambda: _stats_of(sup, run_dir), "the worker's first stats")
    killed = time.perf_counter()
    os.kill(old_pid, signal.SIGKILL)
    new_pid = _poll(lambda: _replaced(sup, old_pid), "the replacement")
    forked = time.perf_counter() - killed
    _poll(lambda: _stats_of(sup, run_dir) == new_pid, "its first stats")
    return Replacement(forked, time.perf_counter() - killed)


def _poll(condition: Callable[[], int | bool | None], what: str) -> int:
    """Poll `condition` every 0.2 ms until it is truthy (a finer grain than `wait_for`'s:
    the figures measured here are a few ms)."""
    deadline = time.monotonic() + 60
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise BenchError(f"timed out waiting for {what}")
        time.sleep(0.0002)
    return int(value)


def _replaced(sup: Any, old_pid: int) -> int | None:
    pid = sup.snapshot().workers[0].pid
    return pid if pid not in (old_pid, None) else None


def _stats_of(sup: Any, run_dir: Path) -> int | None:
    """The pid of slot 0's process once it has published its first stats snapshot."""
    pid = sup.snapshot().workers[0].pid
    if pid is None or not any(run_dir.glob(f"w0-{pid}-*.json")):
        return None
    return int(pid)


# -- the small commands ----------------------------------------------------------------------------


def command_times(root: Path, runs: int = COMMAND_RUNS) -> dict[str, tuple[float, float]]:
    """Median wall time and median CPU time (user + system) of each small command, and of
    `python -c pass` / `import typer`."""
    with scratch(root, "commands") as d:
        enqueue(d / ".qw", 100, fsync="none")
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            'python -c "import typer"': [sys.executable, "-c", "import typer"],
            # what typer imports to run any command with typed options (its pydantic adapters)
            'python -c "import typer._adapters"': [
                sys.executable,
                "-c",
                "import typer._adapters",
            ],
            "qw --help": [QW, "--help"],
            "qw status": [QW, "status"],
            "qw enqueue --count 1": [QW, "enqueue", "--count", "1", "--fsync", "none"],
            "qw task 0": [QW, "task", "0"],
            "qw why 0": [QW, "why", "0"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        cpus: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(runs):  # interleaved: a burst of load hits every command alike
            for name, command in commands.items():
                began = time.perf_counter()
                code, cpu = run_timed(
                    command, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
                times[name].append(time.perf_counter() - began)
                cpus[name].append(cpu)
                if code != 0:
                    raise BenchError(f"{name} exited with {code}")
        return {
            name: (statistics.median(times[name]), statistics.median(cpus[name]))
            for name in commands
        }


def start_section(root: Path, tasks: int, repeats: int) -> Section:
    warm_bytecode()
    log("spawn: 8 workers forked by a warm fork server")
    spawns = spawn_times(root)
    log("replacement after kill -9")
    replaced = replacement_times(root)
    runs = []
    for rep in range(repeats):
        log(f"qw up timeline, 8 workers, {tasks:,} tasks, repeat {rep + 1}/{repeats}")
        runs.append(qw_up(root, 8, tasks))
    firsts = []
    for rep in range(repeats):
        log(f"qw up, 8 workers, {tasks:,} tasks: CPU at the first CLAIM, {rep + 1}/{repeats}")
        firsts.append(first_claims(root, 8, tasks))
    log("the small commands")
    commands = command_times(root)
    log(f"qw up and qw status on a queue of {HISTORY:,} tasks done before")
    history = history_start.run_history_start(root, HISTORY, 1_000, repeats)

    spawn_ms = median(spawns) * 1000
    forked_ms = median(r.forked_s for r in replaced) * 1000
    running_ms = median(r.running_s for r in replaced) * 1000
    startup = median(r.startup_s for r in runs)
    span = median(r.span_s for r in runs)
    shutdown = median(r.shutdown_s for r in runs)
    bare, bare_cpu = commands["python -c pass"]
    rows = [
        ["spawn a worker (fork server warm, 8 in a row)", f"{spawn_ms:.1f} ms (median)"],
        ["kill -9 → replacement forked (no backoff)", f"{forked_ms:.1f} ms"],
        ["kill -9 → replacement's first stats snapshot", f"{running_ms:.1f} ms"],
        [f"qw up, 8 workers, {tasks:,} tasks: launch → first CLAIM", f"{startup:.3f} s"],
        ["… first CLAIM → last DONE", f"{span:.3f} s"],
        ["… last DONE → exit", f"{shutdown:.3f} s"],
        ["… CPU of every qw process, launch → exit", f"{median(r.cpu_s for r in runs):.2f} s"],
        [
            "… CPU of every qw process, launch → first CLAIM (other runs, polled)",
            f"{median(f.first_cpu_s for f in firsts):.3f} s (at "
            f"{median(f.first_s for f in firsts):.3f} s; load "
            f"{median(f.load for f in firsts):.1f})",
        ],
        *history_start.rows(history),
    ]
    command_rows = [
        [
            name,
            f"{seconds * 1000:.0f} ms",
            f"{seconds / bare:.1f}×",
            f"{cpu * 1000:.0f} ms",
            f"{cpu / bare_cpu:.1f}×",
        ]
        for name, (seconds, cpu) in commands.items()
    ]
    body = "\n".join(
        [
            "The supervisor forks its workers from a fork server that has already imported "
            "the worker code (`supervisor/run/forked.py`); `qw up` starts that server first "
            "thing, so that it imports the worker while the supervisor imports its own "
            f"code. Medians ({len(replaced)} kills, {repeats} `qw up` run(s), "
            f"{COMMAND_RUNS} runs of each command).",
            "",
            table(["what", "measured"], rows),
            "",
            "The small commands, wall time and CPU time (user + system; medians), each also "
            "as a multiple of `python -c pass`'s:",
            "",
            table(["command", "wall", "× pass", "CPU", "× pass (CPU)"], command_rows),
        ]
    )
    typer_x = commands['python -c "import typer"'][0] / bare
    adapters_x = commands['python -c "import typer._adapters"'][0] / bare
    worst = max(
        (name for name in commands if name.startswith("qw")), key=lambda name: commands[name][0]
    )
    worst_x = commands[worst][0] / bare
    targets = [
        Target("spawn a worker", "≤ 20 ms", f"{spawn_ms:.1f} ms", spawn_ms <= 20),
        Target("kill -9 → replacement running", "≤ 50 ms", f"{running_ms:.1f} ms",
               running_ms <= 50),
        Target("qw up 8 workers: launch → first CLAIM", "≤ 0.3 s", f"{startup:.2f} s",
               startup <= 0.3),
        Target("qw up: last DONE → exit", "≤ 0.2 s", f"{shutdown:.2f} s", shutdown <= 0.2),
        Target(
            "small commands vs python -c pass (slowest)",
            "≤ 2.5×",
            f"{worst}: {worst_x:.1f}× (import typer alone: {typer_x:.1f}×, "
            f"with the adapters it runs a command with: {adapters_x:.1f}×)",
            worst_x <= 2.5,
        ),
    ]  # fmt: skip
    return Section("Start and stop", body, targets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.start_bench")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--counts", default="1,2,4,8")
    parser.add_argument("--only", default="e2e,start")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qw-start-") as tmp:
        root = Path(tmp)
        if "e2e" in args.only:
            counts = [int(c) for c in args.counts.split(",")]
            results = run_end_to_end(root, counts, args.tasks, args.repeats)
            print(e2e_section(results).markdown(), flush=True)
        if "start" in args.only:
            print(start_section(root, args.tasks, args.repeats).markdown(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
