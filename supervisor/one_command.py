"""The `qw` group with only the command the command line runs.

typer turns every registered command into a click command (an `inspect.signature` and the
type hints of each of its options) whenever the app runs, though a run invokes one: for
`qw`'s 16 commands that is ~45 ms of CPU on the bench machine, more than `qw task` spends
on its own work. When the first argument names a command (or the `demo` group), the group
built here holds that one alone; the command's parsing, help and errors are typer's, as
the command line's are (they are the same command objects, under the same group class).
Anything else (`qw`, `qw --help`, a misspelt name that typer answers with a suggestion)
gets the whole app.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import typer
from typer.main import get_command_name, get_group


def runner(app: typer.Typer, args: list[str]) -> Callable[..., Any]:
    """What to call, as `app` is called, to run the command line `args`."""
    one = only_command(app, args)
    if one is None:
        return app
    # Always a group (typer makes a lone command the app itself, which would take `up` for
    # an argument); called as `Typer.__call__` calls the group it builds (with qw's
    # pretty_exceptions_enable=False, its exception hook is Python's own).
    return get_group(one)


def only_command(app: typer.Typer, args: list[str]) -> typer.Typer | None:
    """`app` with only the command (or group) `args` names; None when it names none."""
    name = args[0] if args else None
    commands = [c for c in app.registered_commands if _command_name(c) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if name is None or len(commands) + len(groups) != 1:
        return None  # no such command (typer says so, and suggests one): the whole app
    one = copy.copy(app)  # the same settings (name, help, group class), one command
    one.registered_commands = commands
    one.registered_groups = groups
    return one


def _command_name(info: Any) -> str | None:
    if info.name:
        return str(info.name)
    return None if info.callback is None else get_command_name(info.callback.__name__)


__all__ = ["only_command", "runner"]
