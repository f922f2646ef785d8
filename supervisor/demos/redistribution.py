"""`qw demo redistribution`: kill -9 a worker mid-task; a survivor finishes the task.

A killed worker writes nothing more: no DONE, no release. Its task is not lost, because its
claim carries a lease: once the lease has run out by the records' timestamps, the next
CLAIM for the task wins (a takeover) and a survivor runs it. The demo kills a holder,
restarts its slot at once as `qw up` does (a new worker id), waits for the takeover and the
completion in the log, and replays the log to show every task done exactly once.

The taker must be a survivor — a worker that was running when the victim was killed — not
the victim's replacement: the pick rules leave a predecessor's lapsed task to the others
("not by the heir", queue_worker/worker/pick.py). A replacement taking it is a failed demo.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from queue_worker.names import worker_label
from queue_worker.producer import Queue
from queue_worker.proof.report import clock_text, duration_text, load_report
from queue_worker.protocol.records import Claim, Done
from queue_worker.protocol.state import Lease, Verdict
from supervisor.demos.common import DemoResult, Narrator, data_dir, write_demo_timeline
from supervisor.demos.fleet import (
    ClaimsTail,
    DemoFailed,
    Fleet,
    Seen,
    WorkerProcess,
    wait_for,
)


@dataclass(frozen=True)
class RedistributionOptions:
    workers: int = 3
    tasks: int = 6
    lease_s: float = 2.0
    work_ms: int = 1500
    tries: int = 3  # a kill that lands after the task finished is tried on another holder
    directory: Path | None = None
    keep: bool = False


@dataclass(frozen=True)
class Redistribution:
    task: int
    victim: str
    victim_claim: Seen
    takeover: Seen
    done: Seen
    survivors: frozenset[str]  # the worker ids running when the victim was killed
    replacement: str | None  # the victim's replacement's id, once it published one


def _done_under(tail: ClaimsTail, claim: int) -> Seen | None:
    return tail.find(lambda s: isinstance(s.record, Done) and s.record.claim == claim)


def _process_of(fleet: Fleet, worker_id: str, patience: float) -> WorkerProcess:
    return wait_for(lambda: fleet.process_of(worker_id), patience, f"the process of {worker_id}")


def _record_at(tail: ClaimsTail, position: int) -> Seen | None:
    return tail.find(lambda s: s.position == position)


def _a_holder(tail: ClaimsTail, killed: set[str]) -> Lease | None:
    """A lease held now by a worker that is still alive, as far as the log says."""
    tail.poll()
    return next(
        (lease for _, lease in tail.follower.state.held_tasks() if lease.worker not in killed),
        None,
    )


def run_scenario(
    location: Path, options: RedistributionOptions, say: Narrator | None = None
) -> Redistribution:
    patience = options.lease_s + options.work_ms / 1000 * options.tasks + 20
    with (
        Fleet(
            location,
            {"lease_s": options.lease_s, "work_ms": options.work_ms, "idle_poll_s": 0.05},
        ) as fleet,
        ClaimsTail(location) as tail,
        Queue(location) as queue,
    ):
        for slot in range(options.workers):
            fleet.start(f"w{slot}", slot=slot, slots=options.workers)
        queue.enqueue_many({"n": n} for n in range(options.tasks))
        killed: set[str] = set()
        for _ in range(options.tries):
            # Every worker has published its id, so the survivors are known by id.
            wait_for(fleet.started, patience, "every worker to start")
            lease = wait_for(lambda: _a_holder(tail, killed), patience, "a worker to hold a task")
            victim = _process_of(fleet, lease.worker, patience)
            survivors = frozenset(set(fleet.worker_ids()) - killed - {lease.worker})
            fleet.kill(victim)
            killed.add(lease.worker)
            # As `qw up` restarts a dead slot: the same name and slot, a new worker id.
            heir = fleet.start(victim.name, slot=victim.config.slot, slots=victim.config.slots)
            if _done_under(tail, lease.claim) is not None:
                continue  # it finished before the kill landed: kill another holder
            won = _record_at(tail, lease.claim)
            task = won.outcome.task if won is not None else None
            assert won is not None and task is not None and isinstance(won.record, Claim)
            if say:
                say.say(
                    f"{worker_label(lease.worker)} holds task {task} (CLAIM @{won.position} at "
                    f"{clock_text(won.record.at)}, lease {options.lease_s:g} s, renewed "
                    f"every {options.lease_s / 2:g} s)"
                )
                say.say(
                    f"kill -9 {victim.pid} ({worker_label(lease.worker)}): it writes nothing "
                    f"more; its slot {victim.name} is restarted as pid {heir.pid}, as qw up does"
                )
            takeover, done = _after_kill(tail, task, won, patience, say)
            replacement = next(
                (w for w, pid in fleet.worker_ids().items() if pid == heir.pid), None
            )
            return Redistribution(task, lease.worker, won, takeover, done, survivors, replacement)
        raise DemoFailed(f"every one of {options.tries} kills landed after its task finished")


def _after_kill(
    tail: ClaimsTail,
    task: int,
    won: Seen,
    patience: float,
    say: Narrator | None,
) -> tuple[Seen, Seen]:
    """Wait for the takeover of the victim's claim `won`, and for its DONE."""
    takeover = tail.wait_for_takeover(won, patience, f"a survivor to take task {task} over")
    previous = takeover.outcome.previous
    assert previous is not None and isinstance(takeover.record, Claim)
    if say:
        say.say(
            f"the victim's lease ran out at {clock_text(previous.expiry)} (by its own records); "
            f"{worker_label(takeover.outcome.worker or '')} took task {task} over with CLAIM "
            f"@{takeover.position}, "
            f"{duration_text(takeover.record.at - previous.expiry)} after it expired"
        )
    done = wait_for(
        lambda: _done_under(tail, takeover.position), patience, f"task {task} to be finished"
    )
    if say:
        say.say(
            f"{worker_label(done.outcome.worker or '')} finished task {task}: "
            f"DONE @{done.position}, verdict '{done.verdict.value}'"
        )
    return takeover, done


