"""`qw up` and `qw status` on a queue with a long history: what a queue that has run for
months costs at each start.

A queue of `history` tasks, enqueued and drained once by `qw up --workers 8` (whose worker
in slot 0 saves the fold checkpoint at its exit, as every run does); then, `repeats`
times: `backlog` new tasks enqueued, `qw up --workers 8 … --exit-when-drained` timed from
its launch to its first CLAIM (the `at` of the first record it appended to the claims
log: no polling process on the cores), and `qw status` (wall and CPU) and `qw enqueue
--count 1` (CPU) timed, medians, run a few seconds after the last DONE, as a user comes
back to a queue (just after a run `qw status` folds the whole history, for the rate of the
last seconds: `supervisor.run.fold_begin`). At the end every task must have been done exactly
once.

    python -m bench.history_start [--history N] [--backlog N] [--repeats R]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    QW,
    REPO,
    USER_ENV,
    BenchError,
    enqueue_batch,
    fold_claims,
    median,
    run_timed,
    scratch,
    up_command,
)
from logstore import Log, open_log
from queue_worker.protocol.records import Claim, Unknown, decode_claims
from queue_worker.topics import CLAIMS_TOPIC

STATUS_RUNS = 5
#: `qw status` runs this long after the last DONE: past the rate's window and clock margin
STATUS_AFTER_S = 5.0


@dataclass
class HistoryStart:
    history: int
    backlog: int
    first_claim_s: list[float]  # launch → first CLAIM, one per repeat
    status_s: list[float]  # `qw status` wall time
    status_cpu_s: list[float]  # `qw status` user + system CPU
    enqueue_cpu_s: list[float] = field(default_factory=list)  # `qw enqueue --count 1`
    last_done_s: float = 0.0  # how long after the last DONE the last `qw status` ran


def run_history_start(
    root: Path, history: int, backlog: int, repeats: int, status_after_s: float = STATUS_AFTER_S
) -> HistoryStart:
    result = HistoryStart(history, backlog, [], [], [])
    with scratch(root, f"history-{history}") as d:
        data = d / "qw"
        enqueue_batch(data, history)
        _up(data, d / "history.out", USER_ENV)
        for _ in range(repeats):
            enqueue_batch(data, backlog)
            with open_log(data, CLAIMS_TOPIC) as claims:
                before = claims.end()
            launched = time.time()
            _up(data, d / "up.out", USER_ENV)
            with open_log(data, CLAIMS_TOPIC) as claims:
                [first] = claims.read(before, 1)
            record = decode_claims(first.data)
            if not isinstance(record, Claim):
                raise BenchError(f"the run's first claims record is {record!r}, not a CLAIM")
            result.first_claim_s.append(record.at / 1e6 - launched)
            # `qw status` as a user runs it later on: once the run's last DONE is out of the
            # rate it shows (supervisor.run.fold_begin: until then it folds the whole history)
            with open_log(data, CLAIMS_TOPIC) as claims:
                last_at = _last_at(claims)
            time.sleep(max(0.0, last_at / 1e6 + status_after_s - time.time()))
            for _ in range(STATUS_RUNS):
                result.last_done_s = time.time() - last_at / 1e6
                started = time.perf_counter()
                code, cpu = run_timed(
                    [QW, "status", "--dir", str(data)], stdout=subprocess.DEVNULL, cwd=REPO
                )
                if code != 0:
                    raise BenchError(f"qw status exited with {code}")
                result.status_s.append(time.perf_counter() - started)
                result.status_cpu_s.append(cpu)
                enqueue = [QW, "enqueue", "--dir", str(data), "--count", "1", "--fsync", "none"]
                code, cpu = run_timed(enqueue, stdout=subprocess.DEVNULL, cwd=REPO)
                if code != 0:
                    raise BenchError(f"qw enqueue exited with {code}")
                result.enqueue_cpu_s.append(cpu)
        _up(data, d / "up.out", USER_ENV)  # (the tasks `qw enqueue` added after the last run)
        fold_claims(data).check_exactly_once(history + repeats * (backlog + STATUS_RUNS))
    return result


def _last_at(claims: Log) -> int:
    """The time (µs) of the claims log's last record."""
    position, last = claims.start, None
    while entries := claims.read(position, 20_000):
        last, position = entries[-1], entries[-1].next
    if last is None:
        raise BenchError("the claims log is empty")
    record = decode_claims(last.data)
    if isinstance(record, Unknown):
        raise BenchError(f"the claims log's last record is {record!r}")
    return record.at


def _up(data: Path, out_path: Path, env: dict[str, str]) -> None:
    with open(out_path, "wb") as out:
        code = subprocess.call(
            up_command(data, 8), env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO
        )
    if code != 0:
        tail = out_path.read_text(errors="replace")[-600:]
        raise BenchError(f"qw up exited with {code}: {tail}")


def rows(result: HistoryStart) -> list[list[str]]:
    """The lines `bench.start_bench` adds to its table."""
    done = f"{result.history:,} tasks done before"
    return [
        [
            f"qw up, 8 workers, {result.backlog:,} new tasks, {done}: launch → first CLAIM",
            f"{median(result.first_claim_s):.3f} s",
        ],
        [
            f"qw status on that queue ({done}): wall, CPU",
            f"{median(result.status_s) * 1000:.0f} ms, {median(result.status_cpu_s) * 1000:.0f} ms",
        ],
        [
            "qw enqueue --count 1 on that queue: CPU",
            f"{median(result.enqueue_cpu_s) * 1000:.0f} ms",
        ],
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.history_start")
    parser.add_argument("--history", type=int, default=200_000)
    parser.add_argument("--backlog", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qw-history-") as tmp:
        result = run_history_start(Path(tmp), args.history, args.backlog, args.repeats)
    for what, measured in rows(result):
        print(f"{what}: {measured}")
    each = ", ".join(f"{s:.3f}" for s in result.first_claim_s)
    print(f"(launch → first CLAIM each run: {each} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
