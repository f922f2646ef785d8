"""Rich text as HTML: the terminal dashboard's cells and lines, shown by the page as they
read in the terminal (the same words, the same emphasis), every character escaped.

Everything the page shows that comes from a log (a worker id, an error, a task's payload
in an event) reaches it through `text_html` or `escape`: no other path puts text into the
page's HTML. A style becomes classes (``b``, ``dim``, ``strike``, ``rev``, ``fg-red``,
``bg-yellow``), never an inline style built from text.
"""

from __future__ import annotations

import html
import io
import itertools
from functools import lru_cache

from rich.console import Console, RenderableType
from rich.style import Style
from rich.text import Text

__all__ = ["escape", "segments_html", "style_classes", "text_html"]

#: the colours the dashboard's styles name; any other shows in the text's own colour
COLOURS = frozenset(
    {"black", "red", "green", "yellow", "blue", "magenta", "cyan", "white", "bright_red"}
)


def escape(text: str) -> str:
    """`text` as HTML text or an attribute's value: & < > " ' escaped."""
    return html.escape(text, quote=True)


@lru_cache(maxsize=256)
def style_classes(style: str) -> tuple[str, ...]:
    """The classes of a rich style ("bold red", "dim strike", "bold black on yellow")."""
    parsed = Style.parse(style) if style else Style()
    classes = [
        name
        for name, on in (
            ("b", parsed.bold),
            ("dim", parsed.dim),
            ("strike", parsed.strike),
            ("rev", parsed.reverse),
            ("blink", parsed.blink),
        )
        if on
    ]
    if parsed.color is not None and parsed.color.name in COLOURS:
        classes.append(f"fg-{parsed.color.name}")
    if parsed.bgcolor is not None and parsed.bgcolor.name in COLOURS:
        classes.append(f"bg-{parsed.bgcolor.name}")
    return tuple(classes)


def text_html(text: Text) -> str:
    """`text` as HTML: each run of one style a ``<span class=…>``, its characters escaped.

    Spans may overlap (a cell's style under a word's): each stretch between two span edges
    gets the classes of every style that covers it, the text's own first."""
    plain = text.plain
    base = str(text.style) if text.style else ""
    edges = {0, len(plain)}
    for span in text.spans:
        edges.update((max(0, span.start), min(len(plain), span.end)))
    cuts = sorted(e for e in edges if 0 <= e <= len(plain))
    out: list[str] = []
    for start, end in itertools.pairwise(cuts):
        if start >= end:
            continue
        classes = list(style_classes(base))
        for span in text.spans:
            if span.start <= start and end <= span.end:
                for name in style_classes(str(span.style)):
                    if name not in classes:
                        classes.append(name)
        piece = escape(plain[start:end])
        out.append(f'<span class="{" ".join(classes)}">{piece}</span>' if classes else piece)
    return "".join(out)


def segments_html(renderable: RenderableType, width: int) -> list[str]:
    """A renderable that lays itself out for a width (the partitions section) as the
    terminal shows it at `width` columns: one HTML string a line."""
    console = Console(width=width, file=io.StringIO(), color_system="standard")
    lines = console.render_lines(renderable, console.options, pad=False)
    out: list[str] = []
    for line in lines:
        parts: list[str] = []
        for segment in line:
            if segment.control or not segment.text:
                continue
            classes = style_classes(str(segment.style)) if segment.style else ()
            piece = escape(segment.text)
            parts.append(f'<span class="{" ".join(classes)}">{piece}</span>' if classes else piece)
        out.append("".join(parts).rstrip())
    return out
