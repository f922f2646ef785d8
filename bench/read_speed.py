"""How fast `FileLog.read` returns small records: the frame layer alone, no decoding of payloads.

Two logs of ~40-byte msgpack payloads (the size of a claims record), written with
`append_many` and read back by a fresh handle (page cache warm, as a replaying worker finds
it):

- batched: 1M records in batches of 1,000 (how the long benchmark builds its claims log);
- one batch: 200k records written by a single `append_many`.

For each it reports `read(pos, 4096)` from start to end (what `ClaimsFollower` and
`iter_from` do), `read(pos)` with no limit, and that plus `msgpack.unpackb` of every payload
for scale. Then the case of a worker loading task payloads one by one with `read(pos, 1)`
from inside one big batch: every record of a 10,000-record batch in order, and records of
the 200k batch (time-boxed: before the fix each call re-verified the rest of the batch).

Times are CPU time of this process (user + system, `time.process_time`), best of
`--repeat` runs: the machines this runs on are shared, and wall-clock time there measures
the neighbours. `--no-gc` turns the cyclic garbage collector off, to show the frame layer's
own cost: every Entry is a GC-tracked object, and a read of many records that the caller
keeps pays for collections that traverse them (and the rest of the heap).

    python -m bench.read_speed [--records N] [--one-batch N] [--repeat N] [--no-gc]
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import msgpack

from logstore.base import Durability
from logstore.file.log import FileLog

BATCH = 1_000
CHUNK_RECORDS = 4_096  # queue_worker.topics.READ_BATCH
POINT_BUDGET_S = 3.0  # time box for the read(pos, 1) loops


def payload(i: int) -> bytes:
    """A claims-sized msgpack record (~40 bytes): kind, task, worker, attempt, lease, time."""
    record = [2, i, f"worker-{i % 8:04d}", 1, 5.0, 1_700_000_000.125 + i]
    return msgpack.packb(record)  # type: ignore[no-any-return]


def build(path: Path, count: int, batch: int) -> list[int]:
    positions: list[int] = []
    with FileLog.open(path, Durability.NONE) as log:
        for start in range(0, count, batch):
            positions += log.append_many(
                [payload(i) for i in range(start, min(count, start + batch))]
            )
    return positions


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    started = time.process_time()
    count = fn()
    return count, time.process_time() - started


def read_chunks(path: Path, max_records: int | None) -> int:
    with FileLog.open(path) as log:
        count = 0
        position = log.start
        while entries := log.read(position, max_records):
            count += len(entries)
            position = entries[-1].next
        return count


def read_and_unpack(path: Path) -> int:
    unpackb = msgpack.unpackb
    with FileLog.open(path) as log:
        count = 0
        position = log.start
        while entries := log.read(position, CHUNK_RECORDS):
            for entry in entries:
                unpackb(entry.data)
            count += len(entries)
            position = entries[-1].next
        return count


def point_loads(path: Path, positions: list[int]) -> tuple[int, float]:
    """read(pos, 1) at each position in order, a fresh handle, stopped after the time box."""
    with FileLog.open(path) as log:
        started = time.process_time()
        done = 0
        for position in positions:
            entries = log.read(position, 1)
            assert entries[0].position == position
            done += 1
            if time.process_time() - started > POINT_BUDGET_S:
                break
        return done, time.process_time() - started


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:>12,.0f} /s  ({count:,} in {seconds:.3f} s)"


def best(fn: Callable[[], int], repeat: int) -> tuple[int, float]:
    runs = [timed(fn) for _ in range(repeat)]
    return min(runs, key=lambda run: run[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--one-batch", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3, help="best of N for the full reads")
    parser.add_argument("--no-gc", action="store_true", help="turn the cyclic GC off")
    args = parser.parse_args()
    if args.no_gc:
        gc.disable()

    with tempfile.TemporaryDirectory(prefix="qw-read-speed-") as tmp:
        batched = Path(tmp) / "batched.log"
        one = Path(tmp) / "one.log"
        ten_k = Path(tmp) / "ten_k.log"
        build(batched, args.records, BATCH)
        one_positions = build(one, args.one_batch, args.one_batch)
        ten_k_positions = build(ten_k, 10_000, 10_000)
        size = batched.stat().st_size
        print(
            f"batched: {args.records:,} records, {size / args.records:.1f} bytes/frame; "
            f"CPU time, best of {args.repeat}; gc {'off' if args.no_gc else 'on'}"
        )

        rows: list[tuple[str, Path, int | None]] = [
            (f"batched {args.records:,}, read(pos, {CHUNK_RECORDS})", batched, CHUNK_RECORDS),
            (f"batched {args.records:,}, read(pos)", batched, None),
            (f"one batch {args.one_batch:,}, read(pos, {CHUNK_RECORDS})", one, CHUNK_RECORDS),
            (f"one batch {args.one_batch:,}, read(pos)", one, None),
        ]
        for label, path, limit in rows:
            count, seconds = best(partial(read_chunks, path, limit), args.repeat)
            print(f"{label:<44} {rate(count, seconds)}")
        count, seconds = best(lambda: read_and_unpack(batched), args.repeat)
        print(f"{'batched, read(pos, 4096) + msgpack.unpackb':<44} {rate(count, seconds)}")

        count, seconds = point_loads(ten_k, ten_k_positions)
        print(f"{'10k batch, read(pos, 1) each in order':<44} {rate(count, seconds)}")
        count, seconds = point_loads(one, one_positions)
        print(
            f"{f'{args.one_batch:,} batch, read(pos, 1) each in order':<44} {rate(count, seconds)}"
        )


if __name__ == "__main__":
    main()
