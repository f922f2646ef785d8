"""The dashboard in a real terminal: tmux runs it, `capture-pane` reads the screen.

The main test drives the real `qw up`: the worker rows appear, `k` kills a worker that holds
a task and the feed shows that task taken over, `q` drains and exits, and the terminal is
itself again (cooked mode, main screen, cursor shown, no process left). The other ways out
(an exception, SIGTERM, Ctrl-C) are driven with a fake supervisor — this module, run as
`python -m tests.test_tui_tmux` — because `qw up` turns those signals into a drain.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from queue_worker.worker.snapshot import parse_snapshot
from supervisor.run.model import Event, QueueView, SlotState, SupervisorSnapshot, WorkerView
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
QW = REPO / ".venv" / "bin" / "qw"
PROMPT = "qwtest$ "

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    """One private tmux server with one pane (160x50 unless told) running bash.

    Its socket is `socket` (a path: under the test's tmp_path, so nothing is left behind);
    a path too long for a unix socket falls back to a unique -L name, whose socket file in
    tmux's own directory is removed by `kill_server`.
    """

    def __init__(self, socket: Path, width: int = 160, height: int = 50) -> None:
        self.width, self.height = width, height
        if len(str(socket)) < 100:  # sun_path holds 108 bytes
            self.where = ["-S", str(socket)]
        else:
            self.where = ["-L", f"qw-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"]
        self.socket_path: str | None = None

    def start(self, cwd: Path) -> None:
        # works inside tmux too; the pane's size is its own (not the tests' COLUMNS)
        env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "COLUMNS", "LINES")}
        self.run(
            "-f",
            "/dev/null",  # no user config: the default keys and terminal
            "new-session",
            "-d",
            "-s",
            "qw",
            "-x",
            str(self.width),
            "-y",
            str(self.height),
            "-c",
            str(cwd),
            # through env(1): tmux starts this with /bin/sh, and dash does not pass PS1 on
            f"env PS1='{PROMPT}' bash --norc --noprofile",
            env=env,
        )
        self.socket_path = self.pane("#{socket_path}")
        wait_until(lambda: PROMPT.strip() in self.screen(), 10, "the shell prompt")

    def run(self, *args: str, env: dict[str, str] | None = None) -> str:
        out = subprocess.run(
            ["tmux", *self.where, *args],
            check=True,
            capture_output=True,
            text=True,
            env=env,
            timeout=10,
        )
        return out.stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "qw")

    def send(self, *keys: str) -> None:
        self.run("send-keys", "-t", "qw", *keys)

    def type_line(self, line: str) -> None:
        self.send("-l", line)  # literally: no key-name lookup
        self.send("Enter")

    def pane(self, fmt: str) -> str:
        return self.run("display-message", "-p", "-t", "qw", fmt).strip()

    @property
    def shell_pid(self) -> int:
        return int(self.pane("#{pane_pid}"))

    def children(self) -> list[psutil.Process]:
        try:
            return list(psutil.Process(self.shell_pid).children(recursive=True))
        except psutil.NoSuchProcess:
            return []

    def kill_server(self) -> None:
        subprocess.run(["tmux", *self.where, "kill-server"], capture_output=True, timeout=10)
        if self.socket_path:
            Path(self.socket_path).unlink(missing_ok=True)  # tmux leaves it behind


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    term = Tmux(tmp_path / "tmux.sock")
    try:
        term.start(REPO)
        yield term
    finally:
        term.kill_server()


def at_prompt(term: Tmux) -> bool:
    """The shell is waiting for a command: its prompt is the last line on the screen."""
    lines = [line for line in term.screen().splitlines() if line.strip()]
    return bool(lines) and lines[-1].rstrip() == PROMPT.rstrip()


def exit_status(term: Tmux, what: str, timeout: float = 60) -> int:
    """Wait for the prompt to come back, then ask the shell for the last command's status.

    Asked separately (not `cmd; echo $?`): bash abandons the rest of a command line when
    its command dies of SIGINT.
    """
    wait_until(lambda: at_prompt(term), timeout, what)
    term.type_line("echo QW_EXIT=$?")

    def status() -> str | None:  # the digits, so that "0" is truthy
        found = re.search(r"^QW_EXIT=(\d+)$", term.screen(), re.MULTILINE)
        return found.group(1) if found else None

    return int(str(wait_until(status, 10, "the exit status")))


def assert_terminal_restored(term: Tmux) -> None:
    """Main screen, cursor shown, and the tty back in cooked mode with echo."""
    assert term.pane("#{alternate_on}") == "0", "still on the alternate screen"
    assert term.pane("#{cursor_flag}") == "1", "the cursor is still hidden"
    term.type_line(
        "printf 'MODES:%s\\n' \"$(stty -a | tr -s ' ;' '\\n\\n' "
        "| grep -xE -- '-?(icanon|echo)' | tr '\\n' ,)\""
    )

    def modes() -> str | None:
        found = re.search(r"^MODES:(.*)$", term.screen(), re.MULTILINE)
        return found.group(1) if found else None

    assert wait_until(modes, 10, "stty's answer") == "icanon,echo,"


def worker_rows(screen: str) -> dict[str, str]:
    """Worker label (w2·4711) → its row of the table (rows start with the slot number)."""
    rows: dict[str, str] = {}
    for line in screen.splitlines():
        words = line.replace("▶", " ").split()  # ▶ marks the selected row
        if len(words) > 2 and words[0].isdigit() and re.fullmatch(r"w\d+·\d+", words[1]):
            rows[words[1]] = line
    return rows


def slot_rows(screen: str) -> dict[str, str]:
    """Slot name (w2) → the row of the process in it now (the first row of that slot)."""
    rows: dict[str, str] = {}
    for label, row in worker_rows(screen).items():
        rows.setdefault(label.split("·")[0], row)
    return rows


# -- the real `qw up` ---------------------------------------------------------------------


SIZES = [(80, 24), (120, 40), (200, 60)]
# make test runs 80x24, the size every screen must fit; make test-all the larger ones too
SIZE_PARAMS = [
    pytest.param(size, marks=() if size == SIZES[0] else pytest.mark.slow) for size in SIZES
]


@pytest.fixture(params=SIZE_PARAMS, ids=[f"{w}x{h}" for w, h in SIZES])
def sized_tmux(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    width, height = request.param
    term = Tmux(tmp_path / "tmux.sock", width, height)
    try:
        term.start(REPO)
        yield term
    finally:
        term.kill_server()


def keys_line_intact(screen: str) -> bool:
    """The keys are on the last line, whole: a status message never lands on it."""
    lines = screen.rstrip("\n").splitlines()
    return bool(lines) and lines[-1].lstrip().startswith("k ") and "drain & quit" in lines[-1]


def feed_lines(screen: str) -> list[str]:
    """The event feed's lines: after its title, down to the status line."""
    lines = screen.rstrip("\n").splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("── events"))
    return [line for line in lines[title + 1 : -2] if line.strip()]


