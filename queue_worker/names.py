"""How a worker is named to a person, in one place.

A worker id is unique per process (``w6-6975-4ede``: slot name, pid, random suffix; with a
host, ``w0@box-11704-d3af``), so a restarted worker never shares its predecessor's id. The
full id is long, and its slot prefix alone (``w6``) makes a replacement look like the
worker it replaced. People see the slot and the process: ``w6·6975`` (``w0·11704@box`` with
a host). Every screen and text output names workers through `worker_label`; JSON output
keeps the full id beside it.

Names come from the log, which anyone can append to: `printable` makes any text safe for one
line of a terminal (a worker named with terminal escapes must not move the cursor).
"""

from __future__ import annotations

__all__ = ["function_label", "printable", "worker_label"]

# Control characters (ESC above all) would be written to the terminal as they are: a
# worker's name or a log line could move the cursor or recolour the screen.
_CONTROLS = {c: "�" for c in [*range(0x20), *range(0x7F, 0xA0)]} | {0x09: " ", 0x0A: " "}


def printable(text: str) -> str:
    """`text` safe for one line of the screen: tabs and newlines become spaces, other
    control characters become �."""
    return text.translate(_CONTROLS)


#: the most cells a function's name takes beside a task id on a screen
FUNCTION_CELLS = 12


def function_label(function: str, cells: int = FUNCTION_CELLS) -> str:
    """A task's function as screens show it beside the task's id (``#17 resize``): made
    printable, and cut to `cells` characters with an ellipsis (a name, unlike a number,
    still reads when cut)."""
    text = printable(function)
    return text if len(text) <= cells else text[: cells - 1] + "…"


def worker_label(worker_id: str) -> str:
    """``w6-6975-4ede`` → ``w6·6975``; ``w0@box-11704-d3af`` → ``w0·11704@box``. An id of
    another shape (written by another tool, or hostile) is shown whole, made printable."""
    head, sep, rest = worker_id.rpartition("-")
    if not sep:
        return printable(worker_id)
    name_host, sep, pid = head.rpartition("-")
    if not sep or not pid.isdigit() or not rest.isalnum() or not name_host:
        return printable(worker_id)
    name, at, host = name_host.partition("@")
    suffix = f"@{host}" if at else ""
    return printable(f"{name}·{pid}{suffix}")
