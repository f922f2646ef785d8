"""Short figures for the dashboard's cells: durations, claim latencies, sizes."""

from __future__ import annotations

__all__ = ["format_bytes", "format_duration", "format_micros"]


def format_duration(seconds: float) -> str:
    """3.2s, 45s, 2m05s, 1h02m: short enough for a table cell."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_micros(micros: int) -> str:
    """A claim latency: 410µs, 1.25ms, 12ms, 1.5s."""
    if micros < 1000:
        return f"{micros}µs"
    if micros < 10_000:
        return f"{micros / 1000:.2f}ms"
    if micros < 1_000_000:
        return f"{micros / 1000:.0f}ms"
    return f"{micros / 1_000_000:.1f}s"


def format_bytes(n: int) -> str:
    """1023B, 12.3K, 45.6M, 1.2G (powers of 1024)."""
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(value) < 1024 or unit == "T":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")  # the loop returns at "T"
