"""`typer` for a command body, imported only when a body needs more than its `echo`.

`import typer` alone costs ~3× a bare `python -c pass` (its vendored click, `inspect`,
`typer._coercion`): the small commands' fast path (supervisor.fast_path) runs their
bodies without it. A body module does `from supervisor import lazy_typer as typer` and
keeps writing `typer.echo(…)`, `raise typer.Exit(2)`, `typer.BadParameter(…)`: `echo`
here writes as click's does, and any other name is typer's own, imported on first use
(an error path, which may pay for it). The exceptions are typer's classes, so the typer
path (and typer's CliRunner) handles them exactly as before.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typer import Abort as Abort
    from typer import BadParameter as BadParameter
    from typer import Exit as Exit
    from typer import TyperException as TyperException


def echo(message: str = "", err: bool = False) -> None:
    """`typer.echo(message, err=err)` for a str, without importing typer when the answer is
    plain: a message with no ANSI escape (click strips those when the stream is not a
    terminal) to a stream whose encoding is not ASCII (click rewraps such a stream), or
    while typer runs the command (its CliRunner swaps the streams, and click's context may
    set the colour): then click's echo itself."""
    stream = sys.stderr if err else sys.stdout
    if stream is None:  # click writes nothing where there is no stream
        return
    encoding = getattr(stream, "encoding", None) or "ascii"
    if "\x1b" in message or "typer" in sys.modules or _is_ascii(encoding):
        import typer

        typer.echo(message, err=err)
        return
    stream.write(message + "\n")
    stream.flush()


def said(error: TyperException) -> int:
    """Say typer's usage error (or any TyperException) as one line on stderr, `qw: error: …`,
    and return its exit code: how `qw` ends on one, whichever path ran the command."""
    message = " ".join(error.format_message().split())
    if message:  # empty: typer has printed the help (`qw` alone)
        echo(f"qw: error: {message}", err=True)
    return int(error.exit_code)


def _is_ascii(encoding: str) -> bool:
    import codecs

    try:
        return codecs.lookup(encoding).name == "ascii"
    except LookupError:
        return False


if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):  # the import system asks for __path__ and the like
            raise AttributeError(name)
        import typer

        return getattr(typer, name)
