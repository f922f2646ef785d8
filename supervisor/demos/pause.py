"""`qw demo pause`: fencing. A paused holder loses its lease; its late result is refused.

A worker is frozen (SIGSTOP) while it works a task: a long GC pause, a laptop lid, a VM
migration. Its lease lapses and another worker takes the task over. Then the frozen worker
wakes (SIGCONT) and its handler — one that, like most real code, never looks at the lease —
completes and writes DONE. The fold refuses that DONE: it names a claim that no longer holds
the task (the claim's log position is the fencing token). The task is counted done once,
but its handler ran twice, and `qw report` says so (exit 1). Last, the same log judged by
the original design's rules, without fencing (`qw report --rules unfenced`): they accept
that DONE, so the task would have been completed twice.
"""

from __future__ import annotations

import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from queue_worker.names import worker_label
from queue_worker.producer import Queue
from queue_worker.proof.explain import explain_task
from queue_worker.proof.report import (
    EXIT_WORKED_TWICE,
    clock_text,
    duration_text,
    load_report,
    read_claims,
    read_task,
)
from queue_worker.proof.unfenced import compare
from queue_worker.protocol.records import Claim, Done
from queue_worker.protocol.state import Verdict
from supervisor.demos.common import DemoResult, Narrator, data_dir, write_demo_timeline
from supervisor.demos.fleet import ClaimsTail, DemoFailed, Fleet, Seen, WorkerProcess, wait_for
from supervisor.report_text import render_story, worked_twice_lines
from supervisor.unfenced_text import comparison_lines

#: the handler the demo's workers run (see `stubborn`)
STUBBORN_HANDLER = "supervisor.demos.pause:stubborn"


def stubborn(payload: Any, ctx: Any) -> dict[str, Any]:
    """A handler that never looks at its lease: it works `work_ms` and completes, even if
    the lease was lost meanwhile (ctx.cancelled is ignored on purpose)."""
    time.sleep(ctx.work_ms / 1000)  # monotonic: a SIGSTOP longer than this ends it at once
    return {"task": ctx.task_id, "worker": ctx.worker_id}


@dataclass(frozen=True)
class PauseOptions:
    lease_s: float = 1.0
    work_ms: int = 2500  # the frozen worker's task
    taker_work_ms: int = 300  # the task as the worker that takes it over runs it
    tries: int = 3  # a pause that lands after the handler finished is tried again
    directory: Path | None = None
    keep: bool = False


@dataclass(frozen=True)
class PauseRun:
    """What one run of the scenario saw: the records that tell the story."""

    task: int
    victim: str
    victim_claim: Seen
    takeover: Seen
    stale_done: Seen
    taker_done: Seen


def run_scenario(location: Path, options: PauseOptions, say: Narrator | None = None) -> PauseRun:
    """Pause a holder until it is taken over, resume it, and wait for both completions.
    Raises DemoFailed when something does not happen in time."""
    lease_s, work_s = options.lease_s, options.work_ms / 1000
    patience = lease_s + work_s + 20  # generous: a loaded machine is slow, never wrong
    with (
        Fleet(location, {"handler": STUBBORN_HANDLER, "lease_s": lease_s}) as fleet,
        ClaimsTail(location) as tail,
        Queue(location) as queue,
    ):
        # One worker first, so that it is the one that wins (and is frozen); the taker is
        # started once it is, with a short task, so the demo does not wait out the work twice.
        first = fleet.start("w1", work_ms=options.work_ms)
        for attempt in range(1, options.tries + 1):
            task = queue.enqueue({"demo": "pause", "try": attempt})
            won = _wait_for_win(tail, task, patience)
            victim_id = won.outcome.worker or ""
            fleet.pause(first)
            if _completed(tail, task, won.position):  # too late: its handler had finished
                fleet.resume(first)
                if say:
                    say.note(f"task {task} finished before the pause landed; trying again")
                continue
            if say:
                say.say(
                    f"{worker_label(victim_id)} won task {task} with its CLAIM @{won.position} at "
                    f"{clock_text(_at(won))}; lease {lease_s:g} s, renewed every "
                    f"{lease_s / 2:g} s while the handler works ({work_s:g} s)"
                )
                say.say(f"SIGSTOP {worker_label(victim_id)}: it is frozen mid-task")
            fleet.start("w2", work_ms=options.taker_work_ms, idle_poll_s=0.05)
            return _after_pause(fleet, tail, first, task, won, patience, say)
        raise DemoFailed(f"every one of {options.tries} pauses landed after the handler finished")


