"""The rich console the commands print their tables on (stdout).

Its own module, with nothing else: `qw why` needs it, and so do the demos.

Piped or redirected, the output is laid out for the width of the terminal the reader will
look at it in: `COLUMNS` when it is set, else 80. Lines wrap between words, and no line ends
in the spaces rich pads a table's last column with (grep and diff see what a reader sees).
"""

from __future__ import annotations

import re
import sys
from typing import Final, TextIO

from rich.console import Console

from supervisor.story_text import PLAIN_WIDTH as PLAIN_WIDTH  # the width without COLUMNS
from supervisor.story_text import plain_width as plain_width

_TRAILING: Final = re.compile(r"[ \t]+\n")


class NoTrailingSpaces:
    """A text stream that writes what it is given without the spaces before each new line.

    Spaces at the end of one write are held back until the next write shows whether a new
    line follows them (rich writes a line's padding and its new line separately)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.held = ""

    def write(self, text: str) -> int:
        text = _TRAILING.sub("\n", self.held + text)
        kept = text.rstrip(" \t")
        self.held = text[len(kept) :]
        self.stream.write(kept)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"


def plain_console(stream: TextIO) -> Console:
    """The console of piped output on `stream`: the reader's width, no trailing spaces."""
    return Console(
        highlight=False,
        width=plain_width(),
        file=NoTrailingSpaces(stream),  # type: ignore[arg-type]  # (write, flush: all rich uses)
    )


def stdout_console() -> Console:
    """stdout: a terminal as it is; a pipe or a file gets plain text at the reader's width."""
    console = Console(highlight=False)
    if console.is_terminal:
        return console
    return plain_console(sys.stdout)
