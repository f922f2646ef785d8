"""How times and spans read to people, in one place, for every text output.

Times come from the logs, which anyone can append to: a record may say `at` = 2^63 − 1 or
a lease of 2^64 − 1 µs with a valid checksum. Nothing here raises on such a value: a time
that is no date on this machine's calendar is shown as its raw number with a note, and a
span too long to mean anything is shown in days.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

__all__ = ["ago_text", "clock_text", "duration_text", "is_date"]

_MICROS: Final = 1_000_000
_HOUR_US: Final = 3600 * _MICROS
_DAY_US: Final = 24 * _HOUR_US
#: the µs since the epoch that a calendar date can have (years 1 to 9999), a day inside
#: each end so that no time zone pushes one over
_FIRST_US: Final = -62_135_596_800 * _MICROS + _DAY_US
_LAST_US: Final = 253_402_300_799 * _MICROS - _DAY_US


def is_date(at_us: int) -> bool:
    """Is this a time a calendar can show (not 2^63 − 1 µs, a year past 9999)?"""
    return type(at_us) is int and _FIRST_US <= at_us <= _LAST_US


def clock_text(at_us: int) -> str:
    """A record's wall-clock time as people read it: 12:00:01.234 (local time).

    A value that is no date (out of the calendar's range, or not an integer) reads
    ``9223372036854775807 µs (not a date)``: the reader sees the raw value and that it is
    suspect, and nothing raises.
    """
    if not is_date(at_us):
        return f"{at_us!r} µs (not a date)"
    try:
        moment = datetime.fromtimestamp(at_us / _MICROS)
    except (ValueError, OverflowError, OSError, TypeError):
        return f"{at_us!r} µs (not a date)"
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def duration_text(us: int) -> str:
    """A span of µs as people read it: 850 µs, 12.3 ms, 4.20 s, 2.5 h, 12 days (negative
    keeps its sign). Any integer reads as something (a hostile lease of 2^64 − 1 µs is
    213503982 days)."""
    sign = "-" if us < 0 else ""
    us = abs(us)
    if us < 1000:
        return f"{sign}{us} µs"
    if us < _MICROS:
        return f"{sign}{us / 1000:.1f} ms"
    if us < 1000 * _MICROS:
        return f"{sign}{us / _MICROS:.2f} s"
    if us < 100 * _HOUR_US:
        return f"{sign}{us / _HOUR_US:.1f} h"
    return f"{sign}{us // _DAY_US} days"


def ago_text(then_us: int, now_us: int) -> str:
    """How long before `now_us` a moment was: "3.10 s ago" (or "in 2.00 s" if later)."""
    if then_us <= now_us:
        return f"{duration_text(now_us - then_us)} ago"
    return f"in {duration_text(then_us - now_us)}"
