"""The dashboard's pure builders, rendered into a plain-text console and read back."""

from __future__ import annotations

import io
import os
import re
import signal
from typing import Any

import pytest
from rich.console import Console, RenderableType

from queue_worker.worker.snapshot import parse_snapshot
from supervisor.partitioned.names import tagged
from supervisor.run.model import Event, Orphan, QueueView, SupervisorSnapshot, WorkerView
from supervisor.tui.dashboard import (
    View,
    event_feed,
    event_matches,
    format_bytes,
    format_duration,
    format_micros,
    full_screen,
    queue_panel,
    render,
    worker_table,
)
from supervisor.tui.live import (
    BACKSPACE,
    DOWN,
    END,
    ENTER,
    ESC,
    HOME,
    LEFT,
    RIGHT,
    UP,
    Dashboard,
    _Keys,
    parse_keys,
    sigterm_stops,
)
from supervisor.tui.sparkline import sparkline

NOW = 1_700_000_000.0
WIDTH = 120


def text_of(renderable: RenderableType, width: int = WIDTH, height: int | None = None) -> str:
    out = io.StringIO()
    Console(file=out, width=width, height=height, color_system=None).print(renderable)
    return out.getvalue()


def stats(**over: Any) -> dict[str, Any]:
    """A worker's published snapshot, as queue_worker.worker.stats.WorkerStats.to_dict() writes
    it."""
    base: dict[str, Any] = {
        "attempts": 40,
        "won": 31,
        "lost_total": 9,
        "finished": 30,
        "current_task": None,
        "current_since": None,
        "lease_expiry": None,
        "claim_latency_micros": {"p50": 420, "p90": 800, "p99": 2350, "samples": 40},
    }
    base.update(over)
    return base


def worker(slot: int, state: str = "idle", **over: Any) -> WorkerView:
    fields: dict[str, Any] = {
        "slot": slot,
        "name": f"w{slot}",
        "worker_id": f"w{slot}-{41000 + slot}-9fe3",
        "pid": 41000 + slot,
        "state": state,
        "stats": stats(),
        "cpu_percent": 12.5,
        "rss_bytes": 31 * 1024 * 1024,
    }
    fields.update(over)
    fields["stats"] = parse_snapshot(fields["stats"])  # as the supervisor reads the file
    return WorkerView(**fields)


def snapshot(workers: list[WorkerView] | None = None, **over: Any) -> SupervisorSnapshot:
    fields: dict[str, Any] = {
        "location": "/home/me/demo/.qw",
        "workers": [] if workers is None else workers,
        "queue": QueueView(
            published=30,
            pending=12,
            held=3,
            done=15,
            failed=1,
            dead=0,
            throughput_now=2.5,
            throughput_history=[0.0, 1.0, 2.0, 3.0, 4.0, 2.0, 0.0, 2.5],
            log_bytes=48_213,
            record_count=187,
        ),
        "events": [],
        "started_at": NOW - 83,
    }
    fields.update(over)
    return SupervisorSnapshot(**fields)


def eight_workers() -> list[WorkerView]:
    states = ["working", "working", "claiming", "idle", "paused", "dead", "working", "idle"]
    out = []
    for slot, state in enumerate(states):
        held = state in ("working", "dead")
        out.append(
            worker(
                slot,
                state,
                stats=stats(
                    current_task=100 + slot if held else None,
                    current_since=NOW - 1.2 if held else None,
                    lease_expiry=NOW + 0.8 if held else None,
                ),
                exit_code=-9 if state == "dead" else None,
                died_at=NOW - 0.5 if state == "dead" else None,
            )
        )
    return out


def row_of(text: str, name: str) -> str:
    """The worker table's row for worker `name`: its label (w2·41002), or its slot name when
    one row has it (rows are the slot number, then the label)."""

    def label(line: str) -> str:
        words = line.replace("▶", " ").split()
        return words[1] if len(words) > 1 and words[0].isdigit() else ""

    rows = [line for line in text.splitlines() if name in (label(line), label(line).split("·")[0])]
    assert len(rows) == 1, f"expected one row for {name}:\n{text}"
    return rows[0]


