"""`qw … --help` as plain text that reads whole at 80 columns.

Typer's rich panels split the options table into six columns and, at 80 columns, cut option
names ("--exit-when-drain…"), split choice lists mid-word and drop defaults. The app uses
click's plain layout instead (`rich_markup_mode=None`: one column of names, one of help),
and this formatter keeps what must stay whole on one line while the help text is wrapped:

- an option name: textwrap breaks words after a hyphen ("--no-" / "tui"), so hyphens are
  swapped for a non-breaking one while wrapping;
- a bracketed note ("[default: commit]", "[env var: QW_LOG]"): its spaces are swapped for
  non-breaking ones (textwrap splits only at ASCII whitespace);
- a command's summary in a command list: the whole first sentence, wrapped, where click
  would cut it with "...".

Both swaps are undone when the text is taken out of the formatter (`getvalue`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

import typer
from typer._click.core import Command  # typer vendors click; its classes live here
from typer._click.formatting import HelpFormatter
from typer.core import TyperGroup

_NBSP: Final = "\u00a0"
_NB_HYPHEN: Final = "\u2011"
_BRACKETED: Final = re.compile(r"\[[^\]\n]*\]")
_SENTENCE_END: Final = re.compile(r"(?<=[.!?])\s")


def _keep_whole(text: str) -> str:
    text = _BRACKETED.sub(lambda m: m.group(0).replace(" ", _NBSP), text)
    return text.replace("-", _NB_HYPHEN)


class WholeWordsFormatter(HelpFormatter):
    """Wraps help text without breaking an option name or a bracketed note."""

    def write_text(self, text: str) -> None:
        super().write_text(_keep_whole(text))

    def write_dl(
        self, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2
    ) -> None:
        kept = [(_keep_whole(first), _keep_whole(second)) for first, second in rows]
        super().write_dl(kept, col_max, col_spacing)

    def getvalue(self) -> str:
        return super().getvalue().replace(_NBSP, " ").replace(_NB_HYPHEN, "-")


class WholeWordsContext(typer.Context):
    formatter_class = WholeWordsFormatter


def first_sentence(text: str) -> str:
    """The first sentence of a help text's first paragraph, on one line."""
    paragraph = " ".join(text.strip().split("\n\n")[0].split())
    return _SENTENCE_END.split(paragraph, maxsplit=1)[0]


def _whole_help(command: Command) -> None:
    command.context_class = WholeWordsContext
    if not command.short_help and command.help:
        command.short_help = first_sentence(command.help)  # never cut with "..." by click
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            _whole_help(sub)


class WholeHelpGroup(TyperGroup):
    """The `qw` group: every command under it (and under `qw demo`) gets the formatter above
    and a whole summary, whichever module registered it."""

    context_class = WholeWordsContext

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _whole_help(self)