def _wait_for_win(tail: ClaimsTail, task: int, patience: float) -> Seen:
    return wait_for(
        lambda: tail.find(lambda s: s.outcome.task == task and s.verdict is Verdict.WON),
        patience,
        f"a worker to win task {task}",
    )


def _at(seen: Seen) -> int:
    assert isinstance(seen.record, Claim | Done)
    return seen.record.at


def _completed(tail: ClaimsTail, task: int, claim: int) -> bool:
    return (
        tail.find(
            lambda s: (
                s.outcome.task == task and isinstance(s.record, Done) and s.record.claim == claim
            )
        )
        is not None
    )


def _after_pause(
    fleet: Fleet,
    tail: ClaimsTail,
    victim: WorkerProcess,
    task: int,
    won: Seen,
    patience: float,
    say: Narrator | None,
) -> PauseRun:
    takeover = tail.wait_for_takeover(won, patience, f"another worker to take task {task} over")
    previous = takeover.outcome.previous
    assert previous is not None
    if say:
        taker = worker_label(takeover.outcome.worker or "")
        say.say(
            f"its lease expired at {clock_text(previous.expiry)}; {taker} "
            f"took task {task} over with CLAIM @{takeover.position}, "
            f"{duration_text(_at(takeover) - previous.expiry)} later (a takeover)"
        )
    fleet.resume(victim)
    if say:
        woken = worker_label(won.outcome.worker or "")
        say.say(f"SIGCONT {woken}: it wakes up; its handler completes")
    stale = wait_for(
        lambda: tail.find(lambda s: isinstance(s.record, Done) and s.record.claim == won.position),
        patience,
        f"the resumed worker's DONE for task {task}",
    )
    taker_done = wait_for(
        lambda: tail.find(lambda s: s.verdict is Verdict.DONE and s.outcome.task == task),
        patience,
        f"the taker's DONE for task {task}",
    )
    if say:
        say.say(
            f"the resumed worker wrote DONE @{stale.position} naming its claim "
            f"@{won.position}: verdict '{stale.verdict.value}' (the holder was claim "
            f"@{takeover.position}): its result is discarded"
        )
        say.say(
            f"{worker_label(takeover.outcome.worker or '')}'s DONE @{taker_done.position}: verdict "
            f"'{taker_done.verdict.value}'"
        )
    return PauseRun(task, won.outcome.worker or "", won, takeover, stale, taker_done)


def run(console: Console, options: PauseOptions) -> DemoResult:
    say = Narrator(console)
    say.title("qw demo pause: fencing a holder that froze while it worked")
    with data_dir(options.directory, options.keep, say) as location:
        say.note(f"data directory: {location}")
        try:
            story = run_scenario(location, options, say)
        except DemoFailed as e:
            return say.result(DemoResult(False, str(e)))
        report = load_report(location)
        say.say("qw why " + str(story.task) + ":")
        console.print(
            render_story(
                explain_task(story.task, read_task(location, story.task), read_claims(location)),
                plain=not console.is_terminal,
            )
        )
        say.say(f"qw report: exit {report.exit_code}: {report.verdict}")
        for line in worked_twice_lines(report):
            say.note(line)
        comparison = compare(read_claims(location))
        title, *lines = comparison_lines(comparison)
        say.say(f"qw report --rules unfenced: {title}")
        width = max(40, console.width - 6)
        for line in lines:  # each wrapped under its note's indent, two more after its first
            say.note("\n      ".join(textwrap.wrap(line, width, break_on_hyphens=False)))
        kept = options.directory is not None or options.keep
        write_demo_timeline(say, location, "demo-pause", kept, unfenced=True)
        both = tuple(sorted((story.taker_done.position, story.stale_done.position)))
        shown = (
            comparison.completed_twice == {story.task: both}
            and story.stale_done.verdict is Verdict.STALE_DONE
            and [w.task for w in report.worked_twice] == [story.task]
            and report.exit_code == EXIT_WORKED_TWICE
            and report.completions_accepted == report.tasks_done
        )
        if not shown:
            return say.result(
                DemoResult(
                    False,
                    f"expected task {story.task} refused once, reported worked twice, and "
                    f"completed twice without fencing; the report says: {report.verdict}",
                )
            )
        return say.result(
            DemoResult(
                True,
                f"task {story.task} was counted done once (DONE @{story.taker_done.position}) "
                f"and the frozen worker's DONE @{story.stale_done.position} was refused; "
                "the report names the task as worked twice: fencing stops a double "
                "completion, not double work (handlers should honour ctx.cancelled); "
                "without fencing, the original's rules would have completed it twice",
            )
        )
