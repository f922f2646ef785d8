"""Every code block of the README and of docs/*.md runs as written, on a fresh directory.

Each document runs in its own directory under tmp_path (the working directory, so `./.qw`
lands there), its blocks in order, sharing that directory as a reader following along would:

- a shell block (indented, or fenced as ``` / sh / bash / console / shell) runs each command
  with bash and the `qw` of this venv first on PATH; in a block with `$ ` prompts only the
  prompted lines are commands (the rest is output). Every command must exit 0.
- a command that does not end by itself runs in the background, as in a second terminal:
  `qw up` without --exit-when-drained (the next command runs once it is up: its status file
  exists), and `qw tail --follow` (once it has printed a line). At the end of the block each
  gets Ctrl-C (SIGINT), as a user would press it, and must exit 0: `qw up` drains.
- a python block runs as a script; one whose first line is `# NAME.py` is that file, so that
  a later block can use it (`--handler NAME:function`).

An HTML comment right before a block changes how it runs; keep them rare:

    <!-- readme-test: make -n -->                each `make T` line runs as `make -n T` at
                                                 the repository's root (it must exit 0)
    <!-- readme-test: redis at HOST:PORT, … -->  each HOST:PORT in the block is replaced by a
                                                 redis-server the test starts
    <!-- readme-test: skip: REASON -->           not run (output shown for its wording, …)

A block in any other language, or a directive this file does not know, fails the test.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.helpers import wait_until

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent  # this venv: its python, its qw
SHELL_LANGS = {"", "sh", "bash", "console", "shell"}
PYTHON_LANGS = {"python", "py"}
DIRECTIVE = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->$")
COMMAND_TIMEOUT_S = 120


@dataclass
class Block:
    doc: Path
    line: int  # 1-based line of the block's first line of content
    lang: str  # "" for an indented block
    lines: list[str]
    directive: str | None = None

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"

    def commands(self) -> list[str]:
        if any(line.startswith("$ ") for line in self.lines):
            return [line[2:] for line in self.lines if line.startswith("$ ")]
        return [line for line in self.lines if line.strip() and not line.startswith("#")]


def blocks_of(doc: Path) -> list[Block]:
    """The fenced and indented code blocks of a Markdown file, each with the directive in
    the HTML comment just before it (blank lines between them allowed)."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    directive: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            lang, start, body = line[3:].strip(), i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            found.append(Block(doc, start + 1, lang, body, directive))
            directive = None
        elif line.startswith("    ") and line.strip() and (i == 0 or not lines[i - 1].strip()):
            start, body = i, []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            while body and not body[-1].strip():
                body.pop()
            found.append(Block(doc, start + 1, "", body, directive))
            directive = None
            continue
        elif match := DIRECTIVE.match(line.strip()):
            directive = match.group(1)
        elif line.strip():
            directive = None  # a directive belongs to the block right after it
        i += 1
    return found


# -- running a document ----------------------------------------------------------------------


@dataclass
class Background:
    command: str
    proc: subprocess.Popen[bytes]
    out: Path


