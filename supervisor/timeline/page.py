"""The timeline page: one self-contained HTML file (inline SVG and CSS, no script, nothing
fetched from the network), so it opens offline in any browser and can be mailed around.

`render_page` is pure: a `View` in, the page's text out.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Final

from queue_worker.ops import DEATH, KILL, PAUSE, RESTART, SKEW
from queue_worker.proof.report import clock_text, duration_text
from supervisor.timeline.charts import (
    Series,
    Window,
    done_per_second,
    histogram,
    queue_depth,
    takeover_delays,
    time_chart,
    time_to_claim,
)
from supervisor.timeline.model import HELD, LOST, STALE, TAKEN_OVER
from supervisor.timeline.svg import MARK_CLASS, OUTCOME_CLASS, esc, render_lanes
from supervisor.timeline.view import View

if TYPE_CHECKING:
    from supervisor.timeline.unfenced import Layer

CSS: Final = """
body { font: 13px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: #1d2330; background: #fafbfc; margin: 0; padding: 18px 24px 40px; }
h1 { font-size: 19px; margin: 0 0 2px; }
h2 { font-size: 14px; margin: 22px 0 6px; color: #3a4252; }
.sub { color: #5b6474; margin: 0 0 10px; }
.facts { display: flex; flex-wrap: wrap; gap: 6px 8px; margin: 8px 0 4px; padding: 0; }
.facts li { list-style: none; background: #fff; border: 1px solid #e1e5eb; border-radius: 6px;
            padding: 3px 9px; }
.facts b { font-variant-numeric: tabular-nums; }
.facts .warn { border-color: #f0a35e; background: #fff6ec; }
.facts .bad { border-color: #e03131; background: #fff0f0; }
.notes { color: #8a5a00; background: #fff8e6; border: 1px solid #f2d48a; border-radius: 6px;
         padding: 6px 10px; margin: 8px 0; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; margin: 6px 0 8px; color: #3a4252; }
.legend span { display: inline-flex; align-items: center; gap: 5px; }
.figure { background: #fff; border: 1px solid #e1e5eb; border-radius: 8px; padding: 6px 0;
          overflow-x: auto; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(660px, 1fr));
          gap: 12px; }
.charts .figure { padding: 4px; }
svg text { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
.lane-bg { fill: #ffffff; } .lane-bg.odd { fill: #f4f6f9; }
.lane-label { text-anchor: end; font-size: 12px; font-weight: 600; fill: #2d3648;
              font-variant-numeric: tabular-nums; }
.grid { stroke: #e3e7ee; stroke-width: 1; }
.tick, .x-tick { font-size: 10.5px; fill: #6b7382; text-anchor: middle; }
.y-tick { font-size: 10.5px; fill: #6b7382; text-anchor: end; }
.y-unit { font-size: 10.5px; fill: #6b7382; text-anchor: end; }
.lease { fill: #e4ecf7; stroke: #b3c4dc; stroke-width: 0.8; }
.bar { stroke: rgba(0,0,0,0.25); stroke-width: 0.6; }
.bar.done, .sw-done { fill: #2f9e66; } .bar.released, .sw-released { fill: #f0a53a; }
.bar.dead, .sw-dead { fill: #a61e1e; } .bar.taken-over, .sw-taken-over { fill: #9a8fc8; }
.bar.held, .sw-held { fill: #3a78c2; }
.bar-label { font-size: 9.5px; fill: #fff; text-anchor: middle; pointer-events: none;
             font-weight: 600; }
.renew { stroke: #2c4a75; stroke-width: 1.3; }
.lapse { fill: none; stroke: #e03131; stroke-width: 1.6; stroke-dasharray: 3 2; }
.expiry { stroke: #e03131; stroke-width: 2.2; }
.late { stroke: #e8590c; stroke-width: 2.2; stroke-dasharray: 4 3; }
.mark.lost circle { fill: #8d95a3; }
.mark.stale path { fill: #f76707; stroke: #b34700; stroke-width: 0.8; }
.mark.stale text { font-size: 9px; font-weight: 700; fill: #fff; text-anchor: middle; }
.mark.stale text.refused { font-size: 10.5px; fill: #c2410c; text-anchor: end;
                           paint-order: stroke; stroke: #fff; stroke-width: 3px; }
.mark.lease-lost path { stroke: #c92a2a; stroke-width: 2; fill: none; }
.op line { stroke-width: 1.6; }
.op text { font-size: 10px; font-weight: 600; paint-order: stroke; stroke: #fff;
           stroke-width: 3px; stroke-linejoin: round; }
.op.kill line { stroke: #c92a2a; stroke-dasharray: 5 3; } .op.kill text { fill: #c92a2a; }
.op.death line { stroke: #4a0d0d; stroke-width: 2.4; } .op.death text { fill: #4a0d0d; }
.op.restart line { stroke: #2b8a3e; } .op.restart text { fill: #2b8a3e; }
.op.resume line { stroke: #a87700; } .op.resume text { fill: #a87700; }
.op .window { fill: url(#hatch); opacity: 0.75; }
.op .band { fill: #f5b50a; opacity: 0.07; }
.op.skew .window { fill: #7048e8; opacity: 0.09; }
.skew-label { font-size: 9.5px; fill: #5f3dc4; font-weight: 600; }
.hatch-bg { fill: #fff3bf; } .hatch-line { stroke: #f0b400; stroke-width: 2; }
.takeover .arrow { fill: none; stroke: #c2255c; stroke-width: 2; }
.arrowhead { fill: #c2255c; }
.arrow-label { font-size: 11px; font-weight: 700; fill: #a61e4d; paint-order: stroke;
               stroke: #fff; stroke-width: 3.5px; stroke-linejoin: round; }
.chart-title { font-size: 12.5px; font-weight: 600; fill: #2d3648; }
.chart-note { font-size: 10.5px; fill: #6b7382; text-anchor: end; }
.empty { font-size: 12px; fill: #8d95a3; text-anchor: middle; }
.axis-line { stroke: #9aa3b2; }
.line { fill: none; stroke-width: 2; }
.s-done { fill: #2f9e66; } .line.s-pending { stroke: #f08c00; } .line.s-held { stroke: #3a78c2; }
rect.s-pending { fill: #f08c00; } rect.s-held { fill: #3a78c2; }
.hist { fill: #5c7cfa; } #chart-takeover-delay .hist { fill: #c2255c; }
.w-pause { fill: #f5b50a; opacity: 0.18; } .w-kill { fill: #e03131; opacity: 0.35; }
.w-view { fill: #3a78c2; opacity: 0.07; }
footer { margin-top: 26px; color: #8d95a3; font-size: 11.5px; }
"""


def _swatch(cls: str, shape: str = "bar") -> str:
    if shape == "lease":
        body = '<rect class="lease" x="1" y="1" width="26" height="12" rx="3"/>'
    elif shape == "renew":
        body = '<rect class="lease" x="1" y="1" width="26" height="12" rx="3"/>' + "".join(
            f'<line class="renew" x1="{x}" y1="1" x2="{x}" y2="13"/>' for x in (9, 18)
        )
    elif shape == "expiry":
        body = '<line class="expiry" x1="14" y1="0" x2="14" y2="14"/>'
    elif shape == "lapse":
        body = '<rect class="lapse" x="2" y="2" width="24" height="10"/>'
    elif shape == "late":
        body = '<line class="late" x1="1" y1="7" x2="27" y2="7"/>'
    elif shape == "lost":
        body = '<g class="mark lost"><circle cx="14" cy="7" r="3"/></g>'
    elif shape == "stale":
        body = '<g class="mark stale"><path d="M14,1 l7,12 h-14 z"/></g>'
    elif shape == "arrow":
        body = '<g class="takeover"><path class="arrow" d="M2,11 C10,11 14,3 26,3"/></g>'
    elif shape == "pause":
        body = '<g class="op"><rect class="window" x="1" y="1" width="26" height="12"/></g>'
    elif shape == "kill":
        body = '<g class="op kill"><line x1="14" y1="0" x2="14" y2="14"/></g>'
    else:
        body = f'<rect class="bar {cls}" x="1" y="3" width="26" height="8" rx="2"/>'
    return f'<svg width="28" height="14" viewBox="0 0 28 14" aria-hidden="true">{body}</svg>'


LEGEND: Final = (
    ("done", "bar", "claim → DONE"),
    ("released", "bar", "claim → FAIL, retried later"),
    ("dead", "bar", "claim → FAIL, dead"),
    ("taken-over", "bar", "lease lapsed, taken over"),
    ("held", "bar", "still held"),
    ("", "renew", "lease, with renewals"),
    ("", "expiry", "lease expired here"),
    ("", "lapse", "lease lapsed, nobody took over"),
    ("", "late", "worked on past its lease"),
    ("", "arrow", "takeover (old token → new)"),
    ("", "lost", "lost CLAIM"),
    ("", "stale", "stale DONE (refused)"),
    ("", "pause", "paused (SIGSTOP)"),
    ("", "kill", "kill / death / restart"),
)


def _present(view: View) -> set[str]:
    """The legend's keys for what this view draws: a legend of absent things is noise."""
    keys = {OUTCOME_CLASS[b.end_kind] for b in view.bars} | {"renew"}
    keys |= {MARK_CLASS[m.kind] for m in view.marks}
    if any(b.lapses for b in view.bars):
        keys.add("lapse")
    if any(b.late is not None for b in view.bars):
        keys.add("late")
    if view.arrows or any(b.end_kind in (TAKEN_OVER, HELD) for b in view.bars):
        keys.add("expiry")
    if view.arrows:
        keys.add("arrow")
    kinds = {o.kind for o in view.ops}
    if PAUSE in kinds:
        keys.add("pause")
    if kinds & {KILL, DEATH, RESTART}:
        keys.add("kill")
    return keys


def _facts(view: View) -> str:
    m = view.model
    kinds = Counter(mark.kind for mark in m.marks)
    ops = Counter(o.kind for o in m.ops)
    items = [
        ("", _count(len(m.lanes), "worker process", "worker processes")),
        ("", _count(len(m.enqueued), "task published", "tasks published")),
        ("", _count(len(m.done_at), "done", "done")),
        ("", _count(len(m.bars), "claim won", "claims won")),
        ("warn" if m.arrows else "", _count(len(m.arrows), "takeover", "takeovers")),
        ("", _count(kinds[LOST], "lost claim", "lost claims")),
        ("bad" if kinds[STALE] else "", _count(kinds[STALE], "stale DONE", "stale DONEs")),
    ]
    items += [("warn", f"<b>{n}</b> {esc(kind)}") for kind, n in sorted(ops.items())]
    items.append(("" if m.checks.valid else "bad", esc(m.checks.summary)))
    return "".join(f'<li class="{cls}">{text}</li>' for cls, text in items)


def _count(n: int, one: str, many: str) -> str:
    """`n` in bold and the noun that agrees with it ("1 takeover", "2 takeovers")."""
    return f"<b>{n}</b> {one if n == 1 else many}"


def _charts(view: View) -> str:
    m = view.model
    windows = [
        Window(o.at, o.end if o.end is not None else m.end, "w-pause", f"{o.kind} {o.lane}")
        for o in m.ops
        if o.kind == PAUSE
    ]
    windows += [
        Window(o.at, o.at, "w-kill", f"{o.kind} {o.record.name}")
        for o in m.ops
        if o.kind not in (PAUSE, SKEW)
    ]
    if view.narrowed:
        windows.append(Window(view.start, view.end, "w-view", "the part the lanes show"))
    width, rate = done_per_second(m)
    pending, held = queue_depth(m)
    per = duration_text(width)
    charts = [
        time_chart(
            "chart-throughput",
            f"tasks done per second ({per} bins)",
            "/s",
            [Series("done", "s-done", rate)],
            m.start,
            m.end,
            windows,
            bars=True,
        ),
        time_chart(
            "chart-depth",
            "pending and held tasks",
            "tasks",
            [pending, held],
            m.start,
            m.end,
            windows,
            whole=True,
        ),
        histogram(
            "chart-claim-wait",
            "time to first claim (enqueue → winning CLAIM)",
            time_to_claim(m),
            "no task was claimed",
        ),
        histogram(
            "chart-takeover-delay",
            "takeover delay after the lease expired",
            takeover_delays(m),
            "no takeover in this run",
        ),
    ]
    return "".join(f'<div class="figure">{c}</div>' for c in charts)


def page_head(location: str) -> str:
    """The page's head and title, the same for one queue's page and a partitioned one's."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>qw timeline: {esc(location)}</title>
<style>{CSS}</style>
</head>
<body>
<h1>qw timeline</h1>"""


def render_page(view: View, location: str, unfenced: Layer | None = None) -> str:
    """The whole HTML page for `view` of the run at `location`; with `unfenced`, the
    original's rules as a second layer (supervisor.timeline.unfenced)."""
    m = view.model
    lanes, section, css = render_lanes(view), "", ""
    if unfenced is not None:
        from supervisor.timeline import unfenced as layer

        lanes = render_lanes(view, layer.overlay(unfenced, view))
        section, css = layer.section_html(unfenced, view), f"<style>{layer.CSS}</style>"
    span = (
        f"{clock_text(m.start)} – {clock_text(m.end)} ({duration_text(m.end - m.start)})"
        if not m.empty
        else "an empty log"
    )
    shown = ""
    if view.narrowed:
        shown = f"; the lanes show {clock_text(view.start)} – {clock_text(view.end)}"
    notes = "".join(f"<div>{esc(n)}</div>" for n in view.notes)
    shown_keys = _present(view)
    legend = "".join(
        f"<span>{_swatch(cls, shape)}{esc(text)}</span>"
        for cls, shape, text in LEGEND
        if (cls or shape) in shown_keys
    )
    return f"""{page_head(location)}
{css}<p class="sub">{esc(location)} · {esc(span)}{esc(shown)} · hover any shape for its record</p>
<ul class="facts">{_facts(view)}</ul>
{f'<div class="notes">{notes}</div>' if notes else ""}
<div class="legend">{legend}</div>
<div class="figure">{lanes}</div>
{section}
<h2>The run over time</h2>
<div class="charts">{_charts(view)}</div>
<footer>Drawn by <code>qw timeline</code> from the claims, tasks and ops logs, folded with the
same ClaimState every worker uses: every colour is the fold's verdict. Hand-written SVG, no
script, nothing loaded from the network.</footer>
</body>
</html>
"""
