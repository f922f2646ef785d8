"""Which part of a run a timeline draws: a time window, some tasks, and a readable default.

A 10k-task run has tens of thousands of claims; drawn whole it is a grey smear and a page
of megabytes. `select` keeps what falls in the window and belongs to the tasks asked for;
asked for nothing on a large run, it picks a window of at most `MAX_BARS` claims around the
first takeover (the moment people want to see) and says in `notes` what it left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from queue_worker.proof.report import clock_text
from supervisor.timeline.model import LOST, Arrow, Bar, Lane, Mark, Model, OpMark

MAX_BARS: Final = 1200
MAX_MARKS: Final = 800

_CLOCK = re.compile(r"^(\d{1,2}):(\d{2}):(\d{2}(?:\.\d{1,6})?)$")
_RELATIVE = re.compile(r"^\+(\d+(?:\.\d*)?)s?$")


class BoundError(ValueError):
    """A --from/--to/--tasks value that is not one; the message says what was expected."""


@dataclass(frozen=True)
class View:
    """The part of the model one picture draws (the charts use the whole model)."""

    model: Model
    lanes: tuple[Lane, ...]
    bars: tuple[Bar, ...]
    marks: tuple[Mark, ...]
    arrows: tuple[Arrow, ...]
    ops: tuple[OpMark, ...]
    start: int
    end: int
    notes: tuple[str, ...]
    narrowed: bool  # a window or tasks were chosen (by the user or the default)


def parse_tasks(text: str) -> frozenset[int]:
    """ "3,5,10-20" → {3, 5, 10, …, 20}."""
    tasks: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise BoundError(f"got {text!r}; expected task ids like 3,5,10-20") from None
        if first < 0 or last < first or last - first > 1_000_000:
            raise BoundError(f"got {text!r}; expected task ids like 3,5,10-20")
        tasks.update(range(first, last + 1))
    return frozenset(tasks)


def parse_bound(text: str, model: Model) -> int:
    """A --from/--to value as a time (µs): a claims-log position (@123 or 123), a clock
    time on the run's day (12:00:01.5), or seconds after the run's first record (+4.5s)."""
    value = text.strip()
    if value.lstrip("@").isdigit():
        position = int(value.lstrip("@"))
        later = [p for p in model.positions if p >= position]
        if not later:
            raise BoundError(f"got {text!r}; the claims log has no record at or after it")
        return model.positions[min(later)]
    if m := _RELATIVE.match(value):
        return model.start + round(float(m.group(1)) * 1_000_000)
    if m := _CLOCK.match(value):
        day = datetime.fromtimestamp(model.start / 1_000_000)
        hours, minutes, seconds = int(m.group(1)), int(m.group(2)), float(m.group(3))
        if hours < 24 and minutes < 60 and seconds < 60:
            whole = int(seconds)
            moment = day.replace(
                hour=hours,
                minute=minutes,
                second=whole,
                microsecond=round((seconds - whole) * 1_000_000),
            )
            return round(moment.timestamp() * 1_000_000)
    raise BoundError(
        f"got {text!r}; expected a claims-log position (@123), a time (12:00:01.5) or "
        "seconds after the start (+4.5s)"
    )


def _default_window(model: Model, bars: list[Bar]) -> tuple[int, int]:
    """A window of at most MAX_BARS claims, starting a little before the first takeover."""
    ordered = sorted(bars, key=lambda b: b.start)
    first = 0
    if model.arrows:
        moment = model.arrows[0].from_expiry
        first = next((i for i, b in enumerate(ordered) if b.end >= moment), 0)
        first = max(0, first - MAX_BARS // 4)
    last = min(len(ordered), first + MAX_BARS) - 1
    return ordered[first].start, ordered[last].start


def select(
    model: Model,
    tasks: frozenset[int] | None = None,
    start: int | None = None,
    end: int | None = None,
) -> View:
    """The part of `model` to draw: in [start, end], about `tasks`; on a large run with
    neither, a default window. `notes` say what is left out."""
    notes: list[str] = []
    narrowed = tasks is not None or start is not None or end is not None

    def wanted(task: int) -> bool:
        return tasks is None or task in tasks

    bars = [b for b in model.bars if wanted(b.task)]
    if not narrowed and len(bars) > MAX_BARS:
        start, end = _default_window(model, bars)
        narrowed = True
        notes.append(
            f"{len(bars)} claims won in this run; showing {clock_text(start)}–{clock_text(end)} "
            "around the first takeover (choose with --from/--to or --tasks)"
        )
    low = model.start if start is None else start
    high = model.end if end is None else end
    if high < low:
        raise BoundError(f"the window ends ({clock_text(high)}) before it starts")
    total = len(bars)
    bars = [b for b in bars if b.start <= high and max(b.end, b.late or 0) >= low]
    if len(bars) > MAX_BARS:
        bars = bars[:MAX_BARS]
        high = max(b.start for b in bars)
        notes.append(f"only the first {MAX_BARS} claims of the window are drawn")
    elif narrowed and len(bars) < total:
        notes.append(f"{len(bars)} of {total} winning claims drawn")
    marks = [m for m in model.marks if wanted(m.task) and low <= m.at <= high]
    lost = [m for m in marks if m.kind == LOST]
    if len(marks) > MAX_MARKS:
        keep = set(lost[: max(0, MAX_MARKS - (len(marks) - len(lost)))])
        marks = [m for m in marks if m.kind != LOST or m in keep]
        notes.append(f"{len(lost) - len(keep)} lost claims not drawn (too many to read)")
    arrows = [
        a for a in model.arrows if wanted(a.task) and a.to_at >= low and a.from_expiry <= high
    ]
    if len(arrows) < len(model.arrows) and narrowed:
        notes.append(f"{len(arrows)} of {len(model.arrows)} takeovers in view")
    ops = [o for o in model.ops if o.at <= high and (o.end or o.at) >= low]
    used = {b.worker for b in bars} | {m.worker for m in marks}
    used |= {a.from_worker for a in arrows} | {a.to_worker for a in arrows}
    if tasks is None:
        used |= {o.lane for o in ops if o.lane is not None}
    else:
        ops = [o for o in ops if o.lane is None or o.lane in used]
    lanes = tuple(lane for lane in model.lanes if lane.worker in used)
    return View(
        model,
        lanes,
        tuple(bars),
        tuple(marks),
        tuple(arrows),
        tuple(ops),
        low,
        max(high, low + 1),
        tuple(notes),
        narrowed,
    )
