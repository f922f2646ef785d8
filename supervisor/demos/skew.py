"""`qw demo skew`: clocks that disagree. Why expiry is judged by the records' timestamps,
and what clock skew still does.

The fold reads no clock: a lease expires at the CLAIM's (or last RENEW's) `at` + lease, and
a CLAIM wins a held task only if its own `at` is past that. Every reader of the log agrees,
whatever its own clock says. But `at` is the *writer's* clock, so skew still matters:

Act 1  A worker whose clock runs ahead by more than the lease writes a CLAIM whose `at` is
       past a live lease's expiry: the fold grants it a takeover, and every reader agrees,
       although in real time the honest holder was still working. Two workers run the task.
Act 2  Fencing limits the damage: the honest holder's lease keeper finds the takeover in the
       log and cancels its handler, so only one DONE is written (and one accepted).
Act 3  A worker whose clock runs behind cannot steal: its CLAIM on a task whose holder died
       is dated before the lease's expiry, so it loses although in real time the lease ran
       out; a worker with a true clock takes the task over. Slow clocks delay redistribution.

The workers here run in this process, each with an injected clock (`Worker(clock=...)`), on
a real file log: nothing of the worker is simulated, only its clock is offset.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from logstore import open_log
from queue_worker.producer import Queue
from queue_worker.proof.report import clock_text, duration_text, load_report
from queue_worker.protocol.clock import now_us, seconds_to_us
from queue_worker.protocol.records import Claim, encode
from queue_worker.protocol.state import ClaimState, Verdict
from queue_worker.topics import CLAIMS_TOPIC, decode_claims_entry
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.loop import StepKind, StepResult, Worker
from supervisor.demos.common import (
    DemoResult,
    Narrator,
    data_dir,
    record_skew,
    write_demo_timeline,
)
from supervisor.demos.fleet import ClaimsTail, DemoFailed, wait_for


@dataclass(frozen=True)
class SkewOptions:
    lease_s: float = 2.0
    skew_s: float = 3.0  # how far the fast clock runs ahead, and the slow one behind
    work_ms: int = 6000  # the honest holder's task: long, so it is still working when robbed
    directory: Path | None = None
    keep: bool = False


class OffsetClock:
    """The wall clock shifted by a fixed offset: a machine whose clock is wrong."""

    def __init__(self, offset_us: int) -> None:
        self.offset_us = offset_us

    def __call__(self) -> int:
        return now_us() + self.offset_us


#: how long the workers other than the robbed one work a task
SHORT_WORK_MS = 100


def _worker(
    location: Path, name: str, options: SkewOptions, clock: OffsetClock, work_ms: int
) -> Worker:
    config = WorkerConfig(
        location=str(location),
        run_dir=str(location / "run"),
        name=name,
        lease_s=options.lease_s,
        work_ms=work_ms,
        pick="first",
    )
    return Worker(config, clock=clock)


def _replay_twice_agrees(location: Path) -> int:
    """Replay the claims log as two readers; return how many records they judged alike.
    (The fold takes no clock, so there is nothing for their clocks to change.)"""
    with open_log(location, CLAIMS_TOPIC) as log:
        entries = list(log.iter_from(log.start))
    a, b = ClaimState(), ClaimState()
    alike = 0
    for entry in entries:
        record = decode_claims_entry(entry)
        alike += a.apply(record, entry.position) == b.apply(record, entry.position)
    if alike != len(entries):
        raise DemoFailed("two readers of the same log disagreed")
    return alike


def act_fast_clock(
    location: Path, options: SkewOptions, tail: ClaimsTail, say: Narrator
) -> tuple[StepResult, int]:
    """Acts 1 and 2. Returns the honest worker's step result and task 0's takeover position."""
    fast_clock = OffsetClock(seconds_to_us(options.skew_s))
    with (
        Queue(location) as queue,
        _worker(location, "honest", options, OffsetClock(0), options.work_ms) as honest,
        _worker(location, "fast", options, fast_clock, SHORT_WORK_MS) as fast,
    ):
        record_skew(location, "fast", fast.worker_id, options.skew_s)
        task = queue.enqueue({"demo": "skew", "act": 1})
        results: list[StepResult] = []
        runner = threading.Thread(target=lambda: results.append(honest.step()), daemon=True)
        runner.start()
        won = wait_for(
            lambda: tail.find(lambda s: s.outcome.task == task and s.verdict is Verdict.WON),
            10 + options.lease_s,
            "the honest worker to win task 0",
        )
        assert won.outcome.holder is not None
        expiry = won.outcome.holder.expiry
        say.say(
            f"honest (true clock) won task {task}: CLAIM @{won.position}, lease until "
            f"{clock_text(expiry)}; its handler works {options.work_ms / 1000:g} s"
        )
        real_now = now_us()
        fast_now = fast_clock()
        say.say(
            f"fast's clock reads {clock_text(fast_now)} while the true time is "
            f"{clock_text(real_now)}: by its clock the lease ended "
            f"{duration_text(fast_now - expiry)} ago, so task {task} looks claimable to it"
        )
        stolen = fast.step(fast_now)
        takeover = tail.find(lambda s: s.position == stolen.claim)
        if takeover is None or takeover.verdict is not Verdict.TAKEOVER:
            raise DemoFailed(f"fast's claim was not a takeover: {stolen}")
        if not real_now < expiry:
            raise DemoFailed("the honest lease had already expired in real time")
        say.say(
            f"fast's CLAIM @{takeover.position} is dated {clock_text(fast_now)}, past the "
            f"expiry: the fold grants a TAKEOVER, and so does every reader, although in real "
            f"time the honest lease had {duration_text(expiry - real_now)} to run"
        )
        say.say(f"fast ran task {task} ({SHORT_WORK_MS} ms), and its DONE is {_fate(stolen.kind)}")
        runner.join(timeout=options.lease_s * 2 + options.work_ms / 1000 + 10)
        if not results:
            raise DemoFailed("the honest worker did not finish its step")
        result = results[0]
        say.say(
            f"honest's lease keeper saw the takeover at its next renewal, "
            f"{options.lease_s / 2:g} s after its claim, and cancelled its handler: honest "
            f"wrote no DONE. Until then both handlers were running task {task} at the same "
            "time: fencing cannot prevent that, only a second completion"
        )
        return result, takeover.position


def _fate(kind: StepKind) -> str:
    """What became of a worker's DONE, in words (StepKind.DONE reads "done": say more)."""
    return "accepted" if kind is StepKind.DONE else f"not accepted (the step: {kind.value})"


