"""The plots under the lanes, as SVG text: throughput, queue depth, two histograms.

Pure: lists of numbers in, one `<svg>` string out per chart. The series come from the
model (`series_*`), the drawing from three small chart functions that know nothing of qw.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Final, NamedTuple

from supervisor.timeline.model import DEAD, DONE, HELD, TAKEN_OVER, Model
from supervisor.timeline.svg import Scale, esc, nice_step

CHART_W: Final = 660
CHART_H: Final = 190
PAD_L: Final = 48
PAD_R: Final = 26
PAD_T: Final = 30
PAD_B: Final = 34
MAX_BINS: Final = 120


class Series(NamedTuple):
    name: str
    css: str  # the CSS class that colours it
    points: tuple[tuple[int, float], ...]  # (time µs, value)


class Window(NamedTuple):
    """A shaded span on a time chart (an op window, or the part the lanes show)."""

    start: int
    end: int
    css: str
    title: str


# -- the series -------------------------------------------------------------------------------


def bin_width(start: int, end: int) -> int:
    """A round bin width (µs) giving at most MAX_BINS bins, at least a millisecond."""
    span = max(1, end - start)
    return max(nice_step(span, MAX_BINS), 1000)


def rate_bin_width(start: int, end: int) -> int:
    """Bins for a rate: about 40 of them, at least 0.1 s (finer is only noise)."""
    return max(nice_step(max(1, end - start), 40), 100_000)


def done_per_second(model: Model) -> tuple[int, tuple[tuple[int, float], ...]]:
    """(bin width, [(bin start, DONEs per second in it)]) over the run."""
    width = rate_bin_width(model.start, model.end)
    bins = (model.end - model.start) // width + 1
    counts = [0] * bins
    for at in model.done_at:
        counts[min(bins - 1, max(0, (at - model.start) // width))] += 1
    rate = 1_000_000 / width
    return width, tuple((model.start + i * width, c * rate) for i, c in enumerate(counts))


def queue_depth(model: Model) -> tuple[Series, Series]:
    """Pending (published, not yet claimed or done) and held (a claim holds it) over time,
    sampled at bin ends: step functions of the records' times."""
    width = bin_width(model.start, model.end)
    enq = sorted(model.enqueued)
    # held: +1 when a claim wins a task nobody held, −1 when it ends (a takeover hands over)
    changes: list[tuple[int, int]] = []
    closed: list[int] = []
    for b in model.bars:
        if not b.takeover:
            changes.append((b.start, 1))
        if b.end_kind not in (TAKEN_OVER, HELD):
            changes.append((b.end, -1))
        if b.end_kind in (DONE, DEAD):
            closed.append(b.end)
    changes.sort()
    closed.sort()
    held_t = [t for t, _ in changes]
    running = 0
    held_after: list[int] = []
    for _, d in changes:
        running += d
        held_after.append(running)
    pending_pts: list[tuple[int, float]] = []
    held_pts: list[tuple[int, float]] = []
    t = model.start
    while True:
        i = bisect.bisect_right(held_t, t)
        held = held_after[i - 1] if i else 0
        published = bisect.bisect_right(enq, t)
        done = bisect.bisect_right(closed, t)
        held_pts.append((t, float(held)))
        pending_pts.append((t, float(max(0, published - done - held))))
        if t >= model.end:
            break
        t = min(model.end, t + width)
    return Series("pending", "s-pending", tuple(pending_pts)), Series(
        "held", "s-held", tuple(held_pts)
    )


def time_to_claim(model: Model) -> list[int]:
    """µs from each task's enqueue to its first winning CLAIM (tasks ever won)."""
    first: dict[int, int] = {}
    for b in model.bars:
        if b.task not in first or b.start < first[b.task]:
            first[b.task] = b.start
    return [
        at - model.enqueued[task]
        for task, at in first.items()
        if 0 <= task < len(model.enqueued) and model.enqueued[task] >= 0
    ]


def takeover_delays(model: Model) -> list[int]:
    """µs from each lapsed lease's expiry to the CLAIM that took its task over."""
    return [a.to_at - a.from_expiry for a in model.arrows]


# -- the charts -------------------------------------------------------------------------------


def _frame(chart_id: str, title: str, y_max: float, y_unit: str) -> list[str]:
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{chart_id}" class="chart" '
        f'width="100%" viewBox="0 0 {CHART_W} {CHART_H}" role="img" '
        f'aria-label="{esc(title)}">',
        f'<text class="chart-title" x="{PAD_L}" y="18">{esc(title)}</text>',
    ]
    bottom = CHART_H - PAD_B
    for k in range(5):
        value = y_max * k / 4
        y = bottom - (bottom - PAD_T) * k / 4
        text = f"{round(value, 2):g}"
        out.append(
            f'<line class="grid" x1="{PAD_L}" y1="{y:.1f}" x2="{CHART_W - PAD_R}" y2="{y:.1f}"/>'
            f'<text class="y-tick" x="{PAD_L - 6}" y="{y + 4:.1f}">{text}</text>'
        )
    out.append(f'<text class="y-unit" x="{PAD_L - 6}" y="{PAD_T - 10}">{esc(y_unit)}</text>')
    return out


