"""The dashboard and the stats endpoint of a partitioned `qw up`: its partitions'
supervisors (`supervisor.partitioned.run.PartitionedSupervisor`) seen as one.

`PartitionedView` is what `supervisor.tui.live.run_dashboard` and `supervisor.http_api` take from
a supervisor — `snapshot()`, the dashboard's controls, `finished`, `task_info` — over every
partition's `Supervisor`:

- the workers of all partitions in one table, numbered in one run of slots (partition 0's
  first), each with its partition (`WorkerView.partition`) and named ``p<k>.w<i>`` in JSON
  and metrics (a partition's slot names start at w0: the name alone would not be unique);
- the queue summed over the partitions, and each partition's counts
  (`SupervisorSnapshot.partitions`) for the partitions section;
- the orphans of every partition, named ``k:id`` (`Orphan.partition`), and the events of
  every partition tagged ``p<k>``, in time order;
- the keys: `k` kills a holder in any partition (the survivor that takes its task over is
  one of that partition's workers: the fold of the partition decides, as on any queue), a
  slot number reaches the partition that runs it, `+` adds a worker to the partition with
  fewest, `-` removes one from the partition with most (never a partition's last).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from queue_worker.partition_layout import TaskRef, parse_task_ref, partition_location
from supervisor.partitioned.names import tagged
from supervisor.partitioned.run import PartitionedSupervisor
from supervisor.run.model import Event, SupervisorSnapshot, WorkerView, sum_queues
from supervisor.run.monitor import TaskInfo
from supervisor.run.supervisor import EVENTS_KEPT, Supervisor, enqueue_hint

__all__ = ["PartitionedView"]


class PartitionedView:
    """The partitions' supervisors as one supervisor to show and to drive."""

    def __init__(self, sup: PartitionedSupervisor, *, shown: str) -> None:
        self.parts = sup.parts
        self.manifest = sup.manifest
        self.location = sup.options.location  # where the logs are (a URL with its password)
        self.shown = shown  # …as the screen shows it
        self._data_dir = sup.options.data_dir
        self._sup = sup
        self._selected: int | None = None
        self._rng = random.Random()

    # -- what is shown -------------------------------------------------------------------------

    def snapshot(self) -> SupervisorSnapshot:
        snaps = [part.snapshot() for part in self.parts]
        workers: list[WorkerView] = []
        departed: list[WorkerView] = []
        orphans = []
        events: list[Event] = []
        offset = 0
        for k, snap in enumerate(snaps):
            for w in snap.workers:
                workers.append(_in_partition(w, k, offset))
            for w in snap.departed:
                departed.append(_in_partition(w, k, offset))
            for o in snap.orphans:
                orphans.append(dataclasses.replace(o, partition=k, slot=o.slot + offset))
            events.extend(partition_event(e, k) for e in snap.events)
            offset += len(snap.workers)
        tasks = self._sup.options.tasks
        if tasks:  # enqueued over the partitions here, not by each (which says it has none)
            events = [e for e in events if "no demo tasks" not in e.text]
            text = f"enqueued {tasks} demo tasks over {len(snaps)} partitions"
            events.append(Event(self._sup.started_at, "info", text))
        events = merge_alike(sorted(events, key=lambda e: e.at), len(snaps))
        orphans.sort(key=lambda o: o.died_at)
        return SupervisorSnapshot(
            location=self.shown,
            workers=workers,
            queue=sum_queues([s.queue for s in snaps]),
            events=events[-EVENTS_KEPT:],
            draining=any(s.draining for s in snaps),
            selected=self._selected,
            started_at=self._sup.started_at,
            orphans=orphans,
            departed=departed,
            enqueue_hint=enqueue_hint(self._data_dir, self.shown),
            demo_rate=sum(s.demo_rate for s in snaps),
            partitions=[s.queue for s in snaps],
        )

    @property
    def finished(self) -> bool:
        return all(part.finished for part in self.parts)

    def task_info(self, task: int) -> TaskInfo | None:
        """A task of a queue without partitions: none here (tasks are named ``k:id``)."""
        return None

    def partition_task(self, text: str) -> tuple[TaskRef, TaskInfo | None, str]:
        """The task named `text` (``k:id``): its ref, the partition's fold's view of it, and
        the partition's location (to read its history). ValueError naming what was expected."""
        ref = parse_task_ref(text, self.manifest.count)
        where = partition_location(self.location, ref.partition, self.manifest.count)
        return ref, self.parts[ref.partition].task_info(ref.task), where

    # -- the controls (supervisor.run.model.Controls) ----------------------------------------------

    def kill_a_holder(self) -> str | None:
        order = list(range(len(self.parts)))
        self._rng.shuffle(order)
        for k in order:
            text = self.parts[k].kill_a_holder()
            if text is not None:
                return tagged(text, k)
        return None

    def kill(self, slot: int) -> str | None:
        return self._on_slot(slot, Supervisor.kill)

    def toggle_pause(self, slot: int) -> str | None:
        return self._on_slot(slot, Supervisor.toggle_pause)

    def add_worker(self) -> str | None:
        live = [_live(part) for part in self.parts]
        k = live.index(min(live))
        text = self.parts[k].add_worker()
        return None if text is None else tagged(text, k)

    def remove_worker(self) -> str | None:
        live = [_live(part) for part in self.parts]
        k = live.index(max(live))
        if live[k] <= 1:
            return "every partition is down to its last worker: none removed"
        text = self.parts[k].remove_worker()
        return None if text is None else tagged(text, k)

    def drain(self) -> None:
        for part in self.parts:
            part.drain()

    def select(self, slot: int | None) -> None:
        self._selected = slot

    def _on_slot(self, slot: int, action: Callable[[Supervisor, int], str | None]) -> str | None:
        """`action(part, local slot)` on the partition that runs global slot `slot`."""
        offset = 0
        for k, part in enumerate(self.parts):
            count = len(part.snapshot().workers)
            if offset <= slot < offset + count:
                text = action(part, slot - offset)
                return None if text is None else tagged(text, k)
            offset += count
        return None


def partition_event(event: Event, partition: int) -> Event:
    return dataclasses.replace(event, text=tagged(event.text, partition))


def merge_alike(events: list[Event], partitions: int) -> list[Event]:
    """Events said alike by every partition at once (each one's "publishing 2 demo
    tasks/s") as one, tagged ``p*``."""
    by_text: dict[tuple[str, str], list[Event]] = {}
    for e in events:
        by_text.setdefault((e.kind, e.text.partition(" ")[2]), []).append(e)
    out: list[Event] = []
    for e in events:
        alike = by_text[(e.kind, e.text.partition(" ")[2])]
        if len(alike) == partitions > 1 and max(a.at for a in alike) - min(a.at for a in alike) < 5:
            if e is alike[0]:
                out.append(dataclasses.replace(e, text="p* " + e.text.partition(" ")[2]))
        else:
            out.append(e)
    return out


def _in_partition(w: WorkerView, partition: int, offset: int) -> WorkerView:
    return dataclasses.replace(
        w, slot=w.slot + offset, name=f"p{partition}.{w.name}", partition=partition
    )


def _live(part: Supervisor) -> int:
    return sum(1 for w in part.snapshot().workers if not w.ended)
