"""The fold at the speed of the log: claims-log replay, and the drain against the raw loop.

Replay: a synthetic claims log (a CLAIM and an accepted DONE per task, eight workers,
`append_many` batches of 1,000 records: `bench.long_bench.extend`) is folded from the start
in this process, three ways, interleaved, median of the repeats, CPU time of this process
(the machine may be shared: wall time there measures the neighbours):

- read: `Log.read(pos, 4096)` to the end (frames and checksums, no decoding);
- record at a time: read, then `decode_claims` and `ClaimState.apply` for each record
  (how a worker folded before `ClaimsFollower.fold_entries`; kept as the reference);
- catch-up: `ClaimsFollower.catch_up` (what a starting worker does).

Drain: `tasks` no-op tasks drained by 2 and by 8 qw worker processes (the drain section's
`qw_drain`, checked exactly-once) and by the raw loop (`bench.raw_loop`) with as many
processes, interleaved, median of the repeats; qw / raw is the share of the raw loop's rate
that qw reaches.

    python -m bench.fold_bench [--records N] [--tasks N] [--repeats N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import raw_loop
from bench.common import Section, Target, median, num, scratch, table
from bench.long_bench import extend
from bench.queue_bench import qw_drain
from logstore import Log, open_log
from queue_worker.records import decode_claims
from queue_worker.state import ClaimSnapshot, ClaimState
from queue_worker.topics import CLAIMS_TOPIC, READ_BATCH, ClaimsFollower

TARGET_REPLAY = 1_000_000  # records/s
#: the share of the raw loop's drain rate qw must reach, by worker count
TARGET_RAW = {2: 0.50, 8: 0.35}
WORKER_COUNTS = (2, 8)


def log(message: str) -> None:
    print(f"  · {message}", file=sys.stderr, flush=True)


# -- replay ----------------------------------------------------------------------------------


def read_only(claims: Log) -> tuple[int, ClaimSnapshot | None]:
    count = 0
    position = claims.start
    while entries := claims.read(position, READ_BATCH):
        count += len(entries)
        position = entries[-1].next
    return count, None


def record_at_a_time(claims: Log) -> tuple[int, ClaimSnapshot | None]:
    state = ClaimState()
    count = 0
    position = claims.start
    while entries := claims.read(position, READ_BATCH):
        for entry in entries:
            state.apply(decode_claims(entry.data), entry.position)
        count += len(entries)
        position = entries[-1].next
    return count, comparable(state.snapshot())


def catch_up(claims: Log) -> tuple[int, ClaimSnapshot | None]:
    follower = ClaimsFollower(claims.start)
    count = follower.catch_up(claims)
    return count, comparable(follower.state.snapshot())


def comparable(snap: ClaimSnapshot) -> ClaimSnapshot:
    """A snapshot with its closed tasks in id order (a set's order is not the state's)."""
    return snap._replace(closed_above=tuple(sorted(snap.closed_above)))


REPLAYS: dict[str, Callable[[Log], tuple[int, ClaimSnapshot | None]]] = {
    "read (frames, checksums)": read_only,
    "record at a time (`decode_claims` + `apply` each)": record_at_a_time,
    "catch-up (`ClaimsFollower.catch_up`)": catch_up,
}


def replay_rates(data: Path, repeats: int) -> dict[str, list[float]]:
    """records/s of each way of replaying, by name; every fold must reach the same state."""
    rates: dict[str, list[float]] = {name: [] for name in REPLAYS}
    with open_log(data, CLAIMS_TOPIC) as claims:
        for _ in range(repeats):
            states = []
            for name, replay in REPLAYS.items():
                started = time.process_time()
                count, state = replay(claims)
                rates[name].append(count / (time.process_time() - started))
                if state is not None:
                    states.append(state)
            if any(state != states[0] for state in states):
                raise RuntimeError("two ways of folding the same log reached different states")
    return rates


# -- the section -----------------------------------------------------------------------------


def fold_section(root: Path, records: int, tasks: int, repeats: int) -> Section:
    with scratch(root, "fold") as d:
        data = d / "data"
        log(f"fold: building a claims log of {records:,} records")
        extend(data, 0, records // 2)
        log(f"fold: replaying it, {repeats} × 3 ways")
        replays = replay_rates(data, repeats)
    drains: dict[int, list[float]] = {n: [] for n in WORKER_COUNTS}
    raws: dict[int, list[float]] = {n: [] for n in WORKER_COUNTS}
    for rep in range(repeats):
        for n in WORKER_COUNTS:
            log(f"fold: drain repeat {rep + 1}/{repeats}, {n} workers: qw, raw loop")
            drains[n].append(qw_drain(root, n, tasks).rate)
            raws[n].append(raw_loop.drain(n, tasks))

    reference = median(replays["record at a time (`decode_claims` + `apply` each)"])
    replay_rows = [
        [name, num(median(runs)), " / ".join(num(r) for r in runs),
         f"{median(runs) / reference:.2f}"]
        for name, runs in replays.items()
    ]  # fmt: skip
    drain_rows = []
    targets = []
    for n in WORKER_COUNTS:
        qw, raw = median(drains[n]), median(raws[n])
        ratio = qw / raw
        drain_rows.append(
            [str(n), num(qw), num(raw), f"{ratio:.1%}",
             " / ".join(f"{q / r:.1%}" for q, r in zip(drains[n], raws[n], strict=True))]
        )  # fmt: skip
        targets.append(
            Target(
                f"drain, {n} workers, no fsync, vs raw-log loop (same run)",
                f"≥ {TARGET_RAW[n]:.0%} of raw",
                f"{ratio:.1%} ({num(qw)} vs {num(raw)}/s)",
                ratio >= TARGET_RAW[n],
            )
        )
    fold_rate = median(replays["catch-up (`ClaimsFollower.catch_up`)"])
    targets.insert(
        0,
        Target(
            "claims-log replay from the start (catch-up, CPU time)",
            f"≥ {TARGET_REPLAY:,} records/s",
            f"{num(fold_rate)} records/s",
            fold_rate >= TARGET_REPLAY,
        ),
    )
    body = "\n".join(
        [
            f"Replay of a synthetic claims log of {records:,} records (CLAIM + DONE per task, "
            f"batches of 1,000), in this process from the start; records/s of CPU time, median "
            f"of {repeats} interleaved runs; × = against folding a record at a time.",
            "",
            table(["replay", "records/s", "runs", "×"], replay_rows),
            "",
            f"Drain of {tasks:,} no-op tasks (`fsync none`, pick spread; start-up excluded, "
            f"as in the drain section) beside the raw loop with as many processes, "
            f"interleaved, median of {repeats}:",
            "",
            table(["workers", "qw tasks/s", "raw loop tasks/s", "qw / raw", "runs"], drain_rows),
        ]
    )
    return Section("The fold: replay and drain against the raw loop", body, targets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qw-fold-") as tmp:
        section = fold_section(Path(tmp), args.records, args.tasks, args.repeats)
    print(section.markdown())
    for target in section.targets:
        print(f"- {target.what}: {target.measured} (wanted {target.wanted})")


if __name__ == "__main__":
    main()
