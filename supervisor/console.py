"""The rich console the commands print their tables on (stdout).

Its own module, with nothing else: `qw why` needs it, and so do the demos.
"""

from __future__ import annotations

from typing import Final

from rich.console import Console

#: the width plain (piped) output is laid out for: wide enough that rows do not wrap
PLAIN_WIDTH: Final = 200


def stdout_console() -> Console:
    """stdout: a terminal as it is; a pipe or a file gets plain text whose lines are not
    wrapped (one line per row or sentence, for grep)."""
    console = Console(highlight=False)
    if console.is_terminal:
        return console
    return Console(highlight=False, width=PLAIN_WIDTH, soft_wrap=True)
