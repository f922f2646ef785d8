"""Attacks by a handler on its own worker (issue 30, rows 6, 7, 13, 17): a result or an error
a record cannot carry, a thread left running, a clock that jumps. Handlers in
tests/poison_handlers.py; task 0 is the poison one."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.attacks.catalog import attack
from tests.attacks.harness import ENV, QW, Finding, broken, held, qw
from tests.helpers import wait_until


def _run_poisoned(
    work: Path, handler: str, poison: dict[str, Any], *options: str, others: int = 2
) -> subprocess.CompletedProcess[str] | Finding:
    """Task 0 is `poison`, then `others` plain tasks: `qw up --exit-when-drained` on them
    (a Finding when it never drained)."""
    data = work / "q"
    qw("enqueue", "--dir", str(data), "--payload", json.dumps(poison), cwd=work)
    qw("enqueue", "--dir", str(data), "--count", str(others), cwd=work)
    try:
        return qw(
            "up", "--dir", str(data), "--no-tui", "--exit-when-drained", "--backoff", "0.01",
            "--handler", f"tests.poison_handlers:{handler}", *options, cwd=work, timeout=180,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return broken("qw up never exited: the queue never drained, or a worker never ended")


def _failed_without_a_crash(
    work: Path, handler: str, poison: dict[str, Any], *words: str
) -> Finding:
    """The poison task must end dead with an error holding `words`, written by the one
    worker process that ran every task (it never crashed)."""
    up = _run_poisoned(work, handler, poison, "--workers", "1", "--max-attempts", "2")
    if isinstance(up, Finding):
        return up
    if up.returncode != 0 or "died" in up.stdout:
        return broken(f"qw up exits {up.returncode}; {up.stdout[-300:]!r}")
    report = json.loads(qw("report", "--dir", "q", "--json", cwd=work).stdout)
    if len(report["workers"]) != 1:
        return broken(f"{len(report['workers'])} worker processes wrote the log: one crashed")
    state = json.loads(qw("task", "0", "--dir", "q", "--json", cwd=work).stdout)["state"]
    if not state.startswith("dead: ") or not all(w in state for w in words):
        return broken(f"task 0 is {state!r}; expected dead naming {words}")
    return held(state)


@attack("a handler returning a 20 MB string")
def result_20mb(work: Path) -> Finding:
    return _failed_without_a_crash(
        work, "huge_result", {"poison": True, "size": 20 << 20},
        "result cannot be recorded: record of ", "exceeds the maximum record size 16777216",
    )  # fmt: skip


@attack("a handler returning a 200 MB string", fast=False)
def result_200mb(work: Path) -> Finding:
    return _failed_without_a_crash(
        work, "huge_result", {"poison": True, "size": 200 << 20},
        "result cannot be recorded: record of ", "exceeds the maximum record size 16777216",
    )  # fmt: skip


@attack("a handler returning a dict of 2,000,000 keys", fast=False)
def result_2m_keys(work: Path) -> Finding:
    return _failed_without_a_crash(
        work, "huge_result", {"poison": True, "keys": 2_000_000},
        "result cannot be recorded: record of ", "exceeds the maximum record size 16777216",
    )  # fmt: skip


@attack("a handler returning a dict whose items() raises")
def result_items_raise(work: Path) -> Finding:
    return _failed_without_a_crash(
        work, "unencodable", {"poison": "result"},
        "result cannot be recorded: cannot encode as msgpack: RuntimeError: items() refused",
    )  # fmt: skip


@attack("a handler raising an exception whose __str__ raises")
def error_str_raises(work: Path) -> Finding:
    return _failed_without_a_crash(
        work, "unencodable", {"poison": "error"},
        "_Unprintable: (its message cannot be read: str() raised RuntimeError)",
    )  # fmt: skip


@attack("a handler leaving a non-daemon thread, --exit-when-drained")
def left_thread_drained(work: Path) -> Finding:
    up = _run_poisoned(work, "leaves_a_thread", {"poison": True}, "--workers", "1")
    if isinstance(up, Finding):
        return up
    if up.returncode != 0 or "qw: drained" not in up.stdout:
        return broken(f"qw up exits {up.returncode}: {up.stderr[-300:]!r}")
    return held(up.stdout.strip().splitlines()[-1])


@attack("a handler leaving a non-daemon thread, then one SIGTERM")
def left_thread_sigterm(work: Path) -> Finding:
    data = work / "q"
    qw("enqueue", "--dir", str(data), "--payload", json.dumps({"poison": True}), cwd=work)
    command = [*QW, "up", "--dir", str(data), "--no-tui", "--workers", "1",
               "--handler", "tests.poison_handlers:leaves_a_thread"]  # fmt: skip
    with (work / "up.out").open("w") as out:
        up = subprocess.Popen(command, cwd=work, env=ENV, stdout=out, stderr=subprocess.STDOUT)
    try:

        def done() -> bool:
            return '"state": "done' in qw("task", "0", "--dir", "q", "--json", cwd=work).stdout

        wait_until(done, 60, "task 0 done")
        up.send_signal(signal.SIGTERM)
        try:
            code = up.wait(60)
        except subprocess.TimeoutExpired:
            return broken("one SIGTERM did not end qw up")
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    said = (work / "up.out").read_text()
    if code != 0 or "killed mid-task" in said:
        return broken(f"qw up exits {code}: {said[-300:]!r}")
    return held(said.strip().splitlines()[-1])


def _clock_named(work: Path, jump_s: int, way: str) -> Finding:
    up = _run_poisoned(
        work, "jumps_the_clock", {"poison": True, "jump_s": jump_s},
        "--workers", "3", "--lease", "1", others=40,
    )  # fmt: skip
    if isinstance(up, Finding):
        return up
    named = re.search(rf"clock of w\d·\d+ ran {way} 1\.0 h at @\d+", up.stdout)
    if named is None:
        return broken(f"no event names the clock: {up.stdout[-300:]!r}")
    why = qw("why", "0", "--dir", "q", cwd=work).stdout
    report = qw("report", "--dir", "q", cwd=work).stdout
    if named[0] not in why or named[0] not in report:
        return broken(f"{named[0]!r} missing from qw why or qw report")
    return held(named[0])


@attack("a worker whose clock jumps back an hour")
def clock_back(work: Path) -> Finding:
    return _clock_named(work, -3600, "back")


@attack("a worker whose clock jumps ahead an hour")
def clock_ahead(work: Path) -> Finding:
    return _clock_named(work, 3600, "ahead")
