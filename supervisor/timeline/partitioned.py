"""`qw timeline` on a partitioned queue: one page, a section per partition.

Each partition is its own run as far as a timeline goes — its own claims log, fold, task
ids and workers — so each is modelled as `qw timeline` models a queue (`load_model` on the
partition's location) and drawn in a section of its own: its facts, its lanes (one per
worker process that worked it; a member of `qw up --rebalance` has a lane in each
partition it worked), with the task ids of that partition (task 5 in "partition 2" is
``2:5``). The page opens with the whole queue's counts. --from/--to take times (a clock
time, or +SECONDS after the queue's first record), the same window for every partition;
--tasks takes ``k:id`` names (``0:3,2:10-12``). A claims position (@120) is one
partition's: refused in one line, naming where to give it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from queue_worker.partition_layout import Manifest, partition_location
from queue_worker.proof.report import ReportInputError, clock_text, duration_text, has_logs
from supervisor.timeline.model import Model
from supervisor.timeline.page import LEGEND, _charts, _facts, _present, _swatch, page_head
from supervisor.timeline.svg import esc, render_lanes
from supervisor.timeline.view import BoundError, View, parse_bound, parse_tasks, select

__all__ = [
    "PartitionViews",
    "load_partition_views",
    "parse_partition_tasks",
    "render_page",
    "write_page",
]


@dataclass(frozen=True)
class PartitionViews:
    """Each partition's view (partitions with no logs yet left out), in partition order."""

    count: int
    views: tuple[tuple[int, View], ...]

    @property
    def notes(self) -> list[str]:
        return [f"partition {k}: {note}" for k, view in self.views for note in view.notes]


def parse_partition_tasks(text: str, count: int) -> dict[int, frozenset[int]]:
    """``0:3,2:10-12`` → {0: {3}, 2: {10, 11, 12}}. BoundError naming what was expected."""
    wanted: dict[int, set[int]] = {}
    for part in text.split(","):
        head, sep, ids = part.strip().partition(":")
        if not sep or not head.isdigit():
            raise BoundError(
                f"got {part.strip()!r}; on a partitioned queue name tasks PARTITION:IDS, "
                "like 0:3 or 2:10-12"
            )
        k = int(head)
        if k >= count:
            raise BoundError(f"partition {k} does not exist: the queue has {count} (0–{count - 1})")
        wanted.setdefault(k, set()).update(parse_tasks(ids))
    return {k: frozenset(ids) for k, ids in wanted.items()}


def load_partition_views(
    location: str,
    manifest: Manifest,
    tasks: str | None,
    start: str | None,
    end: str | None,
) -> PartitionViews:
    """Each partition's model, narrowed alike. ReportInputError for a damaged partition;
    BoundError (with the option's name) for a bad --tasks/--from/--to."""
    models: list[tuple[int, Model]] = []
    for k in range(manifest.count):
        where = partition_location(location, k, manifest.count)
        if not has_logs(where):  # (no task went there yet)
            continue
        from supervisor.timeline.load import load_model

        try:
            models.append((k, load_model(where)))
        except ReportInputError as e:
            raise ReportInputError(f"partition {k}: {e}") from e
    try:
        wanted = parse_partition_tasks(tasks, manifest.count) if tasks is not None else None
    except BoundError as e:
        raise BoundError(f"--tasks: {e}") from e
    first = min((m for _, m in models if not m.empty), key=lambda m: m.start, default=None)
    bounds: list[int | None] = []
    for option, value in (("--from", start), ("--to", end)):
        if value is not None and value.strip().lstrip("@").isdigit():
            raise BoundError(
                f"{option} {value}: a claims position is one partition's; give a time "
                "(12:00:01.5, +4.5s), or a partition's location (--dir DIR/p<k>) with a position"
            )
        if value is None or first is None:
            bounds.append(None)
        else:
            try:
                bounds.append(parse_bound(value, first))
            except BoundError as e:
                raise BoundError(f"{option}: {e}") from e
    views = []
    for k, model in models:
        if wanted is not None and k not in wanted:
            continue
        try:
            view = select(model, None if wanted is None else wanted[k], *bounds)
        except BoundError as e:
            raise BoundError(f"--from/--to: {e}") from e
        views.append((k, view))
    return PartitionViews(manifest.count, tuple(views))


def render_page(parts: PartitionViews, location: str) -> str:
    """The page: the whole queue's counts, then a section per partition."""
    sections = []
    for k, view in parts.views:
        m = view.model
        span = (
            f"{clock_text(m.start)} – {clock_text(m.end)} ({duration_text(m.end - m.start)})"
            if not m.empty
            else "an empty log"
        )
        if view.narrowed:
            span += f"; the lanes show {clock_text(view.start)} – {clock_text(view.end)}"
        notes = "".join(f"<div>{esc(n)}</div>" for n in view.notes)
        legend = "".join(
            f"<span>{_swatch(cls, shape)}{esc(text)}</span>"
            for cls, shape, text in LEGEND
            if (cls or shape) in _present(view)
        )
        sections.append(
            f"""<h2 id="p{k}">partition {k} <span class="sub">· {esc(span)} · task n here is
{k}:n</span></h2>
<ul class="facts">{_facts(view)}</ul>
{f'<div class="notes">{notes}</div>' if notes else ""}
<div class="legend">{legend}</div>
<div class="figure">{render_lanes(view)}</div>
<details><summary>partition {k} over time</summary><div class="charts">{_charts(view)}</div>
</details>"""
        )
    published = sum(len(v.model.enqueued) for _, v in parts.views)
    done = sum(len(v.model.done_at) for _, v in parts.views)
    takeovers = sum(len(v.model.arrows) for _, v in parts.views)
    index = " · ".join(f'<a href="#p{k}">p{k}</a>' for k, _ in parts.views)
    body = "\n".join(sections) or "<p>No partition has any record yet.</p>"
    return f"""{page_head(location)}
<p class="sub">{esc(location)} · a queue of {parts.count} partitions, each its own run: its
own claims log, fold, task ids and lanes · hover any shape for its record</p>
<ul class="facts"><li><b>{published}</b> tasks published</li><li><b>{done}</b> done</li>
<li><b>{takeovers}</b> takeovers</li><li>{index}</li></ul>
{body}
<footer>Drawn by <code>qw timeline</code> from each partition's claims, tasks and ops logs,
folded with the same ClaimState every worker uses: every colour is the fold's verdict.
Hand-written SVG, no script, nothing loaded from the network.</footer>
</body>
</html>
"""


def write_page(parts: PartitionViews, location: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_page(parts, location), encoding="utf-8")