# -- workers ------------------------------------------------------------------------------


def test_worker_rows_show_every_figure() -> None:
    w = worker(
        2,
        "working",
        stats=stats(
            attempts=57,
            won=44,
            lost_total=13,
            finished=41,
            current_task=17,
            current_since=NOW - 3.2,
            lease_expiry=NOW + 1.5,
            claim_latency_micros={"p50": 612, "p90": 900, "p99": 14_200, "samples": 57},
        ),
        cpu_percent=7.25,
        rss_bytes=28 * 1024 * 1024,
    )
    row = row_of(text_of(worker_table([w], now=NOW)), "w2")
    for expected in (
        "w2·41002",
        "working",
        "#17",
        "3.2s",  # held
        "1.5s",  # lease left
        "57/44/13",
        "41",
        "612µs/14ms",
        "7.2%",
        "28.0M",
    ):
        assert expected in row, f"{expected!r} missing from {row!r}"


def test_a_task_by_name_shows_its_function_beside_its_id_within_80_columns() -> None:
    running = {"current_task": 17, "current_since": NOW - 1, "lease_expiry": NOW + 9}
    short = worker(0, "working", stats=stats(**running, current_function="resize"))
    long = worker(1, "working", stats=stats(**running, current_function="thumbnail_\x1b[2Jall"))
    payload = worker(2, "working", stats=stats(**running))
    text = text_of(worker_table([short, long, payload], now=NOW), width=80)
    assert "#17 resize" in row_of(text, "w0")
    assert "#17 thumbnail_�…" in row_of(text, "w1")  # cut to 12, never an escape
    assert re.search(r"#17 \S", row_of(text, "w2")) is None  # a payload task: its id alone
    assert "9.0s" in row_of(text, "w0")  # the lease still fits beside it
    assert all(len(line) <= 80 for line in text.splitlines()), text


def test_a_worker_is_named_by_slot_and_pid_whole() -> None:
    w = worker(0, worker_id="w0-4194303-" + "ab" * 2, pid=4194303)
    assert " w0·4194303 " in row_of(text_of(worker_table([w], now=NOW), width=80), "w0")
    shared = worker(1, worker_id="w1@vm-11704-dev-box-11704-9fe3", pid=11704)
    row = row_of(text_of(worker_table([shared], now=NOW), width=80), "w1")
    assert " w1·11704@vm-11704-dev-box " in row  # a Redis worker's host, not cut


def test_every_state_is_named() -> None:
    text = text_of(worker_table(eight_workers(), now=NOW))
    for name, state in [("w0", "working"), ("w2", "claiming"), ("w3", "idle"), ("w4", "paused")]:
        assert state in row_of(text, name)
    assert "dead KILL" in row_of(text, "w5")  # killed by signal 9, named


def test_lease_lapsed_reads_expired() -> None:
    w = worker(
        0, "working", stats=stats(current_task=3, current_since=NOW - 5, lease_expiry=NOW - 1)
    )
    assert "expired" in row_of(text_of(worker_table([w], now=NOW)), "w0")


def test_dead_worker_keeps_its_last_figures() -> None:
    dead = worker(
        1,
        "dead",
        worker_id="w1-41777-9fe3",
        stats=stats(attempts=23, won=20, lost_total=3, finished=19, current_task=8),
        exit_code=-9,
        died_at=NOW - 2,
        restarts=1,
        pid=41777,
    )
    row = row_of(text_of(worker_table([dead], now=NOW)), "w1")
    for expected in ("dead", "KILL", "w1·41777", "#8", "23/20/3", "19", "420µs/2.35ms", "↻1"):
        assert expected in row, f"{expected!r} missing from {row!r}"


def test_selected_worker_is_marked_without_colour() -> None:
    text = text_of(worker_table(eight_workers(), now=NOW, selected=3))
    assert "▶3" in row_of(text, "w3")
    assert "▶" not in row_of(text, "w2")


def test_no_workers() -> None:
    text = text_of(render(snapshot([]), now=NOW))
    assert "no workers" in text
    assert "0 alive" in text
    assert "The queue is empty" not in text  # this queue has work (published 30)
    assert "no events yet" in text
    assert "q  drain & quit" in text


