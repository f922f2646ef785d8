"""How many examples a property test draws.

`make test-all` (QW_TESTS=all) draws each property's full count; `make test`, the fast
tier, draws a fifth of it (at least 10): every property still runs on every push, and the
full search runs where every test does. `examples(300)` is what a test passes to
hypothesis's `settings(max_examples=...)`; the properties that name no count get the
profile conftest loads (100 examples, or 20).
"""

from __future__ import annotations

import os

FULL = os.environ.get("QW_TESTS") == "all"


def examples(full: int) -> int:
    """The examples to draw of a property whose full search is `full` examples."""
    return full if FULL else max(10, full // 5)
