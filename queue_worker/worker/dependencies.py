"""Dependencies: `f.enqueue(..., after=[h1, h2])` (docs/protocol.md §4, "Dependencies").

A task with dependencies (a TASK of type "A": the ids of earlier tasks, which the task index
keeps, `TaskIndex.after`) waits for them:

waiting   while one of them is open (neither done nor dead) and none is dead, no worker
          tries it (a pick rule: `Waiting`, which `Picker.pick` adds to what it leaves alone).
ready     once all of them are done it is claimable as any task, and runs.
doomed    once one of them is dead it is claimable too, and the worker whose CLAIM wins does
          not run it: it writes a dead FAIL under that claim, "dependency D is dead: <D's
          error>" (`refusal`, asked of the worker's own fold, or of the server's state on a
          Redis queue with server verdicts, where the server's pick keeps the waiting:
          queue_worker/redis/lua/parked.lua).

The fold does not decide the death itself: it reads no tasks topic (protocol Rule 0), so it
does not know the dependencies. It needs not: what decides is in the claims log before the
dependent's CLAIM (D's dead verdict, for ever), and the dead FAIL writes the decision down,
so every reader folds the same verdict. Done and dead are for good, so a pick on any fold
that saw them is right at the CLAIM too. A worker that wins a claim while a dependency is
still open (no qw pick does: a foreign writer's CLAIM) releases the task with a FAIL and
its usual backoff instead of running it.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Protocol

from queue_worker.protocol.records import error_field
from queue_worker.protocol.state import ClaimState
from queue_worker.worker.handlers import HandlerOutcome


class DependencyStates(Protocol):
    """What `refusal` asks of a fold: the worker's own (`ClaimState`), or the server's
    (`queue_worker.redis.server_verdicts.TaskViews`)."""

    def is_closed(self, task: int) -> bool: ...

    def is_dead(self, task: int) -> bool: ...

    def dead_error(self, task: int) -> str | None: ...


def waits(after: Sequence[int], state: ClaimState) -> bool:
    """Is a task with these dependencies still waiting (one open, none dead)?"""
    waiting = False
    for dependency in after:
        if state.is_dead(dependency):
            return False
        if not state.is_closed(dependency):
            waiting = True
    return waiting


class Waiting:
    """`excluded` plus the tasks still waiting for a dependency: what a pick leaves alone."""

    __slots__ = ("after", "excluded", "state")

    def __init__(
        self, excluded: Container[int], after: Mapping[int, Sequence[int]], state: ClaimState
    ) -> None:
        self.excluded = excluded
        self.after = after
        self.state = state

    def __contains__(self, task: object) -> bool:
        after = self.after.get(task) if isinstance(task, int) else None
        if after is not None and waits(after, self.state):
            return True
        return task in self.excluded


def refusal(after: Sequence[int], state: DependencyStates) -> HandlerOutcome | None:
    """What the winner of a claim writes instead of running the task: a dead FAIL naming a
    dead dependency (the lowest), a FAIL to retry when one is still open; None: all done."""
    for dependency in after:
        if state.is_dead(dependency):
            error = state.dead_error(dependency) or ""
            return HandlerOutcome(
                error=error_field(f"dependency {dependency} is dead: {error}"), permanent=True
            )
    for dependency in after:
        if not state.is_closed(dependency):
            return HandlerOutcome(error=f"dependency {dependency} is not done yet")
    return None
