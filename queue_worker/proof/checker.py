"""The run in the checkers' language: Jepsen's total-queue classes, from the fold's verdicts.

Jepsen's total-queue checker sorts every element of a queue test into: *ok* (enqueued and
dequeued once), *lost* (enqueued, never dequeued), *duplicated* (dequeued more than once),
*unexpected* (dequeued, never enqueued) and *recovered* (dequeued only after a failure).
Here "dequeued" is a DONE the fold accepted, and the classes read:

lost         published, not done, not held, not dead, not waiting for a retry: nobody is
             doing it and nobody will unless a worker claims it (in a live queue a task not
             yet claimed is here too; after a drain, none should be)
duplicated   completed more than once: two accepted DONEs for one task. The fold forbids it;
             a run that shows one is a bug in qw. A violation.
unexpected   a DONE for a task id the tasks log never published
recovered    done after a takeover: its first holder's lease lapsed and another claim won it

Two things people confuse are kept apart:

run again    a task with more than one winning claim: its lease lapsed (a holder died,
             froze, or ran past it) and another worker ran it. At-least-once delivery: normal.
completed twice  `duplicated` above: never allowed.

Between them sits "ran to completion twice": a claim that lost its lease still finished
and wrote a DONE the fold refused (the report's "worked twice"): the work happened twice,
one result was discarded, the task still counted done once.

`QueueChecker` takes each record with the fold's outcome, in log order (the report feeds it
from its own replay: no second pass over the log); `result` gives the classes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any, Final

from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Fail
from queue_worker.protocol.state import Outcome, Verdict

#: task ids listed per class (the counts are always whole)
LISTED: Final = 20


@dataclass(frozen=True)
class QueueChecks:
    """The classes of a run's tasks, and a few of each class's ids."""

    published: int = 0
    ok: int = 0  # done exactly once
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    recovered: int = 0
    run_again: int = 0  # more than one winning claim (at-least-once)
    ran_to_completion_twice: int = 0  # a refused DONE from a claim that had won
    lost_tasks: tuple[int, ...] = ()
    duplicated_tasks: tuple[int, ...] = ()
    unexpected_tasks: tuple[int, ...] = ()
    recovered_tasks: tuple[int, ...] = ()

    @property
    def valid(self) -> bool:
        """No class that is never allowed: nothing completed twice, nothing unexpected."""
        return not self.duplicated and not self.unexpected

    def lines(self) -> list[str]:
        """What the run shows, one class a line, as the report prints it."""

        def ids(tasks: tuple[int, ...], count: int) -> str:
            if not tasks:
                return ""
            more = f", … {count - len(tasks)} more" if count > len(tasks) else ""
            noun = "task" if count == 1 else "tasks"
            return f" ({noun} {', '.join(map(str, tasks))}{more})"

        return [
            f"ok: {self.ok} of {self.published} published tasks done exactly once",
            f"lost: {self.lost}{ids(self.lost_tasks, self.lost)}"
            + (" (not done, held, dead or waiting: pending if the queue still runs)"
               if self.lost else ""),
            f"duplicated (completed twice, never allowed): {self.duplicated}"
            + ids(self.duplicated_tasks, self.duplicated),
            f"unexpected (done, never published): {self.unexpected}"
            + ids(self.unexpected_tasks, self.unexpected),
            f"recovered (done after a takeover): {self.recovered}"
            + ids(self.recovered_tasks, self.recovered),
            f"run again after a lease lapsed (at-least-once, allowed): {self.run_again}"
            + (f", {self.ran_to_completion_twice} of them ran to completion twice "
               "(one result refused)" if self.ran_to_completion_twice else ""),
        ]  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in data.items():
            if isinstance(value, tuple):
                data[name] = list(value)
        return data | {"valid": self.valid, "summary": self.summary}

    @property
    def summary(self) -> str:
        """One line: which classes the run shows."""
        shows = [
            f"{n} {name}"
            for n, name in (
                (self.lost, "lost"),
                (self.duplicated, "duplicated"),
                (self.unexpected, "unexpected"),
                (self.recovered, "recovered"),
            )
            if n
        ]
        word = "VALID" if self.valid else "INVALID"
        return f"total-queue check: {word}: " + (", ".join(shows) or "every task ok")


@dataclass
class QueueChecker:
    """Sorts tasks into the total-queue classes as the fold's outcomes arrive."""

    done: Counter[int] = field(default_factory=Counter)  # accepted DONEs per task
    done_any: set[int] = field(default_factory=set)  # tasks any DONE names
    wins: Counter[int] = field(default_factory=Counter)
    won_claims: set[int] = field(default_factory=set)
    taken_over: set[int] = field(default_factory=set)
    held: set[int] = field(default_factory=set)
    waiting: set[int] = field(default_factory=set)
    dead: set[int] = field(default_factory=set)
    completed_twice: set[int] = field(default_factory=set)  # a refused DONE of a won claim

    def apply(self, record: ClaimsRecord, outcome: Outcome) -> None:
        v = outcome.verdict
        if isinstance(record, Claim):
            if v.won:
                self.wins[record.task] += 1
                self.won_claims.add(outcome.position)
                self.held.add(record.task)
                self.waiting.discard(record.task)
                if v is Verdict.TAKEOVER:
                    self.taken_over.add(record.task)
        elif isinstance(record, Done):
            self.done_any.add(record.task)
            if v is Verdict.DONE:
                self.done[record.task] += 1
                self.held.discard(record.task)
            elif record.claim in self.won_claims and self.wins[record.task] > 1:
                self.completed_twice.add(record.task)
        elif isinstance(record, Fail) and v in (Verdict.RELEASED, Verdict.DEAD):
            self.held.discard(record.task)
            (self.waiting if v is Verdict.RELEASED else self.dead).add(record.task)

    def result(self, published: int) -> QueueChecks:
        def first(tasks: set[int] | list[int]) -> tuple[int, ...]:
            return tuple(sorted(tasks)[:LISTED])

        lost = [
            t
            for t in range(published)
            if t not in self.done and t not in self.held and t not in self.dead
            and t not in self.waiting
        ]  # fmt: skip
        duplicated = {t for t, n in self.done.items() if n > 1}
        unexpected = {t for t in self.done_any if not 0 <= t < published}
        recovered = {t for t in self.done if t in self.taken_over}
        return QueueChecks(
            published=published,
            ok=sum(1 for t, n in self.done.items() if n == 1 and 0 <= t < published),
            lost=len(lost),
            duplicated=len(duplicated),
            unexpected=len(unexpected),
            recovered=len(recovered),
            run_again=sum(1 for n in self.wins.values() if n > 1),
            ran_to_completion_twice=len(self.completed_twice),
            lost_tasks=first(lost),
            duplicated_tasks=first(duplicated),
            unexpected_tasks=first(unexpected),
            recovered_tasks=first(recovered),
        )
