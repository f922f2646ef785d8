"""What the supervisor shows: plain data the dashboard, the progress line and HTTP render.

The supervisor builds a `SupervisorSnapshot` a few times a second; renderers are pure
functions of it. `Controls` is what the dashboard's keys may ask the supervisor to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Final, Protocol

from queue_worker.names import printable, worker_label
from queue_worker.worker.snapshot import WorkerSnapshot


class SlotState(str, Enum):
    """What a worker slot is doing, as the dashboard, the status line and HTTP show it: the
    worker's own state (`queue_worker.worker.snapshot.WorkerState`) while it runs, or what the
    supervisor knows better (paused, draining, dead). A str, so it compares, hashes and
    encodes to JSON as its word (Python 3.10 has no enum.StrEnum)."""

    STARTING = "starting"
    IDLE = "idle"
    CLAIMING = "claiming"
    WORKING = "working"
    PAUSED = "paused"
    DRAINING = "draining"
    DEAD = "dead"
    EXITED = "exited"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


#: the states of a slot whose process has ended
ENDED_STATES: Final = (SlotState.DEAD, SlotState.EXITED)


@dataclass
class WorkerView:
    """One worker slot as the supervisor sees it (the process and its last published stats)."""

    slot: int
    name: str  # w0, w1, …
    worker_id: str | None  # the protocol id of the current (or last) process in this slot
    pid: int | None
    state: SlotState
    stats: WorkerSnapshot = field(default_factory=WorkerSnapshot)  # what the worker last published
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    exit_code: int | None = None  # negative: killed by that signal
    died_at: float | None = None  # wall clock, seconds
    restarts: int = 0
    partition: int | None = None  # the partition it works, on a partitioned queue

    def __post_init__(self) -> None:
        self.state = SlotState(self.state)  # a word given where a state goes is checked here

    @property
    def ended(self) -> bool:
        """Has the slot's process ended (dead, or exited as asked)? Its figures are its last."""
        return self.state in ENDED_STATES

    @property
    def label(self) -> str:
        """The process as people see it (w6·6975): a restarted slot never reads as the
        worker it replaced. Before its id is known, from the slot name and the pid."""
        if self.worker_id:
            return worker_label(self.worker_id)
        return printable(f"{self.name}·{self.pid}" if self.pid is not None else self.name)


@dataclass
class QueueView:
    """The queue as the supervisor's own fold of the logs sees it."""

    published: int = 0
    pending: int = 0
    held: int = 0
    done: int = 0
    failed: int = 0  # FAIL records accepted (released for retry, or dead)
    dead: int = 0
    throughput_now: float = 0.0  # tasks done per second, recent
    throughput_history: list[float] = field(default_factory=list)  # one value per second
    log_bytes: int = 0
    # records read from both topics: after the fold checkpoint the reading began from, if any
    record_count: int = 0


@dataclass
class Event:
    """One line of the event feed: a takeover, a lost lease, a stale completion, a death…"""

    at: float  # wall clock, seconds
    # takeover | lease-lost | stale | dead-task | clock | death | log-error | restart | pause | info
    kind: str
    text: str
    task: int | None = None  # the task it is about, if one (the feed's filter matches it)


@dataclass(frozen=True)
class Orphan:
    """A task whose holder died: shown from the death until a survivor takes it over.

    `lease_expiry` and `taken_at` are the log's own times (the dead claim's expiry, the
    takeover CLAIM's `at`), so "0.3 s after the lease lapsed" is what the fold judged.
    """

    task: int
    holder: str  # worker_label of the dead holder: w6·6975
    holder_id: str
    slot: int
    died_at: float  # wall clock, seconds
    lease_expiry: float  # wall clock, seconds
    heir: str | None = None  # worker_label of the worker that took it over
    taken_at: float | None = None  # when the takeover CLAIM was written
    partition: int | None = None  # the task's partition, on a partitioned queue

    @property
    def name(self) -> str:
        """The task as people name it: ``17``, or ``3:17`` on a partitioned queue."""
        return str(self.task) if self.partition is None else f"{self.partition}:{self.task}"


@dataclass
class SupervisorSnapshot:
    location: str
    workers: list[WorkerView]
    queue: QueueView
    events: list[Event]
    draining: bool = False
    selected: int | None = None  # the slot chosen with a digit key
    started_at: float = 0.0
    # tasks orphaned by a death, until a while after their takeover (oldest first)
    orphans: list[Orphan] = field(default_factory=list)
    # workers that died and whose slot already runs another process: their rows stay
    # while their orphans wait (and a few seconds at least), so the death can be watched
    departed: list[WorkerView] = field(default_factory=list)
    # how to put work on this queue, for the first screen: "qw enqueue --count 100 …"
    enqueue_hint: str = "qw enqueue --count 100"
    demo_rate: float = 0.0  # demo tasks/s that `qw up --demo/--rate` adds (0: none)
    # a partitioned queue: each partition's counts, partition k at index k (empty: none)
    partitions: list[QueueView] = field(default_factory=list)


class Controls(Protocol):
    """The actions the dashboard's keys trigger on the supervisor."""

    def kill_a_holder(self) -> str | None:
        """kill -9 a worker that holds a task; returns what it did (for the feed)."""

    def kill(self, slot: int) -> str | None: ...

    def toggle_pause(self, slot: int) -> str | None: ...

    def add_worker(self) -> str | None: ...

    def remove_worker(self) -> str | None: ...

    def drain(self) -> None: ...

    def select(self, slot: int | None) -> None: ...


def sum_queues(queues: Sequence[QueueView]) -> QueueView:
    """The partitions' counts as the whole queue's: counts and rates added, the throughput
    histories added second by second (aligned on the latest second)."""
    total = QueueView()
    longest = max((len(q.throughput_history) for q in queues), default=0)
    total.throughput_history = [0.0] * longest
    for q in queues:
        start = longest - len(q.throughput_history)
        for i, value in enumerate(q.throughput_history):
            total.throughput_history[start + i] += value
        total.published += q.published
        total.pending += q.pending
        total.held += q.held
        total.done += q.done
        total.failed += q.failed
        total.dead += q.dead
        total.throughput_now += q.throughput_now
        total.log_bytes += q.log_bytes
        total.record_count += q.record_count
    return total
