"""`supervisor.plain_params` answers as typer does, without pydantic.

For every option of every `qw` command (found by walking the app, so a new one is covered)
and a table of awkward values, the value or the error message of `PlainParam` is the one
typer's own coercion (its pydantic adapter) gives. And the small commands run without
importing pydantic at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer import _coercion
from typer._click.core import Command
from typer.core import TyperGroup, _TyperParameter

from supervisor import plain_params
from supervisor.cli import QwContext, app

GROUP = typer.main.get_command(app)

#: values as a command line or a default hands them over; each option meets all of them
VALUES: list[object] = [
    "1",
    "0",
    "-3",
    "007",
    " 2 ",
    "1.5",
    "1e3",
    "nan",
    "inf",
    "",
    "x",
    "none",
    "commit",
    "spread",
    "a/b",
    "./x/",
    "~",
    "-",
    "/",
    "host.example",
    "bad host!",
    "δ",
    "bad\udcffbytes",  # an undecodable argv byte, as Python hands it over
    "9" * 60,
    4,
    2.5,
    Path(".qw"),
]


def params(command: Command, path: str = "qw") -> Iterator[tuple[str, Command, _TyperParameter]]:
    for param in command.params:
        assert isinstance(param, _TyperParameter)
        yield f"{path} {param.name}", command, param
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            yield from params(sub, f"{path} {name}")


PARAMS = list(params(GROUP))


def outcome(runtime: _coercion.RuntimeParam, value: object, param: _TyperParameter) -> object:
    """What coercing `value` gives: ("value", type, value), ("error", message) or, for a
    value no command line gives (a Path to a number's parser), the exception raised."""
    ctx = QwContext(GROUP)
    try:
        result = runtime.coerce(value, param=param, ctx=ctx)
    except typer.BadParameter as e:
        return ("error", e.format_message())
    except Exception as e:  # compared: its type and text
        return ("raised", type(e), str(e))
    return ("value", type(result), result)


@pytest.mark.parametrize(("name", "command", "param"), PARAMS, ids=[p[0] for p in PARAMS])
def test_plain_coercion_is_typers(name: str, command: Command, param: _TyperParameter) -> None:
    ours = param.get_runtime_param()
    typers = _coercion.build_runtime_param(param.type_descriptor)
    for value in [*VALUES, param.default]:
        assert outcome(ours, value, param) == outcome(typers, value, param), (name, value)


def test_every_option_of_the_small_commands_and_of_up_is_plain() -> None:
    """A `PlainParam` on each: these commands never build a pydantic adapter."""
    for name, _, param in PARAMS:
        if name.split()[1] in {"up", "enqueue", "status", "task", "why"}:
            assert isinstance(param.get_runtime_param(), plain_params.PlainParam), name


def test_the_help_option_is_plain_too() -> None:
    assert isinstance(GROUP, TyperGroup)
    ctx = QwContext(GROUP.commands["status"], parent=QwContext(GROUP))
    help_option = ctx.command.get_help_option(ctx)
    assert isinstance(help_option, _TyperParameter)
    assert isinstance(help_option.get_runtime_param(), plain_params.PlainParam)


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["status"],
        ["task", "0"],
        ["why", "0"],
        ["enqueue", "--count", "2", "--fsync", "none"],
        ["up", "--help"],
    ],
)
def test_small_commands_do_not_import_pydantic(tmp_path: Path, args: list[str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "enqueue", "--fsync", "none"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    probe = (
        "import sys\n"
        "from supervisor.cli import main\n"
        f"code = main({args!r})\n"
        "print('pydantic' in sys.modules, code, file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert result.stderr.splitlines()[-1] == "False 0", result.stderr


def test_a_bad_value_still_gets_typers_message(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "enqueue", "--count", "x"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "qw: error: Invalid value for '--count': got 'x'; expected a number of tasks "
        "from 1 to 1000000\n"
    )