def run(console: Console, options: RedistributionOptions) -> DemoResult:
    say = Narrator(console)
    say.title(
        f"qw demo redistribution: {options.workers} workers, {options.tasks} tasks of "
        f"{options.work_ms} ms, lease {options.lease_s:g} s; one holder is killed with -9"
    )
    with data_dir(options.directory, options.keep, say) as location:
        say.note(f"data directory: {location}")
        try:
            story = run_scenario(location, options, say)
        except DemoFailed as e:
            return say.result(DemoResult(False, str(e)))
        report = load_report(location)
        say.say(f"qw report: exit {report.exit_code}: {report.verdict}")
        for t in report.takeovers:
            say.note(
                f"takeover of task {t.task} @{t.position}: {worker_label(t.victim)} -> "
                f"{worker_label(t.new_holder)}, "
                f"{duration_text(t.gap_after_last)} after the victim's last record"
            )
        write_demo_timeline(
            say, location, "demo-redistribution", options.directory is not None or options.keep
        )
    new_holder = story.takeover.outcome.worker or ""
    victim, taker = worker_label(story.victim), worker_label(new_holder)
    if new_holder == story.victim:
        return say.result(DemoResult(False, f"the new holder of task {story.task} is the victim"))
    if new_holder not in story.survivors:
        who = (
            "the victim's own replacement" if new_holder == story.replacement else "not a survivor"
        )
        return say.result(
            DemoResult(
                False,
                f"task {story.task} was taken from {victim} by {taker}, which was not running "
                f"when {victim} was killed ({who})",
            )
        )
    if story.done.verdict is not Verdict.DONE or not report.ok:
        return say.result(
            DemoResult(False, f"task {story.task}: {story.done.verdict.value}; {report.verdict}")
        )
    return say.result(
        DemoResult(
            True,
            f"task {story.task} was redistributed from the killed {victim} to {taker} (a "
            f"survivor; takeover @{story.takeover.position}, DONE @{story.done.position}) "
            "and no task was worked twice",
        )
    )
