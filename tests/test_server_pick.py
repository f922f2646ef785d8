"""`--pick` on a Redis queue with server verdicts: the server picks there, so a pick asked
for is refused in one line, before anything is written, by `qw up` (plain and partitioned
queues) and by a worker given it in its config; without `--pick`, and on a queue with client
verdicts, the run goes on as before."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from queue_worker.opening import open_worker
from queue_worker.process import EXIT_CONFIG
from queue_worker.worker.config import WorkerConfig

pytestmark = pytest.mark.redis

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
REFUSAL = "this queue's claims are settled by the server (verdicts=server)"


def qw(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=ENV,
    )


def keys(url: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return sorted(k for k in client.keys("*") if isinstance(k, bytes))
    finally:
        client.close()


def up(url: str, tmp_path: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return qw(
        "up", "--log", url, "--dir", str(tmp_path / "d"), "--workers", "2", "--tasks", "4",
        "--work-ms", "1", "--exit-when-drained", "--no-tui", *more, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize("pick", ["first", "random", "spread"])
def test_up_refuses_a_pick_on_a_new_server_verdicts_queue(
    redis_url: str, tmp_path: Path, pick: str
) -> None:
    done = up(redis_url, tmp_path, "--pick", pick)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"qw: error: --pick {pick!r}: {REFUSAL}")
    assert "orphans first" in lines[0] and "?verdicts=client" in lines[0]
    assert keys(redis_url) == []  # no queue created
    assert not (tmp_path / "d").exists()


def test_up_refuses_a_pick_on_an_existing_server_verdicts_queue(
    redis_url: str, tmp_path: Path
) -> None:
    first = up(redis_url, tmp_path)  # created with server verdicts, the default
    assert first.returncode == 0, first.stdout + first.stderr
    before = {k: redis.Redis.from_url(redis_url).dump(k) for k in keys(redis_url)}
    again = up(redis_url, tmp_path, "--pick", "first")
    assert again.returncode == 2
    assert again.stderr.startswith(f"qw: error: --pick 'first': {REFUSAL}")
    after = {k: redis.Redis.from_url(redis_url).dump(k) for k in keys(redis_url)}
    assert after == before  # nothing written, no task enqueued


def test_up_refuses_a_pick_on_a_partitioned_server_verdicts_queue(
    redis_url: str, tmp_path: Path
) -> None:
    new = up(redis_url, tmp_path, "--partitions", "2", "--pick", "random")
    assert new.returncode == 2
    assert new.stderr.startswith(f"qw: error: --pick 'random': {REFUSAL}")
    assert keys(redis_url) == []
    made = up(redis_url, tmp_path, "--partitions", "2")
    assert made.returncode == 0, made.stdout + made.stderr
    existing = up(redis_url, tmp_path, "--pick", "spread")
    assert existing.returncode == 2
    assert existing.stderr.startswith(f"qw: error: --pick 'spread': {REFUSAL}")


def test_a_pick_works_on_a_client_verdicts_queue(redis_url: str, tmp_path: Path) -> None:
    done = up(f"{redis_url}?verdicts=client", tmp_path, "--pick", "first")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "drained" in done.stdout


def test_a_worker_refuses_a_pick_in_its_config(redis_url: str, tmp_path: Path) -> None:
    config = WorkerConfig(redis_url, str(tmp_path / "run"), pick="first")
    with pytest.raises(ValueError, match=re.escape(f"pick 'first': {REFUSAL}")):
        open_worker(config)
    proc = subprocess.run(
        [sys.executable, "-m", "queue_worker.process", config.to_json()],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert proc.returncode == EXIT_CONFIG
    assert proc.stderr.startswith(f"qw worker w0: pick 'first': {REFUSAL}")
    assert len(proc.stderr.splitlines()) == 1
    # the default (no pick) is the server's
    json_config = json.loads(config.to_json())
    assert WorkerConfig.from_json(json.dumps({**json_config, "pick": None})).pick is None
