"""The live dashboard's pure builders: a `SupervisorSnapshot` in, rich renderables out.

Nothing here reads a file or the terminal, and only `render` reads the clock (when it is not
given `now`): the caller passes `now` (wall clock, seconds) and a snapshot and gets back a
renderable. `supervisor.tui.live` owns the Live loop and the keys; tests render these builders
into a `Console(file=io.StringIO())` and read the text.

    full_screen(snapshot, now=…, height=…)  the screen `tui` draws, top to bottom:
      header                 location, uptime, workers alive / dead / paused, draining
      worker table           one row per worker (supervisor.tui.worker_table)
      orphans                after a death: each orphaned task until its takeover
                             (supervisor.tui.orphan_panel)
      queue                  counts, progress, throughput (sparkline and log size when tall)
      events                 the newest first; filtered with / (`View.filter`)
      status line            what the last key did, the filter being typed, or a hint
      keys                   the keys that act now, on the last line, never overwritten
    render(snapshot, now=…)  the same at its natural height (no screen to fill)

`plan_screen` shares a screen's height out: every section keeps a minimum, then worker rows,
then events, then the taller queue section, and the events take the rest. Widths are each
builder's own job (columns are dropped whole, never cut mid-number).

Cost matters (a frame is drawn four times a second): the worker table is a `TextGrid`, not a
`rich.table.Table`, and the event feed is laid out once per change (`Replayed`).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.segment import Segment
from rich.text import Text

from queue_worker.names import printable
from supervisor.run.model import Event, QueueView, SlotState, SupervisorSnapshot
from supervisor.tui.format import format_bytes, format_duration, format_micros
from supervisor.tui.orphan_panel import TITLE as ORPHANS_TITLE
from supervisor.tui.orphan_panel import orphan_lines
from supervisor.tui.partition_panel import partition_section
from supervisor.tui.sparkline import sparkline
from supervisor.tui.worker_table import STATE_STYLES, TextGrid, worker_table

__all__ = [
    "EVENT_STYLES",
    "FEED_LINES",
    "KEYS_HELP",
    "SPARK_SECONDS",
    "STATE_STYLES",
    "Replayed",
    "ScreenPlan",
    "Spread",
    "TextGrid",
    "View",
    "event_feed",
    "event_matches",
    "footer",
    "format_bytes",
    "format_duration",
    "format_micros",
    "full_screen",
    "header",
    "plan_screen",
    "printable",
    "progress_bar",
    "queue_panel",
    "render",
    "status_line",
    "worker_table",
]

#: events shown in the feed by `render` (a screen shows as many as fit)
FEED_LINES: Final = 10
#: seconds of throughput history in the sparkline (the supervisor keeps one value a second)
SPARK_SECONDS: Final = 60
#: the widest the progress bar gets
PROGRESS_WIDTH: Final = 72
#: event lines a screen keeps however many workers there are (a kill's events: the death,
#: the restart, the takeover, and those of the kills just before it)
FEED_MIN: Final = 5
#: …on a partitioned queue, whose partitions' section takes two lines more
FEED_LEAST: Final = 3
#: event lines given before the queue section grows to its tall form
FEED_WANTED: Final = 8

EVENT_STYLES: dict[str, str] = {
    "takeover": "bold cyan",
    "lease-lost": "yellow",
    "stale": "bold red",
    "dead-task": "red",
    "clock": "yellow",
    "death": "bold red",
    "log-error": "bold red",
    "restart": "green",
    "pause": "magenta",
    "info": "dim",
}

_QUEUE_STYLES: dict[str, str] = {
    "published": "bold",
    "pending": "yellow",
    "held": "cyan",
    "done": "green",
    "failed": "magenta",
    "dead": "red",
}

#: every key, for the help (`?`) and the README
KEYS_HELP: Final = (
    ("k", "kill -9 a worker holding a task (the selected worker, if one is selected)"),
    ("↑ ↓", "select a worker (any number of workers); 0-9 select slots 0 to 9"),
    ("p", "pause / resume the selected worker (SIGSTOP / SIGCONT)"),
    ("Esc", "clear the selection, the event filter, or this help"),
    ("+ -", "add a worker / remove the last one (it finishes its task first)"),
    ("/", "filter the events by task or worker: {examples}; Enter applies"),
    ("?", "show / hide this help"),
    ("q", "drain: workers finish their tasks, then qw exits (Ctrl-C twice: kill now)"),
)


@dataclass(frozen=True)
class View:
    """What the keys changed about the screen (not about the supervisor)."""

    filter: str = ""  # the events shown match it (`event_matches`)
    typing: bool = False  # the filter is being typed: keys go into it
    help: bool = False


# -- the whole screen ---------------------------------------------------------------------


def render(
    snapshot: SupervisorSnapshot,
    *,
    now: float | None = None,
    message: str | None = None,
    feed_lines: int = FEED_LINES,
    view: View = View(),
) -> RenderableType:
    """The dashboard as one renderable, top to bottom, at its natural height."""
    at = time.time() if now is None else now
    rows = max(1, len(snapshot.workers) + len(snapshot.departed))
    plan = ScreenPlan(
        rows, len(snapshot.orphans), True, feed_lines, partition_lines=len(snapshot.partitions)
    )
    return _screen(snapshot, at, plan, message, view)


def full_screen(
    snapshot: SupervisorSnapshot,
    *,
    now: float,
    height: int,
    message: str | None = None,
    view: View = View(),
) -> RenderableType:
    """The dashboard for a screen `height` lines tall, with the keys on the last line.

    The sections are sized by `plan_screen` so that the keys land on the bottom line without
    a `rich.layout.Layout`: a Layout renders the screen twice over, which costs more than
    everything else in the frame.
    """
    return _screen(snapshot, now, plan_screen(snapshot, height), message, view)


@dataclass(frozen=True)
class ScreenPlan:
    """Lines given to each section of the screen."""

    worker_rows: int  # rows of the worker table, below its two heading lines
    orphan_lines: int  # below the orphans' title (0: no orphans section)
    tall_queue: bool  # title, counts, progress, sparkline, log; else counts and progress
    feed: int  # event lines, below the events' title
    partition_lines: int = 0  # below the partitions' title (0: a queue without partitions)
    progress: bool = True  # the progress bar's line below the counts (else beside them)


def plan_screen(snapshot: SupervisorSnapshot, height: int) -> ScreenPlan:
    """Share `height` lines out: minimums first (FEED_MIN events, FEED_LEAST on a
    partitioned queue; two orphan lines; the queue's counts), then worker rows (every slot
    before a departed process's row), then the progress line, the partitions' lines,
    events up to FEED_WANTED, the tall queue section, more orphan lines, and the rest to
    the events."""
    rows = max(1, len(snapshot.workers) + len(snapshot.departed))
    orphans = len(snapshot.orphans)
    partitions = len(snapshot.partitions)
    feed_min = FEED_LEAST if partitions else FEED_MIN
    # header 1, table heading 2, queue counts 1, events title 1, status 1, keys 1
    room = height - 7 - feed_min
    orphan_lines = min(orphans, 2)  # (two: the newest, and a line that sums up the rest)
    room -= (1 + orphan_lines) if orphans else 0
    room -= 2 if partitions else 0  # the partitions' title and one line at least
    worker_rows = max(1, min(rows, room))
    room -= worker_rows
    progress = room >= 1
    room -= 1 if progress else 0
    partition_lines = min(1, partitions) + max(0, min(partitions - 1, room))
    room -= max(0, partition_lines - 1)
    feed = feed_min + max(0, min(room, FEED_WANTED - feed_min))
    room -= feed - feed_min
    tall_queue = progress and room >= 3
    room -= 3 if tall_queue else 0
    extra_orphans = max(0, min(orphans - orphan_lines, room))
    room -= extra_orphans
    return ScreenPlan(
        worker_rows,
        orphan_lines + extra_orphans,
        tall_queue,
        feed + max(0, room),
        partition_lines,
        progress,
    )


def _screen(
    snapshot: SupervisorSnapshot,
    now: float,
    plan: ScreenPlan,
    message: str | None,
    view: View,
) -> RenderableType:
    parts: list[RenderableType] = [header(snapshot, now=now)]
    if view.help:
        # the lines of everything it covers: the table, the queue, the feed and its title
        lines = 2 + plan.worker_rows + (5 if plan.tall_queue else 1 + plan.progress)
        lines += 1 + plan.feed
        lines += (1 + plan.orphan_lines) if plan.orphan_lines else 0
        lines += (1 + plan.partition_lines) if plan.partition_lines else 0
        parts.append(help_panel(snapshot, lines=lines))
    else:
        parts.append(
            worker_table(
                snapshot.workers,
                now=now,
                selected=snapshot.selected,
                departed=snapshot.departed,
                orphans=snapshot.orphans,
                max_rows=plan.worker_rows,
            )
        )
        if snapshot.orphans and plan.orphan_lines:
            parts.append(_title(ORPHANS_TITLE, "bold red"))
            body = Text("\n").join(orphan_lines(snapshot.orphans, now=now, lines=plan.orphan_lines))
            body.no_wrap, body.overflow = True, "ellipsis"
            parts.append(body)
        if snapshot.partitions and plan.partition_lines:
            parts.append(
                partition_section(
                    snapshot.partitions,
                    snapshot.workers,
                    snapshot.orphans,
                    lines=plan.partition_lines,
                )
            )
        parts.append(queue_panel(snapshot.queue, tall=plan.tall_queue, progress=plan.progress))
        parts.append(
            event_feed(
                snapshot.events,
                lines=plan.feed,
                query=view.filter,
                empty=_first_steps(snapshot),
            )
        )
    parts.append(status_line(snapshot, message=message, view=view))
    parts.append(footer(snapshot, view=view))
    return Group(*parts)


class Title:
    """A section's title line, "── text ─────────", exactly as wide as the screen."""

    def __init__(self, text: str, style: str = "bold") -> None:
        self.text, self.style = text, style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        line = Text.assemble(("── ", "dim"), (self.text, self.style), " ")
        line.truncate(options.max_width, overflow="ellipsis")
        line.append("─" * (options.max_width - line.cell_len), style="dim")
        yield line


def _title(text: str, style: str = "bold") -> Title:
    return Title(text, style)


class Spread:
    """One line: `left` from the left edge, `right` against the right edge; the left part
    is cut first with an ellipsis when both do not fit (a Table.grid costs ten times more).
    """

    def __init__(self, left: Text, right: Text) -> None:
        self.left = left
        self.right = right

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        right = self.right
        if right.cell_len > width:
            right = right.copy()
            right.truncate(width, overflow="ellipsis")
        room = width - right.cell_len - (1 if right.cell_len else 0)
        left = self.left.copy()
        left.truncate(max(0, room), overflow="ellipsis")
        line = Text(no_wrap=True, overflow="crop")
        line.append_text(left)
        line.append(" " * (width - left.cell_len - right.cell_len))
        line.append_text(right)
        yield line


# -- header -------------------------------------------------------------------------------


def header(snapshot: SupervisorSnapshot, *, now: float) -> Spread:
    """One line: where the logs are on the left; uptime, workers and draining on the right."""
    workers = snapshot.workers
    dead = sum(1 for w in workers if w.state is SlotState.DEAD)
    paused = sum(1 for w in workers if w.state is SlotState.PAUSED)
    alive = sum(1 for w in workers if not w.ended)

    right = Text()
    if snapshot.partitions:  # on the right: a long location is cut, this never is
        right.append(f"{len(snapshot.partitions)} partitions", style="cyan")
        right.append("  ·  ")
    if snapshot.started_at > 0:
        right.append(f"up {format_duration(now - snapshot.started_at)}")
        right.append("  ·  ")
    right.append(f"{alive} alive", style="green")
    if dead:
        right.append(f" {dead} dead", style="bold red")
    if paused:
        right.append(f" {paused} paused", style="bold magenta")
    waiting = sum(1 for o in snapshot.orphans if o.heir is None)
    if waiting:
        right.append(f" {waiting} orphaned", style="bold red")
    if snapshot.draining:
        right.append("  ·  ")
        right.append("DRAINING", style="bold black on yellow")

    left = Text.assemble(("qw ", "bold"), (printable(snapshot.location), "bold cyan"))
    if snapshot.demo_rate:  # say so: these tasks are not the user's
        left.append(f"  + demo traffic {snapshot.demo_rate:g}/s", style="yellow")
    return Spread(left, right)


# -- queue --------------------------------------------------------------------------------


def queue_panel(
    queue: QueueView,
    *,
    tall: bool = True,
    spark_seconds: int = SPARK_SECONDS,
    progress: bool = True,
) -> QueueSection:
    """Counts and progress; when `tall`, a title, throughput with a sparkline of the last
    minute, and the log size. Without `progress` (a screen short of lines), one line: the
    counts, the share closed and the rate."""
    return QueueSection(queue, tall=tall, spark_seconds=spark_seconds, progress=progress)


class QueueSection:
    """The queue's lines, laid out for the width they are given."""

    def __init__(
        self, queue: QueueView, *, tall: bool, spark_seconds: int, progress: bool = True
    ) -> None:
        self.queue, self.tall, self.spark_seconds = queue, tall, spark_seconds
        self.progress = progress

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        queue, width = self.queue, options.max_width
        counts = Text()
        for key, style in _QUEUE_STYLES.items():
            if counts:
                counts.append("  ")
            counts.append(f"{key} ", style="dim")
            counts.append(f"{getattr(queue, key):,}", style=style)

        closed = queue.done + queue.dead
        fraction = closed / queue.published if queue.published else 0.0
        percent = f" {100 * fraction:.0f}%" if queue.published else " —"
        rate = f"  {queue.throughput_now:.1f}/s"
        bar = max(8, min(PROGRESS_WIDTH, width - len(percent) - len(rate) - 30))
        progress = Text.assemble(
            progress_bar(fraction, bar),
            percent,
            (f" ({closed:,}/{queue.published:,} closed)", "dim"),
            (rate, "bold"),
        )
        lines = [counts, progress]
        if not self.progress:
            counts.append(f" ·{percent}", style="dim")
            counts.append(rate, style="bold")
            lines = [counts]
        if self.tall:
            history = queue.throughput_history[-self.spark_seconds :]
            peak = max(history, default=0.0)
            spark = max(0, min(self.spark_seconds, width - 40))
            lines.append(
                Text.assemble(
                    ("throughput ", "dim"),
                    ("▕", "dim"),  # a frame, so the blank start of a young history reads "no data"
                    (sparkline(history, spark), "cyan"),
                    ("▏", "dim"),
                    (f" peak {peak:.1f}/s · last {spark}s", "dim"),
                )
            )
            lines.append(
                Text.assemble(
                    ("log ", "dim"),
                    format_bytes(queue.log_bytes),
                    ("  ·  ", "dim"),
                    f"{queue.record_count:,}",
                    (" records read", "dim"),  # (after the checkpoint it began from)
                )
            )
        body = Text("\n").join(lines)
        body.no_wrap = True
        body.overflow = "ellipsis"
        if self.tall:
            yield _title("queue")
        yield body


def progress_bar(fraction: float, width: int) -> Text:
    """━ for the part done, ─ for the rest: readable without colour too."""
    fraction = min(1.0, max(0.0, fraction))
    done = round(fraction * width)
    return Text.assemble(("━" * done, "green"), ("─" * (width - done), "dim"))


# -- events -------------------------------------------------------------------------------


def event_matches(event: Event, query: str) -> bool:
    """Does `event` concern `query`: a task id ("17" matches task 17, not 170) or a worker
    ("w6" matches w6·6975 and w6·7001, not w60; "6975" matches w6·6975)? Case-insensitive."""
    query = query.strip()
    if not query:
        return True
    if query.isdigit():
        # a number is a task id or a worker's pid, never any number of the text ("4 demo
        # tasks/s", "after 4 attempts" are not about task 4)
        if event.task is not None and event.task == int(query):
            return True
        return re.search(rf"·{query}(?![0-9])", event.text) is not None
    # whole words: not inside a longer number or name ("·" joins a slot to its pid)
    pattern = rf"(?<![0-9A-Za-z])(?<!\d\.){re.escape(query)}(?![0-9A-Za-z]|\.\d)"
    return re.search(pattern, event.text, re.IGNORECASE) is not None


def event_feed(
    events: Sequence[Event],
    *,
    lines: int = FEED_LINES,
    query: str = "",
    empty: Sequence[Text] = (),
) -> RenderableType:
    """A title and the last `lines` events (matching `query`), newest first, exactly
    `lines` lines below the title. `empty` is what an empty feed shows."""
    matching = [e for e in events if event_matches(e, query)] if query else events
    shown = tuple((e.at, e.kind, e.text) for e in matching[-lines:]) if lines > 0 else ()
    hint = tuple(t.plain for t in empty)
    key = ("events", shown, lines, query, hint)
    return Replayed(key, lambda: _feed(shown, lines, query, empty))


def _feed(
    shown: tuple[tuple[float, str, str], ...], lines: int, query: str, empty: Sequence[Text]
) -> Group:
    title = f"events matching {printable(query)!r} (Esc clears)" if query else "events"
    rows: list[Text] = []
    for at, kind, text in reversed(shown):
        label = kind if len(kind) <= 10 else kind[:9] + "…"
        rows.append(
            Text.assemble(
                (time.strftime("%H:%M:%S ", time.localtime(at)), "dim"),
                (f"{printable(label):<10} ", EVENT_STYLES.get(kind, "")),
                printable(text),
            )
        )
    if not shown:
        if query:
            rows.append(Text(f"no event matches {printable(query)!r}", style="dim"))
        else:
            rows.extend(empty or [Text("no events yet", style="dim")])
    rows = rows[:lines]
    rows.extend(Text("") for _ in range(lines - len(rows)))
    # one Text for all lines: a Table here would cost more than the rest of the frame
    feed = Text("\n").join(rows)
    feed.no_wrap = True
    feed.overflow = "ellipsis"
    return Group(_title(title), feed) if rows else Group(_title(title))


def _first_steps(snapshot: SupervisorSnapshot) -> list[Text]:
    """What an empty feed says: how to give the workers work, and what k does."""
    queue = snapshot.queue
    if queue.published == 0:
        return [
            Text("The queue is empty. Give the workers work, from another terminal:", "bold"),
            Text.assemble("    ", (printable(snapshot.enqueue_hint), "bold cyan")),
            Text(
                "  (tasks of 2 s each leave time to watch: --payload '{\"work_ms\": 2000}')", "dim"
            ),
            Text("Then press k to kill -9 a worker holding a task, and watch a survivor"),
            Text("take it over once its lease lapses (the orphans panel counts it down)."),
        ]
    return [Text("no events yet: press k to kill -9 a worker holding a task", style="dim")]


class Replayed:
    """A renderable laid out once per (key, width), then replayed from its lines.

    The event feed changes a few times a minute but is drawn four times a second, and a
    full feed is the dearest part of a frame to lay out; replaying its lines is cheap.
    `key` must say everything the output depends on besides the console's options. The
    memo is the module's only state: a few laid-out panels, the oldest dropped first.
    """

    _cache: ClassVar[OrderedDict[Hashable, list[list[Segment]]]] = OrderedDict()
    _CACHE_SIZE: ClassVar[int] = 8

    def __init__(self, key: Hashable, build: Callable[[], RenderableType]) -> None:
        self.key = key
        self.build = build

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        key = (self.key, options.max_width, options.ascii_only)  # ascii: other box chars
        cache = Replayed._cache
        lines = cache.get(key)
        if lines is None:
            lines = console.render_lines(self.build(), options, pad=True)
            cache[key] = lines
            while len(cache) > Replayed._CACHE_SIZE:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        new_line = Segment.line()
        for line in lines:
            yield from line
            yield new_line


# -- help ---------------------------------------------------------------------------------


def help_panel(snapshot: SupervisorSnapshot, *, lines: int) -> Group:
    """Every key, and what to do first; exactly `lines` lines."""
    rows: list[Text] = []
    examples = ", ".join(f"/{e}" for e in filter_examples(snapshot))
    for key, what in KEYS_HELP:
        what = what.format(examples=examples)
        rows.append(Text.assemble((f" {key:<4}", "reverse bold"), f"  {what}"))
    rows.append(Text(""))
    rows.append(Text.assemble("Work to do: ", (printable(snapshot.enqueue_hint), "bold cyan")))
    rows.append(Text("After a kill -9 the orphans panel shows each task the dead worker held:"))
    rows.append(Text("its lease counts down, then a survivor takes it over."))
    rows = rows[: lines - 1]
    rows.extend(Text("") for _ in range(lines - 1 - len(rows)))
    out = Text("\n").join(rows)
    out.no_wrap, out.overflow = True, "ellipsis"
    return Group(_title("keys (? or Esc closes this)"), out)


# -- the last two lines -------------------------------------------------------------------


def status_line(
    snapshot: SupervisorSnapshot, *, message: str | None = None, view: View = View()
) -> Text:
    """The line above the keys: the filter being typed, what the last key did, or a hint."""
    if view.typing:
        line = Text.assemble(("filter events: /", "bold"), printable(view.filter), ("▏", "blink"))
        examples = ", ".join(filter_examples(snapshot))
        line.append(f"   Enter applies · Esc cancels · task id or worker ({examples})", "dim")
    elif message:
        line = Text(printable(message), style="bold")
    else:
        line = Text(_hint(snapshot), style="dim")
    line.no_wrap, line.overflow = True, "ellipsis"
    return line


def filter_examples(snapshot: SupervisorSnapshot) -> tuple[str, ...]:
    """What to type after `/`: a partitioned queue names a task `partition:id` (its events
    say `task 2:17`) and a partition `p2`."""
    if snapshot.partitions:
        return ("2:17", "p2", "w6", "w6·6975")
    return ("17", "w6", "w6·6975")


def _hint(snapshot: SupervisorSnapshot) -> str:
    queue = snapshot.queue
    if snapshot.draining:
        return "draining: each worker finishes its task, then exits"
    if queue.pending + queue.held == 0:
        return f"no work queued: {printable(snapshot.enqueue_hint)}"
    if any(o.heir is None for o in snapshot.orphans):
        return "a dead worker's task waits for its lease to lapse, then a survivor claims it"
    return "k: kill -9 a worker holding a task, and watch a survivor take it over"


def footer(snapshot: SupervisorSnapshot, *, view: View = View()) -> KeysLine:
    """The keys that act now (they change with a selection, a filter and while draining),
    as many as fit the width; the essential ones always do."""
    return KeysLine(_key_list(snapshot, view))


def _key_list(snapshot: SupervisorSnapshot, view: View) -> list[tuple[str, str, bool]]:
    """(key, what it does, kept whatever the width)."""
    if view.typing:
        return [("Enter", "apply filter", True), ("Esc", "cancel", True)]
    if snapshot.draining:
        # qw up: a stop request drains, the second kills
        return [
            ("draining", "workers finish their tasks, then qw exits", True),
            ("Ctrl-C ×2", "kill them now", True),
        ]
    keys: list[tuple[str, str, bool]] = []
    selected = next((w for w in snapshot.workers if w.slot == snapshot.selected), None)
    if selected is not None:
        label = selected.label
        keys += [
            ("k", f"kill -9 {label}", True),
            ("p", f"pause/resume {label}", True),
            ("Esc", "clear", False),
        ]
    else:
        keys.append(("k", "kill -9 a holder", True))
    # the optional ones are dropped from the last: +/- first, ↑↓ last
    keys.append(("↑↓", "select", False))
    keys.append(("/", "new filter" if view.filter else "filter", False))
    if selected is None:
        keys.append(("+/-", "workers", False))
    keys += [("?", "keys", True), ("q", "drain & quit", True)]
    return keys


class KeysLine:
    """The keys line: each key as a reversed block, then what it does; the optional ones
    are left out (from the end) until the line fits."""

    def __init__(self, keys: list[tuple[str, str, bool]]) -> None:
        self.keys = keys

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        keys = list(self.keys)

        def text() -> Text:
            line = Text(no_wrap=True, overflow="ellipsis")
            for key, what, _ in keys:
                line.append(f" {key} ", style="reverse bold")
                line.append(f" {what}  ")
            line.rstrip()
            return line

        line = text()
        while line.cell_len > options.max_width and any(not k[2] for k in keys):
            drop = max(i for i, k in enumerate(keys) if not k[2])
            del keys[drop]
            line = text()
        yield line
