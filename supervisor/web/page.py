"""The dashboard's page: one HTML file, its CSS and its script inline, nothing fetched
from anywhere but the server that sent it (the frames, from /events).

The three parts are files beside this module (dashboard.html, dashboard.css,
dashboard.js); `dashboard_page` puts them together. The script and the style carry a
nonce that the page's Content-Security-Policy names: no other script runs on the page,
not even an event handler attribute that text from a log might smuggle in, and it fetches
from its own origin only.
"""

from __future__ import annotations

import secrets
from functools import cache
from importlib import resources

__all__ = ["content_security_policy", "dashboard_page", "new_nonce"]


@cache
def _part(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def new_nonce() -> str:
    return secrets.token_urlsafe(16)


def dashboard_page(*, control: bool, nonce: str) -> str:
    """The page; with `control`, the kill and pause buttons (and the token's box)."""
    return (
        _part("dashboard.html")
        .replace("@CSS@", _part("dashboard.css"))
        .replace("@SCRIPT@", _part("dashboard.js"))
        .replace("@CONTROLS@", _part("controls.html") if control else "")
        .replace("@CONTROL@", "1" if control else "0")
        .replace("@NONCE@", nonce)
    )


def content_security_policy(nonce: str) -> str:
    """The page's policy: its own script and style, fetches to its own origin, no frames
    around it (a page that kills workers must not be clicked through another)."""
    return (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    )