def test_worker_without_stats_yet() -> None:
    fresh = worker(0, "starting", stats={}, pid=None, worker_id=None, rss_bytes=0)
    row = row_of(text_of(worker_table([fresh], now=NOW)), "w0")
    assert "starting" in row
    assert "0/0/0" in row


def test_stats_of_the_wrong_types_do_not_crash() -> None:
    # the stats come from another process's JSON: a bad value shows as missing, not a crash
    odd = worker(
        0,
        "working",
        stats={
            "current_task": "seven",
            "attempts": True,
            "lost": {"lost: held": 2, "lost: done": "x"},
            "claim_latency_micros": [1, 2],
            "lease_expiry": "soon",
        },
    )
    row = row_of(text_of(worker_table([odd], now=NOW)), "w0")
    assert "0/0/2" in row


# -- the queue ----------------------------------------------------------------------------


def test_queue_panel_counts_and_sparkline() -> None:
    queue = QueueView(
        published=1200,
        pending=400,
        held=8,
        done=780,
        failed=4,
        dead=2,
        throughput_now=12.5,
        throughput_history=[float(v) for v in range(0, 9)] * 10,
        log_bytes=3 * 1024 * 1024,
        record_count=51_234,
    )
    text = text_of(queue_panel(queue))
    for expected in (
        "published 1,200",
        "pending 400",
        "held 8",
        "done 780",
        "failed 4",
        "dead 2",
        "12.5/s",
        "3.0M",
        "51,234 records",
        "peak 8.0/s",
        "65%",
    ):
        assert expected in text, f"{expected!r} missing from\n{text}"
    # the last 60 seconds of 0..8 repeated, at full height 8 → "█"
    assert sparkline(queue.throughput_history, 60) in text
    assert " ▁▂▃▄▅▆▇█ ▁▂▃▄▅▆▇█" in text


def test_sparkline() -> None:
    assert sparkline([0, 1, 2, 4, 8], 5) == " ▁▂▄█"
    assert sparkline([1, 2], 5) == "   ▄█"  # missing history is blank, on the left
    assert sparkline([0.01, 100], 2) == "▁█"  # a little work is not none
    assert sparkline([], 3) == "   "
    assert sparkline([0, 0], 2) == "  "
    assert sparkline([float("nan"), -3, float("inf"), 2], 4) == "   █"
    assert sparkline(list(range(100)), 10) == sparkline(list(range(90, 100)), 10)
    assert sparkline([1, 2], 2, maximum=4) == "▂▄"
    assert sparkline([1], 0) == ""


# -- the event feed -----------------------------------------------------------------------


def test_takeover_and_death_in_the_feed_newest_first() -> None:
    events = [
        Event(NOW - 9, "death", "w1 (pid 41001) killed by SIGKILL holding task 17"),
        Event(NOW - 7, "takeover", "task 17: w1 → w3, 2.1s after w1 died"),
        Event(NOW - 6, "restart", "w1 restarted as pid 41010"),
        Event(NOW - 5, "lease-lost", "task 22: w2 lost its lease"),
        Event(NOW - 4, "stale", "task 22: DONE from w2 discarded (stale)"),
    ]
    lines = text_of(event_feed(events)).splitlines()
    takeover = next(line for line in lines if "takeover" in line)
    assert "task 17: w1 → w3, 2.1s after w1 died" in takeover
    kinds = [
        k
        for line in lines
        for k in ("death", "takeover", "restart", "lease-lost", "stale")
        if f" {k} " in line
    ]
    assert kinds == ["stale", "lease-lost", "restart", "takeover", "death"]


def test_feed_shows_the_last_ten() -> None:
    events = [Event(NOW - 100 + i, "info", f"event number {i:03d}") for i in range(40)]
    text = text_of(event_feed(events))
    assert "event number 039" in text
    assert "event number 030" in text
    assert "event number 029" not in text


# -- the whole screen ---------------------------------------------------------------------


