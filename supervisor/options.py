"""What the `qw` commands share: option parsers that name a bad value and what was expected,
the one-line errors, and the --dir / --log options.

A parser raises `typer.BadParameter`, which typer words as "Invalid value for '--x': …" and
`supervisor.cli.app.main` prints as one line on stderr with exit code 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Final, NoReturn

import typer

from logstore import LogError, is_redis_url
from logstore.location import shown as shown  # re-exported: the commands import it from here
from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC
from queue_worker.worker.settings import FSYNC_POLICIES, PICK_STRATEGIES, check_host

#: the largest log position a command takes (`--at POSITION`: qw report, qw replay)
MAX_POSITION: Final = 2**63 - 1

EXIT_USAGE: Final = 2  # a bad option value, a bad input file, no data where one was named
MAX_WORKERS: Final = 256
DEFAULT_DIR: Final = Path(".qw")

PICKS: Final = PICK_STRATEGIES  # the choices are queue_worker.worker.settings's
FSYNCS: Final = FSYNC_POLICIES
TOPICS: Final = (CLAIMS_TOPIC, TASKS_TOPIC)


# -- option parsers: each names the bad value and what was expected ----------------------------


def _given(text: str) -> str:
    """The value as a message quotes it: cut short (a count may be typed with 5000 digits)."""
    return repr(text) if len(text) <= 40 else repr(text[:39] + "…")


def whole(what: str, low: int, high: int | None = None) -> Callable[[str], int]:
    expected = f"{what} from {low} to {high}" if high is not None else f"{what} >= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except (TypeError, ValueError):
            raise typer.BadParameter(f"got {_given(text)}; expected {expected}") from None
        if value < low or (high is not None and value > high):
            raise typer.BadParameter(f"got {_given(text)}; expected {expected}")
        return value

    return parse


def real(what: str, low: float, high: float, *, low_open: bool = False) -> Callable[[str], float]:
    expected = f"{what} {'>' if low_open else '>='} {low:g} and <= {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise typer.BadParameter(f"got {_given(text)}; expected {expected}") from None
        too_low = value <= low if low_open else value < low
        if not math.isfinite(value) or too_low or value > high:
            raise typer.BadParameter(f"got {_given(text)}; expected {expected}")
        return value

    return parse


def one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise typer.BadParameter(f"got {_given(text)}; expected one of {', '.join(choices)}")
        return text

    return parse


def host_name_option(text: str) -> str:
    try:
        check_host(text)
    except ValueError:
        raise typer.BadParameter(
            f"got {text!r}; expected a host name of 1-64 letters, digits, '_', '.' or '-'"
        ) from None
    return text


def data_directory(text: str | Path) -> Path:
    """`--dir`: any path but the empty one, which names the working directory (where no
    queue was asked for: `Path("")` is ``.``)."""
    if not str(text):
        raise typer.BadParameter(
            "got ''; expected a data directory (an empty path would be the current one)"
        )
    return Path(text)


DirOption = Annotated[
    Path,
    typer.Option(
        "--dir",
        "-d",
        parser=data_directory,
        metavar="DIR",
        help="The data directory (logs and run state).",
    ),
]
LogOption = Annotated[
    str | None,
    typer.Option(
        "--log",
        envvar="QW_LOG",  # keeps a password off the command line
        show_envvar=True,
        metavar="URL",
        help="A redis://… log instead of the files in --dir.",
    ),
]


def bad(option: str, value: object, expected: str) -> NoReturn:
    raise typer.BadParameter(f"got {value!r}; expected {expected}", param_hint=f"'{option}'")


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    typer.echo(f"qw: error: {message}", err=True)
    raise typer.Exit(code)


def fail_os(error: OSError, doing: str) -> NoReturn:
    """One line for a file the command could not use (a read-only mount, a directory it
    may not read): the file, what the command was doing, and why; exit 2."""
    where = error.filename if error.filename is not None else "a file"
    fail(f"{where}: cannot {doing}: {error.strerror or error}")


def location_of(directory: Path, log: str | None) -> str:
    if log is None:
        return str(directory)
    if not is_redis_url(log):
        bad("--log", log, "a redis:// URL (the files in --dir are the default)")
    check_log_url(log)
    return log


def check_log_url(url: str) -> None:
    """Parse a redis:// URL as the Redis log will, connecting to nothing: a malformed one
    (a bad port, an unknown parameter value) or a missing redis package is one line and
    exit 2 here, rather than a traceback later."""
    try:
        from logstore.redis.log import RedisLog
    except ImportError as e:
        fail(str(e))
    try:
        RedisLog(url, TASKS_TOPIC).close()  # a handle that never connected
    except ValueError as e:  # its messages never show a password
        fail(f"--log: {e}")


def require_logs(location: str) -> None:
    from queue_worker.proof.log_reading import has_logs, missing_logs_text  # not for `qw --help`

    try:
        found = has_logs(location)
    except LogError as e:
        fail(str(e))
    if not found:
        fail(missing_logs_text(location))
