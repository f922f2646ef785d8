"""Attacks on the file log's bytes that a reader might take for a torn tail, or for the
log's end (docs/protocol.md §5, "What a reader may cut"): every reader must refuse them
alike, naming the file, and nothing may be written."""

from __future__ import annotations

import hashlib
import struct
import subprocess
from pathlib import Path

import msgpack

from logstore.file.log import FileLog
from logstore.file.segments import segment_files
from tests.attacks.catalog import attack
from tests.attacks.harness import Finding, broken, drained_queue, held, qw, refusal
from tests.helpers import log_end

SMALL_SEGMENTS = "4096"


def _files(data: Path) -> dict[str, str]:
    """Every segment file's bytes, hashed (harness.fingerprint sees the first ones only)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(data.iterdir())
        if p.suffix in (".log", ".seg")
    }


def _every_reader_refuses(data: Path, *words: str) -> Finding:
    """`qw report`, `qw status` and `qw up` must each refuse the logs in the same one line
    (exit 2, naming `words`), and write nothing; never say OK, never hang."""
    before = _files(data)
    answers = set()
    for command in (["report"], ["status"], ["up", "--no-tui", "--exit-when-drained"]):
        result = qw(*command, "--dir", str(data), cwd=data.parent, timeout=60)
        if result.returncode == 0:
            return broken(f"qw {command[0]} exits 0 on it")
        found = refusal(result, *words)
        if found is not None:
            return found
        answers.add(result.stderr.strip())
    if _files(data) != before:
        return broken("something was written to the logs")
    if len(answers) != 1:
        return broken(f"the readers disagree: {sorted(answers)}")
    return held(answers.pop())


def _segmented_queue(data: Path) -> None:
    """A drained queue of 800 tasks whose logs hold several 4 KiB segments each."""
    created = qw(
        "up", "--dir", str(data), "--no-tui", "--segment-bytes", SMALL_SEGMENTS,
        "--exit-when-drained", cwd=data.parent,
    )  # fmt: skip
    if created.returncode != 0:
        raise RuntimeError(f"could not make a queue to attack: {created.stderr.strip()}")
    for _ in range(4):
        qw("enqueue", "--dir", str(data), "--count", "200", cwd=data.parent)
    drained_queue(data, tasks=0)


def _cut_second_segment(work: Path, topic: str) -> Finding:
    data = work / "q"
    _segmented_queue(data)
    path = segment_files(str(data / f"{topic}.log"))[1][1]
    holds = Path(path).stat().st_size
    subprocess.run(["truncate", "-s", "3000", path], check=True)
    return _every_reader_refuses(data, path, "3000 bytes", f"{holds} bytes")


@attack("a sealed tasks segment cut short (truncate -s 3000)", fast=False)
def sealed_tasks_cut(work: Path) -> Finding:
    return _cut_second_segment(work, "tasks")


@attack("a sealed claims segment cut short (truncate -s 3000)", fast=False)
def sealed_claims_cut(work: Path) -> Finding:
    return _cut_second_segment(work, "claims")


@attack("a byte flipped in the last DONE of claims.log, below its forced offset")
def flipped_below_forced(work: Path) -> Finding:
    data = work / "q"
    drained_queue(data)
    claims = data / "claims.log"
    with FileLog.open(claims, read_only=True) as log:
        done = [e for e in log.iter_from(log.start) if msgpack.unpackb(e.data)[1] == "D"][-1]
    (forced,) = struct.unpack_from("<Q", (data / "claims.log.sync").read_bytes())
    if done.next > forced:
        raise RuntimeError(f"the last DONE ends at {done.next}, past the forced {forced}")
    raw = bytearray(claims.read_bytes())
    raw[done.next - 2] ^= 0x40
    claims.write_bytes(bytes(raw))
    return _every_reader_refuses(data, "claims.log", "offset", f"below position {forced}")


@attack("garbage written 4,000 bytes into the zeros after claims.log's last record")
def garbage_in_the_zeros(work: Path) -> Finding:
    data = work / "q"
    drained_queue(data)
    claims = data / "claims.log"
    end = log_end(claims)
    with open(claims, "r+b") as f:
        f.seek(end + 4000)
        f.write(b"garbage!")
    return _every_reader_refuses(data, "claims.log", f"offset {end}")
