"""What the command line asks for, read before anything else is imported.

Its own module so that the console script (supervisor.entry) and the command line
(supervisor.cli) both ask it without importing each other.
"""

from __future__ import annotations


def starts_workers(args: list[str]) -> bool:
    """Whether the command line is a `qw up` that will start workers (not its --help)."""
    return args[:1] == ["up"] and "--help" not in args


__all__ = ["starts_workers"]