def test_render_whole_screen() -> None:
    snap = snapshot(
        eight_workers(),
        events=[Event(NOW - 1, "takeover", "task 105: w5 → w0, 2.0s after w5 died")],
        draining=True,
    )
    text = text_of(render(snap, now=NOW, message="killed w5 (pid 41005)"))
    assert "/home/me/demo/.qw" in text
    assert "up 1m23s" in text
    assert "7 alive" in text and "1 dead" in text and "1 paused" in text
    assert "DRAINING" in text
    assert "workers finish their tasks, then qw exits" in text
    assert "Ctrl-C ×2  kill them now" in text
    assert "killed w5 (pid 41005)" in text
    assert "task 105: w5 → w0" in text
    for slot in range(8):
        row_of(text, f"w{slot}")
    assert all(len(line) <= WIDTH for line in text.splitlines())


def test_footer_follows_the_selection() -> None:
    text = text_of(render(snapshot(eight_workers(), selected=4), now=NOW))
    assert "kill -9 w4" in text
    assert "pause/resume w4" in text
    assert "Esc  clear" in text


def test_layout_pins_the_footer_to_the_last_line() -> None:
    events = [Event(NOW - 100 + i, "info", f"event number {i:03d}") for i in range(200)]
    snap = snapshot(eight_workers(), events=events)
    for height in (50, 24):
        lines = text_of(full_screen(snap, now=NOW, height=height), height=height).splitlines()
        assert len(lines) == height
        assert "drain & quit" in lines[-1]
        assert "event number 199" in "\n".join(lines)  # the newest event is always in sight
    tall = text_of(full_screen(snap, now=NOW, height=50), height=50)
    assert "event number 170" in tall  # the feed grew to fill the screen
    assert "event number" in tall.splitlines()[-3]  # up to the status line


def test_very_long_values_are_cut_not_wrapped() -> None:
    huge = 10**30
    w = worker(
        0,
        "working",  # a state is one of SlotState's words: never long
        name="w" * 400,
        worker_id="id" * 300,
        pid=huge,
        stats=stats(
            attempts=huge,
            won=huge,
            lost_total=huge,
            finished=huge,
            current_task=huge,
            current_since=NOW - 10**9,
            lease_expiry=NOW + 10**9,
            claim_latency_micros={"p50": huge, "p99": huge, "samples": 1},
        ),
        cpu_percent=1e9,
        rss_bytes=huge,
        restarts=huge,
    )
    snap = snapshot(
        [w],
        location="/very/long/" + "path/" * 200,
        events=[Event(NOW, "k" * 300, "t" * 5000)],
        queue=QueueView(
            published=huge,
            pending=huge,
            done=huge,
            throughput_now=1e12,
            throughput_history=[1e300] * 500,
            log_bytes=huge,
            record_count=huge,
        ),
    )
    text = text_of(render(snap, now=NOW, message="m" * 1000))
    lines = text.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    assert "…" in text
    assert len(lines) < 40  # nothing wrapped onto extra lines


def test_control_characters_never_reach_the_terminal() -> None:
    # a worker's last log line ends up in a death event; it may carry colour codes
    snap = snapshot(
        [worker(0, name="w0\x1b[2J")],
        events=[Event(NOW, "death", "w0 exited with code 1: \x1b[31mboom\x1b[0m\tat\nline 3")],
    )
    out = io.StringIO()
    console = Console(file=out, width=WIDTH, force_terminal=True, color_system="standard")
    console.print(render(snap, now=NOW, message="\x07bell"))
    screen = out.getvalue()
    assert "\x1b[2J" not in screen  # clear-screen: rich itself never prints it
    assert "\x1b[31mboom" not in screen
    assert "\x07" not in screen
    assert "�[31mboom�[0m at line 3" in text_of(render(snap, now=NOW))


