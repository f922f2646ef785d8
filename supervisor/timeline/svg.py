"""The lanes as SVG text: one lane per worker process, time running left to right.

Pure and hand-written (no drawing library): a `View` in, a string out. Every shape carries a
`<title>` (the browser shows it on hover) with the record it stands for, and the shapes a
test looks for have ids and classes: `g.lane#lane-<worker>`, `g.takeover#takeover-<pos>`,
`rect.bar.<outcome>`, `.mark.<kind>`, `.op.<kind>`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from html import escape
from typing import Final

from queue_worker.names import function_label, worker_label
from queue_worker.ops import DEATH, KILL, PAUSE, RESTART, SKEW
from queue_worker.proof.report import clock_text, duration_text
from supervisor.timeline.labels import LOWER, UPPER, LabelSpace, text_width
from supervisor.timeline.model import (
    DEAD,
    DONE,
    HELD,
    LEASE_LOST,
    LOST,
    RELEASED,
    STALE,
    STALE_FAIL,
    TAKEN_OVER,
    Arrow,
    Bar,
    Mark,
    OpMark,
)
from supervisor.timeline.view import View

WIDTH: Final = 1360
LABEL_W: Final = 140
RIGHT_PAD: Final = 24
TOP: Final = 34  # the time axis above the lanes
LANE_H: Final = 34
BAR_H: Final = 12
BAR_LABEL_PX: Final = 9.5  # a bar's label's font size (page.py: .bar-label)
LEASE_H: Final = 22
BOTTOM: Final = 14
#: stale DONEs are labelled on the picture when there are at most this many in view
MAX_WORDED: Final = 30

#: a bar's colour by how its claim ended (the CSS classes carry the same names)
OUTCOME_CLASS: Final = {
    DONE: "done",
    RELEASED: "released",
    DEAD: "dead",
    TAKEN_OVER: "taken-over",
    HELD: "held",
}
MARK_CLASS: Final = {LOST: "lost", STALE: "stale", LEASE_LOST: "lease-lost", STALE_FAIL: "stale"}

_NICE_STEPS_S: Final = (
    0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005,
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
    1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400,
)  # fmt: skip


def esc(text: object) -> str:
    return escape(str(text), quote=True)


def dom_id(text: str) -> str:
    """A string safe as (part of) an element id."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)


def nice_step(span_us: int, ticks: int = 10) -> int:
    """A round tick step (µs) that cuts `span_us` into about `ticks` pieces."""
    want = span_us / 1_000_000 / ticks
    step = next((s for s in _NICE_STEPS_S if s >= want), _NICE_STEPS_S[-1])
    return max(1, round(step * 1_000_000))


class Scale:
    """Time (µs) → x (px) over the plot's width."""

    def __init__(self, start: int, end: int, left: float, width: float) -> None:
        self.start, self.end = start, max(end, start + 1)
        self.left, self.width = left, width

    def x(self, t: int) -> float:
        frac = (t - self.start) / (self.end - self.start)
        return round(self.left + min(1.05, max(-0.05, frac)) * self.width, 1)

    def right(self) -> float:
        return self.left + self.width


def _title(*lines: str) -> str:
    return f"<title>{esc(chr(10).join(lines))}</title>"


def _who(worker: str) -> str:
    return f"{worker_label(worker)} ({worker})"


def height(view: View) -> int:
    return TOP + LANE_H * max(1, len(view.lanes)) + BOTTOM


#: what a second layer draws over the lanes, given the time scale and each lane's middle
Overlay = Callable[["Scale", Callable[[str], float]], list[str]]


