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
that qw reaches. qw's workers are started both ways of `bench.common.run_fleet` in the same
run (the order flipped every repeat): forked from a preloaded fork server, as `qw up` starts
them (what the targets are judged on), and each as a fresh interpreter (Popen). qw's window
is first CLAIM → last accepted DONE: the first worker's start is outside it, the start of
the others that overlaps its work inside it. The raw loop's processes are forked from this
(warm) process and released together: its window is release → last exit.

The fold runs as the install built it: the claims decoder in C where setup.py could build
it, else its Python (the line under the tables says which). The replays run in a child
process.

    python -m bench.fold_bench [--records N] [--tasks N] [--repeats N] [--start fork|popen|both]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import common, raw_loop
from bench.common import (
    REPO,
    STARTS,
    Section,
    Start,
    Target,
    children_cpu_s,
    median,
    num,
    scratch,
    table,
)
from bench.long_bench import extend
from bench.queue_bench import QwDrain, qw_drain
from logstore import Entry, Log, open_log
from logstore.file.log import FileLog
from queue_worker.protocol import cdecode
from queue_worker.protocol.records import decode_claims, decode_claims_all
from queue_worker.protocol.state import ClaimSnapshot, ClaimState
from queue_worker.topics import CLAIMS_TOPIC, READ_BATCH, ClaimsFollower, claims_decoder, gc_paused

TARGET_REPLAY = 1_000_000  # records/s
#: the fold as the install built it (one path: the table keeps its column)
PATHS = ("installed",)
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
            decoder = claims_decoder()
            while found := claims.read_span(position, READ_BATCH, decoder):
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
    return dict(common.ENV)


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


def replay_child(data: Path, repeats: int) -> None:
    """--replay-of: measure in this process, print JSON for `replay_on`."""
    rates = replay_rates(data, repeats)
    stages: dict[str, list[float]] = {stage: [] for stage in STAGES}
    with open_log(data, CLAIMS_TOPIC) as claims:
        for _ in range(repeats):
            for stage, us in stage_times(claims).items():
                stages[stage].append(us)
    print(json.dumps({"status": cdecode.status(), "rates": rates, "stages": stages}))


# -- the section -----------------------------------------------------------------------------


@dataclass
class Drains:
    """The section's drains: qw's by (path, start, workers), the raw loop's by workers."""

    starts: tuple[Start, ...]
    qw: dict[tuple[str, Start, int], list[QwDrain]] = field(default_factory=dict)
    raw: dict[int, list[float]] = field(default_factory=dict)  # tasks/s
    raw_cpu: dict[int, list[float]] = field(default_factory=dict)  # µs/task

    @property
    def judged(self) -> Start:
        """The start the targets are judged on: `qw up`'s, when measured."""
        return "fork" if "fork" in self.starts else self.starts[0]


def run_drain_pairs(
    root: Path, tasks: int, repeats: int, starts: tuple[Start, ...] = STARTS
) -> Drains:
    """qw's drains on each path and start, and the raw loop's, interleaved; the starts'
    order flips every repeat (the one after the other might find the machine warmer)."""
    out = Drains(starts)
    for rep in range(repeats):
        order = starts if rep % 2 == 0 else starts[::-1]
        for n in WORKER_COUNTS:
            log(f"fold: drain repeat {rep + 1}/{repeats}, {n} workers: qw {order} × {PATHS}, raw")
            for path in PATHS:
                for start in order:
                    with on_path(path):
                        run = qw_drain(root, n, tasks, start=start)
                    out.qw.setdefault((path, start, n), []).append(run)
            before = children_cpu_s()
            out.raw.setdefault(n, []).append(raw_loop.drain(n, tasks))
            out.raw_cpu.setdefault(n, []).append((children_cpu_s() - before) / tasks * 1e6)
    return out


START_NAMES: dict[Start, str] = {"fork": "fork (as qw up)", "popen": "popen"}
#: how the targets' line says the workers were started
STARTED: dict[Start, str] = {
    "fork": "forked as `qw up` forks them",
    "popen": "each a fresh interpreter",
}
DRAIN_HEADERS = (
    "workers", "path", "start", "qw tasks/s", "raw loop tasks/s", "qw / raw", "runs",
    "CPU µs/task", "server", "start-up s", "ramp ms",
)  # fmt: skip


