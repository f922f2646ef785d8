"""Headless Chromium for the tests: find it, load a page once (`browse`: --dump-dom,
--screenshot), or keep one open and drive it (`Page`: the DevTools protocol over a pipe).

`chromium()` skips a test when the browser is missing, except in CI (CI=true), where its
absence fails the test.

`Page` starts chromium with ``--remote-debugging-pipe``: the browser reads DevTools
commands on its fd 3 and writes answers and events on its fd 4, each a JSON message ended
by a NUL byte. No port and no websocket: nobody else on the machine can drive it. The page
can be read (`evaluate`), clicked like a user clicks (`click`: a mouse press and release at
the element's centre) and photographed (`screenshot`).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import queue
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_until

#: how long one DevTools command may take to answer
COMMAND_TIMEOUT_S = 30.0


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed, and CI=true: the browser test must run")
        pytest.skip("chromium is not installed")
    return found


def _flags(browser: str, profile: Path) -> list[str]:
    return [
        browser,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={profile}",
    ]


def browse(
    browser: str, page: Path | str, *args: str, profile: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Load `page` (a file, or a URL) once with `args` (--dump-dom, --screenshot=FILE …);
    the profile is `profile`, by default beside the file."""
    if isinstance(page, Path):
        where, profile = page.as_uri(), profile or page.parent / "chromium-profile"
    else:
        where = page
    if profile is None:
        raise ValueError("a URL needs a profile directory (profile=)")
    return subprocess.run(
        [*_flags(browser, profile), *args, where], capture_output=True, text=True, timeout=120
    )


def external_references(html: str) -> list[str]:
    """Anything in the page that would fetch from elsewhere (the SVG namespace is a name,
    not a fetch)."""
    found = re.findall(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//[^"'\s>]*""", html)
    found += re.findall(r"@import[^;]*", html)
    found += re.findall(r"url\(\s*['\"]?(?!#)[^)]*\)", html)
    return found


def _high(fd: int) -> int:
    """`fd` moved to a number above 9, so that placing the pipes on 3 and 4 in the child
    cannot overwrite one with the other."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class Page:
    """One headless Chromium showing `url`, driven over the DevTools pipe."""

    def __init__(self, browser: str, url: str, profile: Path, *, width: int = 1400,
                 height: int = 900) -> None:  # fmt: skip
        commands_r, self._commands = (_high(fd) for fd in os.pipe())
        self._answers, answers_w = (_high(fd) for fd in os.pipe())

        def on_fds_3_and_4() -> None:  # in the child, before exec
            os.dup2(commands_r, 3)
            os.dup2(answers_w, 4)

        self.stderr_path = profile.parent / f"{profile.name}.stderr"
        with self.stderr_path.open("w") as err:
            self.process = subprocess.Popen(
                [*_flags(browser, profile), "--remote-debugging-pipe",
                 f"--window-size={width},{height}", url],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                pass_fds=(3, 4), preexec_fn=on_fds_3_and_4,
            )  # fmt: skip
        os.close(commands_r)
        os.close(answers_w)
        self._next_id = 0
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        target = wait_until(self._page_target, 60, "chromium to open the page")
        self._session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]

    def _page_target(self) -> str | None:
        targets = self.send("Target.getTargets")["targetInfos"]
        pages = [t["targetId"] for t in targets if t["type"] == "page"]
        return pages[0] if pages else None

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._answers, 65536)
            except OSError:
                return
            if not chunk:
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                with self._lock:
                    waiting = self._replies.get(message.get("id", -1))
                if waiting is not None:
                    waiting.put(message)

    def send(self, method: str, params: dict[str, Any] | None = None, *,
             session: str | None = None) -> dict[str, Any]:  # fmt: skip
        """Send one command and return its result; fail the test on an error answer."""
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            reply: queue.Queue[dict[str, Any]] = queue.Queue()
            self._replies[ident] = reply
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        try:
            answer = reply.get(timeout=COMMAND_TIMEOUT_S)
        except queue.Empty:
            pytest.fail(f"chromium did not answer {method} within {COMMAND_TIMEOUT_S}s")
        finally:
            with self._lock:
                del self._replies[ident]
        if "error" in answer:
            pytest.fail(f"chromium refused {method}: {answer['error']}")
        result: dict[str, Any] = answer["result"]
        return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-like values)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=self._session,
        )
        if "exceptionDetails" in result:
            pytest.fail(f"{expression!r} raised in the page: {result['exceptionDetails']}")
        return result["result"].get("value")

    def text(self) -> str:
        """What the page shows, as a reader sees it (innerText)."""
        return str(self.evaluate("document.body ? document.body.innerText : ''"))

    def click(self, selector: str) -> None:
        """Press and release the left button at the centre of the element `selector`
        names, as a user's click does (the page's own handlers see a real click)."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        assert box is not None, f"no element {selector} on the page"
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
                session=self._session,
            )

    def screenshot(self, out: Path) -> None:
        shot = self.send("Page.captureScreenshot", {"format": "png"}, session=self._session)
        out.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._commands)  # the browser exits when its command pipe closes
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._answers)

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
