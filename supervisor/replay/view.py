"""The screen of `qw replay` at one moment: pure builders of rich Text lines.

`screen_lines(moment, lanes, width, height)` lays the moment out in `height` lines of at
most `width` columns: the record just applied with its verdict and `qw why`'s words for it,
the ops records right after it, the counters, the tasks in play (holder, fencing token,
attempts, lease left by the record's own clock), and each worker's lane as a strip with
the current moment marked (▼ above, the cell reversed). At 80×24 every part fits; a larger
screen gets more rows, wider strips and the legend. `plain_screen` is the same lines as
text, for `--no-tui`.
"""

from __future__ import annotations

import textwrap
from typing import Final

from rich.text import Text

from queue_worker.names import printable, worker_label
from queue_worker.ops import OpRecord
from queue_worker.proof.explain import op_text
from queue_worker.protocol.records import Claim, Done, Renew, Unknown
from queue_worker.protocol.state import ClaimState
from queue_worker.times import clock_text, duration_text
from supervisor.replay.model import Moment, Stepper
from supervisor.timeline.model import build_model
from supervisor.timeline.text import LEGEND, lane_cells
from supervisor.timeline.view import View, select

#: the keys, as the bottom line shows them
KEYS_LINE: Final = "→← step  ][ event  space play  +- speed  g go  / follow  ? keys  q quit"
KEYS_HELP: Final = (
    ("→ / ←", "apply / un-apply one record"),
    ("] / [", "next / previous event: takeover, lease lost, stale DONE, FAIL, dead, kill, pause"),
    ("space", "play at the run's own pace (again: stop)"),
    ("+ / -", "play faster / slower"),
    ("g", "go to a position (@1234) or a time (12:00:01.5, +4.5s); Home/End: the ends"),
    ("/", "follow a task (7) or a worker (w1·1234): steps stop at its records; empty: all"),
    ("?", "this list (any key closes it)"),
    ("q", "quit"),
)
#: verdict words and their colours
_STYLE: Final = {
    "won": "green",
    "takeover": "bold magenta",
    "done": "bold green",
    "renewed": "cyan",
    "stale done": "bold red",
    "lease lost": "bold red",
    "stale fail": "red",
    "released": "yellow",
    "dead": "bold red",
}
#: the columns before a lane's cells
_LABEL: Final = 10
#: on a long run, the lanes show this many snapshots' worth of records around the moment
STRETCH_BLOCKS: Final = 2


