"""The last line of `qw up`: how the run ended, truthfully.

"drained" only when the queue is: nothing pending, nothing held. Otherwise the line says
what is left and by whom, e.g.

    qw: stopped with 1 task held: task 1242 by w2·6975 (dead, lease expired 3.10 s ago)
        (published 2000, done 1999, dead 0, pending 0)

"Expired" is judged by this machine's clock, for the reader: the task stays held (by the
fold's rules) until a live worker's claim takes it over.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from queue_worker.names import worker_label
from queue_worker.times import ago_text, clock_text

if TYPE_CHECKING:  # (`qw status` names held tasks without the supervisor's model)
    from queue_worker.protocol.state import Lease
    from supervisor.run.model import QueueView

#: held tasks named one by one in the line; more are counted
NAMED_HELD: Final = 3


def held_text(
    task: int, lease: Lease, died_at: float | None, now_us: int, *, gone: str | None = None
) -> str:
    """task 1242 by w2·6975 (dead, lease expired 3.10 s ago). `gone` words a holder known
    not to run (without a death time: "not running here")."""
    notes = ["dead"] if died_at is not None else [gone] if gone else []
    if lease.expiry <= now_us:
        notes.append(f"lease expired {ago_text(lease.expiry, now_us)}")
    else:
        notes.append(f"lease until {clock_text(lease.expiry)}")
    return f"task {task} by {worker_label(lease.worker)} ({', '.join(notes)})"


def _tasks(n: int) -> str:
    return f"{n} task{'s' * (n != 1)}"


def left_text(
    queue: QueueView, held: list[tuple[int, Lease, float | None]], now_us: int
) -> str | None:
    """What the queue still holds ("1 task held: task 1242 by …"), or None if nothing."""
    parts = []
    if queue.pending:
        parts.append(f"{_tasks(queue.pending)} pending")
    if held:
        named = "; ".join(held_text(t, lease, died, now_us) for t, lease, died in held[:NAMED_HELD])
        more = f"; and {len(held) - NAMED_HELD} more" if len(held) > NAMED_HELD else ""
        parts.append(f"{_tasks(len(held))} held: {named}{more}")
    return " and ".join(parts) if parts else None
