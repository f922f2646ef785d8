"""The dashboard and the stats endpoint of `qw up --rebalance`: member processes whose
partitions follow membership (`supervisor.partitioned.members.MemberSupervisor`), seen as one run.

A member is one process that works one worker per partition it is assigned, so the worker
table has a row per (member, partition) — ``m1.p2`` is member m1's worker on partition 2 —
from the stats the workers publish; a member's rows change as the partitions are
rebalanced. A slot number is the row's: `k` and a selected row's `k` kill -9 the member
process that runs it (every partition it works). A dead member's rows stay, beneath the
rows of the member that replaced it, with their tasks struck through while its orphans
wait, each orphan named ``k:id``, until a worker of that partition — whichever member is
assigned it now — takes it over by lease expiry.
Pausing, adding and removing workers are `qw up`'s controls for its own slots: members
are restarted by their supervisor, and rebalance when one joins or leaves.
"""

from __future__ import annotations

import dataclasses
import random

from queue_worker.partition_layout import TaskRef, parse_task_ref, partition_location
from supervisor.partitioned.members import MemberSupervisor
from supervisor.run.model import SupervisorSnapshot, WorkerView, sum_queues
from supervisor.run.monitor import TaskInfo
from supervisor.run.supervisor import enqueue_hint

__all__ = ["MembersView"]


class MembersView:
    """A `MemberSupervisor` as one supervisor to show and to drive."""

    def __init__(self, sup: MemberSupervisor, *, shown: str) -> None:
        self.sup = sup
        self.manifest = sup.manifest
        self.location = sup.options.location
        self.shown = shown
        self._selected: int | None = None
        self._rows: list[WorkerView] = []
        self._rng = random.Random()

    # -- what is shown -------------------------------------------------------------------------

    def snapshot(self) -> SupervisorSnapshot:
        sup = self.sup
        live: list[list[WorkerView]] = []
        for member, pid in enumerate(sup.member_pids()):
            live.append([] if pid is None else sup.member_rows(member, pid))
        orphans, departed, events = sup.board([r.pid for views in live for r in views])
        # Each member's rows, then its dead process's rows beneath them (its tasks struck
        # through, until taken over), as a restarted slot's are in a queue's table.
        rows: list[WorkerView] = []
        for member, views in enumerate(live):
            gone = [d for d in departed if _member(d) == member]
            for view in [*views, *gone]:
                rows.append(dataclasses.replace(view, slot=len(rows)))
        self._rows = rows
        queues = [m.queue_view() for m in sup.monitors()]
        return SupervisorSnapshot(
            location=self.shown,
            workers=rows,
            queue=sum_queues(queues),
            events=events,
            draining=sup.snapshot().draining,
            selected=self._selected,
            started_at=sup.started_at,
            orphans=sorted(orphans, key=lambda o: o.died_at),
            enqueue_hint=enqueue_hint(sup.options.data_dir, self.shown),
            demo_rate=sup.options.rate,
            partitions=queues,
        )

    @property
    def finished(self) -> bool:
        return self.sup.wait(0)

    def task_info(self, task: int) -> TaskInfo | None:
        return None  # tasks are named k:id (`partition_task`)

    def partition_task(self, text: str) -> tuple[TaskRef, TaskInfo | None, str]:
        ref = parse_task_ref(text, self.manifest.count)
        monitors = self.sup.monitors()
        info = monitors[ref.partition].task_info(ref.task) if monitors else None
        return ref, info, partition_location(self.location, ref.partition, self.manifest.count)

    # -- the controls (supervisor.run.model.Controls) ----------------------------------------------

    def kill_a_holder(self) -> str | None:
        holders: set[str] = set()
        for monitor in self.sup.monitors():
            holders.update(monitor.holdings())
        members = sorted({_member(r) for r in self._rows if not r.ended and r.worker_id in holders})
        if not members:
            return None
        return self.sup.kill_member(self._rng.choice(members))

    def kill(self, slot: int) -> str | None:
        row = next((r for r in self._rows if r.slot == slot and not r.ended), None)
        return None if row is None else self.sup.kill_member(_member(row))

    def toggle_pause(self, slot: int) -> str | None:
        return "members are not paused here (k kills one; the others take its partitions)"

    def add_worker(self) -> str | None:
        return "with --rebalance, start another qw up --rebalance to add members"

    def remove_worker(self) -> str | None:
        return "with --rebalance, stop a qw up --rebalance to remove its members"

    def drain(self) -> None:
        self.sup.request_stop()

    def select(self, slot: int | None) -> None:
        self._selected = slot


def _member(row: WorkerView) -> int:
    """The member slot of a row named m<slot>.p<k>."""
    return int(row.name[1:].partition(".")[0])