@dataclass
class Reader:
    """Runs one document's blocks in order in `cwd`."""

    cwd: Path
    logs: Path
    redis: str | None = None  # host:port of the test's redis-server, when a block asks
    env: dict[str, str] = field(default_factory=dict)
    ran: int = 0

    def run(self, block: Block) -> None:
        directive = block.directive or ""
        if directive.startswith("skip:"):
            return
        if block.lang in PYTHON_LANGS:
            assert not directive, f"{block.where}: unknown directive {directive!r}"
            self._python(block)
        elif block.lang in SHELL_LANGS:
            commands = block.commands()
            if directive == "make -n":
                for command in commands:
                    self._make_n(block, command)
                return
            if directive.startswith("redis at "):
                assert self.redis is not None
                for address in directive.removeprefix("redis at ").split(","):
                    commands = [c.replace(address.strip(), self.redis) for c in commands]
            elif directive:
                pytest.fail(f"{block.where}: unknown directive {directive!r}")
            self._shell(block, commands)
        else:
            pytest.fail(
                f"{block.where}: a ```{block.lang} block: run it (sh, python) or say why not "
                "with <!-- readme-test: skip: REASON -->"
            )

    def _python(self, block: Block) -> None:
        named = re.fullmatch(r"#\s*([\w.]+\.py)\s*", block.lines[0]) if block.lines else None
        script = self.cwd / (named.group(1) if named else f"block_{block.line}.py")
        script.write_text("\n".join(block.lines) + "\n")
        result = subprocess.run(
            [str(BIN / "python"), script.name],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        self.ran += 1
        assert result.returncode == 0, f"{block.where}: python block failed:\n{result.stderr}"

    def _make_n(self, block: Block, command: str) -> None:
        argv = shlex.split(command, comments=True)
        assert argv[0] == "make", f"{block.where}: {command!r} is not a make command"
        result = subprocess.run(
            ["make", "-n", *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        self.ran += 1
        assert result.returncode == 0, f"{block.where}: make -n {argv[1:]}: {result.stderr}"

    def _shell(self, block: Block, commands: list[str]) -> None:
        background: list[Background] = []
        try:
            for command in commands:
                argv = shlex.split(command, comments=True)
                if runs_on(argv):
                    background.append(self._start(block, command, argv))
                    continue
                result = subprocess.run(
                    ["bash", "-c", command],
                    cwd=self.cwd,
                    env=self.env,
                    capture_output=True,
                    text=True,
                    timeout=COMMAND_TIMEOUT_S,
                )
                self.ran += 1
                assert result.returncode == 0, (
                    f"{block.where}: `{command}` exited {result.returncode}\n"
                    f"stdout: {result.stdout}\nstderr: {result.stderr}"
                )
        finally:
            for job in reversed(background):  # Ctrl-C, as a user ends them
                if job.proc.poll() is None:
                    job.proc.send_signal(signal.SIGINT)
            for job in background:
                try:
                    job.proc.wait(COMMAND_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    job.proc.kill()
                    job.proc.wait()
        for job in background:
            assert job.proc.returncode == 0, (
                f"{block.where}: `{job.command}` ended with {job.proc.returncode} after Ctrl-C:\n"
                + job.out.read_text(errors="replace")
            )

    def _start(self, block: Block, command: str, argv: list[str]) -> Background:
        out = self.logs / f"{block.doc.stem}-{block.line}-{len(list(self.logs.iterdir()))}.out"
        with out.open("wb") as sink:
            proc = subprocess.Popen(
                [str(BIN / "qw"), *argv[1:]],
                cwd=self.cwd,
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.ran += 1
        job = Background(command, proc, out)

        def ready() -> bool:
            assert proc.poll() is None, f"{block.where}: `{command}` exited:\n{out.read_text()}"
            if argv[1] == "up":  # (a partitioned queue's: in each partition's run dir)
                status = Path("run") / "supervisors" / f"{proc.pid}.json"
                where = data_dir(argv, self.cwd)
                return (where / status).exists() or (where / "p0" / status).exists()
            return out.stat().st_size > 0

        wait_until(ready, 60, f"`{command}` ({block.where}) to be running")
        return job


def runs_on(argv: list[str]) -> bool:
    """A command that does not end by itself."""
    if argv[:2] == ["qw", "up"]:
        return "--exit-when-drained" not in argv
    return argv[:2] == ["qw", "tail"] and ("--follow" in argv or "-f" in argv)


def data_dir(argv: list[str], cwd: Path) -> Path:
    for flag in ("--dir", "-d"):
        if flag in argv:
            return cwd / argv[argv.index(flag) + 1]
    return cwd / ".qw"


def reader_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QW_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["TERM"] = "dumb"
    return env


# -- the tests -------------------------------------------------------------------------------


def test_the_documents_have_blocks_to_run() -> None:
    readme = blocks_of(REPO / "README.md")
    assert any(b.lang in PYTHON_LANGS for b in readme)
    assert any(b.lang in SHELL_LANGS and not b.directive for b in readme)
    for doc in DOCS:
        for block in blocks_of(doc):
            assert block.lines, f"{block.where}: an empty block"


def needs_redis(doc: Path) -> bool:
    return any((b.directive or "").startswith("redis at ") for b in blocks_of(doc))


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(
            d,
            id=str(d.relative_to(REPO)),
            # make test runs the README's blocks; make test-all the other documents' too
            marks=[pytest.mark.redis] * needs_redis(d) + [pytest.mark.slow] * (d != DOCS[0]),
        )
        for d in DOCS
    ],
)
def test_every_block_runs_as_written(
    doc: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    blocks = blocks_of(doc)
    cwd, logs = tmp_path / doc.stem, tmp_path / "out"
    cwd.mkdir()
    logs.mkdir()
    reader = Reader(cwd, logs, env=reader_env())
    if needs_redis(doc):
        url: str = request.getfixturevalue("redis_url")  # a clean database 0
        reader.redis = url.removeprefix("redis://").removesuffix("/0")
    for block in blocks:
        reader.run(block)
    runnable = [b for b in blocks if not (b.directive or "").startswith("skip:")]
    assert reader.ran >= len(runnable)  # each runnable block ran at least one thing


def test_make_up_runs_what_the_readme_says() -> None:
    """The README's first lines: `make up      # qw up --workers 8 --demo on ./.qw: …`."""
    first = next(b for b in blocks_of(REPO / "README.md") if b.directive == "make -n")
    up = next(line for line in first.lines if line.startswith("make up "))
    said = up.split("#", 1)[1].split(" on ", 1)[0].strip()  # "qw up --workers 8 --demo"
    result = subprocess.run(["make", "-n", "up"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert f"/{said}" in result.stdout or f" {said}" in result.stdout, result.stdout


README_MAX_LINES = 400
#: a round of work named by its number ("session 9", "sessions 8-10", "session's 3"): project
#: text names a figure's commit and command instead
ROUND_OF_WORK = re.compile(r"session[s']* ?[0-9]", re.IGNORECASE)


def test_the_readme_stays_a_guide() -> None:
    """The front page says what qw is and how to use it; the rest lives in docs/."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move details to docs/"
    )


@pytest.mark.parametrize(
    "doc",
    [*DOCS, *sorted((REPO / "bench").glob("results*.md"))],
    ids=lambda d: str(d.relative_to(REPO)),
)
def test_no_text_names_a_round_of_work(doc: Path) -> None:
    named = [
        f"{doc.relative_to(REPO)}:{number}: {line.strip()}"
        for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if ROUND_OF_WORK.search(line)
    ]
    assert not named, "name the commit (and the date) instead:\n" + "\n".join(named)
