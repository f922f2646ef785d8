"""`qw NAME …` builds the group with command NAME alone (supervisor.one_command): what it
prints, the errors it raises and the exit codes are those of the whole app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.main import get_group

from supervisor.cli import app
from supervisor.one_command import only_command, runner

LINES = [
    ["up", "--help"],
    ["up", "--workers", "0"],
    ["up", "--no-such-option"],
    ["up", "--pick", "sideways"],
    ["enqueue", "--count", "x"],
    ["status", "--help"],
    ["task", "x"],
    ["task"],
    ["why", "--help"],
    ["kill"],
    ["demo", "--help"],
    ["demo", "no-such-demo"],
]


def outcome(call: Any, args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[Any, ...]:
    try:
        result = call(args=args, prog_name="qw", standalone_mode=False)
    except typer.TyperException as e:
        result = (type(e).__name__, e.format_message(), e.exit_code)
    out = capsys.readouterr()
    return result, out.out, out.err


@pytest.mark.parametrize("args", LINES, ids=" ".join)
def test_one_command_answers_as_the_whole_app(
    args: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)  # nothing here is written: every line stops at its options
    monkeypatch.setenv("COLUMNS", "80")
    whole = outcome(app, args, capsys)
    one = outcome(runner(app, args), args, capsys)
    assert one == whole
    assert whole[1] or whole[0] != 0  # each line prints help or fails: a case worth comparing


@pytest.mark.parametrize(
    ("args", "built"),
    [
        (["task", "0"], ["task"]),
        (["up", "--workers", "2"], ["up"]),
        (["demo", "skew"], ["demo"]),
        (["--help"], None),  # the whole list of commands
        ([], None),
        (["statu"], None),  # typer's "No such command" (and its suggestion) need them all
    ],
)
def test_only_the_named_command_is_built(args: list[str], built: list[str] | None) -> None:
    one = only_command(app, args)
    assert (None if one is None else sorted(get_group(one).commands)) == built
    assert len(app.registered_commands) > 1  # the app itself is left whole
