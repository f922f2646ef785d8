"""`qw why`'s story as text, without rich where the output is plain.

rich is ~60 ms of CPU to import, more than the rest of `qw why`. Piped or redirected (not a
terminal), the story is plain aligned columns, which `plain_story` lays out here exactly
as rich lays out the table `supervisor.report_text.render_story` builds from the same rows
(`story_rows`): header, cells padded to their column's widest, one space either side of a
column boundary, none at the table's edges. It does so only where rich's layout is that
simple, and returns None otherwise, for rich to render: a character whose width on a
terminal is not 1, markup (`[`) or an emoji code (`:name:`) that rich would interpret, or
a table wider than the plain console's width (`plain_width`: rich would wrap its cells).
`tests/test_story_text.py` compares the two on generated stories.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from typing import TYPE_CHECKING, Final

from logstore.location import log_file
from queue_worker.names import printable, worker_label
from queue_worker.times import clock_text
from queue_worker.topics import CLAIMS_TOPIC

if TYPE_CHECKING:
    from queue_worker.proof.explain import TaskStory

HEADERS: Final = ("position", "time", "record", "worker", "why")
#: the columns rich right-aligns (the others are left-aligned)
RIGHT: Final = frozenset({0, 1})
#: the plain console's width where COLUMNS does not say (supervisor.console uses it too:
#: it is here because that module imports rich)
PLAIN_WIDTH: Final = 80
#: text whose every character is one column wide on any terminal, as rich measures it
_ONE_COLUMN: Final = re.compile(r"[\x20-\x5a\x5c-\x7e·]*")  # printable ASCII but `[`, and ·
#: rich's emoji codes (rich._emoji_replace): a name of at most 2 digits names no emoji
_EMOJI: Final = re.compile(r"(:(\S*?)(?:(?:\-)(emoji|text))?:)")
_NO_EMOJI_NAME: Final = re.compile(r"\d{0,2}")
Row = tuple[str, str, str, str, str]


def plain_width() -> int:
    """The width plain output is laid out for: COLUMNS if it is a positive whole number (the
    reader's terminal, as a shell exports it), else 80."""
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PLAIN_WIDTH


def positions_note(location: str) -> str:
    """What the numbers after @ and # are, said once at the top of `qw why`."""
    claims = log_file(location, CLAIMS_TOPIC)
    if claims is None:  # Redis
        where = "its stream entry id MS-SEQ packed into one number, MS·2^20 + SEQ"
    else:
        where = f"its byte offset in {claims}"
    width = shutil.get_terminal_size((plain_width(), 24)).columns
    lines = (
        f"@N      a record's position in the claims log: {where}",
        "task #N a task's id: its index in the tasks log",
    )
    return "".join(
        textwrap.fill(line, width, subsequent_indent=" " * 8, break_on_hyphens=False) + "\n"
        for line in lines
    )


def story_rows(story: TaskStory, name: str | None = None) -> tuple[str, list[Row]]:
    """The story's title and its rows, one a record, as the table shows them."""
    rows: list[Row] = []
    for step in story.steps:
        where = f"task #{step.position}" if step.kind == "TASK" else f"@{step.position}"
        where = "ops log" if step.kind == "OP" else where
        rows.append(
            (
                where,
                clock_text(step.at) if step.at else "",
                step.kind,
                worker_label(step.worker) if step.worker is not None else "",
                printable(step.why),
            )
        )
    return f"task {story.named(name)}: {printable(story.state)}", rows


def plain_wanted() -> bool:
    """Would `supervisor.console.stdout_console()` print plain text to stdout: rich's own
    test of a terminal (its TTY_COMPATIBLE and FORCE_COLOR overrides, then isatty), on a
    stream that takes UTF-8 as rich writes it."""
    stream = sys.stdout
    if "TTY_COMPATIBLE" in os.environ or "FORCE_COLOR" in os.environ:
        return False
    encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
    try:
        return encoding == "utf8" and not stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed: rich's answers differ
        return False


def plain_story(story: TaskStory, name: str | None = None) -> str | None:
    """The story as rich prints it plain (without the last new line), or None where rich's
    layout is not this simple one."""
    title, rows = story_rows(story, name)
    table = [HEADERS, *rows]
    if not all(_simple(text) for text in (title, *(cell for row in table for cell in row))):
        return None
    widths = [max(len(row[c]) for row in table) for c in range(len(HEADERS))]
    width = plain_width()
    if sum(widths) + 2 * (len(widths) - 1) > width or len(title) > width:
        return None  # rich would shrink the columns and wrap their cells, or wrap the title
    lines = [title.rstrip()]
    for row in table:
        cells = (
            cell.rjust(width) if c in RIGHT else cell.ljust(width)
            for c, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _simple(text: str) -> bool:
    """Shown by rich as it is, one column a character."""
    if _ONE_COLUMN.fullmatch(text) is None:
        return False
    return all(_NO_EMOJI_NAME.fullmatch(m.group(2)) for m in _EMOJI.finditer(text))
