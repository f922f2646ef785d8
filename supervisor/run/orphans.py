"""The tasks a death left behind, from the death until a while after their takeover.

When a worker dies holding tasks, the supervisor reads them once from the log
(`Monitor.tasks_held_by`, after the fold has caught up with everything the dead process
wrote) and gives them to `OrphanBook.died`. The same list names the task in the kill
message, the death message and the orphans panel, so they always agree; the takeover the
fold sees later (`Monitor.takeover_of`) completes each entry.

The book also keeps the dead worker's row: a slot restarts within a second, and without it
the lease countdown a kill -9 sets off would vanish before it runs out.

Pure bookkeeping: the caller passes `now` and holds the supervisor's lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from queue_worker.names import worker_label
from supervisor.run.model import Orphan, WorkerView

#: an orphan stays on screen this long after its takeover was seen
KEEP_AFTER_TAKEOVER_S: Final = 10.0
#: a dead worker's row stays at least this long after the death (longer while its orphans wait)
DEPARTED_MIN_S: Final = 5.0
#: and this long after its last orphan was taken over (its lease cell then reads "taken")
DEPARTED_AFTER_TAKEOVER_S: Final = 3.0
#: orphans kept at most (a crash loop must not grow the book for ever): the oldest go first
ORPHANS_KEPT: Final = 64


class TakeoverLike(Protocol):
    """What the book needs to know about a takeover (`supervisor.run.monitor.Takeover`)."""

    @property
    def worker(self) -> str: ...

    @property
    def previous(self) -> str: ...

    @property
    def at(self) -> float: ...


@dataclasses.dataclass
class _Entry:
    orphan: Orphan
    seen_taken_at: float | None = None  # when the book learned of the takeover (now)


class OrphanBook:
    """Orphaned tasks and departed workers' rows, pruned as time goes by."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self._departed: list[WorkerView] = []

    def died(
        self,
        view: WorkerView,
        tasks: Sequence[tuple[int, float]],
        *,
        now: float,
    ) -> None:
        """`view` (a worker that has just died) held `tasks`: (task, lease expiry in wall
        seconds) as the log says."""
        worker_id = view.worker_id or ""
        died_at = view.died_at if view.died_at is not None else now
        label = view.label
        for task, expiry in tasks:
            self._entries = [e for e in self._entries if e.orphan.task != task]
            orphan = Orphan(task, label, worker_id, view.slot, died_at, expiry)
            self._entries.append(_Entry(orphan))
        del self._entries[:-ORPHANS_KEPT]
        self._departed = [d for d in self._departed if d.pid != view.pid]
        self._departed.append(view)

    def update(self, takeover_of: Callable[[int], TakeoverLike | None], *, now: float) -> None:
        """Complete the orphans the fold has seen taken over, and forget the old ones."""
        for entry in self._entries:
            orphan = entry.orphan
            if orphan.heir is not None:
                continue
            taken = takeover_of(orphan.task)
            if taken is None or taken.previous != orphan.holder_id:
                continue
            entry.orphan = dataclasses.replace(
                orphan, heir=worker_label(taken.worker), taken_at=taken.at
            )
            entry.seen_taken_at = now
        self._entries = [
            e
            for e in self._entries
            if e.seen_taken_at is None or now - e.seen_taken_at < KEEP_AFTER_TAKEOVER_S
        ]
        waiting = {
            e.orphan.holder_id
            for e in self._entries
            if e.seen_taken_at is None or now - e.seen_taken_at < DEPARTED_AFTER_TAKEOVER_S
        }
        self._departed = [
            d
            for d in self._departed
            if (d.worker_id or "") in waiting
            or (d.died_at is not None and now - d.died_at < DEPARTED_MIN_S)
        ]

    def orphans(self) -> list[Orphan]:
        return [e.orphan for e in self._entries]

    def departed(self, current_pids: Sequence[int | None]) -> list[WorkerView]:
        """The dead workers' rows still shown, less those whose slot still shows them."""
        return [d for d in self._departed if d.pid not in current_pids]