def render_lanes(view: View, overlay: Overlay | None = None) -> str:
    """The lanes figure: one `<svg>` element; `overlay`'s shapes drawn last, over it."""
    # a margin of time on both sides: a mark on the first or last record is drawn whole
    pad = max(1, (view.end - view.start) // 60)
    scale = Scale(view.start - pad, view.end + pad, LABEL_W, WIDTH - LABEL_W - RIGHT_PAD)
    rows = {lane.worker: i for i, lane in enumerate(view.lanes)}

    def y(worker: str) -> float:
        return TOP + LANE_H * rows[worker] + LANE_H / 2

    h = height(view)
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="lanes" class="lanes" '
        f'width="100%" viewBox="0 0 {WIDTH} {h}" role="img" '
        f'aria-label="claims per worker over time">',
        _defs(h),
    ]
    out += _axis(scale, h, view)
    for i, lane in enumerate(view.lanes):
        top = TOP + LANE_H * i
        out.append(
            f'<g class="lane" id="lane-{dom_id(lane.worker)}" data-worker="{esc(lane.worker)}">'
            f'<rect class="lane-bg{" odd" if i % 2 else ""}" x="0" y="{top}" width="{WIDTH}" '
            f'height="{LANE_H}"/>'
            f'<text class="lane-label" x="{LABEL_W - 10}" y="{top + LANE_H / 2 + 4}">'
            f"{esc(lane.label)}{_title(lane.worker)}</text></g>"
        )
    out.append('<g class="plot" clip-path="url(#plot)">')
    out += [_op(o, scale, rows, h, LabelSpace()) for o in view.ops if o.kind in (PAUSE, SKEW)]
    functions = view.model.functions
    out += [
        _bar(b, scale, y(b.worker), functions.get(b.task)) for b in view.bars if b.worker in rows
    ]
    worded = sum(1 for m in view.marks if m.kind == STALE) <= MAX_WORDED
    space = LabelSpace()  # the takeovers' labels first: they carry the fencing tokens
    arrows = [
        _arrow(a, scale, y, rows, space)
        for a in view.arrows
        if a.from_worker in rows and a.to_worker in rows
    ]
    out += [
        _mark(m, scale, y(m.worker), worded, rows[m.worker], space)
        for m in view.marks
        if m.worker in rows
    ]
    out += [_op(o, scale, rows, h, space) for o in view.ops if o.kind not in (PAUSE, SKEW)]
    out += arrows  # drawn last, over the rest
    if overlay is not None:
        out += overlay(scale, y)
    out.append("</g></svg>")
    return "\n".join(out)


def _defs(h: int) -> str:
    return (
        "<defs>"
        # shapes that begin before the window (or end after it) stop at the plot's edges
        f'<clipPath id="plot"><rect x="{LABEL_W}" y="0" width="{WIDTH - LABEL_W - RIGHT_PAD}" '
        f'height="{h}"/></clipPath>'
        '<marker id="arrowhead" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'class="arrowhead"/></marker>'
        '<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" class="hatch-bg"/>'
        '<line x1="0" y1="0" x2="0" y2="6" class="hatch-line"/></pattern>'
        "</defs>"
    )


def _axis(scale: Scale, h: int, view: View) -> list[str]:
    step = nice_step(scale.end - scale.start)
    first = view.model.start
    t = scale.start + (-(scale.start - first) % step)
    out = ['<g class="axis">']
    while t <= scale.end:
        x = scale.x(t)
        if x > scale.right() - 12:  # its label would be cut at the edge
            break
        seconds = (t - first) / 1_000_000
        label = f"+{seconds:.3f}".rstrip("0").rstrip(".") + " s"
        out.append(
            f'<line class="grid" x1="{x}" y1="{TOP - 4}" x2="{x}" y2="{h - BOTTOM}"/>'
            f'<text class="tick" x="{x}" y="{TOP - 10}">{esc(label)}'
            f"{_title(clock_text(t))}</text>"
        )
        t += step
    out.append("</g>")
    return out


def _bar(b: Bar, scale: Scale, y: float, function: str | None = None) -> str:
    """A claim's bar; `function`: its task's (a task by name), named in its title and, where
    the bar is wide enough, in its label (``17 resize``)."""
    x0, x1 = scale.x(b.start), scale.x(b.end)
    xe = scale.x(b.expiry)
    cls = OUTCOME_CLASS[b.end_kind]
    how = {
        DONE: "DONE",
        RELEASED: "FAIL (released for a retry)",
        DEAD: "FAIL (dead)",
        TAKEN_OVER: "taken over",
    }
    ended = (
        "still held when the log ends"
        if b.end_kind == HELD
        else f"ended: {how[b.end_kind]} @{b.end_position} at {clock_text(b.end)}"
    )
    lines = [
        f"CLAIM @{b.claim} · task {b.task}" + ("" if function is None else f" {function}"),
        f"worker {_who(b.worker)}",
        f"at {clock_text(b.start)} · {'won by takeover' if b.takeover else 'won'}",
        ended,
        f"lease until {clock_text(b.expiry)} · {len(b.renewals)} renewal(s)",
    ]
    if b.late is not None:
        lines.append(f"its holder wrote again at {clock_text(b.late)}, after losing the task")
    title = _title(*lines)
    parts = [f'<g class="claim" data-task="{b.task}" data-claim="{b.claim}">{title}']
    # A finished claim's lease no longer matters after its DONE/FAIL: drawn only up to it.
    lease_end = max(xe, x1) if b.end_kind in (TAKEN_OVER, HELD) else x1
    parts.append(
        f'<rect class="lease" x="{x0}" y="{y - LEASE_H / 2}" '
        f'width="{max(1.0, lease_end - x0):.1f}" '
        f'height="{LEASE_H}" rx="3"/>'
    )
    parts.append(
        f'<rect class="bar {cls}" x="{x0}" y="{y - BAR_H / 2}" width="{max(1.5, x1 - x0):.1f}" '
        f'height="{BAR_H}" rx="2"/>'
    )
    for lapse_start, lapse_end in b.lapses:
        xa, xb = scale.x(lapse_start), scale.x(lapse_end)
        lapse_title = _title(
            f"lease of claim @{b.claim} lapsed {clock_text(lapse_start)} – "
            f"{clock_text(lapse_end)} ({duration_text(lapse_end - lapse_start)})",
            "nobody took the task over meanwhile, so its holder's next record was accepted",
        )
        parts.append(
            f'<rect class="lapse" x="{xa}" y="{y - LEASE_H / 2}" width="{max(1.5, xb - xa):.1f}" '
            f'height="{LEASE_H}">{lapse_title}</rect>'
        )
    for r in b.renewals:
        xr = scale.x(r)
        parts.append(f'<line class="renew" x1="{xr}" y1="{y - 9}" x2="{xr}" y2="{y + 9}"/>')
    lapsed = b.end_kind == TAKEN_OVER or (b.end_kind == HELD and b.expiry < scale.end)
    if lapsed:
        parts.append(
            f'<line class="expiry" x1="{xe}" y1="{y - LEASE_H / 2 - 2}" x2="{xe}" '
            f'y2="{y + LEASE_H / 2 + 2}"/>'
        )
    if b.late is not None:
        xl = scale.x(b.late)
        parts.append(f'<line class="late" x1="{xe}" y1="{y}" x2="{xl}" y2="{y}"/>')
    if x1 - x0 >= 26:
        label = str(b.task)
        if function is not None:  # (the name where it fits, cut as every screen cuts it)
            named = f"{b.task} {function_label(function)}"
            label = named if text_width(named, BAR_LABEL_PX) + 6 <= x1 - x0 else label
        x = (x0 + x1) / 2
        parts.append(f'<text class="bar-label" x="{x:.1f}" y="{y + 4}">{esc(label)}</text>')
    parts.append("</g>")
    return "".join(parts)


