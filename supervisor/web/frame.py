"""One frame of the browser's dashboard: a `SupervisorSnapshot` in, JSON out.

The terminal dashboard's own builders make the lines and cells (`supervisor.tui`): the
header, each worker's row (`worker_table`, one slot at a time, so that each row can carry
its slot, pid and state for the page's buttons), the orphans panel with the lease
counting down (`orphan_lines`), the event feed's styles, and the partitions section.
They are turned into escaped HTML (`supervisor.web.html_text`); the page places them and
draws nothing of its own but the buttons. The queue's counts are tiles, large enough for
the back of a room; its throughput over the supervisor's history (one value a second) is
an SVG made here from numbers alone.

A frame is computed for `now` (the server's clock): the countdowns are the server's, so a
browser whose clock is off shows the same seconds as the terminal.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, Final

from rich.text import Text

from queue_worker.names import printable
from supervisor.run.model import Event, QueueView, SlotState, SupervisorSnapshot, WorkerView
from supervisor.tui.dashboard import EVENT_STYLES, header
from supervisor.tui.format import format_bytes
from supervisor.tui.orphan_panel import TITLE as ORPHANS_TITLE
from supervisor.tui.orphan_panel import orphan_lines
from supervisor.tui.partition_panel import partition_section
from supervisor.tui.worker_table import worker_table
from supervisor.web.html_text import escape, segments_html, text_html

__all__ = ["FEED_EVENTS", "dashboard_frame", "event_html", "throughput_svg"]

#: events a frame carries, newest first
FEED_EVENTS: Final = 14
#: orphan lines a frame carries (the last sums up the rest, as in the terminal)
ORPHAN_LINES: Final = 8
#: the columns the partitions' lines are laid out in (half the page, in large type)
TEXT_COLUMNS: Final = 64
#: the queue's counts as the terminal colours them (supervisor.tui.dashboard)
QUEUE_COUNTS: Final = (
    ("published", "b"),
    ("pending", "fg-yellow"),
    ("held", "fg-cyan"),
    ("done", "fg-green"),
    ("failed", "fg-magenta"),
    ("dead", "fg-red"),
)


def dashboard_frame(snap: SupervisorSnapshot, *, now: float, control: bool) -> dict[str, Any]:
    """Everything the page shows at `now`; `control`: rows say what their buttons may do."""
    top = header(snap, now=now)
    columns, rows = _rows(snap, now)
    queue = snap.queue
    history = queue.throughput_history
    return {
        "now": time.strftime("%H:%M:%S", time.localtime(now)),
        "control": control,
        "header": {"left": text_html(top.left), "right": text_html(top.right)},
        "columns": columns,
        "rows": rows,
        "orphans": {
            "title": escape(ORPHANS_TITLE),
            "lines": [
                text_html(t) for t in orphan_lines(snap.orphans, now=now, lines=ORPHAN_LINES)
            ],
        },
        "queue": queue_html(queue),
        "log": escape(f"log {format_bytes(queue.log_bytes)} · {queue.record_count:,} records read"),
        "throughput": throughput_svg(history),
        "throughputNow": round(queue.throughput_now, 2),
        "partitions": (
            segments_html(
                partition_section(
                    snap.partitions, snap.workers, snap.orphans, lines=len(snap.partitions)
                ),
                TEXT_COLUMNS,
            )
            if snap.partitions
            else []
        ),
        "events": [event_html(e) for e in reversed(snap.events[-FEED_EVENTS:])],
        "draining": snap.draining,
    }


def _rows(snap: SupervisorSnapshot, now: float) -> tuple[list[dict[str, object]], list[Any]]:
    """The worker table's columns, and its rows: each slot's, then its departed workers'
    (a dead process whose slot runs another, kept while its orphans wait)."""
    grid = worker_table(snap.workers[:1], now=now)  # the columns (a partition's, if any)
    columns = [{"name": escape(c.name), "justify": c.justify, "drop": c.drop} for c in grid.columns]
    rows: list[Any] = []
    for w in snap.workers:
        gone = [d for d in snap.departed if d.slot == w.slot]
        one = worker_table([w], now=now, departed=gone, orphans=snap.orphans)
        for (cells, _), view, departed in zip(
            one.rows, [w, *gone], [False] + [True] * len(gone), strict=True
        ):
            rows.append(_row(view, [text_html(c) for c in cells], departed=departed))
    return columns, rows


def _row(w: WorkerView, cells: Sequence[str], *, departed: bool) -> dict[str, Any]:
    return {
        "key": f"gone-{w.pid}" if departed else f"slot-{w.slot}",
        "slot": w.slot,
        "pid": w.pid,
        "label": escape(w.label),
        "state": w.state.value,
        "departed": departed,
        "alive": not w.ended and w.pid is not None,
        "paused": w.state is SlotState.PAUSED,
        "cells": list(cells),
    }


def queue_html(queue: QueueView) -> str:
    """The counts as tiles, read from the back of a room, then the share closed as a bar
    (an SVG of numbers) and the same words as the terminal's progress line."""
    tiles = "".join(
        f'<div class="tile"><span class="n {cls}">{getattr(queue, key):,}</span>'
        f'<span class="k">{key}</span></div>'
        for key, cls in QUEUE_COUNTS
    )
    closed = queue.done + queue.dead
    fraction = min(1.0, closed / queue.published) if queue.published else 0.0
    percent = f"{100 * fraction:.0f}%" if queue.published else "—"
    bar = (
        '<svg class="progress" viewBox="0 0 1000 24" preserveAspectRatio="none">'
        '<rect class="rest" x="0" y="0" width="1000" height="24"/>'
        f'<rect class="done" x="0" y="0" width="{1000 * fraction:.1f}" height="24"/></svg>'
    )
    words = (
        f'<div class="closed"><span class="b">{percent}</span> '
        f'<span class="dim">({closed:,}/{queue.published:,} closed)</span> '
        f'<span class="b">{queue.throughput_now:.1f}/s</span></div>'
    )
    return f'<div class="tiles">{tiles}</div>{bar}{words}'