@needs_tmux
def test_qw_up_kill_orphan_takeover_keys_and_quit(sized_tmux: Tmux, tmp_path: Path) -> None:
    tmux = sized_tmux
    if not QW.exists():
        pytest.fail(f"{QW} is missing: install the project (make test does)")
    tmux.type_line(
        f"{QW} up --dir {tmp_path / 'qw'} --workers 8 --lease 3 --work-ms 2000 --tasks 200",
    )

    # eight worker rows, each named whole (slot and the pid of a real worker process)
    def working() -> dict[str, str] | None:
        rows = worker_rows(tmux.screen())
        busy = any("working" in row and re.search(r"#\d+", row) for row in rows.values())
        return rows if len(rows) == 8 and busy else None

    rows = wait_until(working, 60, "eight worker rows, one working")
    assert isinstance(rows, dict)
    qw = next(p for p in tmux.children() if "up" in p.cmdline())
    worker_pids = {p.pid for p in qw.children(recursive=True)}
    assert {int(label.split("·")[1]) for label in rows} <= worker_pids
    assert {label.split("·")[0] for label in rows} == {f"w{i}" for i in range(8)}
    screen = tmux.screen()
    assert keys_line_intact(screen), screen
    assert all(re.search(r"#\d+\b", row) or " — " in row for row in rows.values()), screen

    # arrows select: ↓ from nothing picks w0, ↓ again w1; the keys line names it; Esc clears
    tmux.send("Down")
    wait_until(lambda: "▶0" in slot_rows(tmux.screen()).get("w0", ""), 10, "w0 selected")
    tmux.send("Down")
    wait_until(lambda: "▶1" in slot_rows(tmux.screen()).get("w1", ""), 10, "w1 selected")
    w1 = next(label for label in worker_rows(tmux.screen()) if label.startswith("w1·"))
    assert f"kill -9 {w1}" in tmux.screen().splitlines()[-1]
    tmux.send("Escape")
    wait_until(lambda: "▶" not in tmux.screen(), 10, "the selection cleared")

    # k: kill -9 a holder; the status line, the orphans panel, the death and the takeover
    # all name one task
    tmux.send("k")

    def killed() -> tuple[str, str] | None:
        found = re.search(r"kill -9 (w\d+·\d+), holding task (\d+)", tmux.screen())
        return (found.group(1), found.group(2)) if found else None

    found = wait_until(killed, 10, "the kill -9 of a worker holding a task")
    assert isinstance(found, tuple)
    victim, task = found
    orphan = re.compile(rf"^task {task}  {victim} ", re.MULTILINE)
    wait_until(lambda: orphan.search(tmux.screen()), 10, f"task {task} in the orphans panel")
    screen = tmux.screen()
    assert keys_line_intact(screen), screen
    assert f"{victim} killed by SIGKILL while holding task {task}" in screen

    taken = re.compile(rf"^task {task}  {victim} → (w\d+·\d+)  took over ", re.MULTILINE)
    wait_until(lambda: taken.search(tmux.screen()), 60, f"the takeover of task {task}")
    screen = tmux.screen()
    assert keys_line_intact(screen), screen
    assert any(f"takeover   task {task}: {victim} → " in line for line in feed_lines(screen))

    # /: filter the feed by the task; every line shown is about it
    tmux.send("/")
    wait_until(lambda: "filter events: /" in tmux.screen(), 10, "the filter prompt")
    tmux.send("-l", task)
    tmux.send("Enter")
    wait_until(lambda: f"events matching '{task}'" in tmux.screen(), 10, "the filtered feed")
    lines = feed_lines(tmux.screen())
    assert any("takeover" in line for line in lines), lines
    assert all(re.search(rf"(?<![\d.]){task}(?![\d.])", line) for line in lines), lines
    tmux.send("Escape")
    wait_until(lambda: "events matching" not in tmux.screen(), 10, "the filter cleared")

    # ?: every key, then back
    tmux.send("?")
    wait_until(lambda: "keys (? or Esc closes this)" in tmux.screen(), 10, "the help")
    screen = tmux.screen()
    for key in ("kill -9 a worker holding a task", "select a worker", "filter the events"):
        assert key in screen, screen
    assert keys_line_intact(screen), screen
    tmux.send("?")
    wait_until(lambda: "── events" in tmux.screen(), 10, "the help closed")

    # q: drain; the dashboard stays up while draining, then exits 0
    tmux.send("q")
    wait_until(lambda: "DRAINING" in tmux.screen() or at_prompt(tmux), 10, "draining")
    code = exit_status(tmux, "qw up to drain and exit")
    screen = tmux.screen()
    assert code == 0, screen
    # the CLI's last word, on the main screen: q stopped a queue with tasks still to do, so
    # it says what is left (never "drained": supervisor/run/end_state.py)
    assert "qw: stopped with" in screen and " pending" in screen, screen
    assert "qw: drained" not in screen, screen
    assert not tmux.children(), "a process outlived qw up"
    assert not any(_alive(pid) for pid in worker_pids)
    assert_terminal_restored(tmux)