def drain_text(drains: Drains, tasks: int, repeats: int) -> tuple[list[str], list[Target]]:
    """The drain table and its targets (on `drains.judged`)."""
    rows = []
    targets = []
    for n in WORKER_COUNTS:
        raw = median(drains.raw[n])
        for path in PATHS:
            for start in drains.starts:
                runs = drains.qw[path, start, n]
                qw = median(r.rate for r in runs)
                shares = [q.rate / r for q, r in zip(runs, drains.raw[n], strict=True)]
                server = median(r.server_cpu_s / r.tasks * 1e6 for r in runs)
                rows.append(
                    [str(n), path, START_NAMES[start], num(qw), num(raw), f"{qw / raw:.1%}",
                     " / ".join(f"{share:.1%}" for share in shares),
                     num(median(r.cpu_us_per_task for r in runs)),
                     num(server) if start == "fork" else "–",
                     num(median(r.startup_s for r in runs), 2),
                     num(median(r.ramp_s * 1e3 for r in runs))]
                )  # fmt: skip
        runs = drains.qw[PATHS[0], drains.judged, n]
        qw = median(r.rate for r in runs)
        targets.append(
            Target(
                f"drain, {n} workers, no fsync, vs raw-log loop (same run; "
                f"workers {STARTED[drains.judged]})",
                f"≥ {TARGET_RAW[n]:.0%} of raw",
                f"{qw / raw:.1%} ({num(qw)} vs {num(raw)}/s)",
                qw / raw >= TARGET_RAW[n],
            )
        )
    raw_cpu = ", ".join(f"{n} workers {num(median(drains.raw_cpu[n]))}" for n in WORKER_COUNTS)
    lines = [
        f"Drain of {tasks:,} no-op tasks (`fsync none`, pick spread) beside the raw loop with "
        f"as many processes, interleaved, median of {repeats}. qw's workers started two ways "
        "in the same run (the order flipped every repeat): *fork (as qw up)*: a fork server "
        "(a fresh interpreter importing the worker code, then folding the queue) forks them "
        "one after another, slot 0 last, as `qw up` does; *popen*: each a fresh interpreter "
        "(`python -m queue_worker.process`). qw tasks/s: first CLAIM's `at` → last accepted "
        "DONE's `at`, so the first worker's start is outside the window and the other "
        "workers' starts that overlap its work are inside it (forks; or interpreter "
        "start-ups on the same cores). Raw loop: processes forked from this warm process and "
        "released together, release → last exit. *runs*: qw / raw run by run. CPU µs/task: "
        "user + system time of the workers and, fork, of their fork server (of which in "
        "*server*: its start, imports, folds and forks), start-ups included, over the tasks "
        "(a shared machine's load skews it less than the rates); *start-up s*: launch (of the "
        "fork server, or the first worker) → first CLAIM; *ramp ms*: first CLAIM → the first "
        "CLAIM of the last worker to make one (the part of the window the workers were still "
        "starting in).",
        "",
        table(DRAIN_HEADERS, rows, right=3),
        "",
        f"Raw loop CPU µs/task (its processes, fork from a warm parent included): {raw_cpu}.",
    ]
    return lines, targets


def fold_section(
    root: Path, records: int, tasks: int, repeats: int, starts: tuple[Start, ...] = STARTS
) -> Section:
    replays: dict[str, Replay] = {}
    with scratch(root, "fold") as d:
        data = d / "data"
        log(f"fold: building a claims log of {records:,} records")
        extend(data, 0, records // 2)
        for path in PATHS:
            log(f"fold: replaying it, {repeats} × 3 ways, {path}")
            replays[path] = replay_on(path, data, repeats)
    drain_lines, targets = drain_text(run_drain_pairs(root, tasks, repeats, starts), tasks, repeats)

    reference = median(replays[PATHS[0]].rates["record at a time (`decode_claims` + `apply` each)"])
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
    fold_rate = median(replays[PATHS[0]].rates[CATCH_UP])
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
            f"time, median of {repeats} runs; × = against folding a record at a time.",
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
            *drain_lines,
        ]
    )
    return Section("The fold: replay and drain against the raw loop", body, targets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--start",
        choices=("both", *STARTS),
        default="both",
        help="how qw's drains start their workers (default: both, interleaved)",
    )
    parser.add_argument("--replay-of", type=Path, help=argparse.SUPPRESS)  # see replay_on
    args = parser.parse_args()
    if args.replay_of is not None:
        replay_child(args.replay_of, args.repeats)
        return
    with tempfile.TemporaryDirectory(prefix="qw-fold-") as tmp:
        starts = STARTS if args.start == "both" else (args.start,)
        section = fold_section(Path(tmp), args.records, args.tasks, args.repeats, starts)
    print(section.markdown())
    for target in section.targets:
        print(f"- {target.what}: {target.measured} (wanted {target.wanted})")


if __name__ == "__main__":
    main()
