"""qw on Redis against Huey's RedisHuey, end to end, on one local redis-server.

A redis-server is started for the section on a free loopback port, its data in a scratch
directory, with persistence off (``--save "" --appendonly no``: what both queues get alike).
For each worker count (1/2/4/8) and repeat, alternating:

- qw: a backlog of no-op tasks enqueued (one batch, not timed) under a prefix of its own,
  then ``qw up --log redis://… --workers N --handler bench.noop:noop --fsync none --no-tui
  --exit-when-drained`` timed from its launch to its exit. After each run the claims
  stream is folded by the protocol's own fold and every task must have been done exactly
  once (one accepted DONE, no stale DONE), or the run fails.
- Huey: bench/huey_redis_peer.py, RedisHuey's process consumer from its launch to its last
  stored result, on the same server.

Steady state beside it (qw: first CLAIM → last accepted DONE, on the server's clock; Huey:
first task start → last task end). For qw the server's command statistics of each run
give the round trips per task (script calls, reads and waits), the bytes the server sent
per task and per worker, and the server's CPU per task. Between runs the database is
flushed. The section is skipped, with a note, when redis-server or redis-py is missing.
"""

from __future__ import annotations

import importlib.util
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    NOOP,
    QW,
    REPO,
    USER_ENV,
    BenchError,
    Section,
    Target,
    enqueue_batch,
    fold_claims,
    free_port,
    median,
    num,
    scratch,
    table,
    wait_for,
)
from bench.huey_peer import HueyDrain, HueyStalled
from bench.start_bench import warm_bytecode

TARGET_AT_8 = 1.5
TARGET_EVERY = 1.0
#: the commands a client sends on their own, one round trip each. Not XRANGE and GET: the
#: scripts run them inside (the server counts those too), and qw sends them itself only to
#: check the queue's identity on a new connection, or to read where scripts are refused.
ROUND_TRIPS = ("evalsha", "eval", "xread", "xrevrange", "type", "xlen")
#: ... with server verdicts, whose scripts run XREVRANGE inside (once a call, to find the
#: stream's last entry): not counted there (qw sends it itself only to find a log's end)
SERVER_ROUND_TRIPS = tuple(c for c in ROUND_TRIPS if c != "xrevrange")


def log(message: str) -> None:
    print(f"  · {message}", file=sys.stderr, flush=True)


@contextmanager
def redis_server(directory: Path, binary: str) -> Iterator[str]:
    """A redis-server on a free loopback port; yields ``redis://127.0.0.1:PORT``."""
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
         "--save", "", "--appendonly", "no", "--daemonize", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def accepting() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            return False

    try:
        wait_for(accepting, 20, "redis-server to accept connections")
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass(frozen=True)
class RedisUp:
    """One `qw up` on Redis, launch to exit, with what the server counted meanwhile."""

    workers: int
    tasks: int
    wall_s: float  # launch → exit
    span_s: float  # first CLAIM → last accepted DONE (server clock)
    round_trips: int  # client calls the server answered during the run
    sent_bytes: int  # bytes the server sent to clients during the run
    server_cpu_s: float
    client_cpu_s: float  # qw up and every process it started
    lost: int

    @property
    def rate(self) -> float:
        return self.tasks / self.wall_s

    @property
    def steady_rate(self) -> float:
        return self.tasks / self.span_s if self.span_s > 0 else float("nan")


def server_stats(client: object) -> tuple[Counter[str], int, float]:
    """(calls by command, bytes sent to clients, CPU seconds) the server has counted since
    its start or the last CONFIG RESETSTAT (a subcommand's calls are its command's)."""
    import redis

    assert isinstance(client, redis.Redis)
    calls: Counter[str] = Counter()
    for k, v in client.info("commandstats").items():
        calls[k.removeprefix("cmdstat_").split("|")[0]] += int(v["calls"])
    stats = client.info("stats")
    cpu = client.info("cpu")
    return calls, int(stats["total_net_output_bytes"]), cpu["used_cpu_user"] + cpu["used_cpu_sys"]


def _server_counts(
    client: object, round_trips: tuple[str, ...] = ROUND_TRIPS
) -> tuple[int, int, float]:
    """(round trips, bytes sent, CPU seconds) the server has counted since the reset."""
    calls, sent, cpu = server_stats(client)
    return sum(calls[c] for c in round_trips), sent, cpu


