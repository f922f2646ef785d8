"""The live dashboard's pure builders: a `SupervisorSnapshot` in, rich renderables out.

Nothing here reads a file or the terminal, and only `render` reads the clock (when it is not
given `now`): the caller passes `now` (wall clock, seconds) and a snapshot and gets back a
renderable. `supervisor.tui` owns the Live loop and the keys; tests render these builders
into a `Console(file=io.StringIO())` and read the text.

    render(snapshot, now=…)              the dashboard at its natural height
    full_screen(snapshot, now=…, height=…)  the same, the feed sized so the keys sit on the
                                         last line of a screen that tall (what tui draws)
      header(snapshot, now=…)            location, uptime, workers alive, draining
      worker_table(workers, now=…)       one row per slot; a dead worker keeps its last figures
      queue_panel(queue)                 counts, progress, throughput sparkline, log size
      event_feed(events)                 the newest events first: takeovers, deaths, …
      footer(snapshot, message=…)        the keys, and what the last key did

Cost matters (a frame is drawn four times a second): the worker table is a `TextGrid`, not a
`rich.table.Table`, and the event feed is laid out once per change (`Replayed`). A frame of
8 workers and a full feed on a 160x50 screen costs ~5-8 ms of CPU.
"""

from __future__ import annotations

import signal
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, JustifyMethod, RenderableType, RenderResult
from rich.panel import Panel
from rich.segment import Segment
from rich.text import Text

from queue_worker.names import printable
from supervisor.model import Event, QueueView, SupervisorSnapshot, WorkerView
from supervisor.sparkline import sparkline

__all__ = [
    "EVENT_STYLES",
    "FEED_LINES",
    "SPARK_SECONDS",
    "STATE_STYLES",
    "Replayed",
    "Spread",
    "TextGrid",
    "event_feed",
    "footer",
    "format_bytes",
    "format_duration",
    "format_micros",
    "full_screen",
    "header",
    "printable",
    "progress_bar",
    "queue_panel",
    "render",
    "worker_table",
]

#: events shown in the feed
FEED_LINES = 10
#: seconds of throughput history in the sparkline (the supervisor keeps one value a second)
SPARK_SECONDS = 60
#: cells of the progress bar (the sparkline line lines up under it)
PROGRESS_WIDTH = 72
#: cells of a worker id shown: ids are "<name>-<pid>-<4 hex>" (14 fits a 5-digit pid whole);
#: a longer id keeps its start, which names the worker
SHORT_ID = 14
#: the narrowest a worker-table column gets on a narrow screen
MIN_COLUMN = 3
#: below this many seconds of lease left, the lease column turns yellow: renewal is due
LEASE_WARN_SECONDS = 1.0

STATE_STYLES: dict[str, str] = {
    "starting": "blue",
    "idle": "dim",
    "claiming": "yellow",
    "working": "bold green",
    "paused": "magenta",
    "draining": "cyan",
    "dead": "bold red",
    "exited": "dim",
}

EVENT_STYLES: dict[str, str] = {
    "takeover": "bold cyan",
    "lease-lost": "yellow",
    "stale": "bold red",
    "dead-task": "red",
    "death": "bold red",
    "restart": "green",
    "pause": "magenta",
    "info": "dim",
}

#: name, justification, usual width: columns keep it when the screen has room, so the table
#: does not jitter as values come and go (e.g. a worker dies: "dead KILL")
_WORKER_COLUMNS: tuple[tuple[str, JustifyMethod, int], ...] = (
    ("slot", "right", 4),
    ("worker", "left", 6),
    ("id", "left", 13),  # "w0-12345-9fe3"
    ("pid", "right", 5),
    ("state", "left", 9),  # "dead KILL"
    ("task", "right", 5),
    ("held", "right", 5),
    ("lease", "right", 7),  # "expired"
    ("att/won/lost", "right", 12),
    ("fin", "right", 4),
    ("p50/p99", "right", 12),
    ("cpu", "right", 5),
    ("rss", "right", 6),
)

_QUEUE_STYLES: dict[str, str] = {
    "published": "bold",
    "pending": "yellow",
    "held": "cyan",
    "done": "green",
    "failed": "magenta",
    "dead": "red",
}


# -- the whole screen ---------------------------------------------------------------------


def render(
    snapshot: SupervisorSnapshot,
    *,
    now: float | None = None,
    message: str | None = None,
    feed_lines: int = FEED_LINES,
) -> RenderableType:
    """The dashboard as one renderable, top to bottom, at its natural height."""
    at = time.time() if now is None else now
    return Group(
        header(snapshot, now=at),
        worker_table(snapshot.workers, now=at, selected=snapshot.selected),
        queue_panel(snapshot.queue),
        event_feed(snapshot.events, lines=feed_lines),
        footer(snapshot, message=message),
    )


