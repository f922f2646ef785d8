"""The fold at the speed of the log: claims-log replay, and the drain against the raw loop.

Replay: a synthetic claims log (a CLAIM and an accepted DONE per task, eight workers,
`append_many` batches of 1,000 records: `bench.long_bench.extend`) is folded from the start
in this process, three ways, interleaved, median of the repeats, CPU time of this process
(the machine may be shared: wall time there measures the neighbours):

- read: `Log.read(pos, 4096)` to the end (frames and checksums, no decoding);
- record at a time: read, then `decode_claims` and `ClaimState.apply` for each record
  (how a worker folded before `ClaimsFollower.fold_entries`; kept as the reference);
- catch-up: `ClaimsFollower.catch_up` (what a starting worker does).

A catch-up's time per record is also split by stage (read + decode: `FileLog.read_span`,
the file, frames, checksums and each record decoded in one walk; fold:
`ClaimState.apply_all`), each stage timed over the whole log on its own, the collector held
off as a catch-up holds it off.

Drain: `tasks` no-op tasks drained by 2 and by 8 qw worker processes (the drain section's
`qw_drain`, checked exactly-once) and by the raw loop (`bench.raw_loop`) with as many
processes, interleaved, median of the repeats; qw / raw is the share of the raw loop's rate
that qw reaches.

Both ways of running the fold are measured in the same run: the Python modules
(`QW_PURE=1`) and the compiled ones (`queue_worker.compiled`; the line under each table says
what was in use). The replays run in a child process per path (a process imports one or the
other); the drains' workers get the path in their environment.

    python -m bench.fold_bench [--records N] [--tasks N] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import common, raw_loop
from bench.common import REPO, Section, Target, median, num, scratch, table
from bench.long_bench import extend
from bench.queue_bench import qw_drain
from logstore import Entry, Log, open_log
from logstore.file_log import FileLog
from queue_worker import claims_span, compiled
from queue_worker.records import decode_claims, decode_claims_all
from queue_worker.state import ClaimSnapshot, ClaimState
from queue_worker.topics import CLAIMS_TOPIC, READ_BATCH, ClaimsFollower, gc_paused

TARGET_REPLAY = 1_000_000  # records/s
#: the two ways of running the fold: the Python modules, and the compiled ones
PATHS = ("pure", "compiled")
CATCH_UP = "catch-up (`ClaimsFollower.catch_up`)"
#: on a file log, a catch-up reads and decodes in one walk (read_span): "read + decode"
STAGES = ("read + decode", "fold")
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
    CATCH_UP: catch_up,
}


def stage_times(claims: Log) -> dict[str, float]:
    """µs of CPU a record for each stage of a catch-up, each over the whole log: on a file
    log, the span read (file, frames, checksums and decoding in one walk: `read_span`) and
    the fold; else the read (entries), the decode and the fold."""
    with gc_paused():
        started = time.process_time()
        spans: list[tuple[list[Any], list[int]]] = []
        position = claims.start
        if isinstance(claims, FileLog):
            loop = claims_span.loop()
            while found := claims.read_span(position, READ_BATCH, loop):
                spans.append((found.items, found.positions))
                position = found.next
            decode = time.process_time()
        else:
            batches: list[list[Entry]] = []
            while entries := claims.read(position, READ_BATCH):
                batches.append(entries)
                position = entries[-1].next
            for entries in batches:
                spans.append(
                    (decode_claims_all([e.data for e in entries]), [e.position for e in entries])
                )
            decode = time.process_time()
        state = ClaimState()
        for records, positions in spans:
            if None in records:
                raise RuntimeError("a malformed record in the synthetic log")
            state.apply_all(records, positions)
        fold = time.process_time()
    count = sum(len(records) for records, _ in spans) or 1
    return {
        "read + decode": (decode - started) / count * 1e6,
        "fold": (fold - decode) / count * 1e6,
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


class Replay:
    """What a child process measured replaying the log on one path."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.status = str(answer["status"])
        self.rates: dict[str, list[float]] = answer["rates"]
        self.stages: dict[str, list[float]] = answer["stages"]


def path_env(path: str) -> dict[str, str]:
    """The environment of a process that runs the fold on `path`."""
    env = {k: v for k, v in common.ENV.items() if k != compiled.PURE_ENV}
    if path == "pure":
        env[compiled.PURE_ENV] = "1"
    return env


@contextmanager
def on_path(path: str) -> Iterator[None]:
    """The bench's worker processes (common.ENV) run the fold on `path` meanwhile."""
    saved = dict(common.ENV)
    common.ENV.clear()
    common.ENV.update(path_env(path))
    try:
        yield
    finally:
        common.ENV.clear()
        common.ENV.update(saved)


