"""The small commands' fast path (supervisor.fast_path) against the typer path.

The spec the fast path parses with is generated from the typer app: the file in the
repository must be what the generator writes today. Then the same command lines, run by
the `qw` script (which tries the fast path first) and by supervisor.cli.main (typer's
parsing, always), each on its own copy of one real queue, must print the same stdout and
stderr, exit with the same code and leave the same tasks in the log.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from itertools import count
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_worker.records import decode_task
from queue_worker.topics import TASKS_TOPIC, open_topic
from supervisor import fast_path, make_fast_spec

ENV = {**os.environ, "COLUMNS": "80", "PYTHONDONTWRITEBYTECODE": "1"}
ENV.pop("QW_LOG", None)

#: runs the `qw` script's main (fast path first) and notes whether typer was imported
FAST = (
    "import sys\n"
    "from supervisor.entry import main\n"
    "sys.argv = ['qw', *sys.argv[2:]]\n"
    "try:\n"
    "    code = main()\n"
    "finally:\n"
    "    open(sys.argv_mark if False else MARK, 'w').write(str('typer' in sys.modules))\n"
    "sys.exit(code)\n"
)
#: supervisor.cli.main: typer parses every command line
TYPER = (
    "import sys\n"
    "from supervisor.cli import main\n"
    "sys.argv = ['qw', *sys.argv[2:]]\n"
    "sys.exit(main())\n"
)


def _qw(directory: Path, args: list[str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "supervisor.entry", *args],
        cwd=directory,
        env=ENV,
        check=True,
        capture_output=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A queue in .qw with done tasks (claims and DONE records, a stopped worker's stats)
    and a pending one, and a file of payloads beside it."""
    root = tmp_path_factory.mktemp("template")
    _qw(root, ["enqueue", "--count", "3", "--fsync", "none"])
    _qw(root, ["up", "--workers", "1", "--work-ms", "0", "--exit-when-drained", "--no-tui"])
    _qw(root, ["enqueue", "--payload", '{"x": 1}'])
    (root / "tasks.jsonl").write_text('{"a": 1}\n[2]\n')
    return root


#: `qw status --json`'s throughput over the last seconds, by the reader's clock: it may move
#: between the two runs of one command line, whichever path runs it
_NOW_RATE = re.compile(r'"throughput_now": [0-9.e+-]+')


class Run:
    def __init__(self, result: subprocess.CompletedProcess[str], directory: Path) -> None:
        stdout = _NOW_RATE.sub('"throughput_now": …', result.stdout)
        self.out = (result.returncode, stdout, result.stderr)
        self.tasks = _tasks(directory / ".qw")
        self.files = sorted(p.name for p in (directory / ".qw").iterdir())


def _tasks(data_dir: Path) -> list[Any]:
    if not (data_dir / "tasks.log").exists():
        return []
    with open_topic(data_dir, TASKS_TOPIC, read_only=True) as log:
        return [decode_task(bytes(entry.data)) for entry in log.iter_from(log.start)]


_copies = count()