def full_screen(
    snapshot: SupervisorSnapshot,
    *,
    now: float,
    height: int,
    message: str | None = None,
) -> RenderableType:
    """The dashboard for a screen `height` lines tall, with the keys on the last line.

    The event feed takes whatever the rest leaves (at least one line), so the footer lands
    on the bottom line without a `rich.layout.Layout`: a Layout renders the screen twice
    over, which costs more than everything else in the frame.
    """
    return Group(
        header(snapshot, now=now),
        worker_table(snapshot.workers, now=now, selected=snapshot.selected),
        queue_panel(snapshot.queue),
        event_feed(snapshot.events, lines=max(1, height - _fixed_lines(snapshot))),
        footer(snapshot, message=message),
    )


def _fixed_lines(snapshot: SupervisorSnapshot) -> int:
    # header 1, table head 2 + a row a worker ("no workers" is a row), queue panel 6,
    # the feed's two borders, footer 1
    return 1 + 2 + max(1, len(snapshot.workers)) + 6 + 2 + 1


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
    dead = sum(1 for w in workers if w.state == "dead")
    paused = sum(1 for w in workers if w.state == "paused")
    alive = sum(1 for w in workers if w.state not in ("dead", "exited"))

    right = Text()
    if snapshot.started_at > 0:
        right.append(f"up {format_duration(now - snapshot.started_at)}")
        right.append("  ·  ")
    right.append(f"{alive} alive", style="green")
    if dead:
        right.append(f" {dead} dead", style="bold red")
    if paused:
        right.append(f" {paused} paused", style="magenta")
    if snapshot.draining:
        right.append("  ·  ")
        right.append("DRAINING", style="bold black on yellow")

    left = Text.assemble(("qw ", "bold"), (printable(snapshot.location), "bold cyan"))
    if snapshot.demo_rate:  # say so: these tasks are not the user's
        left.append(f"  + demo traffic {snapshot.demo_rate:g}/s", style="yellow")
    return Spread(left, right)


# -- workers ------------------------------------------------------------------------------


def worker_table(
    workers: Sequence[WorkerView], *, now: float, selected: int | None = None
) -> TextGrid:
    """One row per worker slot. A dead worker keeps the figures it last published."""
    rows = [
        (
            _worker_cells(w, now, selected=w.slot == selected),
            "reverse" if w.slot == selected else None,
        )
        for w in workers
    ]
    if not rows:
        rows = [([Text(""), Text("no workers", style="dim")], None)]
    return TextGrid(_WORKER_COLUMNS, rows)


class TextGrid:
    """Columns of one-line cells, each cut with an ellipsis to fit the width it is given.

    Why not `rich.table.Table`: a 13-column Table of 8 workers costs ~16 ms a frame to lay
    out, more than the dashboard's whole budget (5% of a core at 4 frames a second); this
    grid lays out the same cells as one Text for a tenth of that. A column gets its usual
    width or its widest cell; when that does not fit, the widest columns are narrowed first
    (never below MIN_COLUMN), so one huge value cannot push the others off screen.
    """

    def __init__(
        self,
        columns: Sequence[tuple[str, JustifyMethod, int]],
        rows: Sequence[tuple[Sequence[Text], str | None]],
        *,
        gap: int = 2,
    ) -> None:
        self.columns = columns
        self.rows = rows  # (cells, style of the whole row)
        self.gap = gap

    def widths(self, max_width: int) -> list[int]:
        natural = [max(usual, cell_len(name)) for name, _, usual in self.columns]
        for cells, _ in self.rows:
            for i, cell in enumerate(cells[: len(natural)]):
                natural[i] = max(natural[i], cell.cell_len)
        least = [min(n, MIN_COLUMN) for n in natural]
        budget = max_width - self.gap * (len(self.columns) - 1)

        def fitted(cap: int) -> list[int]:
            return [max(lo, min(n, cap)) for n, lo in zip(natural, least, strict=True)]

        if sum(natural) <= budget:
            return natural
        # the largest cap on column widths that fits: binary search, the widest shrink first
        lo, hi = 0, max(natural)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if sum(fitted(mid)) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return fitted(lo)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = self.widths(options.max_width)
        head = Text(style="bold")
        for i, ((name, justify, _), width) in enumerate(zip(self.columns, widths, strict=True)):
            _append_cell(head, Text(name), width, justify, self.gap if i else 0)
        lines = [head, Text("─" * (sum(widths) + self.gap * (len(widths) - 1)), style="dim")]
        for cells, style in self.rows:
            line = Text()
            for i, ((_, justify, _), width) in enumerate(zip(self.columns, widths, strict=True)):
                cell = cells[i] if i < len(cells) else Text("")
                _append_cell(line, cell, width, justify, self.gap if i else 0)
            if style:
                line.stylize(style)
            lines.append(line)
        out = Text("\n").join(lines)
        out.no_wrap = True
        out.overflow = "ellipsis"
        yield out