def _mark(m: Mark, scale: Scale, y: float, worded: bool, lane: int, space: LabelSpace) -> str:
    x = scale.x(m.at)
    record = "CLAIM" if m.kind == LOST else {STALE: "DONE", LEASE_LOST: "RENEW"}.get(m.kind, "FAIL")
    under = f" under claim @{m.claim}" if m.claim is not None else ""
    title = _title(
        f"{record} @{m.position} · task {m.task}{under}",
        f"worker {_who(m.worker)}",
        f"at {clock_text(m.at)} · {m.verdict}",
    )
    cls = MARK_CLASS[m.kind]
    if m.kind == LOST:
        shape = f'<circle cx="{x}" cy="{y - 13}" r="2.6"/>'
    elif m.kind == STALE:
        shape = f'<path d="M{x},{y - 9} l7,13 h-14 z"/><text x="{x}" y="{y + 3}">!</text>'
        # the fencing, said on the picture: this DONE carried an old token and was refused
        words = f"DONE @{m.position} refused: token @{m.claim}"
        line = (
            space.place(lane, (UPPER, LOWER), x - 9, text_width(words, 10.5), end=True)
            if worded
            else None
        )
        if line is not None:  # else another label is there: the title says it
            shape += (
                f'<text class="refused" x="{x - 9}" y="{y - 5 if line == UPPER else y + 13}">'
                f"{words}</text>"
            )
    else:
        shape = f'<path d="M{x - 4},{y - 4} l8,8 M{x + 4},{y - 4} l-8,8"/>'
    return f'<g class="mark {cls}" data-task="{m.task}">{title}{shape}</g>'