@pytest.mark.parametrize(("width", "height"), [(20, 5), (60, 12), (300, 100)])
def test_any_screen_size_renders(width: int, height: int) -> None:
    events = [Event(NOW, "takeover", "task 1: w0 → w1, 2.0 s after w0 died")] * 50
    text = text_of(
        full_screen(snapshot(eight_workers(), events=events), now=NOW, height=height),
        width=width,
        height=height,
    )
    assert all(len(line) <= width for line in text.splitlines())


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.04, "0.0s"), (3.25, "3.2s"), (42, "42s"), (125, "2m05s"), (3725, "1h02m"), (-5, "0.0s")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_micros_and_bytes() -> None:
    assert [format_micros(v) for v in (410, 1250, 12_345, 1_500_000)] == [
        "410µs",
        "1.25ms",
        "12ms",
        "1.5s",
    ]
    assert [format_bytes(v) for v in (0, 1023, 12 * 1024, 45 * 1024**2, 3 * 1024**5)] == [
        "0B",
        "1023B",
        "12.0K",
        "45.0M",
        "3072.0T",
    ]


# -- keys (no terminal needed) ------------------------------------------------------------


def test_parse_keys_drops_escape_sequences() -> None:
    assert parse_keys("k3p") == ["k", "3", "p"]
    assert parse_keys("\x1b") == [ESC]
    # up and down select; other arrows and ctrl-right are not commands
    assert parse_keys("\x1b[A\x1b[1;5Cq\x1b[D\x1bOB") == [UP, "q", LEFT, DOWN]
    assert parse_keys("\x1b[C\x1b[H\x1bOF") == [RIGHT, HOME, END]
    assert parse_keys("\x1bOPk") == ["k"]  # F1
    assert parse_keys("\r\t\x7f") == [ENTER, BACKSPACE]


def test_keys_from_a_hung_up_terminal_stop_being_read() -> None:
    read_end, write_end = os.pipe()
    try:
        keys = _Keys(read_end)
        assert keys.read(timeout=0.0) == []
        os.write(write_end, b"k\x1b[Bq")
        assert keys.read(timeout=1.0) == ["k", DOWN, "q"]
        os.close(write_end)
        write_end = -1
        assert keys.read(timeout=1.0) == []  # end of file: readable for ever after
        assert keys.fd is None  # so it is not polled again (that loop would burn a core)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_sigterm_ends_the_loop_instead_of_the_process() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_stops() as sigterm:
        was = sigterm.received
        os.kill(os.getpid(), signal.SIGTERM)
        assert (was, sigterm.received) == (False, True)
    assert signal.getsignal(signal.SIGTERM) == before


def test_sigterm_goes_to_the_callers_handler_when_there_is_one() -> None:
    calls: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    try:
        with sigterm_stops() as sigterm:
            os.kill(os.getpid(), signal.SIGTERM)
            assert calls == [signal.SIGTERM]
            assert not sigterm.received  # the caller decides (qw up drains)
    finally:
        signal.signal(signal.SIGTERM, before)


class RecordingSupervisor:
    """Controls that record what the keys asked for."""

    def __init__(self, snap: SupervisorSnapshot) -> None:
        self.snap = snap
        self.calls: list[tuple[str, int | None]] = []
        self.finished = False

    def snapshot(self) -> SupervisorSnapshot:
        return self.snap

    def kill_a_holder(self) -> str | None:
        self.calls.append(("kill_a_holder", None))
        return "killed w0 holding task 100"

    def kill(self, slot: int) -> str | None:
        self.calls.append(("kill", slot))
        return None

    def toggle_pause(self, slot: int) -> str | None:
        self.calls.append(("toggle_pause", slot))
        return f"paused w{slot}"

    def add_worker(self) -> str | None:
        self.calls.append(("add_worker", None))
        raise RuntimeError("no more slots")

    def remove_worker(self) -> str | None:
        self.calls.append(("remove_worker", None))
        return None

    def drain(self) -> None:
        self.calls.append(("drain", None))

    def select(self, slot: int | None) -> None:
        self.calls.append(("select", slot))


