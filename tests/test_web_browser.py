"""The browser dashboard in headless Chromium over a real run: `qw up --no-tui --http …
--http-control --workers 3` with real worker processes; the page lists every worker's
pid, a kill clicked on the page (a real mouse press and release, `tests.browser.Page`)
kills a real process holding a task, and the takeover shows on the page.

Skipped only when chromium is missing outside CI; in CI (CI=true) its absence fails.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from supervisor.web.control import TOKEN_HEADER
from tests.browser import Page, chromium, external_references
from tests.helpers import free_port, wait_until

QW = [sys.executable, "-m", "supervisor.cli.app"]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def stats(url: str) -> dict[str, Any] | None:
    status, body = get(f"{url}/stats")
    return json.loads(body) if status == 200 else None


def worker_pids(url: str, count: int) -> list[int] | None:
    """The pids of the `count` live workers /stats names, once they all run."""
    body = stats(url)
    if body is None:
        return None
    pids = [w["pid"] for w in body["workers"] if w["pid"] is not None]
    alive = [p for p in pids if psutil.pid_exists(p)]
    return alive if len(alive) == count else None


def post_kill(url: str, headers: dict[str, str]) -> int:
    request = urllib.request.Request(
        f"{url}/control/kill", data=b"slot=0", method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_the_page_follows_a_real_run_and_a_kill_clicked_on_it(tmp_path: Path) -> None:
    browser = chromium()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    err_path = tmp_path / "up.err"
    args = ["--dir", str(tmp_path / "qw"), "--workers", "3", "--tasks", "60", "--work-ms",
            "1500", "--lease", "1", "--http", f"127.0.0.1:{port}", "--http-control"]  # fmt: skip
    with err_path.open("w") as err:
        up = subprocess.Popen(
            [*QW, "up", "--no-tui", *args], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err
        )
    try:

        def token() -> str | None:
            found = re.search(r"^qw: control token: (\S+)$", err_path.read_text(), re.M)
            return found.group(1) if found else None

        secret = str(wait_until(token, 60, "qw up to print its control token"))
        assert f"qw: kill and pause from {url}/#token={secret}" in err_path.read_text()
        pids = wait_until(lambda: worker_pids(url, 3), 60, "three worker processes")
        assert isinstance(pids, list)

        # no token, a wrong one: 403, and every worker still runs
        assert post_kill(url, {}) == 403
        assert post_kill(url, {TOKEN_HEADER: secret[:-1]}) == 403
        assert worker_pids(url, 3) == pids

        status, page_html = get(f"{url}/")
        assert status == 200 and external_references(page_html) == []
        assert secret not in page_html

        with Page(browser, f"{url}/#token={secret}", tmp_path / "profile") as page:
            wait_until(
                lambda: all(str(pid) in page.text() for pid in pids),
                30,
                f"the page to list every worker's pid {pids}",
            )
            assert "token" not in page.evaluate("location.href")  # not left on the screen
            assert page.evaluate("document.querySelectorAll('tbody button.kill').length") == 3
            wait_until(lambda: "working" in page.text(), 30, "a worker holding a task")

            page.click("#kill-holder")
            said = wait_until(
                lambda: re.search(
                    r"kill -9 (w\d·\d+), holding task (\d+)",
                    str(page.evaluate("document.getElementById('said').textContent")),
                ),
                30,
                "the page to say whom it killed",
            )
            assert isinstance(said, re.Match)
            victim, task = said.group(1), said.group(2)
            killed = int(victim.split("·")[1])
            assert killed in pids
            wait_until(lambda: not psutil.pid_exists(killed), 10, f"pid {killed} to be gone")

            def takeover_shown() -> bool:
                orphans = str(page.evaluate("document.getElementById('orphans').innerText"))
                events = str(page.evaluate("document.getElementById('event-lines').innerText"))
                return (
                    re.search(rf"task {task}\s+{victim}\s+→\s+w\d·\d+\s+took over", orphans)
                    is not None
                    and re.search(rf"takeover\s+task {task}: {victim} → ", events) is not None
                )

            wait_until(takeover_shown, 30, f"the takeover of task {task} on the page")
            row = str(
                page.evaluate(f"document.querySelector('tr[data-pid=\"{killed}\"]').innerText")
            )
            assert "dead KILL" in row
            page.screenshot(tmp_path / "dashboard.png")
            assert (tmp_path / "dashboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

            # pause and resume a worker from its row
            page.click('tr[data-key="slot-2"] button.pause')
            wait_until(
                lambda: "paused" in str(page.evaluate(
                    "document.querySelector('tr[data-key=\"slot-2\"]').innerText")),
                30, "slot 2 to show paused",
            )  # fmt: skip
            page.click('tr[data-key="slot-2"] button.pause')
            wait_until(
                lambda: "paused" not in str(page.evaluate(
                    "document.querySelector('tr[data-key=\"slot-2\"]').innerText")),
                30, "slot 2 to run again",
            )  # fmt: skip

        status, timeline = get(f"{url}/timeline")  # the run so far, as qw timeline draws it
        assert status == 200 and "qw timeline" in timeline
        assert 'id="takeover-' in timeline and 'class="op kill"' in timeline
        assert "<script" not in timeline
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
