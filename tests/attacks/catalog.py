"""The attacks, one function each: what was done, and what the README promises instead.

Each takes a fresh working directory and returns a Finding. `fast` ones take a few seconds
and run in CI (tests/test_attacks.py); the others run with `make attack`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgpack

from queue_worker.topics import open_topics
from tests.attacks.harness import (
    ENV,
    QW,
    Finding,
    broken,
    degraded,
    drained_queue,
    fingerprint,
    held,
    qw,
    refusal,
)
from tests.helpers import free_port, log_end, wait_until


@dataclass(frozen=True)
class Attack:
    name: str
    fast: bool
    run: Callable[[Path], Finding]


ATTACKS: list[Attack] = []


def attack(
    name: str, *, fast: bool = True
) -> Callable[[Callable[[Path], Finding]], Callable[[Path], Finding]]:
    def register(fn: Callable[[Path], Finding]) -> Callable[[Path], Finding]:
        ATTACKS.append(Attack(name, fast, fn))
        return fn

    return register


def _report_refuses(data: Path, *words: str) -> Finding:
    """The usual end of a mixed-up log set: `qw report` must refuse it, not say OK."""
    before = fingerprint(data)
    report = qw("report", "--dir", str(data), cwd=data.parent)
    if report.returncode == 0:
        return broken(f"qw report exits 0 on it: {report.stdout.strip().splitlines()[-1:]}")
    found = refusal(report, *words)
    if found is not None:
        return found
    if fingerprint(data) != before:
        return broken("qw report changed the logs")
    return held(report.stderr.strip())


# -- logs that are not what they seem -------------------------------------------------------


@attack("tasks.log cut short, then enqueue")
def tasks_log_cut(work: Path) -> Finding:
    data = work / "q"
    drained_queue(data)
    with (data / "tasks.log").open("r+b") as f:
        f.truncate(log_end(data / "tasks.log") // 2)
    enqueue = qw("enqueue", "--dir", str(data), "--count", "3", cwd=work)
    if enqueue.returncode == 0:
        report = qw("report", "--dir", str(data), cwd=work)
        if report.returncode == 0:
            return broken("enqueue reused done ids and qw report exits 0")
        return degraded("enqueue wrote into a cut log (the report refuses it afterwards)")
    return refusal(enqueue, "tasks.log") or held(enqueue.stderr.strip())


@attack("another queue's claims.log in place of ours")
def foreign_claims(work: Path) -> Finding:
    ours, theirs = work / "ours", work / "theirs"
    drained_queue(theirs, tasks=8)
    qw("enqueue", "--dir", str(ours), "--count", "8", cwd=work)
    shutil.copy(theirs / "claims.log", ours / "claims.log")
    return _report_refuses(ours, "claims.log")


@attack("another queue's tasks.log in place of ours")
def foreign_tasks(work: Path) -> Finding:
    ours, theirs = work / "ours", work / "theirs"
    drained_queue(ours, tasks=4)
    qw("enqueue", "--dir", str(theirs), "--count", "9", cwd=work)
    shutil.copy(theirs / "tasks.log", ours / "tasks.log")
    return _report_refuses(ours, "tasks.log")


@attack("tasks.log and claims.log swapped")
def swapped(work: Path) -> Finding:
    data = work / "q"
    drained_queue(data)
    (data / "tasks.log").rename(data / "tmp")
    (data / "claims.log").rename(data / "tasks.log")
    (data / "tmp").rename(data / "claims.log")
    before = fingerprint(data)
    up = qw("up", "--dir", str(data), "--no-tui", "--exit-when-drained", cwd=work, timeout=60)
    if fingerprint(data) != before:
        return broken("qw up appended to swapped logs")
    if up.returncode == 0:
        return broken("qw up ran on swapped logs and exited 0")
    return refusal(up) or _report_refuses(data)


@attack("claims.log is a directory")
def claims_is_directory(work: Path) -> Finding:
    data = work / "q"
    qw("enqueue", "--dir", str(data), "--count", "2", cwd=work)
    claims = data / "claims.log"
    if claims.exists():
        claims.unlink()
    claims.mkdir()
    return _report_refuses(data, "claims.log")


def _flip_middle_byte(path: Path) -> None:
    """Flip a byte half way through the records (not through the zeros written ahead)."""
    raw = bytearray(path.read_bytes())
    raw[log_end(path) // 2] ^= 0x40
    path.write_bytes(bytes(raw))


@attack("a flipped byte in the middle of claims.log")
def damaged_claims(work: Path) -> Finding:
    data = work / "q"
    drained_queue(data, tasks=40)
    _flip_middle_byte(data / "claims.log")
    qw("enqueue", "--dir", str(data), "--count", "2", cwd=work)
    before = fingerprint(data)
    status = qw("status", "--dir", str(data), cwd=work)
    if status.returncode != 2:
        return degraded(f"qw status exits {status.returncode} on a damaged log")
    up = qw("up", "--dir", str(data), "--no-tui", "--exit-when-drained", cwd=work, timeout=60)
    if fingerprint(data) != before:
        return broken("workers appended past the damage")
    return refusal(up, "claims.log", "offset") or held(up.stderr.strip())


@attack("auditing a read-only copy (0444 files in a 0555 directory)")
def read_only_audit(work: Path) -> Finding:
    data = work / "q"
    drained_queue(data)
    files = sorted(p for p in data.iterdir() if p.is_file())
    for p in files:
        p.chmod(0o444)
    data.chmod(0o555)
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in files}
    entries = sorted(p.name for p in data.iterdir())
    try:
        for command in (["report"], ["why", "0"], ["status"], ["tail"], ["task", "0"]):
            result = qw(*command, "--dir", str(data), cwd=work)
            if result.returncode != 0:
                return degraded(f"qw {command[0]} exits {result.returncode}: {result.stderr!r}")
        after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in files}
        names = sorted(p.name for p in data.iterdir())
    finally:
        data.chmod(0o755)
    if after != before or names != entries:
        return broken("an audit command wrote to the data directory")
    return held("report, why, status, tail and task read it and wrote nothing")


# -- well-formed but hostile records ------------------------------------------------------


def _append_claims(data: Path, *records: list[object]) -> None:
    tasks, claims = open_topics(data)
    with tasks, claims:
        for record in records:
            claims.append(msgpack.packb(record, use_bin_type=True))


@attack("records with times out of every range")
def huge_times(work: Path) -> Finding:
    data = work / "q"
    qw("enqueue", "--dir", str(data), "--count", "2", cwd=work)
    big = 2**63 - 1
    _append_claims(data, [1, "C", 0, "w0-1-ab", big, 2**64 - 1], [1, "C", 1, "w1-2-cd", -big, 1])
    for command in (["report"], ["tail", "-n", "10"], ["why", "0"], ["task", "0"], ["status"]):
        result = qw(*command, "--dir", str(data), cwd=work)
        if "Traceback" in result.stderr or result.returncode not in (0, 2):
            return degraded(f"qw {command[0]}: exit {result.returncode} {result.stderr[-200:]!r}")
    return held("report, tail, why, task and status read them")


@attack("a CLAIM for a task that was never published")
def unpublished_claim(work: Path) -> Finding:
    data = work / "q"
    qw("enqueue", "--dir", str(data), "--count", "2", cwd=work)
    _append_claims(data, [1, "C", -1, "w0-1-ab", 1, 1], [1, "C", 2**64 - 1, "w0-1-ab", 1, 1])
    try:
        up = qw(
            "up", "--dir", str(data), "--no-tui", "--workers", "1", "--work-ms", "0",
            "--exit-when-drained", cwd=work, timeout=60,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return degraded("--exit-when-drained never exits")
    if up.returncode != 0:
        return degraded(f"qw up exits {up.returncode}: {up.stderr[-200:]!r}")
    return held("drained; the unpublished ids do not count as pending")


@attack("a worker named with terminal escapes")
def escape_name(work: Path) -> Finding:
    data = work / "q"
    qw("enqueue", "--dir", str(data), "--count", "1", cwd=work)
    _append_claims(data, [1, "C", 0, "\x1b[2J\x1b]0;pwned\x07-1-ab", 1, 10**6])
    for command in (["report"], ["why", "0"], ["tail"], ["task", "0"], ["status"]):
        result = qw(*command, "--dir", str(data), cwd=work)
        if "\x1b" in result.stdout or "\x1b" in result.stderr:
            return broken(f"qw {command[0]} writes the escape to the terminal")
    return held("every command shows the name escaped")


# -- bad input ----------------------------------------------------------------------------


@attack("enqueue --payload nested 1000 deep")
def deep_payload(work: Path) -> Finding:
    data = work / "q"
    qw("enqueue", "--dir", str(data), "--count", "1", cwd=work)
    before = fingerprint(data)
    result = qw("enqueue", "--dir", str(data), "--payload", "[" * 1000 + "]" * 1000, cwd=work)
    if fingerprint(data) != before:
        return broken("something was written")
    return refusal(result, "payload") or held(result.stderr.strip())


@attack("enqueue --count 99999999999999999999")
def huge_count(work: Path) -> Finding:
    data = work / "q"
    qw("enqueue", "--dir", str(data), "--count", "1", cwd=work)
    before = fingerprint(data)
    result = qw("enqueue", "--dir", str(data), "--count", "99999999999999999999", cwd=work)
    if fingerprint(data) != before:
        return broken("something was written")
    return refusal(result, "99999999999999999999") or held(result.stderr.strip())


@attack("tail -n 99999999999999999999")
def huge_tail(work: Path) -> Finding:
    data = work / "q"
    qw("enqueue", "--dir", str(data), "--count", "1", cwd=work)
    result = qw("tail", "--dir", str(data), "-n", "99999999999999999999", cwd=work)
    if "Traceback" in result.stderr:
        return degraded(result.stderr.strip().splitlines()[-1])
    return held(f"exit {result.returncode}")


@attack("--dir naming a plain file")
def dir_is_file(work: Path) -> Finding:
    plain = work / "plain"
    plain.write_text("not a directory\n")
    result = qw("enqueue", "--dir", str(plain), "--count", "1", cwd=work)
    if plain.read_text() != "not a directory\n":
        return broken("the file was changed")
    return refusal(result, str(plain)) or held(result.stderr.strip())


@attack("GET /task/<5000 digits>")
def http_huge_id(work: Path) -> Finding:
    data = work / "q"
    port = free_port()
    up = subprocess.Popen(
        [*QW, "up", "--dir", str(data), "--no-tui", "--http", f"127.0.0.1:{port}"],
        cwd=work, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def answered(path: str) -> int | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                    return int(r.status)
            except urllib.error.HTTPError as e:
                return e.code
            except OSError:
                return None

        wait_until(lambda: answered("/health") is not None, timeout=30, what="the HTTP server")
        code = answered("/task/" + "9" * 5000)
        if code is None:
            return degraded("no reply")
        if code >= 500 or code == 200:
            return degraded(f"HTTP {code}")
        return held(f"HTTP {code}")
    finally:
        up.terminate()
        up.wait(timeout=60)


# -- handlers that fight back -------------------------------------------------------------


@attack("a handler that calls os._exit (poison pill)")
def poison_pill(work: Path) -> Finding:
    data = work / "q"
    qw("enqueue", "--dir", str(data), "--payload", json.dumps({"poison": True}), cwd=work)
    qw("enqueue", "--dir", str(data), "--count", "4", cwd=work)
    try:
        up = qw(
            "up", "--dir", str(data), "--no-tui", "--workers", "2", "--lease", "1",
            "--max-attempts", "2", "--handler", "tests.poison_handlers:exits",
            "--exit-when-drained", cwd=work, timeout=120,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return degraded("the fleet never drained")
    if up.returncode != 0:
        return degraded(f"qw up exits {up.returncode}: {up.stderr[-300:]!r}")
    report = qw("report", "--dir", str(data), "--json", cwd=work)
    if report.returncode != 0:
        return broken(f"qw report exits {report.returncode}")
    return held("the poison task went dead, the others ran once")


@attack("a handler that sleeps for ever, ignoring cancellation", fast=False)
def sleeper(work: Path) -> Finding:
    data = work / "q"
    qw("enqueue", "--dir", str(data), "--payload", json.dumps({"poison": True}), cwd=work)
    try:
        up = qw(
            "up", "--dir", str(data), "--no-tui", "--workers", "1", "--task-timeout", "2",
            "--max-attempts", "1", "--handler", "tests.poison_handlers:hangs",
            "--exit-when-drained", cwd=work, timeout=120,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return degraded("no time limit ended it")
    return held(f"exit {up.returncode}") if up.returncode == 0 else degraded(up.stderr[-200:])


import tests.attacks.file_damage  # noqa: E402  (the file log's damage rules)
import tests.attacks.partition_damage  # noqa: E402  (partition layouts, refusals that write nothing)
import tests.attacks.redis_damage  # noqa: E402  (Redis: a stream trimmed, a server flushed)
import tests.attacks.surface  # noqa: E402  (errors reaching the operator, checkpoint recovery)
import tests.attacks.worker_failures  # noqa: E402, F401  (handlers' results, threads and clocks)