@needs_tmux
def test_more_than_ten_workers_are_reached_with_the_arrows(tmux: Tmux) -> None:
    tmux.type_line(f"{PYTHON} -m tests.test_tui_tmux --workers 12")
    wait_until(lambda: len(slot_rows(tmux.screen())) == 12, 20, "the fake dashboard")
    tmux.send("Up")  # from nothing, up picks the last
    wait_until(lambda: "▶11" in slot_rows(tmux.screen()).get("w11", ""), 10, "w11 selected")
    tmux.send("Up")
    wait_until(lambda: "▶10" in slot_rows(tmux.screen()).get("w10", ""), 10, "w10 selected")
    tmux.send("p")
    wait_until(lambda: "paused" in slot_rows(tmux.screen())["w10"], 10, "w10 paused")
    tmux.send("q")
    assert exit_status(tmux, "the dashboard to exit", 20) == 0


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


# -- every way out, with a fake supervisor ------------------------------------------------


@needs_tmux
@pytest.mark.parametrize("way_out", ["q", "exception", "SIGTERM", "Ctrl-C"])
def test_terminal_restored_on_every_way_out(tmux: Tmux, tmp_path: Path, way_out: str) -> None:
    trigger = tmp_path / "crash-now"
    tmux.type_line(f"{PYTHON} -m tests.test_tui_tmux --crash-when {trigger}")
    wait_until(lambda: len(slot_rows(tmux.screen())) == 3, 20, "the fake dashboard")
    assert tmux.pane("#{alternate_on}") == "1"

    if way_out == "q":
        # on the way: a digit selects, p pauses the selected worker, Esc clears
        tmux.send("1")
        wait_until(lambda: "▶1" in slot_rows(tmux.screen()).get("w1", ""), 10, "w1 selected")
        tmux.send("p")
        wait_until(lambda: "paused" in slot_rows(tmux.screen())["w1"], 10, "w1 paused")
        tmux.send("Escape")
        wait_until(lambda: "▶" not in tmux.screen(), 10, "the selection cleared")
        tmux.send("q")
        expected = 0
    elif way_out == "exception":
        trigger.touch()  # the next snapshot raises
        expected = 1  # the traceback is printed on the main screen, after the restore
    elif way_out == "SIGTERM":
        python = next(p for p in tmux.children() if "tests.test_tui_tmux" in p.cmdline())
        python.send_signal(signal.SIGTERM)
        expected = 128 + signal.SIGTERM
    else:
        tmux.send("C-c")
        expected = 128 + signal.SIGINT

    assert exit_status(tmux, f"the dashboard to exit on {way_out}", 20) == expected, tmux.screen()
    if way_out == "exception":
        assert "RuntimeError: the fake snapshot failed" in tmux.screen()
    assert_terminal_restored(tmux)


