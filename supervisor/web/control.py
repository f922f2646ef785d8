"""`qw up --http … --http-control`: kill and pause from the page, for whoever has the token.

The token is made when `qw up` starts and printed on its terminal only: the page does not
contain it (anyone on the machine may read the page) and asks the browser for it; the link
qw up prints carries it in the fragment (``/#token=…``), which a browser never sends to a
server. Every control request is a POST with the token in the ``X-QW-Token`` header (or a
``token`` form field, for curl); without the right one it gets 403 and does nothing.
Without --http-control these paths do not exist (404).

    POST /control/kill         kill -9 a worker that holds a task (the terminal's k)
    POST /control/kill  slot=N kill -9 the worker in slot N (k on a selected row)
    POST /control/pause slot=N pause or resume it (p: SIGSTOP / SIGCONT)

Each goes through the supervisor's own controls (`supervisor.run.model.Controls`), the
ones the terminal's keys call: the kill is recorded in the ops log and the event feed as
a key's is.
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any, Final
from urllib.parse import parse_qs

from supervisor.run.model import Controls

__all__ = ["CONTROL_PATHS", "TOKEN_HEADER", "ControlDesk", "announce", "new_token"]

TOKEN_HEADER: Final = "X-QW-Token"
CONTROL_PATHS: Final = ("/control/kill", "/control/pause")
#: the longest request body read (a slot and a token need a few dozen bytes)
MAX_BODY: Final = 4096
#: the highest slot a request may name
MAX_SLOT: Final = 9999  # four digits

Reply = tuple[int, dict[str, Any]]


def new_token() -> str:
    """A token no one can guess (128 bits), short enough to read off a terminal."""
    return secrets.token_urlsafe(16)


def announce(address: str, token: str) -> list[str]:
    """What `qw up` prints about the controls: the token, and the link that carries it."""
    return [
        f"qw: control token: {token}",
        f"qw: kill and pause from http://{address}/#token={token}",
    ]


class ControlDesk:
    """The control requests: the token checked, then the supervisor's control called."""

    def __init__(self, controls: Controls, token: str) -> None:
        self.controls = controls
        self._token = token.encode()

    def allowed(self, header: str | None, form: dict[str, list[str]]) -> bool:
        given = header if header is not None else (form.get("token") or [""])[0]
        return hmac.compare_digest(given.encode(), self._token)

    def post(self, path: str, header: str | None, body: bytes) -> Reply:
        """The answer to a POST on `path` (one of CONTROL_PATHS) with `body` (a form)."""
        try:
            form = parse_qs(body.decode("utf-8", errors="replace"), max_num_fields=4)
        except ValueError:  # more fields than a control request has
            form = {}
        if not self.allowed(header, form):
            return 403, {"error": f"the control token is missing or wrong: send {TOKEN_HEADER}"}
        slots = form.get("slot")
        slot = None
        if slots:
            slot_text = slots[0]
            if not (slot_text.isascii() and slot_text.isdigit() and len(slot_text) <= 4):
                shown = slot_text[:20]
                return 400, {"error": f"slot {shown!r} is not a slot; expected 0 to {MAX_SLOT}"}
            slot = int(slot_text)
        if path == "/control/kill":
            if slot is None:
                done = self.controls.kill_a_holder()
                return _reply(done, "no worker holds a task right now")
            return _reply(self.controls.kill(slot), f"slot {slot}: nothing to kill")
        if slot is None:
            return 400, {"error": "pause needs slot=N: the worker to pause or resume"}
        return _reply(self.controls.toggle_pause(slot), f"slot {slot}: nothing to pause or resume")


def _reply(done: str | None, otherwise: str) -> Reply:
    return (200, {"done": done}) if done else (409, {"error": otherwise})
