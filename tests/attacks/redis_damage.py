"""Attacks on a Redis queue that loses part of itself: a stream trimmed by hand under its
kept identity, and a server flushed under a running `qw up` (issue 30, rows 5 and 16).
Each starts a redis-server of its own on a free loopback port."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from queue_worker.waiting import WaitTimeout, wait_until
from tests.attacks.catalog import attack
from tests.attacks.harness import ENV, QW, Finding, broken, degraded, held, qw
from tests.helpers import running_redis_server


@contextmanager
def redis_server(work: Path) -> Iterator[str]:
    """A redis-server without persistence on a free loopback port; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    with running_redis_server(binary, work) as url:
        yield f"{url}/0"


def _client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def _streams(client: Any) -> dict[bytes, object]:
    """What the queue's streams hold: to show that a refusal wrote nothing."""
    return {
        key: client.xrange(key)
        for key in sorted(client.keys("qw:*"))
        if client.type(key) == b"stream"
    }


def _one_line(result: subprocess.CompletedProcess[str], code: int, *words: str) -> Finding | None:
    err = result.stderr.strip()
    if "Traceback" in err:
        return degraded(f"traceback (exit {result.returncode}): {err.splitlines()[-1]}")
    if result.returncode != code:
        return degraded(f"exit {result.returncode}, not {code}: {err[:200]!r}")
    if len(err.splitlines()) != 1:
        return degraded(f"{len(err.splitlines())} lines of error, not one: {err[:200]!r}")
    missing = [w for w in words if w not in err]
    return degraded(f"the error does not name {missing}: {err!r}") if missing else None


@attack("a Redis claims stream trimmed by hand (XTRIM MAXLEN) after a drain", fast=False)
def redis_claims_trimmed(work: Path) -> Finding:
    with redis_server(work) as url:
        done = qw(
            "up", "--log", url, "--dir", str(work / "run"), "--no-tui", "--workers", "2",
            "--work-ms", "0", "--tasks", "200", "--exit-when-drained", cwd=work,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"could not make a queue to attack: {done.stderr.strip()}")
        client = _client(url)
        client.xtrim("qw:claims", maxlen=100, approximate=False)
        before = _streams(client)
        report = qw("report", "--log", url, cwd=work)
        if report.returncode == 0:
            return broken(f"qw report exits 0: {report.stdout.strip().splitlines()[-1:]}")
        found = _one_line(report, 3, "qw:claims", "entries are gone")
        if found is not None:
            return found
        up = qw(
            "up", "--log", url, "--dir", str(work / "run"), "--no-tui", "--workers", "2",
            "--work-ms", "0", "--exit-when-drained", cwd=work,
        )  # fmt: skip
        if _streams(client) != before:
            return broken("something was written to the trimmed queue")
        return _one_line(up, 2, "qw:claims") or held(report.stderr.strip())


@attack("Redis FLUSHALL under a running qw up", fast=False)
def redis_flushall_mid_run(work: Path) -> Finding:
    with redis_server(work) as url:
        up = subprocess.Popen(
            [*QW, "up", "--log", url, "--dir", str(work / "run"), "--no-tui", "--workers",
             "2", "--work-ms", "100", "--tasks", "200", "--exit-when-drained"],
            cwd=work, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            client = _client(url)
            try:
                wait_until(lambda: client.xlen("qw:claims") >= 6, 60, "the first tasks done")
            except WaitTimeout:
                return degraded("the queue never started")
            client.flushall()
            try:
                out, err = up.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                return broken("qw up never stopped by itself after FLUSHALL")
        finally:
            if up.poll() is None:
                up.kill()
                up.wait()
        if client.keys("qw:tasks*") or client.keys("qw:claims*"):
            return broken("workers appended to the flushed server")
        if client.keys("qw:*"):
            return degraded(f"a queue was made anew on the flushed server: {client.keys('qw:*')}")
        if out.count("death: ") > 2:
            return degraded(f"workers were restarted ({out.count('death: ')} deaths)")
        result = subprocess.CompletedProcess(up.args, up.returncode, out, err)
        return _one_line(result, 3, "the server was reset") or held(err.strip())
