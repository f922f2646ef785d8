"""The browser dashboard's server side without a browser: the frame escapes what comes
from the logs, the page fetches from nowhere else, and the control paths answer only with
--http-control and the token (a real server, real HTTP; a recording supervisor).

The page in a real browser over a real run: tests/test_web_browser.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from queue_worker.worker.snapshot import WorkerSnapshot
from supervisor.http_api import StatsServer
from supervisor.run.model import Event, Orphan, QueueView, SlotState, SupervisorSnapshot, WorkerView
from supervisor.run.monitor import TaskInfo
from supervisor.tui.live import Dashboard
from supervisor.web.control import TOKEN_HEADER, ControlDesk, announce
from supervisor.web.frame import dashboard_frame, throughput_svg
from supervisor.web.html_text import text_html
from supervisor.web.page import dashboard_page
from tests.browser import external_references

NOW = 1_700_000_000.0
HOSTILE = '<img src=x onerror="alert(1)">'
TOKEN = "s3cret-token-for-the-test"


def snapshot() -> SupervisorSnapshot:
    """Two workers, one dead holding task 7 (orphaned), and names and texts from the logs
    that carry HTML."""
    hostile_id = f"w1-{HOSTILE}-4711-abcd"
    return SupervisorSnapshot(
        location="/tmp/<b>q</b>",
        workers=[
            WorkerView(
                0,
                "w0",
                "w0-4710-aaaa",
                4710,
                SlotState.WORKING,
                WorkerSnapshot(current_task=3, current_since=NOW - 1, lease_expiry=NOW + 4),
            ),
            WorkerView(1, "w1", hostile_id, 4711, SlotState.DEAD, exit_code=-9, died_at=NOW - 2),
        ],
        queue=QueueView(published=10, pending=5, held=2, done=3, throughput_history=[0, 2, 5]),
        events=[
            Event(NOW - 3, "info", "enqueued 10 demo tasks"),
            Event(NOW - 1, "stale", f"task 7: a DONE from {HOSTILE} <script>alert(2)</script>", 7),
        ],
        orphans=[Orphan(7, f"w1·{HOSTILE}", hostile_id, 1, NOW - 2, NOW + 2.5)],
        started_at=NOW - 60,
    )


def all_html(frame: dict[str, Any]) -> str:
    return json.dumps(frame)


def test_the_frame_escapes_every_text_from_the_logs() -> None:
    frame = dashboard_frame(snapshot(), now=NOW, control=True)
    text = all_html(frame)
    assert "<img" not in text and "<script" not in text and "<b>" not in text
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in text
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in text
    # what the terminal shows, in its words: the orphan's countdown, the dead row
    assert frame["orphans"]["lines"][0].count("2.5s left") == 1
    dead = next(r for r in frame["rows"] if r["slot"] == 1)
    assert not dead["alive"] and "dead" in dead["cells"][2] and "KILL" in dead["cells"][2]
    assert 'class="strike"' in dead["cells"][3]  # its orphaned task struck through
    assert [r["pid"] for r in frame["rows"]] == [4710, 4711]
    assert "stale" in frame["events"][0]  # newest first


def test_text_html_keeps_styles_as_classes_only() -> None:
    from rich.text import Text

    text = Text.assemble(("a<", "bold red"), ("b", "dim strike"), ("c&", "bold black on yellow"))
    assert text_html(text) == (
        '<span class="b fg-red">a&lt;</span><span class="dim strike">b</span>'
        '<span class="b fg-black bg-yellow">c&amp;</span>'
    )


def test_the_throughput_chart_is_numbers_only() -> None:
    svg = throughput_svg([0.0, 1.0, 4.0, 3.0])
    assert svg.count('class="bar"') == 3  # the zero second draws no bar
    assert "peak 4.0" in svg and ">5<" in svg  # the axis rounded up to 5


@pytest.mark.parametrize("control", [False, True])
def test_the_page_fetches_from_nowhere_else(control: bool) -> None:
    page = dashboard_page(control=control, nonce="N0NCE")
    assert external_references(page) == []
    assert re.search(r"https?://", page) is None
    assert page.count('nonce="N0NCE"') == 2  # its one style and its one script
    assert ("<button" in page) is control  # no button without --http-control
    assert TOKEN not in page


class Recording:
    """A supervisor that records the controls asked of it."""

    def __init__(self) -> None:
        self.snap = snapshot()
        self.calls: list[tuple[str, int | None]] = []

    def snapshot(self) -> SupervisorSnapshot:
        return self.snap

    def task_info(self, task: int) -> TaskInfo | None:
        return None

    def kill_a_holder(self) -> str | None:
        self.calls.append(("kill_a_holder", None))
        return "kill -9 w0·4710, holding task 3"

    def kill(self, slot: int) -> str | None:
        self.calls.append(("kill", slot))
        return None if slot == 1 else f"kill -9 slot {slot}"

    def toggle_pause(self, slot: int) -> str | None:
        self.calls.append(("toggle_pause", slot))
        return f"w{slot} paused"

    def add_worker(self) -> str | None:
        return None

    def remove_worker(self) -> str | None:
        return None

    def drain(self) -> None:
        pass

    def select(self, slot: int | None) -> None:
        pass


@pytest.fixture
def served() -> Iterator[tuple[str, str, Recording]]:
    """(URL with --http-control, URL without, the supervisor both serve)."""
    sup = Recording()
    with_control = StatsServer(sup, "127.0.0.1", 0, control=ControlDesk(sup, TOKEN))
    read_only = StatsServer(sup, "127.0.0.1", 0)
    for server in (with_control, read_only):
        server.start()
    try:
        yield f"http://{with_control.address}", f"http://{read_only.address}", sup
    finally:
        with_control.close()
        read_only.close()


def post(url: str, form: str = "", token: str | None = None) -> tuple[int, dict[str, Any]]:
    headers = {} if token is None else {TOKEN_HEADER: token}
    request = urllib.request.Request(url, data=form.encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_without_http_control_the_control_paths_do_not_exist(served: Any) -> None:
    _, read_only, sup = served
    for path in ("/control/kill", "/control/pause"):
        assert post(read_only + path, "slot=0", TOKEN)[0] == 404
    assert sup.calls == []
    with urllib.request.urlopen(read_only + "/", timeout=10) as answer:
        page = answer.read().decode()
        policy = answer.headers["Content-Security-Policy"]
    assert "<button" not in page
    assert "frame-ancestors 'none'" in policy and "connect-src 'self'" in policy


def test_a_control_request_without_the_token_gets_403_and_does_nothing(served: Any) -> None:
    url, _, sup = served
    assert post(url + "/control/kill")[0] == 403
    assert post(url + "/control/kill", "slot=0", "wrong")[0] == 403
    assert post(url + "/control/pause", f"slot=0&token={TOKEN}x")[0] == 403
    assert post(url + "/control/kill", "slot=0", "")[0] == 403
    assert sup.calls == []


def test_the_token_opens_the_supervisors_own_controls(served: Any) -> None:
    url, _, sup = served
    assert post(url + "/control/kill", "", TOKEN) == (
        200,
        {"done": "kill -9 w0·4710, holding task 3"},
    )
    assert post(url + "/control/kill", "slot=2", TOKEN) == (200, {"done": "kill -9 slot 2"})
    assert post(url + "/control/kill", "slot=1", TOKEN) == (
        409,
        {"error": "slot 1: nothing to kill"},
    )
    assert post(url + "/control/pause", f"slot=0&token={TOKEN}") == (200, {"done": "w0 paused"})
    status, body = post(url + "/control/pause", "slot=١", TOKEN)  # an Arabic-Indic one
    assert status == 400 and "is not a slot" in body["error"]
    assert post(url + "/control/pause", "", TOKEN)[0] == 400
    assert post(url + "/control/nothing", "", TOKEN)[0] == 404
    assert sup.calls == [("kill_a_holder", None), ("kill", 2), ("kill", 1), ("toggle_pause", 0)]


def test_events_stream_frames(served: Any) -> None:
    _, read_only, _ = served
    with urllib.request.urlopen(read_only + "/events", timeout=10) as stream:
        assert stream.headers["Content-Type"] == "text/event-stream"
        frames = 0
        while frames < 2:  # two frames: it goes on
            line = stream.readline().decode()
            if line.startswith("data: "):
                frame = json.loads(line.removeprefix("data: "))
                assert [r["pid"] for r in frame["rows"]] == [4710, 4711]
                frames += 1


def test_http_control_without_http_is_refused_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", "up", "--dir", str(data), "--http-control"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == (
        "qw: error: --http-control needs --http HOST:PORT (the page its buttons are on)\n"
    )
    assert not data.exists() and list(tmp_path.iterdir()) == []


def test_the_terminal_dashboard_keeps_the_token_line_on_show() -> None:
    line = announce("127.0.0.1:8080", TOKEN)
    assert line == [
        f"qw: control token: {TOKEN}",
        f"qw: kill and pause from http://127.0.0.1:8080/#token={TOKEN}",
    ]
    assert all(len(text) <= 80 for text in line)
    dash = Dashboard(Recording(), note=f"page controls: http://127.0.0.1:8080/#token={TOKEN}")  # type: ignore[arg-type]
    console = Console(file=None, width=100, record=True)
    with console.capture() as captured:
        console.print(dash.frame(height=30, now=NOW))
    assert f"#token={TOKEN}" in captured.get()
    dash.on_key("k", now=NOW)  # a key's message wins for a while, then the note is back
    with console.capture() as captured:
        console.print(dash.frame(height=30, now=NOW))
    assert "kill -9 w0·4710" in captured.get() and TOKEN not in captured.get()
    with console.capture() as captured:
        console.print(dash.frame(height=30, now=time.time() + 60))
    assert f"#token={TOKEN}" in captured.get()