class Lanes:
    """The workers' lanes (`qw timeline`'s model of the same records, its cells), drawn
    for the whole run, or on a long run for a stretch of it around the moment."""

    def __init__(self, stepper: Stepper) -> None:
        self.stepper = stepper
        tape = stepper.tape
        #: the whole run's span (what `g +4.5s` counts from)
        self.start = tape.clock[0] if len(tape) else 0
        self.end = tape.clock[-1] if len(tape) else 0
        self._whole = len(tape) <= STRETCH_BLOCKS * stepper.every
        self._block: int | None = None
        self._view: View | None = None

    def view_at(self, place: int) -> View:
        """The lanes' view for the cursor at `place`."""
        stepper, tape = self.stepper, self.stepper.tape
        if self._whole:
            if self._view is None:
                claims = zip(tape.positions, tape.records, strict=True)
                model = build_model(claims, (), tape.ops)
                self._view = select(model, start=model.start, end=model.end)
            return self._view
        # STRETCH_BLOCKS snapshots' worth of records, the cursor in the middle half
        every = stepper.every
        blocks = (len(tape) + every - 1) // every
        first = (max(0, place) + every // 2) // every - STRETCH_BLOCKS // 2
        first = max(0, min(blocks - STRETCH_BLOCKS, first))
        if self._view is None or self._block != first:
            low, high = first * every, min(len(tape), (first + STRETCH_BLOCKS) * every)
            state = stepper.state_before(first)
            start = state if isinstance(state, ClaimState) else None
            claims = zip(tape.positions[low:high], tape.records[low:high], strict=True)
            begin, end = tape.clock[low], tape.clock[high - 1]
            ops = [op for op in tape.ops if begin <= op.at <= end]
            m = build_model(claims, (), ops, start)
            # every bar of the stretch (select would keep MAX_BARS): the cells take them all
            self._view = View(m, m.lanes, m.bars, m.marks, m.arrows, m.ops, begin, end, (), True)
            self._block = first
        return self._view


def _record_line(moment: Moment) -> Text:
    record = moment.record
    line = Text()
    if record is None:
        line.append("before the first record: nothing applied yet", style="dim")
        return line
    line.append(f"@{moment.position} ", style="bold")
    if isinstance(record, Unknown):
        line.append(f"a record of unknown type {printable(record.code)!r}: skipped")
        return line
    kind = {Claim: "CLAIM", Renew: "RENEW", Done: "DONE"}.get(type(record), "FAIL")
    line.append(f"{kind} ", style="bold")
    line.append(f"task {record.task} by {worker_label(record.worker)}")
    if not isinstance(record, Claim):
        line.append(f" under claim @{record.claim}")
    if moment.why is not None:
        line.append(" → ")
        line.append(moment.why.verdict, style=_STYLE.get(moment.why.verdict, "bold"))
    return line


def _held_by(moment: Moment, worker: str | None) -> str:
    tasks = [str(p.task) for p in moment.in_play if p.lease.worker == worker]
    if not tasks:
        return "holding no task"
    return (
        f"holding task {', '.join(tasks)}"
        if len(tasks) == 1
        else f"holding tasks {', '.join(tasks)}"
    )


def _op_line(op: OpRecord, worker: str | None, moment: Moment) -> str:
    if worker is None:
        name = op.name or (f"pid {op.pid}" if op.pid is not None else "a process")
        return f"then: {op.kind} of {printable(name)} by the {op.by} at {clock_text(op.at)}"
    return "then: " + op_text(op, worker, _held_by(moment, worker))


def _counters_line(moment: Moment) -> Text:
    c = moment.counters
    line = Text()
    items = (
        ("done", c.done, "green"),
        ("takeovers", c.takeovers, "magenta"),
        ("stale", c.stale, "red"),
        ("lost", c.lost, ""),
        ("leases lost", c.leases_lost, "red"),
        ("released", c.released, "yellow"),
        ("dead", c.dead, "red"),
    )
    for n, (name, value, style) in enumerate(items):
        if n:
            line.append("  ")
        line.append(f"{name} ")
        line.append(str(value), style=f"bold {style}".strip())
    return line


def _in_play_lines(moment: Moment, rows: int) -> list[Text]:
    """The header and up to `rows` − 1 tasks (the current record's task first)."""
    current = (
        None if moment.record is None or isinstance(moment.record, Unknown) else moment.record.task
    )
    tasks = sorted(moment.in_play, key=lambda p: (p.task != current, p.lease.claim))
    title = Text(f"in play: {len(tasks)} held", style="bold")
    lines = [title]
    if not tasks or rows < 2:
        return lines
    lines.append(
        Text(f"{'task':>6}  {'holder':<14} {'token':>10}  {'attempts':>8}  lease left", style="dim")
    )
    room = rows - 2
    shown = tasks if len(tasks) <= room else tasks[: max(0, room - 1)]
    for p in shown:
        left = p.left
        when = f"{duration_text(left)}" if left >= 0 else f"lapsed {duration_text(-left)} ago"
        style = "bold" if p.task == current else ("red" if left < 0 else "")
        lines.append(
            Text(
                f"{p.task:>6}  {worker_label(p.lease.worker):<14} {'@' + str(p.lease.claim):>10}  "
                f"{p.attempts:>8}  {when}",
                style=style,
            )
        )
    if len(shown) < len(tasks):
        lines.append(Text(f"{'':>6}  … {len(tasks) - len(shown)} more", style="dim"))
    return lines


def _lane_lines(moment: Moment, lanes: Lanes, width: int, rows: int, legend: bool) -> list[Text]:
    view = lanes.view_at(moment.place)
    cells = max(10, width - _LABEL)
    grid = lane_cells(view, cells)
    span = max(1, view.end - view.start)
    now = moment.now
    col = None if now is None else min(cells - 1, max(0, (now - view.start) * cells // span))
    head = f"{clock_text(view.start)} → {clock_text(view.end)} ({duration_text(span)})"
    ruler = [" "] * cells
    if col is not None:
        ruler[col] = "▼"
    lines = [Text(f"{'lanes':<{_LABEL}}{head}", style="bold"), Text(" " * _LABEL + "".join(ruler))]
    workers = [lane for lane in view.lanes]
    room = rows - 2 - (len(_legend_lines(width)) if legend else 0)
    if moment.follow is not None:  # the followed worker's lane first
        workers.sort(key=lambda lane: lane.label != moment.follow)
    shown = workers if len(workers) <= room else workers[: max(0, room - 1)]
    for lane in shown:
        line = Text(f"{printable(lane.label)[: _LABEL - 1]:<{_LABEL}}")
        for c, (char, style) in enumerate(grid[lane.worker]):
            if c == col:
                style = f"{style} reverse".strip()
            elif col is not None and c > col:
                style = f"{style} dim".strip()
            line.append(char, style=style)
        lines.append(line)
    if len(shown) < len(workers):
        lines.append(Text(f"… {len(workers) - len(shown)} more lanes", style="dim"))
    if legend:
        lines += _legend_lines(width)
    return lines


def _event_lines(lanes: Lanes, rows: int) -> list[Text]:
    """The events so far, newest last: what `[` steps back through."""
    stepper = lanes.stepper
    tape = stepper.tape
    events = stepper.events_before(max(0, rows - 1))
    lines = [Text("events so far (] [ jump between them)", style="bold")]
    for event in events:
        if event.op is not None:
            worker = tape.op_worker(event.op)
            who = worker_label(worker) if worker is not None else printable(event.op.name)
            text = f"after @{tape.positions[event.place]}: {event.kind} of {who}"
        else:
            record = tape.records[event.place]
            assert not isinstance(record, Unknown)
            text = (
                f"@{tape.positions[event.place]} {event.kind}: task {record.task} by "
                f"{worker_label(record.worker)}"
            )
        style = "bold" if event.place == stepper.index else ""
        at = event.op.at if event.op is not None else tape.clock[event.place]
        lines.append(Text(f"  {clock_text(at)}  {text}", style=style))
    return lines


def _legend_lines(width: int) -> list[Text]:
    """The lanes' legend, its items kept whole, as many on a line as fit."""
    lines = [""]
    for item in LEGEND:
        if lines[-1] and len(lines[-1]) + 2 + len(item) > width:
            lines.append("")
        lines[-1] += ("  " if lines[-1] else "") + item
    return [Text(line, style="dim") for line in lines]


def screen_lines(
    moment: Moment,
    lanes: Lanes,
    width: int,
    height: int,
    *,
    location: str = "",
    status: str | None = None,
    keys: bool = True,
) -> list[Text]:
    """The screen at `moment`: at most `height` lines, each at most `width` columns."""
    big = height >= 36
    lines: list[Text] = []
    head = Text()
    head.append("qw replay", style="bold")
    if moment.total:
        head.append(f"  record {moment.place + 1}/{moment.total}")
    if moment.now is not None:
        head.append(f"  {clock_text(moment.now)}")
    if moment.follow is not None:
        head.append(f"  following {moment.follow}", style="bold cyan")
    if moment.differences is not None:  # --rules unfenced: records judged otherwise so far
        head.append(f"  unfenced differs {moment.differences}", style="bold magenta")
    if location:  # last: a long path is what gets cut
        head.append(f"  {printable(location)}", style="dim")
    lines.append(head)
    lines.append(_record_line(moment))
    if moment.why is not None:
        wrapped = textwrap.wrap(printable(moment.why.why), width - 5, break_on_hyphens=False)
        keep = 5 if big else (3 if height >= 24 else 2)
        if len(wrapped) > keep:
            wrapped = wrapped[:keep]
            wrapped[-1] = wrapped[-1][: width - 6] + "…"
        for n, text in enumerate(wrapped):
            lines.append(Text(("why: " if n == 0 else "     ") + text, style="italic" if n else ""))
    if moment.unfenced is not None:  # --rules unfenced: the original's rules differ here
        wrapped = textwrap.wrap(printable(moment.unfenced), width - 10, break_on_hyphens=False)
        keep = 5 if big else (4 if height >= 24 else 2)
        if len(wrapped) > keep:
            wrapped = wrapped[:keep]
            wrapped[-1] = wrapped[-1][: width - 11] + "…"
        for n, text in enumerate(wrapped):
            lines.append(Text(("unfenced: " if n == 0 else " " * 10) + text, style="bold magenta"))
    for op in moment.ops[: 3 if big else 1]:
        worker = _op_worker(lanes, op)
        lines.append(Text(_op_line(op, worker, moment), style="bold yellow"))
    if len(moment.ops) > (3 if big else 1):
        lines.append(Text(f"… and {len(moment.ops) - 1} more ops records here", style="yellow"))
    lines.append(_counters_line(moment))
    bottom = (1 if status is not None else 0) + (1 if keys else 0)
    room = max(0, height - len(lines) - bottom)
    lane_count = len(lanes.view_at(moment.place).lanes)
    legend = big and width >= 100
    legend_rows = len(_legend_lines(width)) if legend else 0
    lane_rows = min(lane_count + 2 + legend_rows, max(3, room // 2))
    play_rows = room - lane_rows
    if play_rows < 2:  # tiny screen: the lanes give way to the tasks
        lane_rows, play_rows = max(0, room - 2), min(room, 2)
    event_rows = 0
    if big:  # a tall screen: the events so far share the middle with the tasks in play
        wanted = min(len(moment.in_play) + 3, play_rows)
        event_rows = min(play_rows - wanted, 10) if play_rows - wanted >= 3 else 0
        play_rows -= event_rows
    lines += _in_play_lines(moment, play_rows)
    if event_rows:
        lines.append(Text(""))
        lines += _event_lines(lanes, event_rows - 1)
    pad = max(0, height - bottom - lane_rows - len(lines))
    lines += [Text("")] * pad if keys else []
    if lane_rows >= 3:
        lines += _lane_lines(moment, lanes, width, lane_rows, legend)
    if status is not None:
        lines.append(Text(status, style="bold cyan"))
    if keys:
        lines.append(Text(KEYS_LINE if width >= len(KEYS_LINE) else "? keys  q quit", style="dim"))
    for line in lines:
        line.truncate(width, overflow="ellipsis")
        line.no_wrap = True
    return lines[:height] if keys else lines


def _op_worker(lanes: Lanes, op: OpRecord) -> str | None:
    return lanes.stepper.tape.op_worker(op)


def help_lines(width: int) -> list[Text]:
    """`?`: every key, and what it does."""
    lines = [Text("qw replay: the keys", style="bold"), Text("")]
    for key, what in KEYS_HELP:
        for n, text in enumerate(textwrap.wrap(what, max(20, width - 10))):
            lines.append(Text(f"{key if n == 0 else '':<8}  {text}"))
    lines.append(Text(""))
    lines.append(
        Text(
            "the screen: the record just applied and the rule that decided it (qw why's",
            style="dim",
        )
    )
    lines.append(
        Text("words), the counters so far, the tasks held, the workers' lanes (▼ now)", style="dim")
    )
    for line in lines:
        line.truncate(width, overflow="ellipsis")
    return lines


def plain_screen(moment: Moment, lanes: Lanes, width: int, height: int, location: str = "") -> str:
    """The screen as plain text (no styles, no trailing spaces), for `--no-tui`."""
    lines = screen_lines(moment, lanes, width, height, location=location, keys=False)
    return "\n".join(line.plain.rstrip() for line in lines)


__all__ = ["KEYS_HELP", "KEYS_LINE", "Lanes", "help_lines", "plain_screen", "screen_lines"]
