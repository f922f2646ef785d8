"""Chaos on Redis: `qw up --log redis://…` with restarts on, while workers that hold tasks are
killed with -9 again and again, and the Redis server itself is killed with -9 and restarted
(AOF on, fsync always: it loses nothing it acknowledged) under the running workers.

Afterwards the claims stream must prove what the file-log chaos run proves (see
test_chaos.py): every task done exactly once and `qw report` exits 0; the original's
invariants on every prefix of the log; never two holders (a claim wins a held task only when
the holder's lease, by the records' own times — here the server's clock — had run out); and
every worker's published view is the fold of the prefix it had read.

The short run is part of the normal suite; QW_CHAOS=long runs a longer, wider one.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from logstore import LogError
from logstore.redis.log import RedisLog
from queue_worker.redis.server_verdicts import ServerVerdicts
from queue_worker.worker.stats import read_all
from supervisor.demos.fleet import ClaimsTail
from tests.helpers import wait_until
from tests.test_chaos import Chaos, Plan, check_the_run
from tests.test_redis_e2e import ENV, OwnRedis, qw_command

pytestmark = [pytest.mark.chaos, pytest.mark.redis]

LONG = os.environ.get("QW_CHAOS") == "long"

# The lease is longer than in the file-log run: a server restart must not outlast it (a
# holder cut off from the server for longer than its lease may be taken over mid-task, and
# the report would rightly say that task was worked twice).
SHORT = Plan(workers=4, tasks=150, work_ms=60, lease_s=3.0, tasks_between_kills=12)
WIDE = Plan(workers=8, tasks=3000, work_ms=60, lease_s=3.0, tasks_between_kills=30)

#: the server is restarted after every this many worker kills
KILLS_PER_SERVER_RESTART = 3 if not LONG else 5


# covered in make test by a kill -9 of workers: test_chaos; of the server:
# test_redis_e2e's server restarts
@pytest.mark.slow
@pytest.mark.parametrize(
    "verdicts", [pytest.param("client", marks=pytest.mark.slow), "server"]
)  # make test: the default mode
def test_kill_9_workers_and_the_server_and_every_task_is_done_exactly_once(
    tmp_path: Path, verdicts: str
) -> None:
    """`verdicts`: the workers' own folds decide, or the server's copy of the rules does
    (?verdicts=server, queue_worker.redis.server_claim; the report checks it against the fold)."""
    plan = WIDE if LONG else SHORT
    server = OwnRedis(tmp_path / "redis")
    server.start()
    url = f"{server.url}?verdicts={verdicts}"
    data_dir = tmp_path / "qw"
    # fmt: off
    supervisor = subprocess.Popen(
        qw_command(
            "up", "--log", url, "--dir", str(data_dir), "--workers", str(plan.workers),
            "--tasks", str(plan.tasks), "--work-ms", str(plan.work_ms),
            "--lease", str(plan.lease_s), "--exit-when-drained", "--no-tui",
            "--max-attempts", "1000",  # a kill uses an attempt: the kills must not use them up
            *(["--pick", "random"] if verdicts == "client" else []),  # (else the server picks)
        ),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=ENV,
    )
    # fmt: on
    chaos = Chaos()
    try:
        with ClaimsTail(url) as tail:
            done = 0

            def poll() -> int:
                nonlocal done
                try:
                    tail.poll()
                except LogError:  # the server is restarting: no news
                    return done
                done = tail.follower.state.done_count
                return done

            def progressed(target: int) -> Callable[[], bool]:
                return lambda: poll() >= target or supervisor.poll() is not None

            wait_until(lambda: read_all(data_dir / "run"), 60, "qw up to start its workers")
            rounds = 0
            while poll() < plan.tasks and supervisor.poll() is None:
                target = min(plan.tasks, done + plan.tasks_between_kills)
                if chaos.kill_a_holder(data_dir, tail) is not None:
                    rounds += 1
                    if rounds % KILLS_PER_SERVER_RESTART == 0:
                        server.restart()
                wait_until(progressed(target), 90, f"{target} tasks done amid the kills")
        output, _ = supervisor.communicate(timeout=120)
    finally:
        if supervisor.poll() is None:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.send_signal(signal.SIGTERM)  # the second one kills the workers now
            supervisor.wait(30)
    try:
        assert supervisor.returncode == 0, output
        kills = sum(len(times) for times in chaos.kills.values())
        assert kills >= 3, f"only {kills} kills: the run was too short to be chaos"
        assert server.restarts >= 1, "the server was never restarted"

        # The workers' published views count too: no restart of the server made a worker
        # fold a record twice or skip one.
        views = chaos.views | {
            (int(s["consumed_up_to"]), int(s["done_tasks"])) for s in read_all(data_dir / "run")
        }
        check_the_run(url, plan, views, ["--log", url], ENV)
        if verdicts == "server":  # the server folded every record (and the report checked)
            with RedisLog.open(url, "claims") as claims:
                assert isinstance(claims, RedisLog)
                state = ServerVerdicts(claims).state()
            assert state is not None and state.through == state.tail
            assert len(state.tasks) == plan.tasks
    finally:
        server.kill9()
