"""`qw demo collisions`: how the pick strategy decides how many claim attempts are wasted.

One backlog, the same number of workers, three runs: `first` (everyone tries the lowest
claimable id), `random`, and `spread` (each worker prefers its own residue class of ids).
Two workers that try for one task at about the same time both append a CLAIM; the log's
order picks the winner and the other attempt is lost. The table counts those losses from
the replay of each run's claims log (the same numbers `qw report` prints).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from queue_worker.names import worker_label
from queue_worker.producer import Queue
from queue_worker.proof.report import Report, duration_text, load_report, read_claims
from queue_worker.protocol.records import Claim
from queue_worker.protocol.state import ClaimState, Verdict
from queue_worker.worker.config import PICK_STRATEGIES
from supervisor.demos.common import DemoResult, Narrator, data_dir, write_demo_timeline
from supervisor.demos.fleet import ClaimsTail, DemoFailed, Fleet, wait_for


@dataclass(frozen=True)
class CollisionOptions:
    workers: int = 8
    tasks: int = 400
    work_ms: int = 5
    lease_s: float = 10.0
    directory: Path | None = None
    keep: bool = False


def run_strategy(location: Path, pick: str, options: CollisionOptions) -> Report:
    """Start the workers idle, publish the whole backlog at once, wait until they have
    drained it and exited, and replay the log."""
    patience = 30 + options.tasks * options.work_ms / 1000
    with Fleet(
        location,
        {
            "pick": pick,
            "work_ms": options.work_ms,
            "lease_s": options.lease_s,
            "fsync": "none",  # the demo is about collisions, not durability: keep it quick
            "idle_poll_s": 0.05,
        },
    ) as fleet:
        for slot in range(options.workers):
            fleet.start(f"{pick}{slot}", slot=slot, slots=options.workers)
        # Everyone idle first: the backlog then lands on workers that all look at once.
        wait_for(fleet.started, patience, f"{options.workers} workers to start")
        with ClaimsTail(location) as tail, Queue(location, fsync="none") as queue:
            queue.enqueue_many({"n": n} for n in range(options.tasks))
            wait_for(
                lambda: tail.poll() is not None and tail.follower.state.done_count >= options.tasks,
                patience,
                f"the {pick} workers to finish the backlog",
            )
    return load_report(location)


def run(console: Console, options: CollisionOptions) -> DemoResult:
    say = Narrator(console)
    say.title(
        f"qw demo collisions: {options.tasks} tasks, {options.workers} workers, "
        f"{options.work_ms} ms of work each, under every pick strategy"
    )
    reports: dict[str, Report] = {}
    with data_dir(options.directory, options.keep, say) as root:
        for pick in PICK_STRATEGIES:
            location = root / pick
            say.say(f"pick={pick}: {location}")
            try:
                reports[pick] = run_strategy(location, pick, options)
            except DemoFailed as e:
                return say.result(DemoResult(False, f"pick={pick}: {e}"))
            example = first_collision(location)
            say.note(
                f"{reports[pick].lost} of {reports[pick].attempts} attempts lost"
                + (f"; the first: {example}" if example else "")
            )
            kept = options.directory is not None or options.keep
            write_demo_timeline(say, location, f"demo-collisions-{pick}", kept)
    console.print(collision_table(reports, plain=not console.is_terminal))
    return say.result(judge(reports, options.tasks))


def first_collision(location: Path) -> str | None:
    """The first lost claim of a run, told with the positions of the records it lost to."""
    state = ClaimState()
    done_at: dict[int, int] = {}
    for position, record in read_claims(location):
        outcome = state.apply(record, position)
        if outcome.verdict is Verdict.DONE and outcome.task is not None:
            done_at[outcome.task] = position
        if not isinstance(record, Claim):
            continue
        if outcome.verdict is Verdict.LOST_HELD and outcome.holder is not None:
            holder = outcome.holder
            gap = record.at - holder.at
            loser, winner = worker_label(record.worker), worker_label(holder.worker)
            lost = (
                f"{loser}'s CLAIM @{position} for task {record.task} lost: {winner}'s "
                f"CLAIM @{holder.claim} came first in the log and holds the task"
            )
            if gap < 0:  # the clocks say otherwise: the log's order still decides
                return (
                    f"{lost}, although {loser}'s is dated {duration_text(-gap)} earlier: "
                    "the order in the log decides, not the clocks"
                )
            return f"{lost} ({winner}'s is dated {duration_text(gap)} earlier)"
        if outcome.verdict is Verdict.LOST_DONE:
            return (
                f"{worker_label(record.worker)}'s CLAIM @{position} for task {record.task} "
                f"came after its DONE @{done_at.get(record.task, '?')}: the claimant had picked it "
                "from a view of the log that was already out of date"
            )
    return None


def collision_table(reports: dict[str, Report], plain: bool) -> Table:
    table = Table(
        title="lost claim attempts by pick strategy",
        title_justify="left",
        box=None if plain else box.SIMPLE_HEAD,
    )
    for column in ("pick", "attempts", "wins", "lost", "lost %", "done", "claims log"):
        table.add_column(column, justify="left" if column == "pick" else "right")
    for pick, r in reports.items():
        table.add_row(
            pick,
            str(r.attempts),
            str(r.wins),
            str(r.lost),
            f"{r.lost_percent:.1f}%",
            str(r.tasks_done),
            f"@0..@{r.claims_position}",
        )
    return table


def judge(reports: dict[str, Report], tasks: int) -> DemoResult:
    """What the demo claims: every run finished every task exactly once, and `first`
    wasted more attempts than either other strategy."""
    for pick, r in reports.items():
        if r.tasks_done != tasks or not r.ok:
            return DemoResult(False, f"pick={pick}: {r.tasks_done}/{tasks} done; {r.verdict}")
    first = reports["first"].lost
    others = {p: r.lost for p, r in reports.items() if p != "first"}
    if not all(first > lost for lost in others.values()):
        return DemoResult(
            False,
            f"pick=first lost {first} attempts, not more than {others}: with this few "
            "workers or this much work per task, the workers rarely looked at once",
        )
    best = min(others, key=lambda p: others[p])
    return DemoResult(
        True,
        f"every task was done exactly once under each strategy; pick=first lost "
        f"{first} attempts ({reports['first'].lost_percent:.1f}%) against {others[best]} "
        f"for pick={best}: workers that all pick the lowest id collide on it",
    )