def event_html(event: Event) -> str:
    """One line of the feed, as the terminal's: the time, the kind, the text."""
    kind = event.kind if len(event.kind) <= 10 else event.kind[:9] + "…"
    return text_html(
        Text.assemble(
            (time.strftime("%H:%M:%S ", time.localtime(event.at)), "dim"),
            (f"{printable(kind):<10} ", EVENT_STYLES.get(event.kind, "")),
            printable(event.text),
        )
    )


#: the throughput chart's drawing box (the page scales it to its width)
CHART_W: Final = 900
CHART_H: Final = 210
_LEFT, _BOTTOM, _TOP = 70, 44, 16


def throughput_svg(history: Sequence[float]) -> str:
    """Tasks done per second over the history (the oldest second on the left, the last
    complete one on the right), as bars; the axis is scaled to a round peak."""
    peak = max(history, default=0.0)
    top = _round_up(peak)
    plot_w, plot_h = CHART_W - _LEFT - 12, CHART_H - _BOTTOM - _TOP
    n = max(1, len(history))
    step = plot_w / n
    parts = [
        f'<svg class="chart" viewBox="0 0 {CHART_W} {CHART_H}" role="img" '
        f'aria-label="tasks done per second, the last {len(history)} seconds">'
    ]
    for frac in (0.0, 0.5, 1.0):
        y = _TOP + plot_h * (1 - frac)
        parts.append(
            f'<line class="grid" x1="{_LEFT}" x2="{CHART_W - 12}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        parts.append(
            f'<text class="tick" x="{_LEFT - 10}" y="{y + 9:.1f}">{_figure(top * frac)}</text>'
        )
    for i, value in enumerate(history):
        if value <= 0:
            continue
        h = plot_h * min(1.0, value / top)
        x = _LEFT + i * step
        parts.append(
            f'<rect class="bar" x="{x:.1f}" y="{_TOP + plot_h - h:.1f}" '
            f'width="{max(1.0, step - 1):.1f}" height="{h:.1f}"/>'
        )
    base = CHART_H - 8
    parts.append(f'<text class="tick start" x="{_LEFT}" y="{base}">−{len(history)}s</text>')
    parts.append(f'<text class="tick end" x="{CHART_W - 12}" y="{base}">now</text>')
    parts.append(
        f'<text class="tick middle" x="{_LEFT + plot_w / 2:.0f}" y="{base}">'
        f"done/s · peak {peak:.1f}</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


def _round_up(value: float) -> float:
    """The axis top: 1, 2 or 5 times a power of ten, at least `value` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return float(next(m * power for m in (1, 2, 5, 10) if m * power >= value))


def _figure(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"
