"""Replay of a real drain's claims log: what a starting worker folds after `qw up`.

`bench.fold_bench` replays a synthetic log in which each DONE directly follows its CLAIM
(one writer's layout). A drain by several workers interleaves them: a worker appends each
DONE with its next CLAIM, and the other workers' records land between a task's CLAIM and its
DONE. This drains `--tasks` no-op tasks with `qw up --workers N --exit-when-drained` (the
console script, as a user runs it), checks the run with `qw report`, then folds the claims
log from the start (`ClaimsFollower.catch_up`) `--repeats` times in this process, CPU time,
and prints the median with the log's layout (how many records lie between a CLAIM and its
DONE).

    python -m bench.replay_drained [--tasks N] [--workers N] [--repeats N]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import QW, median, num
from logstore import open_log
from queue_worker.protocol import cdecode
from queue_worker.protocol.records import Claim, Done, decode_claims
from queue_worker.topics import CLAIMS_TOPIC, READ_BATCH, ClaimsFollower


def drain(data: Path, tasks: int, workers: int) -> None:
    """`tasks` no-op tasks drained by `workers` workers, checked exactly once."""
    run = {"check": True, "stdout": subprocess.DEVNULL}
    subprocess.run([QW, "enqueue", "--dir", str(data), "--count", str(tasks)], **run)  # type: ignore[call-overload]
    subprocess.run(  # type: ignore[call-overload]
        [QW, "up", "--dir", str(data), "--workers", str(workers), "--handler",
         "bench.noop:noop", "--rate", "0", "--fsync", "none", "--no-tui",
         "--exit-when-drained"],
        **run,
    )  # fmt: skip
    subprocess.run([QW, "report", "--dir", str(data)], **run)  # type: ignore[call-overload]


def layout(data: Path) -> tuple[int, float, float]:
    """Records, the median number of records from a CLAIM to its DONE, and the share of
    DONEs right after their CLAIM."""
    distances: list[int] = []
    with open_log(data, CLAIMS_TOPIC) as claims:
        position, index = claims.start, 0
        claimed: dict[int, tuple[int, int]] = {}  # task -> (index, position) of its CLAIM
        while entries := claims.read(position, READ_BATCH):
            for entry in entries:
                record = decode_claims(entry.data)
                if type(record) is Claim:
                    claimed[record.task] = (index, entry.position)
                elif type(record) is Done:
                    at = claimed.get(record.task)
                    if at is not None and at[1] == record.claim:
                        distances.append(index - at[0])
                index += 1
            position = entries[-1].next
    adjacent = sum(1 for d in distances if d == 1) / max(1, len(distances))
    return index, median([float(d) for d in distances]), adjacent


def replay(data: Path, repeats: int) -> list[float]:
    """records/s of `repeats` catch-ups from the start, CPU time."""
    rates = []
    with open_log(data, CLAIMS_TOPIC) as claims:
        for _ in range(repeats):
            follower = ClaimsFollower(claims.start)
            started = time.process_time()
            count = follower.catch_up(claims)
            rates.append(count / (time.process_time() - started))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qw-replay-") as tmp:
        data = Path(tmp) / "data"
        drain(data, args.tasks, args.workers)
        records, distance, adjacent = layout(data)
        rates = replay(data, args.repeats)
    print(f"claims decoder: {cdecode.status()}")
    print(
        f"a drain of {args.tasks:,} no-op tasks by {args.workers} workers: {records:,} claims "
        f"records; a DONE comes a median {distance:g} records after its CLAIM, {adjacent:.0%} "
        f"right after it"
    )
    print(
        f"catch-up from the start: {num(median(rates))} records/s (median of {len(rates)}: "
        + " / ".join(num(r) for r in rates)
        + ")"
    )


if __name__ == "__main__":
    main()