def replay_on(path: str, data: Path, repeats: int) -> Replay:
    command = [sys.executable, "-m", "bench.fold_bench", "--replay-of", str(data)]
    done = subprocess.run(
        [*command, "--repeats", str(repeats)],
        env=path_env(path),
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return Replay(json.loads(done.stdout))


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's waited-for children: a drain's workers."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def replay_child(data: Path, repeats: int) -> None:
    """--replay-of: measure in this process, print JSON for `replay_on`."""
    rates = replay_rates(data, repeats)
    stages: dict[str, list[float]] = {stage: [] for stage in STAGES}
    with open_log(data, CLAIMS_TOPIC) as claims:
        for _ in range(repeats):
            for stage, us in stage_times(claims).items():
                stages[stage].append(us)
    print(json.dumps({"status": compiled.status(), "rates": rates, "stages": stages}))


# -- the section -----------------------------------------------------------------------------


def fold_section(root: Path, records: int, tasks: int, repeats: int) -> Section:
    replays: dict[str, Replay] = {}
    with scratch(root, "fold") as d:
        data = d / "data"
        log(f"fold: building a claims log of {records:,} records")
        extend(data, 0, records // 2)
        for path in PATHS:
            log(f"fold: replaying it, {repeats} × 3 ways, {path}")
            replays[path] = replay_on(path, data, repeats)
    drains: dict[tuple[str, int], list[float]] = {(p, n): [] for p in PATHS for n in WORKER_COUNTS}
    cpus: dict[tuple[str, int], list[float]] = {(p, n): [] for p in PATHS for n in WORKER_COUNTS}
    raws: dict[int, list[float]] = {n: [] for n in WORKER_COUNTS}
    for rep in range(repeats):
        for n in WORKER_COUNTS:
            log(f"fold: drain repeat {rep + 1}/{repeats}, {n} workers: qw pure, compiled, raw")
            for path in PATHS:
                before = children_cpu()
                with on_path(path):
                    drains[path, n].append(qw_drain(root, n, tasks).rate)
                cpus[path, n].append((children_cpu() - before) / tasks * 1e6)
            raws[n].append(raw_loop.drain(n, tasks))

    reference = median(replays["pure"].rates["record at a time (`decode_claims` + `apply` each)"])
    replay_rows = [
        [name, path, num(median(runs)), " / ".join(num(r) for r in runs),
         f"{median(runs) / reference:.2f}"]
        for name in REPLAYS
        for path in PATHS
        if (runs := replays[path].rates[name])
    ]  # fmt: skip
    stage_rows = []
    for path in PATHS:
        us = {stage: median(replays[path].stages[stage]) for stage in STAGES}
        total = sum(us.values())
        stage_rows.append(
            [path, *(f"{us[s]:.2f} ({us[s] / total:.0%})" for s in STAGES), f"{total:.2f}"]
        )
    drain_rows = []
    targets = []
    for n in WORKER_COUNTS:
        raw = median(raws[n])
        for path in PATHS:
            qw = median(drains[path, n])
            shares = [q / r for q, r in zip(drains[path, n], raws[n], strict=True)]
            drain_rows.append(
                [str(n), path, num(qw), num(raw), f"{qw / raw:.1%}",
                 " / ".join(f"{share:.1%}" for share in shares),
                 f"{median(cpus[path, n]):.0f}"]
            )  # fmt: skip
        ratio = median(drains["compiled", n]) / raw
        targets.append(
            Target(
                f"drain, {n} workers, no fsync, vs raw-log loop (same run)",
                f"≥ {TARGET_RAW[n]:.0%} of raw",
                f"{ratio:.1%} ({num(median(drains['compiled', n]))} vs {num(raw)}/s)",
                ratio >= TARGET_RAW[n],
            )
        )
    fold_rate = median(replays["compiled"].rates[CATCH_UP])
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
            f"batches of 1,000), from the start, in a child process per path; records/s of CPU "
            f"time, median of {repeats} runs; × = against folding a record at a time (pure).",
            "",
            table(["replay", "path", "records/s", "runs", "×"], replay_rows),
            "",
            "Where a catch-up's time goes: µs of CPU a record by stage (read + decode = "
            "`read_span`: file, frames, checksums and records in one walk; fold = `apply_all`):",
            "",
            table(["path", *STAGES, "total µs"], stage_rows),
            "",
            *(f"- {path}: {replays[path].status}" for path in PATHS),
            "",
            f"Drain of {tasks:,} no-op tasks (`fsync none`, pick spread; start-up excluded, "
            f"as in the drain section) beside the raw loop with as many processes, "
            f"interleaved, median of {repeats}; CPU µs/task = the workers' user + system time "
            f"(start-up included) over the tasks, which a shared machine's load does not skew:",
            "",
            table(
                [
                    "workers",
                    "path",
                    "qw tasks/s",
                    "raw loop tasks/s",
                    "qw / raw",
                    "runs",
                    "CPU µs/task",
                ],
                drain_rows,
            ),
        ]
    )
    return Section("The fold: replay and drain against the raw loop", body, targets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--replay-of", type=Path, help=argparse.SUPPRESS)  # see replay_on
    args = parser.parse_args()
    if args.replay_of is not None:
        replay_child(args.replay_of, args.repeats)
        return
    with tempfile.TemporaryDirectory(prefix="qw-fold-") as tmp:
        section = fold_section(Path(tmp), args.records, args.tasks, args.repeats)
    print(section.markdown())
    for target in section.targets:
        print(f"- {target.what}: {target.measured} (wanted {target.wanted})")


if __name__ == "__main__":
    main()
