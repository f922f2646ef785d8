"""The plain output of `qw up` when there is no terminal (or --no-tui): one line a second.

    12:00:05 up 5s · workers 4/4 · published 120 pending 30 held 4 done 86 failed 0 dead 0 · 9.7/s
    12:00:06 up 6s · workers 4/4 · … · 9.7/s · orphaned: task 17 of w2·6975 (lease 1.3 s left)
    12:00:06 takeover: task 17: w2·6975 → w3·6980, 1.2 s after w2·6975 died

Each new event is printed on its own line before the status line, so a log file keeps the
whole feed. `progress_line` is pure (a snapshot in, a line out); `run_progress` is the loop,
which fits each line to the reader's width (COLUMNS, else 80: `fitted`), a status line
broken between its parts, an event between words, each continued under the clock.
"""

from __future__ import annotations

import time
from typing import Final, Protocol, TextIO

from supervisor.run.model import Event, Orphan, SupervisorSnapshot
from supervisor.width import fit_parts, output_width

#: seconds between status lines
INTERVAL_S = 1.0
#: the indent of a line continued under its clock ("12:00:05 ")
HANG: Final = " " * 9


class ProgressSource(Protocol):
    """What the progress loop needs from the supervisor."""

    def snapshot(self) -> SupervisorSnapshot: ...

    def events_since(self, seen: int) -> tuple[list[Event], int]: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _uptime(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def progress_line(snap: SupervisorSnapshot, now: float) -> str:
    """One status line: uptime, workers alive, the queue's counts and throughput."""
    alive = sum(1 for w in snap.workers if not w.ended)
    q = snap.queue
    parts = [
        f"{_clock(now)} up {_uptime(now - snap.started_at)}",
        f"workers {alive}/{len(snap.workers)}",
        f"published {q.published} pending {q.pending} held {q.held} done {q.done} "
        f"failed {q.failed} dead {q.dead}",
        f"{q.throughput_now:.1f}/s",
    ]
    waiting = [o for o in snap.orphans if o.heir is None]
    if waiting:
        # a death's tasks until their takeover (the takeover itself is an event line)
        parts.append("orphaned: " + ", ".join(_orphan(o, now) for o in waiting))
    if snap.draining:
        parts.append("draining")
    return " · ".join(parts)


def _orphan(orphan: Orphan, now: float) -> str:
    left = orphan.lease_expiry - now
    lease = f"lease {left:.1f} s left" if left > 0 else f"lease lapsed {-left:.1f} s ago"
    return f"task {orphan.task} of {orphan.holder} ({lease})"


def event_line(event: Event) -> str:
    return f"{_clock(event.at)} {event.kind}: {event.text}"


def fitted(line: str, width: int) -> str:
    """`line` in lines of at most `width` columns: a status line broken between its parts
    (the next starting "· " under the clock), an event line between its words."""
    return fit_parts(line, width, hang=len(HANG))


def run_progress(source: ProgressSource, out: TextIO, interval: float = INTERVAL_S) -> None:
    """Print events and a status line every `interval` seconds until the supervisor ends."""
    seen = 0
    while True:
        finished = source.wait(interval)
        events, seen = source.events_since(seen)
        width = output_width()
        for event in events:
            out.write(fitted(event_line(event), width) + "\n")
        out.write(fitted(progress_line(source.snapshot(), time.time()), width) + "\n")
        out.flush()
        if finished:
            return
