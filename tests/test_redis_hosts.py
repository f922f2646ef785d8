"""Several hosts for real: two `qw up` supervisors with different host names on one Redis
queue, one of them on a machine whose clock runs five minutes fast (`qw up` run by
tests/qw_run.py with --clock-offset: its workers' `WorkerConfig.clock_offset_s`). On Redis
the server stamps every claims record, so the skew cannot shorten a live lease (the fast
host's CLAIMs lose), and a dead worker's task is taken over by the fast host once the lease
has lapsed on the server's clock, not earlier: exactly once holds. On the file log the same
skew takes live leases over: the contrast, in one process, is
test_a_fast_clock_cannot_take_a_live_lease_over_on_redis_but_can_on_the_file_log in
tests/test_redis_e2e.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from queue_worker.proof.report import load_report
from queue_worker.protocol.records import Claim, decode_claims
from queue_worker.protocol.state import Verdict
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.stats import read_all
from supervisor.demos.fleet import ClaimsTail, Seen
from tests.helpers import wait_until
from tests.test_redis_e2e import ENV, finish, queue_url, qw, qw_command

SKEW_S = 300  # five minutes: far more than the lease
LEASE_S = 2.0


def test_a_clock_offset_is_refused_beyond_ten_years_and_when_not_a_number(tmp_path: Path) -> None:
    WorkerConfig(str(tmp_path), str(tmp_path), clock_offset_s=-90.5).validate()
    for bad in (float("nan"), 1e12, -1e12):
        with pytest.raises(ValueError, match=f"clock_offset_s is {bad}; expected a number"):
            WorkerConfig(str(tmp_path), str(tmp_path), clock_offset_s=bad).validate()
    with pytest.raises(ValueError, match="'clock_offset_s' is 'five minutes'; expected a number"):
        WorkerConfig.from_json(
            '{"location": "x", "run_dir": "y", "clock_offset_s": "five minutes"}'
        )


def host_of(worker: str | None) -> str:
    """`w0@host-b-4711-9f3a` → `host-b`."""
    _, _, rest = (worker or "").partition("@")
    return rest.rsplit("-", 2)[0]


@pytest.mark.redis
@pytest.mark.parametrize(
    "verdicts", [pytest.param("client", marks=pytest.mark.slow), "server"]
)  # make test: the default mode
def test_a_host_with_a_fast_clock_neither_steals_a_live_lease_nor_delays_a_takeover(
    redis_url: str, tmp_path: Path, verdicts: str
) -> None:
    """With client verdicts host B's worker tries a live lease and loses; with server
    verdicts the server does not offer it one (host B idles, waiting on the server's clock).
    Either way host B takes the dead worker's task over once the lease has lapsed on the
    server's clock (the dead worker's replacement on host A leaves it to the others)."""
    url = queue_url(redis_url) + f"&verdicts={verdicts}"
    gate = tmp_path / "gate"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"n": n, "gate": str(gate)}) + "\n" for n in range(2)))
    enqueued = qw("enqueue", "--log", url, "--file", str(tasks), cwd=tmp_path)
    assert enqueued.returncode == 0, enqueued.stderr

    def up(host: str, workers: int, clock_offset_s: float = 0) -> subprocess.Popen[str]:
        # fmt: off
        args = [
            "up", "--no-tui", "--log", url, "--exit-when-drained", "--workers", str(workers),
            "--dir", str(tmp_path / host), "--handler", "tests.test_redis_e2e:gated",
            "--lease", str(LEASE_S), "--host-name", host,
        ]
        if verdicts == "client":  # (with server verdicts the server picks)
            args += ["--pick", "random"]
        # fmt: on
        command = qw_command(*args)
        if clock_offset_s:  # (tests/qw_run.py)
            command = [
                sys.executable,
                "-m",
                "tests.qw_run",
                "--clock-offset",
                str(clock_offset_s),
                "--",
                *args,
            ]
        return subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
            env=ENV,
        )

    def working(host: str) -> list[dict[str, Any]]:
        return [s for s in read_all(tmp_path / host / "run") if s["state"] == "working"]

    ups: list[subprocess.Popen[str]] = []
    with ClaimsTail(url) as tail:
        try:
            # Host A, a true clock: its two workers hold both tasks (at the gate, renewing).
            ups.append(up("host-a", 2))
            wait_until(lambda: len(working("host-a")) == 2, 120, "host-a to hold both tasks")
            # Host B, five minutes fast: by its clock both leases lapsed long ago.
            ups.append(up("host-b", 1, clock_offset_s=SKEW_S))

            def by_b(verdict: Verdict) -> Callable[[Seen], bool]:
                return lambda s: s.verdict is verdict and host_of(s.outcome.worker) == "host-b"

            if verdicts == "client":
                wait_until(lambda: tail.find(by_b(Verdict.LOST_HELD)), 120, "host-b to try a lease")
            else:  # the server's pick offers host B nothing: it has asked, and idles
                wait_until(
                    lambda: [
                        s for s in read_all(tmp_path / "host-b" / "run") if s["state"] == "idle"
                    ],
                    120,
                    "host-b to ask for a task and idle",
                )
                tail.poll()
                assert not [s for s in tail.seen if host_of(s.outcome.worker) == "host-b"]
            assert tail.find(by_b(Verdict.TAKEOVER)) is None  # it lost: the lease is live

            # A worker of host A dies holding its task: host B takes it over once the lease
            # has lapsed on the server's clock (its replacement leaves it to the others).
            [victim, *_] = working("host-a")
            os.kill(victim["pid"], signal.SIGKILL)
            taken = cast(
                "Seen",
                wait_until(
                    lambda: tail.find(
                        lambda s: (
                            by_b(Verdict.TAKEOVER)(s) and s.outcome.task == victim["current_task"]
                        )
                    ),
                    120,
                    "host-b to take the dead worker's task over",
                ),
            )
            gate.touch()
            outputs = finish(ups, 180, [tmp_path / "host-a", tmp_path / "host-b"])
        finally:
            for proc in ups:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
        assert [p.returncode for p in ups] == [0, 0], outputs
        tail.poll()
        seen = tail.seen
        raw = {e.position: e for e in tail.log.iter_from(tail.log.start)}

    # The skew was real: host B's CLAIMs carry its own clock, five minutes ahead of the
    # server's stamp; the fold judged them by the stamp.
    b_claims = 0
    for s in seen:
        if isinstance(s.record, Claim) and host_of(s.record.worker) == "host-b":
            entry = raw[s.outcome.position]
            written = decode_claims(entry.data)
            assert isinstance(written, Claim) and entry.server_time_us is not None
            assert written.at - entry.server_time_us > (SKEW_S - 60) * 1_000_000
            b_claims += 1
    assert b_claims >= (2 if verdicts == "client" else 1)  # (the lost try), the takeover

    # Takeover timing: never before the dead lease's expiry on the server's clock, and every
    # earlier try of host B on a live lease lost.
    previous = taken.outcome.previous
    assert previous is not None and host_of(previous.worker) == "host-a"
    assert isinstance(taken.record, Claim) and taken.record.at >= previous.expiry
    for s in seen:
        if s.verdict is Verdict.LOST_HELD and host_of(s.outcome.worker) == "host-b":
            holder = s.outcome.holder
            assert isinstance(s.record, Claim) and holder is not None
            assert s.record.at < holder.expiry

    # Exactly once, across hosts and clocks.
    report = load_report(url)
    assert report.ok and report.exit_code == 0, report.verdict
    assert report.tasks_done == report.completions_accepted == 2
    assert not report.worked_twice and report.completions_stale == 0
    assert [host_of(t.new_holder) for t in report.takeovers] == ["host-b"]