def _nice_max(value: float, whole: bool = False) -> float:
    """A round top for the y axis; `whole`: counts, whose four grid steps stay whole."""
    if whole:  # a round top whose quarters are whole: 8, 120, 1500, 10000
        return float(max(4, -(-int(_nice_max(value)) // 4) * 4))
    if value <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(value))) / 10 if value >= 1 else 0.1
    for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if value <= m * magnitude:
            return m * magnitude
    return value


def _time_axis(scale: Scale, start: int) -> list[str]:
    out = []
    step = nice_step(scale.end - scale.start, 6)
    t = scale.start + (-(scale.start - start) % step)
    while t <= scale.end:
        x = scale.x(t)
        if x > scale.right() - 14:  # its label would be cut at the edge
            break
        label = f"+{(t - start) / 1_000_000:.3f}".rstrip("0").rstrip(".") + " s"
        out.append(f'<text class="x-tick" x="{x}" y="{CHART_H - PAD_B + 16}">{esc(label)}</text>')
        t += step
    return out


def time_chart(
    chart_id: str,
    title: str,
    y_unit: str,
    series: Sequence[Series],
    start: int,
    end: int,
    windows: Sequence[Window] = (),
    bars: bool = False,
    whole: bool = False,
) -> str:
    """Values over time: lines (steps), or bars for the first series when `bars`; `whole`:
    the values are counts."""
    y_max = _nice_max(max((v for s in series for _, v in s.points), default=0.0), whole)
    out = _frame(chart_id, title, y_max, y_unit)
    scale = Scale(start, end, PAD_L, CHART_W - PAD_L - PAD_R)
    bottom = CHART_H - PAD_B

    def y(v: float) -> float:
        return round(bottom - (bottom - PAD_T) * v / y_max, 1)

    for w in windows:
        x0, x1 = scale.x(w.start), scale.x(w.end)
        out.append(
            f'<rect class="{w.css}" x="{x0}" y="{PAD_T}" width="{max(1.5, x1 - x0):.1f}" '
            f'height="{bottom - PAD_T}"><title>{esc(w.title)}</title></rect>'
        )
    for s in series:
        pts = s.points
        if bars and pts:
            step = (pts[1][0] - pts[0][0]) if len(pts) > 1 else max(1, end - start)
            for t, v in pts:
                if v <= 0:
                    continue
                x0, x1 = scale.x(t), scale.x(t + step)
                out.append(
                    f'<rect class="{s.css}" x="{x0}" y="{y(v)}" '
                    f'width="{max(1.0, x1 - x0 - 0.6):.1f}" '
                    f'height="{bottom - y(v):.1f}"><title>{esc(f"{v:g} {y_unit}")}</title></rect>'
                )
            continue
        d = " ".join(
            (f"M{scale.x(t)},{y(v)}" if i == 0 else f"H{scale.x(t)} V{y(v)}")
            for i, (t, v) in enumerate(pts)
        )
        out.append(f'<path class="line {s.css}" d="{d}"><title>{esc(s.name)}</title></path>')
    out += _time_axis(scale, start)
    if len(series) > 1:
        for i, s in enumerate(series):
            x = CHART_W - PAD_R - 150 + i * 75
            out.append(
                f'<rect class="{s.css} key" x="{x}" y="9" width="12" height="4"/>'
                f'<text class="key-text" x="{x + 16}" y="15">{esc(s.name)}</text>'
            )
    out.append(
        f'<line class="axis-line" x1="{PAD_L}" y1="{bottom}" x2="{CHART_W - PAD_R}" y2="{bottom}"/>'
    )
    out.append("</svg>")
    return "\n".join(out)


def histogram(chart_id: str, title: str, values_us: Sequence[int], empty: str) -> str:
    """A histogram of durations, with round bins; `empty` is said when there are none."""
    if not values_us:
        out = _frame(chart_id, title, 1, "count")
        out.append(
            f'<text class="empty" x="{CHART_W / 2}" y="{CHART_H / 2 + 10}">{esc(empty)}</text>'
        )
        out.append("</svg>")
        return "\n".join(out)
    low, high = min(values_us), max(values_us)
    low = min(low, 0)
    width = max(1, nice_step(high - low + 1, 24))
    first = (low // width) * width
    bins = max(12, (high - first) // width + 1)  # one sample is a bar, not the whole chart
    counts = [0] * bins
    for v in values_us:
        counts[(v - first) // width] += 1
    y_max = _nice_max(max(counts), whole=True)
    out = _frame(chart_id, title, y_max, "count")
    bottom = CHART_H - PAD_B
    plot = CHART_W - PAD_L - PAD_R
    col = plot / bins
    from queue_worker.proof.report import duration_text

    for i, c in enumerate(counts):
        lo = first + i * width
        x = PAD_L + i * col
        h = (bottom - PAD_T) * c / y_max
        if c:
            out.append(
                f'<rect class="hist" x="{x + 0.5:.1f}" y="{bottom - h:.1f}" '
                f'width="{max(1.0, col - 1):.1f}" height="{h:.1f}">'
                f"<title>{esc(f'{duration_text(lo)} – {duration_text(lo + width)}: {c}')}</title>"
                "</rect>"
            )
    every = max(1, bins // 6)
    for i in range(0, bins + 1, every):
        x = PAD_L + i * col
        out.append(
            f'<text class="x-tick" x="{x:.1f}" y="{bottom + 16}">'
            f"{esc(duration_text(first + i * width))}</text>"
        )
    n = len(values_us)
    ordered = sorted(values_us)
    median = ordered[n // 2]
    out.append(
        f'<text class="chart-note" x="{CHART_W - PAD_R}" y="18">{n} samples · median '
        f"{esc(duration_text(median))} · max {esc(duration_text(ordered[-1]))}</text>"
    )
    out.append(
        f'<line class="axis-line" x1="{PAD_L}" y1="{bottom}" x2="{CHART_W - PAD_R}" y2="{bottom}"/>'
    )
    out.append("</svg>")
    return "\n".join(out)
