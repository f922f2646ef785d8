"""Redistribution: kill -9 the worker holding a task, time the takeover against the lease.

4 worker processes (lease 0.5 s, renewed every 0.25 s; the demo handler working for ten
minutes) and one task. Each round: find the task's holder in the claims log, wait a random
0–0.5 s (so the kill lands anywhere in the renewal cycle), SIGKILL it, start a replacement
(the pool stays at 4), and wait for the TAKEOVER record. The sample is the takeover CLAIM's
`at` minus the expiry of the lease it replaced (the victim's last CLAIM or RENEW `at` +
lease), both read from the log by the protocol's fold: how long after the lease ran out a
survivor took the task. The next round kills the new holder.

A takeover of a holder that was not killed (a renewal that came too late on a loaded
machine) would be a lease lost by a live worker: counted and shown, not a sample.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import (
    TIMEOUT_S,
    Fleet,
    Fold,
    Section,
    Target,
    fold_claims,
    num,
    percentile,
    scratch,
    table,
    us,
    wait_for,
    worker_config,
)
from queue_worker.producer import Queue
from queue_worker.worker.config import WorkerConfig

LEASE_S = 0.5
WORK_MS = 600_000  # far longer than the run: the task is only ever finished by a kill
TARGET_OVER_LEASE_US = 50_000
WORKERS = 4
TASK = 0


def log(message: str) -> None:
    print(f"  · {message}", file=sys.stderr, flush=True)


def _pid_of(worker_id: str) -> int:
    """A worker id is ``<name>-<pid>-<hex>``."""
    return int(worker_id.rsplit("-", 2)[1])


@dataclass
class Takeovers:
    samples_us: list[float] = field(default_factory=list)  # takeover `at` − victim's expiry
    kill_to_takeover_s: list[float] = field(default_factory=list)
    of_live_holders: int = 0


def measure(root: Path, rounds: int) -> Takeovers:
    rng = random.Random(2)
    out = Takeovers()
    with scratch(root, "redistribution") as d:
        data, run_dir = d / "data", d / "run"

        def config(index: int) -> WorkerConfig:
            return worker_config(
                data,
                run_dir,
                f"r{index}",
                handler="queue_worker.worker.handlers:demo",
                work_ms=WORK_MS,
                lease_s=LEASE_S,
                pick="first",
                exit_when_drained=False,
            )

        with Queue(data, fsync="none") as queue, Fleet(d / "logs") as fleet:
            for index in range(WORKERS):
                fleet.start(config(index))
            queue.enqueue({"work_ms": WORK_MS})

            def claimed() -> Fold | None:
                f = fold_claims(data)
                return f if TASK in f.holders else None

            wait_for(claimed, TIMEOUT_S, "a worker to claim the task")
            killed: set[str] = set()
            for r in range(rounds):
                time.sleep(rng.uniform(0.0, LEASE_S))
                fold = fold_claims(data)  # the holder may have changed meanwhile
                victim = fold.holders[TASK]
                os.kill(_pid_of(victim), signal.SIGKILL)
                killed_at = time.time()
                killed.add(victim)
                fleet.start(config(WORKERS + r))
                seen = len(fold.takeover_list)

                def taken(seen: int = seen) -> Fold | None:
                    f = fold_claims(data)
                    return f if len(f.takeover_list) > seen else None

                fold = wait_for(taken, TIMEOUT_S, f"round {r + 1}: a takeover")
                claim, previous = fold.takeover_list[-1]
                if previous.worker in killed:
                    out.samples_us.append(float(claim.at - previous.expiry))
                    out.kill_to_takeover_s.append(claim.at / 1e6 - killed_at)
            final = fold_claims(data)
            out.of_live_holders = sum(
                1 for _, previous in final.takeover_list if previous.worker not in killed
            )
    return out


def redistribution_section(root: Path, rounds: int) -> Section:
    log(f"redistribution: {rounds} rounds of kill -9, lease {LEASE_S} s")
    result = measure(root, rounds)
    samples = result.samples_us
    p50, p99 = percentile(samples, 0.50), percentile(samples, 0.99)
    kill_mean = sum(result.kill_to_takeover_s) / max(1, len(result.kill_to_takeover_s))
    body = "\n".join(
        [
            f"{WORKERS} workers, lease {LEASE_S} s (renewed every {LEASE_S / 2} s), one long "
            f"task; {rounds} rounds of kill -9 of its holder. Sample: the takeover CLAIM's "
            "`at` − the victim's lease expiry, both from the log.",
            "",
            table(
                ["samples", "p50", "p90", "p99", "max", "kill → takeover (mean)",
                 "takeovers of live holders"],
                [[
                    str(len(samples)), us(p50), us(percentile(samples, 0.90)), us(p99),
                    us(max(samples, default=float("nan"))), f"{num(kill_mean * 1000)} ms",
                    str(result.of_live_holders),
                ]],
            ),
        ]
    )  # fmt: skip
    target = Target(
        "takeover after kill -9, p99",
        f"≤ lease + {TARGET_OVER_LEASE_US // 1000} ms",
        f"lease + {p99 / 1000:,.1f} ms",
        p99 <= TARGET_OVER_LEASE_US,
    )
    return Section("Redistribution: takeover after kill -9", body, [target])
