"""`qw up` on a partitioned queue: the supervisor's workers split over the partitions.

One `Supervisor` per partition runs the workers this supervisor assigns to it (slot i of
the N workers works partition `slot_partitions(N, P)[i]`: the assignor of
`queue_worker.partition_layout`, over members named by slot). Each of them is today's supervisor
on today's queue — its partition's location, its own run directory (``p<k>/run``), its own
monitor, restarts, ops records and exit — so everything a queue guarantees, a partition
does. A worker that dies is restarted on its partition; its tasks are taken over by lease
expiry by that partition's other workers (or by its replacement, after one lease).

This supervisor starts them together, forwards stop requests to all, and prints the
progress as one line per second summed over the partitions, plus each partition's events
tagged ``p<k>``. It ends when every partition's supervisor has ended; its exit code is the
first non-zero one among them (0 when every partition drained).

Every worker here works exactly one partition, so there must be at least as many workers
as partitions (`qw up` refuses fewer).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Protocol, TextIO

from queue_worker.partition_layout import Manifest, partition_location, slot_partitions
from supervisor.run.model import Event, QueueView, SupervisorSnapshot, sum_queues
from supervisor.run.supervisor import Supervisor, SupervisorOptions, demo_payloads
from supervisor.tui.progress import event_line, fitted, progress_line
from supervisor.width import output_width

#: seconds between status lines
INTERVAL_S = 1.0


def partition_options(options: SupervisorOptions, manifest: Manifest) -> list[SupervisorOptions]:
    """Each partition's supervisor options: its location, its run directory, its share of
    the workers and of the demo rate (start tasks are enqueued across the partitions by
    `PartitionedSupervisor.start`, not by each)."""
    count = manifest.count
    slots = slot_partitions(options.workers, count)
    return [
        dataclasses.replace(
            options,
            data_dir=options.data_dir / f"p{k}",
            location=partition_location(options.location, k, count),
            workers=slots.count(k),
            tasks=0,
            rate=options.rate / count,
        )
        for k in range(count)
    ]


class PartitionedSupervisor:
    """The supervisors of a partitioned queue's partitions, run as one."""

    def __init__(self, options: SupervisorOptions, manifest: Manifest) -> None:
        """ValueError for fewer workers than partitions (`slot_partitions`)."""
        self.options = options
        self.manifest = manifest
        self.parts = [Supervisor(o) for o in partition_options(options, manifest)]
        self._seen = [0] * len(self.parts)
        self.started_at = 0.0

    @property
    def finished(self) -> bool:
        return all(part.finished for part in self.parts)

    def start(self) -> None:
        """Enqueue the start tasks over the partitions, then start every partition's
        supervisor (one that fails to start stops those already started)."""
        from queue_worker.partitions.queue import PartitionedQueue

        self.started_at = time.time()
        if self.options.tasks:
            with PartitionedQueue(self.options.location, self.manifest, self.options.fsync) as q:
                q.enqueue_many(demo_payloads(0, self.options.tasks))
        started: list[Supervisor] = []
        try:
            for part in self.parts:
                part.start()
                started.append(part)
        except BaseException:
            for part in started:
                part.stop_now()
            for part in started:
                part.wait(10)
            raise

    def request_stop(self) -> None:
        """Safe from a signal handler: the first request drains, the second kills."""
        for part in self.parts:
            part.request_stop()

    def stop_now(self) -> None:
        for part in self.parts:
            part.stop_now()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every partition's supervisor has finished (True), or `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for part in self.parts:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not part.wait(left):
                return False
        return True

    @property
    def exit_code(self) -> int | None:
        codes = [part.exit_code for part in self.parts]
        if any(code is None for code in codes):
            return None
        return next((code for code in codes if code), 0)

    @property
    def log_failure(self) -> str | None:
        return next(
            (f"partition {k}: {p.log_failure}" for k, p in enumerate(self.parts) if p.log_failure),
            None,
        )

    def snapshot(self) -> SupervisorSnapshot:
        """The partitions' snapshots as one: counts summed, workers and orphans together."""
        snaps = [part.snapshot() for part in self.parts]
        return SupervisorSnapshot(
            location=self.options.location,
            workers=[w for s in snaps for w in s.workers],
            queue=sum_queues([s.queue for s in snaps]),
            events=[],
            draining=any(s.draining for s in snaps),
            started_at=self.started_at,
            orphans=[o for s in snaps for o in s.orphans],
        )

    def partition_queues(self) -> list[QueueView]:
        return [part.snapshot().queue for part in self.parts]

    def status_note(self) -> str:
        return ""

    def events(self) -> list[Event]:
        """The events since the last call, each tagged with its partition."""
        new: list[Event] = []
        for k, part in enumerate(self.parts):
            events, self._seen[k] = part.events_since(self._seen[k])
            new.extend(dataclasses.replace(e, text=f"p{k} {e.text}") for e in events)
        return sorted(new, key=lambda e: e.at)


class PartitionedRun(Protocol):
    """What the progress lines need: `PartitionedSupervisor`, `MemberSupervisor`."""

    def wait(self, timeout: float | None = None) -> bool: ...

    def events(self) -> list[Event]: ...

    def snapshot(self) -> SupervisorSnapshot: ...

    def partition_queues(self) -> list[QueueView]: ...

    def status_note(self) -> str: ...


def run_partitioned_progress(
    sup: PartitionedRun, out: TextIO, interval: float = INTERVAL_S
) -> None:
    """Print events and a status line every `interval` seconds until every partition's
    supervisor has ended."""
    done = threading.Event()
    while not done.is_set():
        if sup.wait(interval):
            done.set()
        width = output_width()
        for event in sup.events():
            out.write(fitted(event_line(event), width) + "\n")
        snap = sup.snapshot()
        line = progress_line(snap, time.time())
        if not snap.workers:  # members (MemberSupervisor): their count is in the note
            line = line.replace(" · workers 0/0", "")
        parts = " ".join(
            f"p{k} {q.done}/{q.published}" for k, q in enumerate(sup.partition_queues())
        )
        note = sup.status_note()
        out.write(fitted(f"{line} · {parts}{' · ' + note if note else ''}", width) + "\n")
        out.flush()


__all__ = [
    "PartitionedRun",
    "PartitionedSupervisor",
    "partition_options",
    "run_partitioned_progress",
    "sum_queues",
]
