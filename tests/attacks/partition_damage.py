"""Attacks on a partitioned queue's layout (docs/protocol.md §9): the manifest, a partition
or one of its logs removed, and the commands that must refuse before they create anything."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from tests.attacks.catalog import attack
from tests.attacks.harness import ENV, QW_EXEC_WORKERS, Finding, broken, held, qw, refusal

#: the tasks run before the damage, and those still pending when it happens
DONE_TASKS, PENDING_TASKS = 5, 90
#: every command that opens a queue by its directory, as the attacks run them
COMMANDS = (
    ("enqueue", "--count", "1"),
    ("report",),
    ("status",),
    ("task", "0:0"),
    ("why", "0:0"),
    ("tail",),
    ("timeline",),
    ("up", "--no-tui", "--workers", "4", "--exit-when-drained"),
)


def tree_fingerprint(directory: Path) -> dict[str, str]:
    """Every file and directory under `directory` (nothing when it does not exist), files by
    their bytes hashed: to show that a refused command wrote nothing anywhere in it."""
    if not directory.exists():
        return {}
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file()
        else "dir"
        for p in sorted(directory.rglob("*"))
    }


def partitioned_queue(data: Path, partitions: int = 4) -> None:
    """A queue of `partitions` partitions with tasks done and tasks pending. Its workers
    are started by exec, not by the fork server: what is attacked is the layout, and the
    fork server's start under `qw up --partitions` sometimes fails (reported, not fixed
    here)."""
    run = subprocess.run(
        [*QW_EXEC_WORKERS, "up", "--dir", str(data),
         "--no-tui", "--partitions", str(partitions), "--workers", str(partitions),
         "--work-ms", "0", "--tasks", str(DONE_TASKS), "--exit-when-drained"],
        cwd=data.parent, env=ENV, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    more = qw("enqueue", "--dir", str(data), "--count", str(PENDING_TASKS), cwd=data.parent)
    if run.returncode != 0 or more.returncode != 0:
        raise RuntimeError(f"could not make a queue to attack: {run.stderr}{more.stderr}")


def every_command_refuses(data: Path, *words: str) -> Finding:
    """Each of `COMMANDS` on `data` must be refused (exit 2, one line naming `words`, nothing
    written anywhere under `data`)."""
    before = tree_fingerprint(data)
    for command in COMMANDS:
        result = qw(*command, "--dir", str(data), cwd=data.parent, timeout=60)
        if tree_fingerprint(data) != before:
            return broken(f"qw {command[0]} wrote into it (exit {result.returncode})")
        if result.returncode == 0:
            return broken(f"qw {command[0]} exits 0 on it: {result.stdout.strip()[-200:]!r}")
        found = refusal(result, *words)
        if found is not None:
            return Finding(found.verdict, f"qw {command[0]}: {found.detail}")
    return held(f"{len(COMMANDS)} commands refused it: {result.stderr.strip()}")


@attack("a partitioned queue's manifest removed")
def manifest_removed(work: Path) -> Finding:
    data = work / "parts"
    partitioned_queue(data)
    (data / "partitions").unlink()
    return every_command_refuses(data, "no partitions manifest", str(data / "partitions"))


@attack("a partition's directory removed")
def partition_removed(work: Path) -> Finding:
    data = work / "parts"
    partitioned_queue(data)
    shutil.rmtree(data / "p2")
    return every_command_refuses(data, str(data / "p2"), "missing")


@attack("a partition's claims.log removed")
def partition_claims_removed(work: Path) -> Finding:
    data = work / "parts"
    partitioned_queue(data)
    (data / "p1" / "claims.log").unlink()
    return every_command_refuses(data, str(data / "p1" / "claims.log"), "missing")


@attack("--dir '' (the empty path)")
def empty_dir(work: Path) -> Finding:
    before = tree_fingerprint(work)
    for command in COMMANDS:
        result = qw(*command, "--dir", "", cwd=work, timeout=60)
        if tree_fingerprint(work) != before:
            return broken(f"qw {command[0]} --dir '' wrote into the working directory")
        found = refusal(result, "--dir", "''")
        if found is not None:
            return Finding(found.verdict, f"qw {command[0]}: {found.detail}")
    return held(result.stderr.strip())


@attack("qw up --partitions 4 --workers 2 (refused) creates nothing")
def refused_up_creates_nothing(work: Path) -> Finding:
    data = work / "p"
    up = qw("up", "--dir", str(data), "--no-tui", "--partitions", "4", "--workers", "2", cwd=work)
    if data.exists():
        return broken(f"the refused qw up (exit {up.returncode}) created {data}")
    return refusal(up, "--workers 2", "4 partitions") or held(up.stderr.strip())
