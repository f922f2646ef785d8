"""A one-line chart of recent values in unicode blocks: `sparkline([0, 1, 3, 2]) -> " ▃█▆"`.

Pure and dependency-free so the dashboard, a progress line or a test can use it alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: a blank for zero (so a stall after a kill -9 shows as a gap), then eight heights
BLOCKS = " ▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 60, *, maximum: float | None = None) -> str:
    """The last `width` values as a `width`-character string, scaled to `maximum`.

    `maximum` defaults to the largest value shown. Missing history is padded with blanks on
    the left, so the chart grows from the right the way a live feed does. Any positive value
    shows at least the lowest block: "a little work" must not look like "none". Negative,
    NaN and infinite values count as zero.
    """
    if width <= 0:
        return ""
    shown = [_clean(v) for v in values[-width:]]
    top = max(shown, default=0.0) if maximum is None else _clean(maximum)
    steps = len(BLOCKS) - 1
    chars = []
    for v in shown:
        if v <= 0.0 or top <= 0.0:
            chars.append(BLOCKS[0])
        else:
            level = math.ceil(min(v, top) / top * steps)
            chars.append(BLOCKS[max(1, min(steps, level))])
    return " " * (width - len(chars)) + "".join(chars)


def _clean(value: float) -> float:
    return value if math.isfinite(value) and value > 0.0 else 0.0