# -- the fake supervisor ------------------------------------------------------------------


class FakeSupervisor:
    """Workers without processes: every worker holds a task; a killed worker's task is
    taken over one (fake) lease later and the worker restarts. `q` finishes a second later.
    """

    def __init__(self, workers: int = 3, crash_when: Path | None = None, events: int = 0) -> None:
        self.started = time.time()
        self.crash_when = crash_when
        self.frames = 0
        self.selected: int | None = None
        self.draining_since: float | None = None
        self.views = [self._fresh(i) for i in range(workers)]
        self.events = [
            Event(self.started - events + i, "takeover", f"task {i}: w1 → w2, 2.0 s after w1 died")
            for i in range(events)
        ]
        self.history: list[float] = []
        self.done = 0
        self.next_task = workers

    def _fresh(self, slot: int, task: int | None = None) -> WorkerView:
        now = time.time()
        return WorkerView(
            slot=slot,
            name=f"w{slot}",
            worker_id=f"w{slot}-{50000 + slot}-{slot:04x}",
            pid=50000 + slot,
            state=SlotState.WORKING,
            stats=parse_snapshot(
                {
                    "attempts": 3,
                    "won": 2,
                    "lost_total": 1,
                    "finished": 1,
                    "current_task": slot if task is None else task,
                    "current_since": now,
                    "lease_expiry": now + 2.0,
                    "claim_latency_micros": {"p50": 450, "p90": 700, "p99": 1900, "samples": 3},
                }
            ),
            cpu_percent=4.0,
            rss_bytes=30 << 20,
        )

    def snapshot(self) -> SupervisorSnapshot:
        self.frames += 1
        if self.crash_when is not None and self.crash_when.exists():
            raise RuntimeError("the fake snapshot failed")
        now = time.time()
        for i, view in enumerate(self.views):
            if view.state == "dead" and view.died_at is not None and now - view.died_at > 1.0:
                task = view.stats.current_task
                heir = self.views[(i + 1) % len(self.views)].name
                text = f"task {task}: {view.name} → {heir}, 1.0 s after {view.name} died"
                self.events.append(Event(now, "takeover", text))
                self.views[i] = dataclasses.replace(
                    self._fresh(i, self.next_task), restarts=view.restarts + 1
                )
                self.next_task += 1
                self.events.append(Event(now, "restart", f"{view.name} restarted"))
        self.history = [*self.history[-59:], float(self.frames % 7)]
        return SupervisorSnapshot(
            location="fake://dashboard",
            workers=list(self.views),
            queue=QueueView(published=100, pending=90, held=len(self.views), done=self.done),
            events=list(self.events),
            draining=self.draining_since is not None,
            selected=self.selected,
            started_at=self.started,
        )

    @property
    def finished(self) -> bool:
        return self.draining_since is not None and time.time() - self.draining_since > 1.0

    def kill_a_holder(self) -> str | None:
        holder = next((v for v in self.views if v.state == "working"), None)
        return None if holder is None else self.kill(holder.slot)

    def kill(self, slot: int) -> str | None:
        view = self.views[slot]
        if view.state == "dead":
            return None
        task = view.stats.current_task
        self.views[slot] = dataclasses.replace(
            view, state=SlotState.DEAD, exit_code=-signal.SIGKILL, died_at=time.time()
        )
        text = f"{view.name} (pid {view.pid}) killed by SIGKILL while holding task {task}"
        self.events.append(Event(time.time(), "death", text))
        return f"kill -9 {view.name} (pid {view.pid}), holding task {task}"

    def toggle_pause(self, slot: int) -> str | None:
        view = self.views[slot]
        state = SlotState.WORKING if view.state is SlotState.PAUSED else SlotState.PAUSED
        self.views[slot] = dataclasses.replace(view, state=state)
        return f"{view.name} {state}"

    def add_worker(self) -> str | None:
        self.views.append(self._fresh(len(self.views)))
        return f"{self.views[-1].name} added"

    def remove_worker(self) -> str | None:
        if not self.views:
            return None
        return f"{self.views.pop().name} removed"

    def drain(self) -> None:
        self.draining_since = time.time()

    def select(self, slot: int | None) -> None:
        self.selected = slot


def main(argv: list[str] | None = None) -> None:
    """Run the dashboard on a fake supervisor (what the tests above start under tmux)."""
    from supervisor.tui.live import run_dashboard

    parser = argparse.ArgumentParser(prog="python -m tests.test_tui_tmux")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--crash-when", type=Path, help="raise once this file exists")
    parser.add_argument("--refresh", type=float, default=4.0)
    parser.add_argument("--events", type=int, default=0, help="events already in the feed")
    args = parser.parse_args(argv)
    sup = FakeSupervisor(args.workers, args.crash_when, args.events)
    run_dashboard(sup, refresh_per_second=args.refresh)


if __name__ == "__main__":
    main()
