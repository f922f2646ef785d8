"""Every `qw … --help` reads whole at 80 columns: the real command, COLUMNS=80, TERM=dumb.

For each command and subcommand (found by walking the app, so a new one is covered): no line
is wider than 80 columns, every option name appears whole (never "--exit-when-drain…" or
"--no-" / "tui"), every choice list stays on one line, every "[default: …]" or "[env var: …]"
note opens and closes on one line, and no summary is cut with "...".
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer._click.core import Command
from typer.core import TyperGroup

from supervisor.cli.app import app
from supervisor.cli.help_format import first_sentence

QW = Path(sys.executable).parent / "qw"
WIDTH = 80


def commands(
    command: Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Command]]:
    yield path, command
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            yield from commands(sub, (*path, name))


COMMANDS = dict(commands(typer.main.get_command(app)))


def help_at_80(path: tuple[str, ...]) -> str:
    env = {**os.environ, "COLUMNS": str(WIDTH), "TERM": "dumb"}
    result = subprocess.run(
        [str(QW), *path, "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def whole(token: str, text: str) -> bool:
    """`token` appears in `text` with no name character (letter, digit, '-') glued to it."""
    return re.search(rf"(?<![\w-]){re.escape(token)}(?![\w-])", text) is not None


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(path) for path in COMMANDS}
    assert {"up", "enqueue", "status", "tail", "task", "why", "kill", "report"} <= names
    assert {"demo", "demo collisions", "demo redistribution", "demo pause", "demo skew"} <= names


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda p: " ".join(p) or "qw")
def test_help_reads_whole_at_80_columns(path: tuple[str, ...]) -> None:
    text = help_at_80(path)
    lines = text.splitlines()
    command = COMMANDS[path]

    too_wide = [line for line in lines if len(line) > WIDTH]
    assert not too_wide, f"wider than {WIDTH} columns: {too_wide}"

    for param in command.params:
        for name in [*param.opts, *param.secondary_opts]:
            if name.startswith("-"):
                assert any(whole(name, line) for line in lines), f"{name} is not whole"
        if param.metavar and "|" in param.metavar:  # a choice list: on one line
            assert any(whole(param.metavar, line) for line in lines), param.metavar

    for line in lines:
        assert line.count("[") == line.count("]"), f"a bracketed note split: {line!r}"
        assert not line.rstrip().endswith(("…", "-")), f"a cut word: {line!r}"
        if not line.startswith("Usage:"):  # "COMMAND [ARGS]..." is click's usage syntax
            assert "..." not in line, f"cut with '...': {line!r}"

    flat = " ".join(text.split())
    if isinstance(command, TyperGroup):  # each command's summary, whole
        for sub in command.commands.values():
            assert sub.help is not None
            assert first_sentence(sub.help) in flat


def test_defaults_show_whole_in_up() -> None:
    text = help_at_80(("up",))
    for note in [
        "[default: spread]",
        "[default: commit]",
        "[default: queue_worker.worker.handlers:demo]",
    ]:
        assert any(note in line for line in text.splitlines()), note
    assert any(whole("first|random|spread", line) for line in text.splitlines())
