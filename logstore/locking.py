"""The locks of a file log: one lock file, two ways to take it.

The hot path (every append) takes `fcntl.flock` on a descriptor of ``<log>.lock`` that the
handle keeps open. Maintenance (creating the log, `repair()`) takes the same file through
`filelock.FileLock`. Both are flock on the same inode, so they exclude each other across
processes (and between two descriptors in one process). filelock's UnixFileLock leaves the
file in place on release (we also ask for that with ``preserve_lock_file``), so every holder
locks the same inode.

Why not filelock on the hot path: an acquire + release through filelock costs about 80 µs
here (it opens, checks and closes the file each time), flock on a kept descriptor about
1.7 µs, and an append is a few µs of work.

Where `fcntl` is missing, `open_lock` falls back to filelock for the hot path as well (and a
shared lock is then an exclusive one).

filelock is imported when a maintenance lock is first taken, not with this module: its import
(logging, secrets, inspect, decimal, platform…) costs more CPU than `qw status` spends on
everything else, measured on the bench machine, and a reader of an existing log never takes
that lock.

A third, `directory_lock`, is flock on a data directory itself: the creation of a
partitioned queue holds it (queue_worker.partitions.queue), and a reader that finds partitions
without their manifest waits on it before it calls them damaged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import filelock

try:
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system
    HAVE_FLOCK = False
else:
    HAVE_FLOCK = True


class HeldLock(Protocol):
    """An inter-process lock a handle keeps for its lifetime; acquire/release are cheap."""

    path: str
    #: take the lock exclusively (blocks)
    acquire: Callable[[], object]
    #: take it shared with other shared holders (blocks while anyone holds it exclusively)
    acquire_shared: Callable[[], object]
    release: Callable[[], object]

    def close(self) -> None:
        """Close the kept descriptor (which releases the lock if this handle holds it)."""


class FlockLock:
    """flock on a kept-open descriptor. The methods are C partials: no Python frame per call."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        self.acquire: Callable[[], object] = partial(fcntl.flock, self.fd, fcntl.LOCK_EX)
        self.acquire_shared: Callable[[], object] = partial(fcntl.flock, self.fd, fcntl.LOCK_SH)
        self.release: Callable[[], object] = partial(fcntl.flock, self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self.fd)


class FallbackLock:
    """filelock.FileLock, for platforms without fcntl.flock. Shared is exclusive here."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = maintenance_lock(path)
        self.acquire: Callable[[], object] = self._lock.acquire
        self.acquire_shared: Callable[[], object] = self._lock.acquire
        self.release: Callable[[], object] = self._lock.release

    def close(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)


class ReadFlockLock(FlockLock):
    """flock on a read-only descriptor of an existing lock file (flock needs no write
    access): a read-only handle can still wait for writers to finish a cut."""

    def __init__(self, path: str) -> None:  # (does not call FlockLock's: no O_CREAT)
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.acquire = partial(fcntl.flock, self.fd, fcntl.LOCK_SH)  # never exclusive
        self.acquire_shared = partial(fcntl.flock, self.fd, fcntl.LOCK_SH)
        self.release = partial(fcntl.flock, self.fd, fcntl.LOCK_UN)


class NoLock:
    """No lock at all: a read-only handle on a log with no lock file (nobody ever wrote it
    through qw here, so there is no writer to exclude)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.acquire: Callable[[], object] = _nothing
        self.acquire_shared: Callable[[], object] = _nothing
        self.release: Callable[[], object] = _nothing

    def close(self) -> None:
        pass


def _nothing() -> None:
    return None


def open_read_lock(path: str) -> HeldLock:
    """The lock of a read-only handle: the existing lock file opened read-only, shared only;
    no lock when the file is missing (nothing is created)."""
    if HAVE_FLOCK:
        try:
            return ReadFlockLock(path)
        except (FileNotFoundError, PermissionError):
            pass
    return NoLock(path)


def open_lock(path: str) -> HeldLock:
    """The hot-path lock on `path`: flock where available, else filelock."""
    return FlockLock(path) if HAVE_FLOCK else FallbackLock(path)


@contextmanager
def directory_lock(directory: str, *, shared: bool = False) -> Iterator[None]:
    """flock on a directory itself, for the `with` block: it excludes as a lock file does,
    but creates nothing, so that a reader waiting there for a writer leaves the directory
    as it found it. OSError when the directory cannot be opened; no lock without flock."""
    if not HAVE_FLOCK:
        yield
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (releases the lock)


def maintenance_lock(path: str) -> filelock.BaseFileLock:
    """A filelock.FileLock on `path` that keeps the lock file in place on release."""
    import filelock  # here, not at the top: see the module docstring

    try:
        return filelock.FileLock(path, preserve_lock_file=True)
    except TypeError:  # filelock 3.x: no such option; its Unix lock never unlinks the file
        return filelock.FileLock(path)
