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

import contextlib
import os
import sys
import time

PACKAGES = ("supervisor", "queue_worker", "logstore")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: in a cache's directory: the stamp of the files its key was found for (`current_key`)
STAMP_FILE = "sources.stamp"
#: how old a file's mtime and ctime must be for a stamp of it to be written: more than the
#: tick of any file system's clock (FAT's is 2 s)
STAMP_MARGIN_NS = 3_000_000_000
#: QW_HELP_CACHE: another directory for the cache (the tests build one in their tmp_path)
CACHE_ENV = "QW_HELP_CACHE"
DEFAULT_CACHE = os.path.join(ROOT, "supervisor", "_compiled", "help")
#: click's width: min(columns, 80) - 2, and at least 50
WIDTHS = range(50, 79)


def _sources() -> tuple[str | None, list[str]]:
    """The files the key covers: typer's `__init__` (which holds its version), and every
    source of qw's packages, in a fixed order."""
    from importlib.util import find_spec

    typer = find_spec("typer")
    files: list[str] = []
    for package in PACKAGES:
        for directory, subdirs, names in os.walk(os.path.join(ROOT, package)):
            subdirs[:] = sorted(d for d in subdirs if d not in ("__pycache__", "_compiled"))
            files += [os.path.join(directory, n) for n in sorted(names) if n.endswith(".py")]
    return (typer.origin if typer is not None else None), files


def source_key(sources: tuple[str | None, list[str]] | None = None) -> str:
    """A hash of every source of qw's packages, of typer's version and of Python's."""
    from _blake2 import blake2b  # built in, cheap to import (hashlib loads OpenSSL)

    typer, files = _sources() if sources is None else sources
    digest = blake2b(digest_size=12)
    digest.update(sys.version.encode())
    if typer is not None:
        with open(typer, "rb") as f:  # holds typer's __version__
            digest.update(f.read())
    for path in files:
        with open(path, "rb") as f:
            digest.update(os.path.relpath(path, ROOT).encode() + b"\0" + f.read())
    return digest.hexdigest()


def _stamp(sources: tuple[str | None, list[str]]) -> tuple[str, int]:
    """Python's version, then each file's path, size, mtime, ctime and inode (typer's
    first), a line each; and the newest of their mtimes and ctimes."""
    typer, files = sources
    lines = [sys.version.replace("\n", " ") + "\n", f"typer: {typer}\n"]
    newest = 0
    for path in [typer, *files] if typer is not None else files:
        st = os.stat(path)
        lines.append(f"{path}\t{st.st_size}\t{st.st_mtime_ns}\t{st.st_ctime_ns}\t{st.st_ino}\n")
        newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
    return "".join(lines), newest


def current_key(directory: str, now_ns: int | None = None) -> str:
    """`source_key()`, read from the stamp of a cache under `directory` when the files stat
    exactly as stamped (hashing ~170 files is ~3 ms, most of what `qw --help` does).

    queue_worker.compiled's rule: any write to a file changes its ctime (which nothing sets
    back) and a file replaced by another changes its inode, so the stamp then differs and the
    files are hashed; a hash that names an existing cache is stamped there, unless a file is
    younger than STAMP_MARGIN_NS at `now_ns` (a write in the same tick of a coarse clock
    could go unseen) or changed while it was hashed. A file added or removed changes the
    stamp's lines."""
    sources = _sources()
    stamp, newest = _stamp(sources)
    try:
        names = os.listdir(directory)
    except OSError:
        names = []
    for name in names:
        try:
            with open(os.path.join(directory, name, STAMP_FILE), encoding="utf-8") as f:
                if f.read() == stamp:
                    return name
        except (OSError, ValueError):  # not a cache, no stamp, an unreadable one
            continue
    key = source_key(sources)
    where = os.path.join(directory, key)
    now_ns = time.time_ns() if now_ns is None else now_ns
    if newest <= now_ns - STAMP_MARGIN_NS and os.path.isdir(where) and _stamp(sources)[0] == stamp:
        temporary = os.path.join(where, f".{STAMP_FILE}.{os.getpid()}")
        try:
            with open(temporary, "w", encoding="utf-8") as f:
                f.write(stamp)
            os.replace(temporary, os.path.join(where, STAMP_FILE))
        except OSError:  # a read-only install: hashed at each `qw --help`, as before
            with contextlib.suppress(OSError):
                os.unlink(temporary)
    return key


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
    directory = cache_dir()
    path = os.path.join(directory, current_key(directory), f"{width()}.txt")
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
