"""Where a queue's logs live, and how a message shows that place.

A location is a data directory (the file log: ``<dir>/<topic>.log``) or a Redis URL (the
stream ``qw:<topic>``). These are the one answer to "is it Redis?", "which file holds this
topic?" and "how is it shown?": a URL is shown without its password, always.
No redis import here (redis is an optional extra): showing a URL needs only its text.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def is_redis_url(location: str | Path) -> bool:
    """Is `location` a Redis URL (else a data directory)?"""
    return str(location).startswith(REDIS_SCHEMES)


def log_file(location: str | Path, topic: str) -> Path | None:
    """The file that holds `topic`'s log at a data directory; None for a Redis location."""
    if is_redis_url(location):
        return None
    return Path(location) / f"{topic}.log"


def redact_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (ValueError for a malformed port)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = quote(parts.username or "", safe="")
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def shown(location: str | Path) -> str:
    """A location as a message shows it: a directory as given, a Redis URL without its
    password (one that cannot be parsed: only its scheme, as nothing of it can be trusted
    to hide the password)."""
    text = str(location)
    if not is_redis_url(text):
        return text
    try:
        return redact_url(text)
    except ValueError:
        return "redis://…"


__all__ = ["REDIS_SCHEMES", "is_redis_url", "log_file", "redact_url", "shown"]
