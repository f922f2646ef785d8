"""What `qw report` proves of dependencies (`enqueue(after=…)`, queue_worker.worker.dependencies):
no task ran before its dependencies were done.

From the logs alone: a task with dependencies that is done was completed under a claim that
won after every one of them was done (its accepted DONE's claim, the last winning CLAIM
before it, stands after each dependency's accepted DONE). A dependency closed in history
that compaction removed was done before every retained record. `check_dependencies` is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DependencyProof:
    """The tasks with dependencies in the logs, how they ended, and what breaks the rule."""

    tasks: int
    done: int
    dead: int
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def line(self) -> str:
        """``dependencies: 5 tasks — 3 done after theirs, 2 dead``"""
        head = f"dependencies: {self.tasks} task{'s' * (self.tasks != 1)} with them"
        if not self.ok:
            return f"{head}, {len(self.problems)} run before theirs were done"
        return f"{head} — {self.done} done after theirs, {self.dead} dead, none run early"


def check_dependencies(
    after: Iterable[tuple[int, tuple[int, ...]]],
    done_at: Mapping[int, int],
    done_claim: Mapping[int, int],
    dead: Iterable[int],
    first_retained: int = 0,
) -> DependencyProof | None:
    """`after`: (task, its dependencies); `done_at`: each task's accepted DONE position;
    `done_claim`: the claim that DONE acted under; `dead`: the tasks dead; tasks below
    `first_retained` were closed in history compaction removed. None: no task has any."""
    dead_tasks = set(dead)
    tasks = done = died = 0
    problems: list[str] = []
    for task, dependencies in after:
        tasks += 1
        died += task in dead_tasks
        claim = done_claim.get(task)
        if claim is None:
            continue
        done += 1
        for dependency in dependencies:
            if dependency < first_retained:
                continue
            finished = done_at.get(dependency)
            if finished is None or finished > claim:
                when = "never done" if finished is None else f"done @{finished}"
                problems.append(
                    f"task {task} was completed under claim @{claim} (DONE @{done_at[task]}), "
                    f"but its dependency {dependency} was {when}"
                )
    if not tasks:
        return None
    return DependencyProof(tasks, done, died, tuple(problems))
