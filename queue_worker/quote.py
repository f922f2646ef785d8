"""How a value from the log (a payload, a result, an error) is quoted in one line of text.

The value is untrusted: it may be huge, nested a thousand levels deep (the builtin repr and
json.dumps raise RecursionError), or hold terminal escapes. `quote` never raises, stays
within its limit, and gives printable text.
"""

from __future__ import annotations

import contextlib
import json
import reprlib
from typing import Any, Final

from queue_worker.names import printable

__all__ = ["quote"]

_REPR: Final = reprlib.Repr()
_REPR.maxlevel = 4
_REPR.maxstring = 80
_REPR.maxother = 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 10


def quote(value: Any, limit: int = 80, *, as_json: bool = True) -> str:
    """`value` as JSON when it is small and plain (what a user typed; `as_json` False: as
    Python's repr), else a bounded repr; cut to `limit` characters with …, and printable."""
    text = _REPR.repr(value)
    # Only a value whose bounded repr was not cut is small enough that JSON cannot recurse.
    if as_json and len(text) <= limit and "..." not in text:
        # bytes and other msgpack values that JSON lacks keep the repr
        with contextlib.suppress(TypeError, ValueError, RecursionError):
            text = json.dumps(value, ensure_ascii=False)
    text = printable(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"
