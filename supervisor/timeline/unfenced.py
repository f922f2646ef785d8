"""`qw timeline --rules unfenced`: the original's rules as a second layer over the lanes.

qw's fold draws the lanes (supervisor.timeline.model); this layer adds where the original's
rules (queue_worker.proof.unfenced) judge the same records differently: a green ring on each
DONE qw refused that they would accept (`g.unfenced-accepted`), a dashed line joining the
completions of each task they would complete twice (`g.completed-twice`), a violet diamond
on any other record judged differently (`g.unfenced-differs`); and, under the figure (or
after the text lanes), each difference in words (supervisor.unfenced_text).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, NamedTuple

from queue_worker.proof.report import read_claims
from queue_worker.proof.unfenced import Comparison, Difference, compare
from queue_worker.protocol.records import Done
from queue_worker.protocol.state import Verdict
from supervisor.timeline.labels import text_width
from supervisor.timeline.svg import Scale, esc
from supervisor.timeline.view import View
from supervisor.unfenced_text import (
    UNFENCED_TITLE,
    completed_text,
    difference_text,
    summary_text,
)

CSS: Final = """
.unfenced-accepted circle { fill: none; stroke: #2b8a3e; stroke-width: 2.4; }
.unfenced-differs path { fill: #7048e8; stroke: #fff; stroke-width: 0.8; }
.completed-twice path { fill: none; stroke: #2b8a3e; stroke-width: 1.8;
                        stroke-dasharray: 5 3; }
.completed-twice text { text-anchor: middle; font-size: 10.5px; font-weight: 700; fill: #2b8a3e;
                        paint-order: stroke; stroke: #fff; stroke-width: 3px; }
.unfenced { background: #fff; border: 1px solid #b2f2bb; border-radius: 8px;
            padding: 6px 12px; }
.unfenced li { margin: 3px 0; }
"""


KEY: Final = (
    "On the lanes: a green ring on each DONE qw refused that these rules accept; a dashed "
    "green line joining the completions of a task they complete twice; a violet diamond on "
    "any other record they judge differently. Hover one for its record."
)


class Layer(NamedTuple):
    """The comparison over the whole log, and where each completion it names was written
    (claims position -> the DONE's worker and at)."""

    comparison: Comparison
    dones: dict[int, tuple[str, int]]


def load_layer(location: str) -> Layer:
    """Judge the claims log at `location` under both rule sets."""
    dones: dict[int, tuple[str, int]] = {}
    records = []
    for position, record in read_claims(location):
        if isinstance(record, Done):
            dones[position] = (record.worker, record.at)
        records.append((position, record))
    comparison = compare(records)
    wanted = {p for ps in comparison.completed_twice.values() for p in ps}
    return Layer(comparison, {p: dones[p] for p in wanted})


def in_view(layer: Layer, view: View) -> list[Difference]:
    """The differences in the view's window, about records on its lanes."""
    lanes = {lane.worker for lane in view.lanes}
    return [
        d
        for d in layer.comparison.differences
        if view.start <= d.record.at <= view.end and d.record.worker in lanes
    ]


def _accepted_by_them(d: Difference) -> bool:
    return d.qw.verdict is Verdict.STALE_DONE and d.unfenced.verdict.accepted_done


def overlay(layer: Layer, view: View) -> Callable[[Scale, Callable[[str], float]], list[str]]:
    """What `svg.render_lanes` draws over the lanes for this layer."""

    def draw(scale: Scale, y: Callable[[str], float]) -> list[str]:
        lanes = {lane.worker for lane in view.lanes}
        out: list[str] = []
        for d in in_view(layer, view):
            x, cy = scale.x(d.record.at), y(d.record.worker)
            title = f"<title>{esc(difference_text(d))}</title>"
            if _accepted_by_them(d):
                out.append(
                    f'<g class="unfenced-accepted" data-position="{d.position}">{title}'
                    f'<circle cx="{x}" cy="{cy - 4}" r="11"/></g>'
                )
            else:
                out.append(
                    f'<g class="unfenced-differs" data-position="{d.position}">{title}'
                    f'<path d="M{x},{cy - 19} l5,5 l-5,5 l-5,-5 z"/></g>'
                )
        for task, positions in layer.comparison.completed_twice.items():
            points = [layer.dones[p] for p in positions if layer.dones[p][0] in lanes]
            if len(points) < 2:
                continue
            path = " ".join(
                f"{'M' if i == 0 else 'L'}{scale.x(at)},{y(w) + 10}"
                for i, (w, at) in enumerate(points)
            )
            label = f"task {task} completed {len(points)}× without fencing"
            # at the line's middle, inside the plot whichever end is at its edge
            xs = [scale.x(at) for _, at in points]
            half = text_width(label, 10.5) / 2 + 4
            lx = min(max((min(xs) + max(xs)) / 2, scale.left + half), scale.right() - half)
            ly = max(y(w) for w, _ in points) + 15
            out.append(
                f'<g class="completed-twice" data-task="{task}">'
                f"<title>{esc(completed_text(task, positions))}</title>"
                f'<path d="{path}"/><text x="{lx}" y="{ly}">{esc(label)}</text></g>'
            )
        return out

    return draw


def section_html(layer: Layer, view: View) -> str:
    """The differences in words, under the figure."""
    items = "".join(f"<li>{esc(difference_text(d))}</li>" for d in in_view(layer, view))
    return (
        f"<h2>{esc(UNFENCED_TITLE.rstrip(':'))}</h2>"
        f'<div class="unfenced"><p>{esc(KEY)}</p><ul>{items}</ul>'
        f"<p>{esc(summary_text(layer.comparison))}</p></div>"
    )


def text_lines(layer: Layer, view: View) -> list[str]:
    """`--text`: the lines after the lanes."""
    return [
        UNFENCED_TITLE,
        *(f"≠ {difference_text(d)}" for d in in_view(layer, view)),
        summary_text(layer.comparison),
    ]
