"""The run in the checkers' language: Jepsen's total-queue classes, from the fold's verdicts.

Jepsen's total-queue checker sorts every element of a queue test into: *ok* (enqueued and
dequeued once), *lost* (enqueued, never dequeued), *duplicated* (dequeued more than once),
*unexpected* (dequeued, never enqueued) and *recovered* (dequeued only after a failure).
Here "dequeued" is a DONE the fold accepted. A queue whose logs keep every task has no task
that a later run cannot finish, so Jepsen's "lost" splits into the words a user reads:

ok           done exactly once
pending      published, not done, nobody holds it: never claimed, or failed and waiting for
             its retry. It runs when a worker claims it (after a `q`, at the next `qw up`).
held         a claim holds it. If its worker is gone (killed, or the run stopped), a survivor
             takes it over once the lease lapses: at the next `qw up` if none runs.
dead         every attempt failed (--max-attempts used up): it never runs again by itself
lost         really gone: a record of the claims log names it, but its TASK record is not in
             the tasks log (cut short, or replaced), and no DONE names it: nobody can run it.
             A violation.
duplicated   completed more than once: two accepted DONEs for one task. The fold forbids it;
             a run that shows one is a bug in qw. A violation.
unexpected   a DONE for a task id the tasks log does not hold. A violation.
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


def _plural(count: int, word: str) -> str:
    return word if count == 1 else f"{word}s"


@dataclass(frozen=True)
class QueueChecks:
    """The classes of a run's tasks, and a few of each class's ids."""

    published: int = 0
    ok: int = 0  # done exactly once
    pending: int = 0
    retrying: int = 0  # of the pending, those a FAIL released to wait for a retry
    held: int = 0
    dead: int = 0
    dead_attempts: tuple[int, int] = (0, 0)  # fewest and most attempts of a dead task
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    recovered: int = 0
    run_again: int = 0  # more than one winning claim (at-least-once)
    ran_to_completion_twice: int = 0  # a refused DONE from a claim that had won
    pending_tasks: tuple[int, ...] = ()
    held_tasks: tuple[int, ...] = ()
    dead_tasks: tuple[int, ...] = ()
    lost_tasks: tuple[int, ...] = ()
    duplicated_tasks: tuple[int, ...] = ()
    unexpected_tasks: tuple[int, ...] = ()
    recovered_tasks: tuple[int, ...] = ()

    @property
    def valid(self) -> bool:
        """No class that is never allowed: nothing lost, completed twice or unexpected."""
        return not self.lost and not self.duplicated and not self.unexpected

    @property
    def attempts_used(self) -> str:
        """The attempts the dead used, as the fold counted them: "attempts used up: 3 each"."""
        low, high = self.dead_attempts
        if not high:
            return "attempts used up"
        if low == high:
            return f"attempts used up: {high} each"
        return f"attempts used up: {low} to {high}"

    @property
    def dead_text(self) -> str:
        """The dead and their attempts: "3 dead (attempts used up: 3 each)"."""
        return f"{self.dead} dead ({self.attempts_used})"

    def lines(self) -> list[str]:
        """What the run shows, one class a line, as the report prints it."""

        def ids(tasks: tuple[int, ...], count: int) -> str:
            if not tasks:
                return ""
            more = f", … {count - len(tasks)} more" if count > len(tasks) else ""
            return f" ({_plural(count, 'task')} {', '.join(map(str, tasks))}{more})"

        retrying = f", {self.retrying} of them waiting for a retry" if self.retrying else ""
        return [
            f"ok: {self.ok} of {self.published} published tasks done exactly once",
            f"pending (not done, not held: a worker runs it when it claims it): "
            f"{self.pending}{retrying}"
            + ids(self.pending_tasks, self.pending),
            f"held (a claim holds it; a survivor takes it over if its worker is gone): "
            f"{self.held}" + ids(self.held_tasks, self.held),
            "dead (every attempt failed; never runs again by itself): "
            + (self.dead_text if self.dead else "0")
            + ids(self.dead_tasks, self.dead),
            f"lost (named by the claims log, its TASK record gone, no DONE; never "
            f"allowed): {self.lost}" + ids(self.lost_tasks, self.lost),
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
        """One line: which classes the run shows, the violations first."""

        def shown(*classes: tuple[int, str]) -> list[str]:
            return [text for n, text in classes if n]

        unfinished = ", ".join(
            shown((self.held, f"{self.held} held"), (self.pending, f"{self.pending} pending"))
        )
        if unfinished:
            unfinished += " (unfinished, not lost: a worker runs them, the next qw up if none runs)"
        shows = shown(
            (self.lost, f"{self.lost} lost"),
            (self.duplicated, f"{self.duplicated} duplicated"),
            (self.unexpected, f"{self.unexpected} unexpected"),
            (self.dead, self.dead_text),
            (len(unfinished), unfinished),
            (self.recovered, f"{self.recovered} recovered"),
        )
        if not shows:
            shows = [
                f"every task done exactly once ({self.ok})" if self.published
                else "no task published"
            ]  # fmt: skip
        word = "VALID" if self.valid else "INVALID"
        return f"total-queue check: {word}: " + ", ".join(shows)


@dataclass
class QueueChecker:
    """Sorts tasks into the total-queue classes as the fold's outcomes arrive."""

    done: Counter[int] = field(default_factory=Counter)  # accepted DONEs per task
    done_any: set[int] = field(default_factory=set)  # tasks any DONE names
    named: set[int] = field(default_factory=set)  # tasks any record names
    wins: Counter[int] = field(default_factory=Counter)
    won_claims: set[int] = field(default_factory=set)
    taken_over: set[int] = field(default_factory=set)
    held: set[int] = field(default_factory=set)
    waiting: set[int] = field(default_factory=set)
    dead: set[int] = field(default_factory=set)
    completed_twice: set[int] = field(default_factory=set)  # a refused DONE of a won claim

    def apply(self, record: ClaimsRecord, outcome: Outcome) -> None:
        v = outcome.verdict
        if isinstance(record, Claim | Done | Fail):
            self.named.add(record.task)
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

        def published_task(t: int) -> bool:
            return 0 <= t < published

        pending = [
            t
            for t in range(published)
            if t not in self.done and t not in self.held and t not in self.dead
        ]
        held = {t for t in self.held if published_task(t)}
        dead = {t for t in self.dead if published_task(t)}
        lost = {t for t in self.named - self.done_any if not published_task(t)}
        duplicated = {t for t, n in self.done.items() if n > 1}
        unexpected = {t for t in self.done_any if not published_task(t)}
        recovered = {t for t in self.done if t in self.taken_over}
        attempts = [self.wins[t] for t in dead if self.wins[t]]
        return QueueChecks(
            published=published,
            ok=sum(1 for t, n in self.done.items() if n == 1 and published_task(t)),
            pending=len(pending),
            retrying=sum(1 for t in pending if t in self.waiting),
            held=len(held),
            dead=len(dead),
            dead_attempts=(min(attempts), max(attempts)) if attempts else (0, 0),
            lost=len(lost),
            duplicated=len(duplicated),
            unexpected=len(unexpected),
            recovered=len(recovered),
            run_again=sum(1 for n in self.wins.values() if n > 1),
            ran_to_completion_twice=len(self.completed_twice),
            pending_tasks=first(pending),
            held_tasks=first(held),
            dead_tasks=first(dead),
            lost_tasks=first(lost),
            duplicated_tasks=first(duplicated),
            unexpected_tasks=first(unexpected),
            recovered_tasks=first(recovered),
        )