def _append_cell(line: Text, cell: Text, width: int, justify: JustifyMethod, lead: int) -> None:
    """Append `cell` to `line` in exactly `width` cells, after `lead` blanks."""
    if cell.cell_len > width:
        cell = cell.copy()
        cell.truncate(width, overflow="ellipsis")
    pad = width - cell.cell_len
    if justify == "right":
        line.append(" " * (lead + pad))
        line.append_text(cell)
    else:
        if lead:
            line.append(" " * lead)
        line.append_text(cell)
        line.append(" " * pad)


def _worker_cells(w: WorkerView, now: float, *, selected: bool) -> list[Text]:
    s = w.stats
    dead = w.state in ("dead", "exited")
    figures = "dim" if dead else ""  # a dead worker's figures are its last, not live ones

    name = Text(printable(w.name))
    if w.restarts:
        name.append(f" ↻{w.restarts}", style="yellow")

    state = Text(printable(w.state), style=STATE_STYLES.get(w.state, ""))
    if w.state == "dead" and w.exit_code is not None:
        state.append(f" {_exit_reason(w.exit_code)}", style="red")

    task = _int(s, "current_task")
    since = _float(s, "current_since")
    expiry = _float(s, "lease_expiry")
    if task is None:
        task_cell, held, lease = Text("—", style="dim"), Text(""), Text("")
    elif dead:
        # the task it held when it died: a survivor takes it over once the lease lapses
        task_cell = Text(f"#{task}", style="dim strike")
        held = Text("")
        lease = _lease_cell(expiry, now)
    else:
        task_cell = Text(f"#{task}", style="bold")
        held = Text(format_duration(now - since) if since is not None else "")
        lease = _lease_cell(expiry, now)

    lost = _int(s, "lost_total")
    if lost is None:
        lost_by = s.get("lost")
        lost = (
            sum(v for v in lost_by.values() if isinstance(v, int))
            if isinstance(lost_by, dict)
            else 0
        )
    att_won_lost = f"{_n(s, 'attempts')}/{_n(s, 'won')}/{lost}"

    lat = s.get("claim_latency_micros")
    if isinstance(lat, Mapping) and _int(lat, "samples"):
        latency = f"{format_micros(_int(lat, 'p50') or 0)}/{format_micros(_int(lat, 'p99') or 0)}"
    else:
        latency = "—"

    return [
        Text(f"▶ {w.slot}" if selected else str(w.slot)),  # ▶: visible without colour
        name,
        Text(printable(_short_id(w.worker_id)), style="dim"),
        Text("" if w.pid is None else str(w.pid), style=figures),
        state,
        task_cell,
        held,
        lease,
        Text(att_won_lost, style=figures),
        Text(str(_n(s, "finished")), style=figures or "green"),
        Text(latency, style=figures),
        Text(f"{w.cpu_percent:.1f}%" if not dead else "—", style=figures),
        Text(format_bytes(w.rss_bytes) if w.rss_bytes else "—", style=figures),
    ]


def _lease_cell(expiry: float | None, now: float) -> Text:
    if expiry is None:
        return Text("")
    left = expiry - now
    if left <= 0:
        return Text("expired", style="bold red")
    return Text(format_duration(left), style="yellow" if left < LEASE_WARN_SECONDS else "")


def _exit_reason(code: int) -> str:
    # a negative exit code is the signal that killed it: "KILL" reads better than -9
    if code < 0:
        try:
            return signal.Signals(-code).name.removeprefix("SIG")
        except ValueError:
            return f"sig {-code}"
    return f"exit {code}"


def _short_id(worker_id: str | None) -> str:
    if not worker_id:
        return "—"
    return worker_id if len(worker_id) <= SHORT_ID else worker_id[: SHORT_ID - 1] + "…"


# -- queue --------------------------------------------------------------------------------


