"""Where the lanes' words go: each label takes a stretch of its lane's top or bottom line,
and a label that would overlap one already placed moves to the other line, or is left out
(its shape keeps its record in the title a pointer shows).

Widths are estimated from the character count and the font size the page gives each kind
of label (supervisor/timeline/page.py): 0.62 em a character holds system-ui's digits and
capitals, which the labels are made of, with a little to spare.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

#: the average advance of a label's character, in ems (bold system-ui at 10–11 px)
EM_PER_CHAR: Final = 0.62
#: the space kept between two labels on one line, px
GAP: Final = 4.0
UPPER: Final = "upper"  # the line above the bars
LOWER: Final = "lower"  # the line below them


def text_width(text: str, font_px: float) -> float:
    return len(text) * font_px * EM_PER_CHAR


@dataclass
class LabelSpace:
    """The stretches of each lane's two label lines already taken."""

    taken: dict[tuple[int, str], list[tuple[float, float]]] = field(default_factory=dict)

    def place(
        self, lane: int, lines: tuple[str, ...], x: float, width: float, *, end: bool = False
    ) -> str | None:
        """The first of `lines` (UPPER, LOWER) where a label `width` wide fits on `lane`,
        starting at `x` (ending there when `end`), now taken; None when it fits on none."""
        left, right = (x - width, x) if end else (x, x + width)
        for line in lines:
            spans = self.taken.setdefault((lane, line), [])
            if all(right + GAP <= a or left >= b + GAP for a, b in spans):
                spans.append((left, right))
                return line
        return None