def test_keys_drive_the_controls() -> None:
    sup = RecordingSupervisor(snapshot(eight_workers()))
    dash = Dashboard(sup)
    dash.frame(now=NOW, height=40)  # learns which slots exist

    dash.on_key("k", now=NOW)
    assert dash.message == "killed w0 holding task 100"
    dash.on_key("p", now=NOW)
    assert dash.message is not None and "select a worker first" in dash.message
    dash.on_key("9", now=NOW)
    assert dash.selected is None and dash.message == "no worker in slot 9"
    for key in ("3", "k", "p", ESC, "+", "-", "q", "q"):
        dash.on_key(key, now=NOW)
    assert sup.calls == [
        ("kill_a_holder", None),
        ("select", 3),
        ("kill", 3),
        ("toggle_pause", 3),
        ("select", None),
        ("add_worker", None),
        ("remove_worker", None),
        ("drain", None),  # once: a second q does not drain again
    ]
    assert dash.selected is None and dash.draining
    assert dash.message is not None and "already draining" in dash.message

    frame = text_of(dash.frame(now=NOW + 1, height=40), height=40)
    assert "DRAINING" in frame and "already draining" in frame
    assert "already draining" not in text_of(dash.frame(now=NOW + 60, height=40), height=40)


def test_a_failing_control_is_shown_not_raised() -> None:
    dash = Dashboard(RecordingSupervisor(snapshot(eight_workers())))
    dash.on_key("+", now=NOW)
    assert dash.message == "+: RuntimeError: no more slots"


# -- any screen size: every worker whole, the keys on the last line -------------------------


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40), (200, 60)])
@pytest.mark.parametrize("view", [View(), View(help=True), View(filter="w1·41001", typing=True)])
def test_every_size_shows_every_worker_whole_and_the_keys_last(
    width: int, height: int, view: View
) -> None:
    workers = eight_workers()
    workers[5] = worker(5, "starting", pid=41999, worker_id=None, restarts=1)
    gone = worker(5, "dead", worker_id="w5-41005-9fe3", pid=41005, exit_code=-9, died_at=NOW - 1)
    orphans = [
        Orphan(105, "w5·41005", "w5-41005-9fe3", 5, NOW - 1, NOW + 2.5),
        Orphan(88, "w3·40003", "w3-40003-aaaa", 3, NOW - 9, NOW - 4, "w1·41001", NOW - 3.9),
    ]
    events = [
        Event(NOW - 60 + i, "takeover", f"task {i}: w1·41001 → w2·41002, 2.0 s after", i)
        for i in range(60)
    ]
    snap = snapshot(workers, departed=[gone], orphans=orphans, events=events)
    text = text_of(
        full_screen(
            snap, now=NOW, height=height, message="kill -9 w5·41005, holding task 105", view=view
        ),
        width=width,
        height=height,
    )
    lines = text.splitlines()
    assert len(lines) == height, text
    assert all(len(line) <= width for line in lines)
    assert "q  drain & quit" in lines[-1] or "Esc  cancel" in lines[-1], text  # the keys
    assert "?  keys" in lines[-1] or view.typing, text
    if view.typing:
        assert "filter events: /w1·41001" in lines[-2]
    else:
        assert lines[-2].startswith("kill -9 w5·41005, holding task 105")  # its own line
    if view.help:
        return
    for w in workers:
        row = row_of(text, f"w{w.slot}·{w.pid}")
        task = w.stats.current_task
        if task is not None:
            assert re.search(rf"(?<!\d)#{task}(?!\d)", row), row
    assert "#105" in row_of(text, "w5·41005")  # the dead row, beneath the new process's
    assert "2.5s" in row_of(text, "w5·41005")  # its lease, counting down
    assert re.search(r"^task 105  w5·41005 died 1\.0s ago\s+lease 2\.5s left", text, re.M)
    assert re.search(r"^task 88  w3·40003 → w1·41001  took over 0\.1s after", text, re.M)
    feed = lines[next(i for i, line in enumerate(lines) if line.startswith("── events")) :]
    assert len([line for line in feed if "takeover " in line]) >= 3, text


def test_filter_matches_a_task_or_a_worker_whole() -> None:
    takeover = Event(NOW, "takeover", "task 17: w2·6975 → w5·7001, 1.2 s after w2·6975 died", 17)
    death = Event(NOW, "death", "w6·6980 killed by SIGKILL while holding task 170", 170)
    info = Event(NOW, "info", "publishing 17 demo tasks/s; w4·6975 restarted after 6980 ms")
    for query, matches in [
        ("17", [takeover]),
        ("170", [death]),
        ("w2", [takeover]),
        ("W5·7001", [takeover]),
        ("6980", [death]),
        ("w", []),
        ("1", []),  # not the 1 of "1.2 s"
        ("", [takeover, death, info]),
        ("6975", [takeover, info]),  # a pid: the worker's, in both
    ]:
        events = (takeover, death, info)
        assert [e for e in events if event_matches(e, query)] == matches, query