def act_slow_clock(location: Path, options: SkewOptions, tail: ClaimsTail, say: Narrator) -> bool:
    """Act 3: a dead holder's lease runs out; the slow worker loses, the honest one wins."""
    lease_us = seconds_to_us(options.lease_s)
    slow_clock = OffsetClock(-seconds_to_us(options.skew_s))
    with (
        Queue(location) as queue,
        open_log(location, CLAIMS_TOPIC) as claims,
        _worker(location, "honest2", options, OffsetClock(0), SHORT_WORK_MS) as honest,
        _worker(location, "slow", options, slow_clock, SHORT_WORK_MS) as slow,
    ):
        record_skew(location, "slow", slow.worker_id, -options.skew_s)
        task = queue.enqueue({"demo": "skew", "act": 3})
        # What a worker killed right after its claim leaves behind: one CLAIM, nothing more.
        ghost_at = now_us()
        ghost = claims.append(encode(Claim(task, "ghost", ghost_at, lease_us)))
        expiry = ghost_at + lease_us
        say.say(
            f"a worker claimed task {task} (CLAIM @{ghost} by 'ghost') and died; its lease "
            f"ends at {clock_text(expiry)}"
        )
        wait_for(lambda: now_us() > expiry, options.lease_s + 10, "the ghost's lease to end")
        slow_now = slow_clock()
        lost = slow.attempt(task, slow_now)
        say.say(
            f"the true time is past the expiry, but slow's CLAIM @{lost.claim} is dated "
            f"{clock_text(slow_now)}: verdict '{lost.verdict.value if lost.verdict else '?'}'"
            " (a slow clock cannot steal a lease; it only waits longer)"
        )
        won = honest.step()
        seen = tail.find(lambda s: s.position == won.claim)
        verdict = seen.verdict if seen is not None else None
        say.say(
            f"honest2 (true clock) claims task {task}: CLAIM @{won.claim} "
            f"'{verdict.value if verdict else '?'}', and its DONE is {_fate(won.kind)}"
        )
        return (
            lost.verdict is Verdict.LOST_HELD
            and verdict is Verdict.TAKEOVER
            and won.kind is StepKind.DONE
        )


def run(console: Console, options: SkewOptions) -> DemoResult:
    say = Narrator(console)
    say.title(
        f"qw demo skew: lease {options.lease_s:g} s; one clock {options.skew_s:g} s fast, "
        f"one {options.skew_s:g} s slow"
    )
    if options.skew_s <= options.lease_s:
        return say.result(DemoResult(False, "--skew must exceed --lease for a clock to steal"))
    with data_dir(options.directory, options.keep, say) as location, ClaimsTail(location) as tail:
        say.note(f"data directory: {location}")
        try:
            honest, takeover = act_fast_clock(location, options, tail, say)
            slow_shown = act_slow_clock(location, options, tail, say)
            alike = _replay_twice_agrees(location)
        except DemoFailed as e:
            return say.result(DemoResult(False, str(e)))
        say.say(f"two readers replay the claims log: all {alike} verdicts agree (no clock)")
        report = load_report(location)
        # the report counts completions: act 1's overlap wrote one DONE, not two
        say.say(f"qw report (it counts completions): exit {report.exit_code}: {report.verdict}")
        write_demo_timeline(
            say, location, "demo-skew", options.directory is not None or options.keep
        )
    if honest.kind is not StepKind.CANCELLED:
        return say.result(
            DemoResult(False, f"the robbed worker's step was {honest.kind.value}, not cancelled")
        )
    if not slow_shown or not report.ok or report.tasks_done != 2:
        return say.result(DemoResult(False, f"act 3 not shown; {report.verdict}"))
    return say.result(
        DemoResult(
            True,
            f"a clock {options.skew_s:g} s fast took a live lease over (@{takeover}) and "
            "every reader agreed; fencing cancelled the robbed handler, so one DONE was "
            "accepted; a slow clock could not steal. Keep skew well under the lease.",
        )
    )