def queue_panel(queue: QueueView, *, spark_seconds: int = SPARK_SECONDS) -> Panel:
    """Counts, progress, throughput with a sparkline of the last minute, and the log size."""
    counts = Text()
    for key, style in _QUEUE_STYLES.items():
        if counts:
            counts.append("   ")
        counts.append(f"{key} ", style="dim")
        counts.append(f"{getattr(queue, key):,}", style=style)

    closed = queue.done + queue.dead
    fraction = closed / queue.published if queue.published else 0.0
    progress = Text.assemble(
        ("progress   ", "dim"),
        progress_bar(fraction, PROGRESS_WIDTH),
        f"  {100 * fraction:.0f}%" if queue.published else "  —",
        (f"  ({closed:,}/{queue.published:,} closed)", "dim"),
    )

    history = queue.throughput_history[-spark_seconds:]
    peak = max(history, default=0.0)
    rate = Text.assemble(
        ("throughput ", "dim"),
        (f"{queue.throughput_now:.1f}/s".rjust(PROGRESS_WIDTH - spark_seconds), "bold"),
        ("▕", "dim"),  # a frame, so the blank start of a young history reads as "no data"
        (sparkline(history, spark_seconds), "cyan"),
        ("▏", "dim"),
        (f" peak {peak:.1f}/s · last {spark_seconds}s", "dim"),
    )

    log = Text.assemble(
        ("log        ", "dim"),
        format_bytes(queue.log_bytes),
        ("  ·  ", "dim"),
        f"{queue.record_count:,}",
        (" records", "dim"),
    )
    body = Text("\n").join([counts, progress, rate, log])
    body.no_wrap = True
    body.overflow = "ellipsis"
    return Panel(body, title="queue", title_align="left", box=box.ROUNDED, padding=(0, 1))


def progress_bar(fraction: float, width: int) -> Text:
    """━ for the part done, ─ for the rest: readable without colour too."""
    fraction = min(1.0, max(0.0, fraction))
    done = round(fraction * width)
    return Text.assemble(("━" * done, "green"), ("─" * (width - done), "dim"))


# -- events -------------------------------------------------------------------------------


def event_feed(events: Sequence[Event], *, lines: int = FEED_LINES) -> RenderableType:
    """The last `lines` events, newest first, in a panel exactly `lines` tall inside."""
    shown = tuple((e.at, e.kind, e.text) for e in events[-lines:]) if lines > 0 else ()
    return Replayed(("events", shown, lines), lambda: _feed_panel(shown, lines))


def _feed_panel(shown: tuple[tuple[float, str, str], ...], lines: int) -> Panel:
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
    if not rows:
        rows.append(Text("no events yet: try k to kill -9 a worker holding a task", style="dim"))
    # one Text for all lines: a Table here would cost more than the rest of the frame
    feed = Text("\n").join(rows)
    feed.no_wrap = True
    feed.overflow = "ellipsis"
    return Panel(
        feed,
        title="events",
        title_align="left",
        box=box.ROUNDED,
        padding=(0, 1),
        height=max(1, lines) + 2,
    )


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


# -- footer -------------------------------------------------------------------------------


def footer(snapshot: SupervisorSnapshot, *, message: str | None = None) -> Spread:
    """The keys that act now (they change with a selection and while draining)."""
    keys = Text()

    def key(k: str, what: str) -> None:
        keys.append(f" {k} ", style="reverse bold")
        keys.append(f" {what}  ")

    if snapshot.draining:
        keys.append("draining: workers finish their tasks, then qw exits", style="bold yellow")
        keys.append("   ")
        key("Ctrl-C ×2", "kill them now")  # qw up: a stop request drains, the second kills
    elif snapshot.selected is not None:
        name = next((w.name for w in snapshot.workers if w.slot == snapshot.selected), None)
        label = name or f"slot {snapshot.selected}"
        key("k", f"kill -9 {label}")
        key("p", f"pause/resume {label}")
        key("Esc", "clear")
        key("0-9", "select")
        key("q", "drain & quit")
    else:
        key("k", "kill -9 a holder")
        key("0-9", "select")
        key("+", "add")
        key("-", "remove")
        key("q", "drain & quit")

    return Spread(keys, Text(printable(message or ""), style="bold"))


# -- formatting ---------------------------------------------------------------------------


def format_duration(seconds: float) -> str:
    """3.2s, 45s, 2m05s, 1h02m: short enough for a table cell."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_micros(micros: int) -> str:
    """A claim latency: 410µs, 1.25ms, 12ms, 1.5s."""
    if micros < 1000:
        return f"{micros}µs"
    if micros < 10_000:
        return f"{micros / 1000:.2f}ms"
    if micros < 1_000_000:
        return f"{micros / 1000:.0f}ms"
    return f"{micros / 1_000_000:.1f}s"


def format_bytes(n: int) -> str:
    """1023B, 12.3K, 45.6M, 1.2G (powers of 1024)."""
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(value) < 1024 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")  # the loop returns at "T"


# -- reading stats (a JSON dict from another process: trust no type) -----------------------


def _int(data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    # bool is an int subclass; True is not a task id
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _n(data: Mapping[str, Any], key: str) -> int:
    return _int(data, key) or 0