def _run(template: Path, where: Path, script: str, args: list[str]) -> Run:
    directory = where / f"q{next(_copies)}"
    shutil.copytree(template, directory)
    mark = directory / "typer-loaded"
    code = script.replace("MARK", repr(str(mark)))
    result = subprocess.run(
        [sys.executable, "-c", code, "--", *args],
        cwd=directory,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return Run(result, directory)


def _same(a: Run, b: Run) -> None:
    assert a.out == b.out
    # enqueue stamps each TASK with its time: compare what was enqueued, not when
    assert [t.payload for t in a.tasks] == [t.payload for t in b.tasks]
    assert a.files == [*b.files]


def test_the_spec_is_what_the_generator_writes_from_the_app() -> None:
    assert make_fast_spec.SPEC_PATH.read_text(encoding="utf-8") == make_fast_spec.text()


PLAIN = [
    ["status"],
    ["status", "--json", "--dir", ".qw"],
    ["task", "0"],
    ["task", "1", "--json"],
    ["why", "2", "--dir=.qw"],
    ["why", "3", "--json"],
    ["task", "99"],  # no such task: the body's own error
    ["status", "--dir", "nowhere"],  # no logs there
    ["enqueue", "--count", "2"],
    ["enqueue", "--payload", "[1, 2]", "--count", "3", "--fsync", "none"],
    ["enqueue", "--file", "tasks.jsonl"],
    ["enqueue", "--file", "tasks.jsonl", "--count", "1"],  # refused by the body
    ["enqueue", "--payload", "{nope"],  # not JSON: refused by the body
    ["status", "--log", "nothing"],  # not a redis:// URL: typer's BadParameter, from the body
]


@pytest.mark.parametrize("args", PLAIN, ids=" ".join)
def test_plain_forms_run_without_typer_as_typer_runs_them(
    template: Path, tmp_path: Path, args: list[str]
) -> None:
    fast = _run(template, tmp_path, FAST, args)
    typer = _run(template, tmp_path, TYPER, args)
    _same(fast, typer)
    marks = sorted(tmp_path.glob("q*/typer-loaded"))
    assert len(marks) == 1  # only the fast side writes it
    # typer is imported only when a body fails (it raises typer's Exit or BadParameter)
    assert marks[0].read_text() == str(fast.out[0] != 0)


TOKENS = [
    "0", "1", "3", "99", "2:1", "x", "-1", "", "extra",
    "--dir", ".qw", "--dir=.qw", "-d", "--dir=", "nowhere",
    "--json", "--json=1", "--js", "--help", "-h", "--",
    "--count", "--count=2", "0", "1000001",
    "--payload", '{"a": 1}', "[1", "--file", "tasks.jsonl", "missing.jsonl",
    "--fsync", "none", "bogus", "--log", "redis", "--no-json",
]  # fmt: skip


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    command=st.sampled_from(["status", "task", "why", "enqueue"]),
    rest=st.lists(st.sampled_from(TOKENS), max_size=5),
)
def test_any_command_line_answers_as_typer_answers(
    template: Path, tmp_path: Path, command: str, rest: list[str]
) -> None:
    args = [command, *rest]
    _same(_run(template, tmp_path, FAST, args), _run(template, tmp_path, TYPER, args))


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--help"],
        ["status", "-d", ".qw"],
        ["status", "--di", ".qw"],  # an abbreviation: typer decides
        ["task"],
        ["task", "0", "1"],
        ["task", "x"],
        ["enqueue", "--count", "0"],
        ["enqueue", "--count", "1", "--count", "2"],
        ["enqueue", "--payload", "-1"],
        ["status", "--json=yes"],
        ["status", "--", "x"],
        ["up"],
        [],
    ],
    ids=repr,
)
def test_the_forms_that_are_not_plain_go_to_typer(args: list[str]) -> None:
    assert fast_path.run(args) is None


def test_an_environment_variable_an_option_reads_goes_to_typer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QW_LOG", "redis://127.0.0.1:1/0")
    assert fast_path.run(["status"]) is None


@pytest.mark.parametrize(
    ("args", "collector"),
    [
        (["status", "--dir", "nowhere"], False),  # a small command: over in a few ms
        (["tail", "--help"], True),  # any other may run for long (`qw tail -f`, `qw up`)
    ],
)
def test_the_collector_is_off_only_for_the_small_commands(
    args: list[str], collector: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`qw` turns the cyclic garbage collector off for the small commands only: a command
    that goes to the typer path runs with it on."""
    import gc

    from supervisor import cli, entry, small_commands

    seen: list[bool] = []

    def body(*_: Any, **__: Any) -> int:
        seen.append(gc.isenabled())
        return 0

    monkeypatch.setattr(small_commands, "status", body)
    monkeypatch.setattr(cli, "main", body)
    monkeypatch.setattr(sys, "argv", ["qw", *args])
    monkeypatch.chdir(tmp_path)
    try:
        assert entry.main() == 0
    finally:
        gc.enable()
        gc.unfreeze()  # (a small command freezes what it leaves for the exit: see entry)
    assert seen == [collector]
