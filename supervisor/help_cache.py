"""`qw --help` from a cache of typer's own output, written at build time.

    python -m supervisor.help_cache          (`make compiled` runs it)

`qw --help` is the whole app's help: building it imports typer and every command's module
(~5× a bare `python -c pass`). What it prints depends on the app's sources, typer, the
width click lays it out at and the language of click's own words ("Usage:", "Options:"),
so the build renders it through supervisor.cli.main itself, once for each width click can
choose (it takes the terminal's columns, at most 80, minus 2, and never less than 50), into
`supervisor/_compiled/help/<key>/<width>.txt`, where `key` hashes every source file of qw's
packages, typer's version and Python's. `qw --help` reads the file of the current key and
width; without one (no build, an edited source, a typer upgrade), with a translation of
click's words installed (gettext finds a catalogue), or on a stdout click would rewrap,
it returns None and typer answers as before. tests/test_help_cache.py compares the two
byte for byte at several widths.
"""

from __future__ import annotations

import os
import sys

PACKAGES = ("supervisor", "queue_worker", "logstore")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: QW_HELP_CACHE: another directory for the cache (the tests build one in their tmp_path)
CACHE_ENV = "QW_HELP_CACHE"
DEFAULT_CACHE = os.path.join(ROOT, "supervisor", "_compiled", "help")
#: click's width: min(columns, 80) - 2, and at least 50
WIDTHS = range(50, 79)


def source_key() -> str:
    """A hash of every source of qw's packages, of typer's version and of Python's."""
    from _blake2 import blake2b  # built in, cheap to import (hashlib loads OpenSSL)
    from importlib.util import find_spec

    digest = blake2b(digest_size=12)
    digest.update(sys.version.encode())
    typer = find_spec("typer")
    if typer is not None and typer.origin is not None:
        with open(typer.origin, "rb") as f:  # holds typer's __version__
            digest.update(f.read())
    for package in PACKAGES:
        for directory, subdirs, files in os.walk(os.path.join(ROOT, package)):
            subdirs[:] = sorted(d for d in subdirs if d not in ("__pycache__", "_compiled"))
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    with open(path, "rb") as f:
                        digest.update(os.path.relpath(path, ROOT).encode() + b"\0" + f.read())
    return digest.hexdigest()


def width() -> int:
    """The width click lays help out at (typer._click.formatting.HelpFormatter)."""
    import shutil

    return max(min(shutil.get_terminal_size().columns, 80) - 2, 50)


def cache_dir() -> str:
    return os.environ.get(CACHE_ENV) or DEFAULT_CACHE


def cached_help(args: list[str]) -> int | None:
    """Print `qw --help` from the cache and return 0; None when the cache cannot answer."""
    if args != ["--help"]:
        return None
    import gettext

    if gettext.find("messages") is not None:  # click's words would be translated
        return None
    path = os.path.join(cache_dir(), source_key(), f"{width()}.txt")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    from supervisor.lazy_typer import echo

    echo(text)  # as click echoes the help: the text and a new line, flushed
    return 0


def build(directory: str | None = None) -> str:
    """Render `qw --help` through typer at every width into the cache; its directory."""
    import io
    from contextlib import redirect_stdout

    from typer._click import formatting

    from supervisor.cli import main

    where = os.path.join(directory or cache_dir(), source_key())
    os.makedirs(where, exist_ok=True)
    for w in WIDTHS:
        out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", newline="")
        formatting.FORCED_WIDTH = w  # what the terminal's columns give
        try:
            with redirect_stdout(out):
                code = main(["--help"])
        finally:
            formatting.FORCED_WIDTH = None
        out.flush()
        text = out.buffer.getvalue().decode("utf-8")
        if code != 0 or not text.endswith("\n"):
            raise RuntimeError(f"qw --help at width {w}: exit {code}, {text!r:.200}")
        tmp = os.path.join(where, f".{w}.txt.tmp")
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text[:-1])  # echo adds the new line again
        os.replace(tmp, os.path.join(where, f"{w}.txt"))
    return where


def main() -> int:
    print(f"qw --help cached in {build()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