def qw_up_redis(
    root: Path, url: str, workers: int, tasks: int, prefix: str, verdicts: str | None = None
) -> RedisUp:
    """`qw up --log …` on a backlog of `tasks` no-op tasks, checked exactly once.
    `verdicts`: the queue's mode, ``&verdicts=`` in the URL that creates it; None: none in
    the URL, so the queue gets the default (server verdicts, logstore.redis.verdict_mode)."""
    import redis

    location = f"{url}/0?prefix={prefix}" + (f"&verdicts={verdicts}" if verdicts else "")
    client = redis.Redis.from_url(f"{url}/0")
    with scratch(root, f"redis-up-{workers}") as d:
        enqueue_batch(location, tasks)
        client.config_resetstat()
        _, _, cpu0 = _server_counts(client)
        command = [QW, "up", "--log", location, "--dir", str(d / "run"), "--workers",
                   str(workers), "--handler", NOOP, "--fsync", "none", "--no-tui",
                   "--exit-when-drained"]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(d / "up.out", "wb") as out:
            launched = time.time()
            # USER_ENV: with bytecode caches, as a user's Python runs qw (a build environment's
            # PYTHONDONTWRITEBYTECODE made every process of a run compile qw's sources
            # again: ~0.3 s of CPU an 8-worker run, measured; the Huey peer's consumer
            # is run the same way, bench.huey_peer)
            code = subprocess.call(
                command, stdout=out, stderr=subprocess.STDOUT, env=USER_ENV, cwd=REPO
            )
            ended = time.time()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        trips = ROUND_TRIPS if verdicts == "client" else SERVER_ROUND_TRIPS
        calls, sent, cpu1 = _server_counts(client, trips)
        if code != 0:
            tail = (d / "up.out").read_text(errors="replace")[-600:]
            raise BenchError(f"qw up on redis exited with {code}: {tail}")
    fold = fold_claims(location)
    fold.check_exactly_once(tasks)
    client.flushdb()
    client.close()
    return RedisUp(
        workers=workers,
        tasks=tasks,
        wall_s=ended - launched,
        span_s=fold.span_us / 1e6,
        round_trips=calls,
        sent_bytes=sent,
        server_cpu_s=cpu1 - cpu0,
        client_cpu_s=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        lost=fold.lost_total,
    )


def _huey(url: str, workers: int, tasks: int) -> HueyDrain:
    """One RedisHuey drain; run again when Huey loses a result (up to 3 tries)."""
    from bench import huey_redis_peer

    for attempt in range(3):
        try:
            return huey_redis_peer.drain(f"{url}/0", workers, tasks)
        except HueyStalled as e:
            log(f"{e}; running it again ({attempt + 1}/3)")
    raise BenchError(f"huey lost a result in 3 runs of {tasks} tasks, {workers} workers")


@dataclass
class RedisRuns:
    tasks: int
    repeats: int
    #: qw with the default mode: no verdicts= in the URL (server verdicts,
    #: queue_worker.redis.server_claim)
    qw: dict[int, list[RedisUp]] = field(default_factory=dict)
    #: qw with ?verdicts=client (every worker folds the claims stream)
    qw_client: dict[int, list[RedisUp]] = field(default_factory=dict)
    huey: dict[int, list[HueyDrain]] = field(default_factory=dict)


def run_redis(root: Path, counts: Sequence[int], tasks: int, repeats: int) -> RedisRuns | str:
    """Every run, alternating qw and Huey; a string says why the section is skipped."""
    binary = shutil.which("redis-server")
    for module in ("redis", "huey"):
        if importlib.util.find_spec(module) is None:
            return f"Skipped: the Python package {module} is missing (`make bench` installs it)."
    if binary is None:
        return "Skipped: redis-server is not installed (`apt-get install redis-server`)."
    runs = RedisRuns(tasks, repeats)
    warm_bytecode()  # as a first run would have: no run pays for compiling qw
    with scratch(root, "redis") as d, redis_server(d, binary) as url:
        for rep in range(repeats):
            for n in counts:
                log(f"redis repeat {rep + 1}/{repeats}, {n} workers: qw up (default)")
                up = qw_up_redis(root, url, n, tasks, prefix=f"bench{rep}-{n}")
                runs.qw.setdefault(n, []).append(up)
                log(f"redis repeat {rep + 1}/{repeats}, {n} workers: qw up, client verdicts")
                up = qw_up_redis(root, url, n, tasks, f"bench{rep}-{n}-c", verdicts="client")
                runs.qw_client.setdefault(n, []).append(up)
                log(f"redis repeat {rep + 1}/{repeats}, {n} workers: RedisHuey")
                runs.huey.setdefault(n, []).append(_huey(url, n, tasks))
    return runs


