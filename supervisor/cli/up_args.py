"""What the command line asks for, read before anything else is imported.

Its own module so that the console script (supervisor.cli.entry) and the command line
(supervisor.cli.app) both ask it without importing each other.
"""

from __future__ import annotations

#: what a Redis location starts with (logstore.location.REDIS_SCHEMES, not imported: this
#: module is read before anything else is)
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def starts_workers(args: list[str]) -> bool:
    """Whether the command line is a `qw up` that will start workers (not its --help)."""
    return args[:1] == ["up"] and "--help" not in args


def on_redis(args: list[str], qw_log: str | None) -> bool:
    """Whether the queue of this command line is on Redis: its ``--log``, else `qw_log`
    ($QW_LOG)."""
    location = qw_log or ""
    for i, arg in enumerate(args):
        if arg == "--log" and i + 1 < len(args):
            location = args[i + 1]
        elif arg.startswith("--log="):
            location = arg.removeprefix("--log=")
    return location.startswith(_REDIS_SCHEMES)


__all__ = ["on_redis", "starts_workers"]
