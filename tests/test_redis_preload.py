"""On Redis, the fork server imports the Redis log once, before it forks any worker.

redis-py costs ~0.25 s of CPU to import (most of it the asyncio it imports whatever is
used): imported by each worker after its fork, that was 2 s of CPU of an 8-worker `qw up`
on two cores. These tests start a real fork server (`supervisor.run.forked.start_server`) in a
fresh interpreter and ask a process it forks what it has imported before running anything.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from supervisor.cli.up_args import on_redis

# The forked child's target is `exec` (a builtin: nothing of qw is imported to unpickle
# it); its exit code says whether the fork server had imported the Redis log.
_PROBE = """
import multiprocessing
from supervisor.run.forked import start_server, stop_server
start_server(redis={redis})
child = multiprocessing.get_context("forkserver").Process(
    target=exec,
    args=("import sys; sys.exit(10 + ('logstore.redis.log' in sys.modules) "
          "+ 2 * ('queue_worker.redis.server_claim' in sys.modules))",),
)
child.start()
child.join(60)
print(child.exitcode)
stop_server()
"""


@pytest.mark.parametrize(("redis", "code"), [(True, 13), (False, 10)])
def test_the_fork_server_preloads_the_redis_log_only_for_a_redis_queue(
    redis: bool, code: int
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(redis=redis)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert out.split() == [str(code)]


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["up", "--log", "redis://h:6379/0"], {}, True),
        (["up", "--log=rediss://h/0", "--workers", "2"], {}, True),
        (["up", "--log", "unix:///tmp/r.sock"], {}, True),
        (["up"], {"QW_LOG": "redis://h/0"}, True),
        (["up", "--log", "/data/q"], {"QW_LOG": "redis://h/0"}, False),  # --log wins
        (["up", "--dir", "redis://not-a-log"], {}, False),
        (["up"], {}, False),
        (["up", "--log"], {}, False),  # no value: typer says so later
    ],
)
def test_on_redis_reads_the_log_option_then_the_environment(
    args: list[str], env: dict[str, str], expected: bool
) -> None:
    assert on_redis(args, env.get("QW_LOG")) is expected