def redis_section(root: Path, counts: Sequence[int], tasks: int, repeats: int) -> Section:
    title = "Redis: qw up against Huey's RedisHuey, launch to drained"
    runs = run_redis(root, counts, tasks, repeats)
    if isinstance(runs, str):
        return Section(title, runs, [Target("qw on Redis vs RedisHuey", "", "skipped", None)])
    rows, cost_rows = [], []
    ratios: dict[int, float] = {}
    for n in sorted(runs.qw):
        qw, client, huey = runs.qw[n], runs.qw_client[n], runs.huey[n]
        qw_rate, huey_rate = median(r.rate for r in qw), median(h.wall_rate for h in huey)
        client_rate = median(r.rate for r in client)
        ratios[n] = qw_rate / huey_rate
        rows.append(
            [n, num(qw_rate), " / ".join(num(r.rate) for r in qw), num(client_rate),
             " / ".join(num(r.rate) for r in client), num(huey_rate),
             " / ".join(num(h.wall_rate) for h in huey), f"{ratios[n]:.2f}×",
             f"{client_rate / huey_rate:.2f}×", num(median(r.steady_rate for r in qw)),
             num(median(r.steady_rate for r in client)), num(median(h.rate for h in huey))]
        )  # fmt: skip
        for kind, ups in (("server (default)", qw), ("client", client)):
            cost_rows.append(
                [n, kind, f"{median(r.round_trips / r.tasks for r in ups):.2f}",
                 num(median(r.sent_bytes / r.tasks / n for r in ups)),
                 num(median(r.server_cpu_s / r.tasks * 1e6 for r in ups)),
                 num(median(r.client_cpu_s / r.tasks * 1e6 for r in ups)),
                 str(sum(r.lost for r in ups))]
            )  # fmt: skip
        if all(h.consumer_cpu_s is not None and h.server_cpu_s is not None for h in huey):
            cost_rows.append(
                [n, "RedisHuey", "—", "—",
                 num(median((h.server_cpu_s or 0.0) / h.tasks * 1e6 for h in huey)),
                 num(median((h.consumer_cpu_s or 0.0) / h.tasks * 1e6 for h in huey)), "—"]
            )  # fmt: skip
    body = "\n".join(
        [
            f"{runs.tasks:,} no-op tasks enqueued beforehand on one local redis-server "
            "(persistence off); `qw up --log redis://… --workers N --handler bench.noop:noop "
            "--fsync none --no-tui --exit-when-drained` from its launch to its exit, against "
            "RedisHuey's process consumer (bench/huey_redis_peer.py) from its launch to its "
            "last stored result. qw twice: with no `verdicts=` in the URL, so the queue gets "
            "the default mode, server verdicts (the server's copy of the rules claims the "
            "next task for a worker in one call, queue_worker/redis/server_claim.py), and with "
            "`&verdicts=client` (every worker's own fold settles each claim). Medians of "
            f"{runs.repeats} alternating run(s) "
            "(qw, qw client verdicts, Huey, at each count in turn); × = qw's tasks/s / "
            "Huey's. Steady state: first CLAIM → "
            "last DONE (qw, server clock), first task start → last task end (Huey). Every qw "
            "run passed the exactly-once check (its claims stream folded by the protocol's "
            "fold: one accepted DONE per task, no stale DONE).",
            "",
            table(
                [
                    "workers",
                    "qw tasks/s (default)",
                    "qw runs",
                    "qw client verdicts /s",
                    "client verdicts runs",
                    "Huey tasks/s",
                    "Huey runs",
                    "× default",
                    "× client",
                    "qw steady /s",
                    "client verdicts steady /s",
                    "Huey steady /s",
                ],
                rows,
            ),
            "",
            "What each qw task cost (medians; the server's command statistics of the run): "
            "round trips (script calls, appends and reads, and blocking waits) per task, "
            "bytes the server sent per task per worker, CPU per task of redis-server and of "
            "`qw up` with its workers "
            "(start-up included), and the CLAIMs lost in all runs; RedisHuey's rows: the "
            "server's CPU per task and that of its consumer with its workers (start-up "
            "included; forked from the bench's process, which has imported huey).",
            "",
            table(
                [
                    "workers",
                    "verdicts",
                    "round trips / task",
                    "bytes sent / task / worker",
                    "server CPU µs / task",
                    "qw (or Huey) CPU µs / task",
                    "lost CLAIMs",
                ],
                cost_rows,
            ),
        ]
    )
    targets = []
    for n, ratio in sorted(ratios.items()):
        wanted = TARGET_AT_8 if n == max(ratios) else TARGET_EVERY
        targets.append(
            Target(
                f"qw on Redis (default: server verdicts) vs RedisHuey, end to end, {n} workers",
                f"≥ {wanted}×",
                f"{ratio:.2f}×",
                ratio >= wanted,
            )
        )
    return Section(title, body, targets)
