"""Lines that fit the reader's width: the terminal's, `COLUMNS` when set, 80 when piped.

The commands print lines of items kept apart by two or more spaces (`published 100  pending
68`, a tail record's fields). A line wider than the width is broken between items first,
the next line indented under the second item (so values line up under their label), and an
item still too wide between its words; no line ends in spaces. Without rich: `qw status`,
`qw task` and `qw tail` do not import it (~60 ms).
"""

from __future__ import annotations

import re
import shutil
import textwrap
from typing import Final

import typer

from supervisor.story_text import plain_width

_SEPARATOR: Final = re.compile(r"( {2,})")
#: what keeps the parts of a status line apart
PARTS: Final = " · "


def output_width() -> int:
    """COLUMNS, else the terminal's width, else (piped) 80."""
    return shutil.get_terminal_size((plain_width(), 24)).columns


def fit(line: str, width: int | None = None, hang: int | None = None) -> str:
    """`line` as lines of at most `width` columns; `hang`: the continuation lines' indent
    (default: under the second item, or four spaces in when that is past half the width)."""
    width = width or output_width()
    line = line.rstrip()
    if len(line) <= width:
        return line
    lead = len(line) - len(line.lstrip(" "))
    parts = _SEPARATOR.split(line[lead:])
    items, separators = parts[0::2], parts[1::2]
    if hang is None:
        second = lead + len(items[0]) + len(separators[0]) if separators else width
        hang = second if second <= width // 2 else lead + 4
    hang = min(hang, width // 2)
    lines, current = [], " " * lead + items[0]
    for separator, item in zip(separators, items[1:], strict=True):
        if len(current) + len(separator) + len(item) <= width:
            current += separator + item
        else:
            lines.append(current)
            current = " " * hang + item
    lines.append(current)
    out: list[str] = []
    for piece in lines:
        if len(piece) <= width:
            out.append(piece)
            continue
        indent = " " * (len(piece) - len(piece.lstrip(" ")))
        out += textwrap.wrap(
            piece.strip(),
            width,
            initial_indent=indent,
            subsequent_indent=" " * hang,
            break_on_hyphens=False,
        )
    return "\n".join(out)


def fit_parts(line: str, width: int | None = None, *, hang: int = 4) -> str:
    """A line of parts kept apart by " · " (`qw up`'s status, a partition's report line) in
    lines of at most `width` columns, broken between its parts: each next line starts
    "· " `hang` columns in; a part still too wide is broken between its words."""
    width = width or output_width()
    if len(line) <= width:
        return line
    indent = " " * min(hang, width // 2)
    parts = line.split(PARTS)
    lines = [parts[0]]
    for part in parts[1:]:
        if len(lines[-1]) + len(PARTS) + len(part) <= width:
            lines[-1] += PARTS + part
        else:
            lines.append(f"{indent}· {part}")
    return "\n".join(
        textwrap.fill(piece, width, subsequent_indent=indent + "  ", break_on_hyphens=False)
        for piece in lines
    )


def echo(text: str, *, hang: int | None = None, err: bool = False) -> None:
    """typer.echo of `text`, each of its lines fitted to the reader's width."""
    width = output_width()
    typer.echo("\n".join(fit(line, width, hang) for line in text.split("\n")), err=err)
