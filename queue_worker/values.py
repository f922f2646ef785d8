"""A value from the log (a payload, a result) as people read it: one line of JSON.

Payloads and results are msgpack values; every text output (`qw task`, `qw why`, `qw tail`)
shows them through `value_text`, so that `{"n": 3}` reads the same everywhere (not
`{'n': 3}` in one place and `{"n": 3}` in another) and can be pasted back into
`qw enqueue --payload`. What JSON lacks is written as close to JSON as it gets: bytes as a
string of their Python form (`"b'\\x00'"`), a map key that is not a string as its JSON text.
"""

from __future__ import annotations

import json
import reprlib
from typing import Any, Final

from queue_worker.names import printable

__all__ = ["json_value", "value_text"]


def json_value(value: Any) -> Any:
    """`value` with what JSON lacks written as above: for a JSON body. A value nested too
    deep to walk (a hostile record can hold one 1000 levels deep) becomes a string of its
    bounded Python form, `"[[[[[[...]]]]]]"`: a JSON body never fails to build."""
    try:
        return _json_value(value)
    except RecursionError:
        return _BOUNDED.repr(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {_key(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)  # bytes, msgpack's ExtType: their Python form, as a JSON string


def _key(key: Any) -> str:
    return key if isinstance(key, str) else json.dumps(_json_value(key), ensure_ascii=False)


def value_text(value: Any, limit: int | None = None) -> str:
    """`value` as one line of JSON, safe for a terminal; cut with "…" past `limit` chars.

    Never raises: a value nested too deep for JSON (a hostile record can hold one 1000
    levels deep; msgpack decodes it, json.dumps and `json_value` recurse) reads as a bounded
    Python repr instead, `[[[[[...]]]]]`."""
    try:
        text = json.dumps(_json_value(value), ensure_ascii=False)
    except RecursionError:
        text = _BOUNDED.repr(value)
    text = printable(text)
    if limit is not None and len(text) > limit:
        return text[: limit - 1] + "…"
    return text


_BOUNDED: Final = reprlib.Repr()
_BOUNDED.maxlevel = 6
_BOUNDED.maxstring = _BOUNDED.maxother = 80
