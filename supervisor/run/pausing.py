"""Pausing a worker (SIGSTOP) without stalling the others.

A worker stopped while it holds a log's lock — an append takes ``<log>.lock``, a durable
one then ``<log>.sync`` — stops every other writer of that log until it is resumed: no
other worker could take its task over, or finish anything. The moment a person or a demo
reacts to (a worker's record just appeared in the log) is the likeliest to catch it there:
its append has written and not yet unlocked (measured: 2 of 300 pauses sent as soon as a
CLAIM was seen, on a loaded machine). So `stop_outside_appends` stops the process, waits
until it has stopped (SIGSTOP is delivered asynchronously), and if a log lock of the data
directory is held then, lets it run a moment and stops it again.

On Redis there are no lock files, and nothing to wait for.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from pathlib import Path
from typing import Final

#: how often the pause looks again (at the process's state, or after letting it run)
POLL_S: Final = 0.005


def stopped(pid: int) -> bool:
    """Has process `pid` stopped, or gone?"""
    import psutil  # not with the supervisor's imports: they come before its first fork

    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def log_locks_free(location: str | Path) -> bool:
    """Could the append and sync locks of every log in the data directory `location` be
    taken right now? (Each is taken and let go at once: a writer waits a few µs at most.)"""
    directory = Path(location)
    if not directory.is_dir():
        return True  # a redis:// URL: no lock files
    for path in sorted([*directory.glob("*.lock"), *directory.glob("*.sync")]):
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)
    return True


def stop_outside_appends(pid: int, location: str | Path, patience: float) -> bool:
    """SIGSTOP `pid` at a moment it holds none of `location`'s log locks. True once it is
    stopped so; False if that did not happen within `patience` seconds (it is left
    running). Raises ProcessLookupError if the process is gone."""
    deadline = time.monotonic() + patience
    while True:
        os.kill(pid, signal.SIGSTOP)
        while not stopped(pid):
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                return False
            time.sleep(POLL_S)  # delivery of SIGSTOP: microseconds, unless the host is busy
        if log_locks_free(location):
            return True
        os.kill(pid, signal.SIGCONT)  # it holds a lock: let it finish its append
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