def test_the_filter_examples_are_what_the_queue_can_match() -> None:
    """A partitioned queue's events say `p2` and `task 2:17` (`partition_names.tagged`): its
    help and its filter line give those forms, and each example matches such an event."""
    partitioned = snapshot(eight_workers(), partitions=[QueueView(), QueueView(), QueueView()])
    single = snapshot(eight_workers())
    for snap, wanted, unwanted in [
        (partitioned, "/2:17, /p2, /w6", "/17,"),
        (single, "/17, /w6, /w6·6975", "/2:17"),
    ]:
        shown = text_of(render(snap, now=NOW, view=View(help=True)), width=120, height=40)
        assert wanted in shown and unwanted not in shown, shown
        typing = text_of(render(snap, now=NOW, view=View(typing=True)), width=160, height=40)
        assert wanted.replace("/", "") in typing, typing
    event = Event(NOW, "takeover", tagged("task 17: w6·6975 → w5·7001", 2), 17)
    for query in ("2:17", "p2", "w6", "w6·6975"):
        assert event_matches(event, query), query
    assert not event_matches(event, "1:17")


def test_the_empty_queue_says_how_to_add_work() -> None:
    empty = snapshot(
        eight_workers(), queue=QueueView(), enqueue_hint="qw enqueue --count 100 --dir /x"
    )
    text = text_of(full_screen(empty, now=NOW, height=24), width=80, height=24)
    assert "The queue is empty" in text
    assert "    qw enqueue --count 100 --dir /x" in text
    assert "press k to kill -9 a worker holding a task" in text


def test_arrows_move_the_selection_and_slash_types_a_filter() -> None:
    workers = [worker(i) for i in range(12)]
    sup = RecordingSupervisor(snapshot(workers))
    dash = Dashboard(sup)
    dash.frame(now=NOW, height=40)
    dash.on_key(UP, now=NOW)
    assert dash.selected == 11
    dash.on_key(UP, now=NOW)
    dash.on_key(DOWN, now=NOW)
    dash.on_key(DOWN, now=NOW)
    assert dash.selected == 11  # the last stays the last
    for key in ["/", "k", "1", "7", BACKSPACE, ENTER]:
        dash.on_key(key, now=NOW)
    assert dash.view.filter == "k1" and not dash.view.typing
    assert ("kill", 11) not in sup.calls  # typed into the filter, not a command
    dash.on_key(ESC, now=NOW)  # the selection first
    assert (selection(dash), dash.view.filter) == (None, "k1")
    dash.on_key(ESC, now=NOW)  # then the filter
    assert dash.view.filter == ""
    dash.on_key("?", now=NOW)
    assert dash.view == View(help=True)
    dash.on_key("?", now=NOW)
    assert dash.view == View()


def selection(dash: Dashboard) -> int | None:
    return dash.selected  # read through a call: mypy would keep the narrowing of an assert


def test_more_workers_than_fit_scroll_with_the_selection() -> None:
    workers = [worker(i, "working") for i in range(20)]
    text = text_of(
        full_screen(snapshot(workers, selected=15), now=NOW, height=24), width=80, height=24
    )
    lines = text.splitlines()
    assert len(lines) == 24 and "q  drain & quit" in lines[-1]
    assert "▶15" in row_of(text, "w15·41015")
    assert re.search(r"… \d+ more rows: ↑/↓ select to scroll", text)
    assert len([line for line in lines if line.startswith("── events")]) == 1


@pytest.mark.parametrize("width", [80, 200])
def test_the_worker_tables_rule_spans_the_screen_as_the_sections_rules_do(width: int) -> None:
    lines = text_of(worker_table(eight_workers(), now=NOW), width=width).splitlines()
    assert lines[1] == "─" * width
