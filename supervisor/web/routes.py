"""What `supervisor.http_api` answers for the browser:

    /            the live dashboard (supervisor.web.page)
    /events      its frames, as server-sent events: one frame each FRAME_SECONDS
    /frame       one frame, as JSON (what /events sends)
    /timeline    the run so far, drawn as `qw timeline` draws it (supervisor.timeline)
    POST /control/kill, /control/pause    with --http-control only (supervisor.web.control)

`WebRoutes.get` returns the answer to a GET, or None for a path that is not the browser's;
`stream` writes /events until the server closes or the browser goes away.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

from logstore import LogError
from queue_worker.partition_layout import read_manifest
from queue_worker.proof.report import ReportInputError
from supervisor.options import shown
from supervisor.run.model import SupervisorSnapshot
from supervisor.web.control import CONTROL_PATHS, ControlDesk
from supervisor.web.frame import dashboard_frame
from supervisor.web.page import content_security_policy, dashboard_page, new_nonce

__all__ = ["FRAME_SECONDS", "Answer", "WebRoutes", "timeline_html"]

#: how often /events sends a frame (the terminal draws four a second)
FRAME_SECONDS: Final = 0.5
HTML: Final = "text/html; charset=utf-8"

#: (status, content type, body, extra headers)
Answer = tuple[int, str, str, dict[str, str]]


class Snapshots(Protocol):
    def snapshot(self) -> SupervisorSnapshot: ...


class WebRoutes:
    """The browser's paths over `source`; `logs` is where /timeline reads the run."""

    def __init__(self, source: Snapshots, logs: str | None, desk: ControlDesk | None) -> None:
        self.source = source
        self.logs = logs
        self.desk = desk
        self.stopping = threading.Event()

    def get(self, path: str) -> Answer | None:
        if path == "/":
            nonce = new_nonce()
            page = dashboard_page(control=self.desk is not None, nonce=nonce)
            return 200, HTML, page, {"Content-Security-Policy": content_security_policy(nonce)}
        if path == "/frame":
            return 200, "application/json", json.dumps(self.frame()) + "\n", {}
        if path == "/timeline":
            location = self.logs or self.source.snapshot().location
            status, page = timeline_html(location)
            # the timeline page has no script at all, and only its inline style
            policy = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
            return status, HTML, page, {"Content-Security-Policy": policy}
        return None

    def frame(self) -> dict[str, object]:
        return dashboard_frame(
            self.source.snapshot(), now=time.time(), control=self.desk is not None
        )

    def post(self, path: str, token: str | None, body: bytes) -> tuple[int, dict[str, object]]:
        """A control request: 404 unless --http-control made the desk and `path` is one."""
        if self.desk is None or path not in CONTROL_PATHS:
            return 404, {"error": f"no such path {path} to POST to"}
        return self.desk.post(path, token, body)

    def stream(self, write: Callable[[bytes], object], flush: Callable[[], object]) -> None:
        """/events: a frame now, then one each FRAME_SECONDS. Returns when the server is
        closing; a browser that went away ends it with a ConnectionError."""
        write(b"retry: 2000\n\n")  # how soon a browser reconnects, in ms
        while not self.stopping.is_set():
            data = json.dumps(self.frame(), separators=(",", ":"))
            write(f"data: {data}\n\n".encode())
            flush()
            self.stopping.wait(FRAME_SECONDS)


def timeline_html(location: str) -> tuple[int, str]:
    """The timeline page of the run at `location` so far (`qw timeline`'s own drawing),
    or 503 and a line saying why there is none yet."""
    from supervisor.timeline.load import load_model
    from supervisor.timeline.page import render_page
    from supervisor.timeline.view import select

    try:
        manifest = read_manifest(location)
        if manifest is None:
            return 200, render_page(select(load_model(location)), shown(location))
        from supervisor.timeline import partitioned

        parts = partitioned.load_partition_views(location, manifest, None, None, None)
        return 200, partitioned.render_page(parts, shown(location))
    except (ReportInputError, LogError, ValueError) as e:
        from supervisor.web.html_text import escape

        return (
            503,
            f"<!doctype html><title>qw timeline</title><p>no timeline yet: {escape(str(e))}</p>\n",
        )