def _op(o: OpMark, scale: Scale, rows: dict[str, int], h: int, space: LabelSpace) -> str:
    r = o.record
    who = r.name or "?"
    if r.worker:
        who = f"{worker_label(r.worker)} ({r.worker})"
    elif r.pid:
        who = f"{r.name}·{r.pid}"
    lines = [f"{o.kind} by {r.by} · {who}", f"at {clock_text(o.at)}"]
    if o.end is not None:
        lines.append(f"until {clock_text(o.end)} ({duration_text(o.end - o.at)})")
    if r.task is not None:
        lines.append(f"holding task {r.task}")
    if r.detail:
        lines.append(r.detail)
    title = _title(*lines)
    x = scale.x(o.at)
    lane_top = TOP + LANE_H * rows[o.lane] if o.lane in rows else None
    cls = f"op {dom_id(o.kind)}"
    if o.kind in (PAUSE, SKEW):
        x1 = scale.x(o.end) if o.end is not None else scale.right()
        top, tall = (lane_top, LANE_H) if lane_top is not None else (TOP, h - TOP - BOTTOM)
        # A pause stops that process only: its lane is shaded; the others work on. Only a
        # pause whose process has no lane here (its id unknown) is shaded across all.
        band = (
            f'<rect class="band" x="{x}" y="{top}" width="{max(2.0, x1 - x):.1f}" height="{tall}"/>'
        )
        if o.kind == SKEW:  # a skewed clock is the lane's own affair, labelled once
            band = f'<text class="skew-label" x="{x + 3}" y="{top + 9}">{esc(r.detail)}</text>'
        return (
            f'<g class="{cls}">{title}{band}<rect class="window" x="{x}" y="{top}" '
            f'width="{max(2.0, x1 - x):.1f}" height="{tall}"/></g>'
        )
    label = {KILL: "kill", DEATH: "died", RESTART: "restart"}.get(o.kind, o.kind)
    if lane_top is None:
        y0, y1 = TOP, h - BOTTOM
    else:
        y0, y1 = lane_top + 1, lane_top + LANE_H - 1
    line = f'<line x1="{x}" y1="{y0}" x2="{x}" y2="{y1}"/>'
    # Labels sit at the lane's foot (a takeover's label uses its head); a kill is usually
    # followed at once by the death it caused, so the kill reads leftwards, the rest right.
    end = o.kind == KILL
    side = f'x="{x - 3}" text-anchor="end"' if end else f'x="{x + 3}"'
    spot: str | None = LOWER
    if o.lane in rows:  # a label too close to another one moves up, or is left out
        at = x - 3 if end else x + 3
        spot = space.place(rows[o.lane], (LOWER, UPPER), at, text_width(label, 10), end=end)
    text = ""
    if spot is not None:
        text = f'<text {side} y="{y1 - 3 if spot == LOWER else y0 + 9}">{esc(label)}</text>'
    return f'<g class="{cls}">{title}{line}{text}</g>'


def _arrow(
    a: Arrow, scale: Scale, y: Callable[[str], float], rows: dict[str, int], space: LabelSpace
) -> str:
    x0, y0 = scale.x(a.from_expiry), y(a.from_worker)
    x1, y1 = scale.x(a.to_at), y(a.to_worker)
    bend = max(18.0, abs(y1 - y0) / 2)
    if y0 == y1:  # taken over by the same process (a new claim): a hop above the lane
        path = f"M{x0},{y0 - 8} C{x0},{y0 - 8 - bend} {x1},{y1 - 8 - bend} {x1},{y1 - 8}"
        lx, ly = (x0 + x1) / 2, y0 - 8 - bend * 0.75
    else:
        # From the lapsed lease's edge to the new bar's edge; a steep hop when the two are
        # close in time, a flat S when far apart. The label sits on the victim's lane just
        # after its expiry, where that lane is empty (its holder is dead or frozen).
        down = 1 if y1 > y0 else -1
        ya, yb = y0 + down * LEASE_H / 2, y1 - down * BAR_H / 2
        if x1 - x0 < 60:
            reach = 30 + abs(x1 - x0) / 2
            path = f"M{x0},{ya} C{x0 + reach},{ya} {x1 + reach},{yb} {x1},{yb}"
        else:
            path = f"M{x0},{y0} C{x0 + bend},{y0} {x1 - bend * 2},{y1} {x1},{y1}"
        lx, ly = x0 + 8, y0 - 5
    anchor = ""
    if lx > WIDTH - RIGHT_PAD - 150:  # no room on the right: the label ends at the expiry
        lx, anchor = x0 - 6, ' text-anchor="end"'
    title = _title(
        f"takeover of task {a.task}",
        f"from {_who(a.from_worker)}: claim @{a.from_claim}, "
        f"lease expired {clock_text(a.from_expiry)}",
        f"to {_who(a.to_worker)}: CLAIM @{a.to_claim} at {clock_text(a.to_at)}",
        f"{duration_text(a.to_at - a.from_expiry)} after expiry; the old token @{a.from_claim} "
        f"is fenced off: its DONE would be refused",
    )
    label = f"task {a.task}: @{a.from_claim} → @{a.to_claim}"
    width, end = text_width(label, 11), bool(anchor)
    text = ""
    if y0 == y1:  # a hop above the lane: its own place, which also takes the upper line
        space.place(rows[a.from_worker], (UPPER,), lx, width, end=end)
        text = f'<text class="arrow-label" x="{lx:.1f}" y="{ly:.1f}"{anchor}>{esc(label)}</text>'
    elif (line := space.place(rows[a.from_worker], (UPPER, LOWER), lx, width, end=end)) is not None:
        ly = ly if line == UPPER else y0 + 14  # (else another takeover's is there: the title)
        text = f'<text class="arrow-label" x="{lx:.1f}" y="{ly:.1f}"{anchor}>{esc(label)}</text>'
    return (
        f'<g class="takeover" id="takeover-{a.to_claim}" data-task="{a.task}">{title}'
        f'<path class="arrow" d="{path}" marker-end="url(#arrowhead)"/>{text}</g>'
    )
