"""Stop signals for `qw up`: SIGINT, SIGTERM and SIGHUP all ask the supervisor to stop.

The handler only calls `request_stop` (the supervisor counts the requests: the first drains,
the second kills every worker now). It does nothing else because it runs on the main thread
between two bytecodes, wherever that thread was: taking a lock there could deadlock.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Final

STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals(request_stop: Callable[[], None]) -> Iterator[None]:
    """Route the stop signals to `request_stop` while the block runs; restore them after."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        request_stop()

    previous = {signum: signal.signal(signum, on_signal) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
