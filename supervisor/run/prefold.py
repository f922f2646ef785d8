"""The fork server's fold of the queue, brought up to date before each fork and inherited
by the worker it forks (see `queue_worker.worker.inherited` for why, and for what the worker
checks before it starts from it).

Three sides, one module:
  supervisor   before each fork, `request` writes one line to the control pipe: the queue
               the next worker is for ({"location": null}: none, fold nothing); and `qw
               up` writes the same line (`warm`) as soon as it knows its queue;
  fork server  `install` folds the queue of the supervisor's first line as soon as it comes
               (before the server's loop: its imports done, it would idle until the first
               fork otherwise), and registers `_before_fork` with os.register_at_fork:
               multiprocessing's server loop calls os.fork() for each worker, and just
               before it this reads
               the last request, brings that queue's `Prefold` up to date (reading only
               what was appended since the last fork), and freezes the garbage collector's
               view of it (gc.freeze: the child's collections then leave the inherited
               objects' pages alone, so they stay shared copy-on-write);
  worker       `take` returns the fold inherited with the fork, if it is of the worker's
               queue, and closes what the child must not use (the server's log handles
               and the control pipe).
The control pipe's read end is handed to the server as it is spawned (`supervisor.run.forked`)
and named on its command line. A request written before the connection that asks for the
fork is there to read when the server forks: the pipe is in order, and the supervisor
sends one request and one fork at a time.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from queue_worker.worker.config import WorkerConfig
    from queue_worker.worker.inherited import Prefold, StartingFold

#: the most queues one fork server keeps a fold of (a partitioned queue has one each)
MAX_FOLDS: Final = 64
#: how long the server waits for the supervisor's first line before its loop (`install`)
FIRST_WORD_WAIT_S: Final = 1.0


# -- the supervisor's side -----------------------------------------------------------------------


def can_prefold(location: str) -> bool:
    """Whether a fork server folds this queue for its workers: a queue of files (a Redis
    worker reads over the network, and a fork would share the server's connection). Here,
    not beside the fold (queue_worker.worker.inherited): with the checkpoint's imports (secrets,
    hashlib) that module is ~16 ms of the supervisor's CPU before its first fork, and the
    supervisor itself never folds."""
    from logstore.location import is_redis_url

    return not is_redis_url(location)


def request(control_fd: int, config: WorkerConfig) -> None:
    """Ask the fork server to fold `config`'s queue for the worker it forks next."""
    _send(control_fd, config.location, config.slots, warm=False)


def warm(control_fd: int, location: str, slots: int) -> None:
    """Ask the fork server to fold `location`'s queue for `slots` workers: `request`, and
    what `qw up` sends as soon as it knows its queue, so that a server ready before the
    supervisor folds while the supervisor makes ready (`install`)."""
    _send(control_fd, location, slots, warm=True)


def _send(control_fd: int, location: str, slots: int, *, warm: bool) -> None:
    message: dict[str, object] = {"location": None}
    if can_prefold(location):
        message = {"location": location, "path": os.path.abspath(location), "slots": slots}
    if warm:
        message["warm"] = True  # no fork asked for with it (`fork_asked`)
    with contextlib.suppress(BlockingIOError, BrokenPipeError):  # then the worker folds
        os.write(control_fd, json.dumps(message).encode() + b"\n")


# -- the fork server's side ----------------------------------------------------------------------

_server_pid: int | None = None
_control_fd: int | None = None
_folds: dict[str, Prefold] = {}
#: what `_first_fold` read from the control pipe (`_last_request` reads it first)
_unread = b""
#: the fold made for the fork under way (read by the child through `take`)
_inherited: StartingFold | None = None


def install(control_fd: int) -> None:
    """In the fork server: fold the requested queue before each fork; and first, the queue
    of the supervisor's first word, as soon as it comes (`_first_fold`)."""
    global _server_pid, _control_fd
    _server_pid, _control_fd = os.getpid(), control_fd
    os.register_at_fork(before=_before_fork)
    _first_fold(control_fd)
    os.set_blocking(control_fd, False)


def _first_fold(control_fd: int) -> None:
    """Wait for the supervisor's first word (`warm`, or the first fork's `request`: every
    fork is asked for after one) and fold that queue now, before the server's loop: when
    the server has imported the worker code before the supervisor is ready to fork (the
    usual case: it is started first thing, and `qw up` warms it as soon as it knows its
    queue), the fold is made while the supervisor makes ready, not after it asks. The
    words read stay for `_last_request`. EOF (the supervisor gone): the loop sees it too."""
    global _unread
    import select

    with contextlib.suppress(OSError):
        # (bounded: a fork asked for by other means than `request` is never held up long)
        if select.select([control_fd], [], [], FIRST_WORD_WAIT_S)[0]:
            _unread = os.read(control_fd, 65536)
    wanted = _parse(_unread)
    if wanted is not None:
        with contextlib.suppress(Exception):  # the fork's own refresh meets it again
            _prefold(*wanted).refresh(wanted[2])


def fork_asked() -> bool:
    """In the fork server, after `install`: whether a fork may already be asked for (a
    request read or waiting in the control pipe), so that the server is not idle."""
    import select

    assert _control_fd is not None
    if not all(_is_warm(line) for line in _unread.splitlines()):
        return True
    try:
        return bool(select.select([_control_fd], [], [], 0)[0])
    except OSError:
        return True


def _is_warm(line: bytes) -> bool:
    """Whether a control-pipe line is a `warm` (no fork asked for with it)."""
    try:
        message = json.loads(line)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("warm") is True


def _prefold(location: str, path: str, slots: int) -> Prefold:
    from queue_worker.worker.inherited import Prefold

    prefold = _folds.get(location)
    if prefold is None:
        if len(_folds) >= MAX_FOLDS:
            _folds.pop(next(iter(_folds))).close()
        prefold = _folds[location] = Prefold(location, path)
    return prefold


def _last_request() -> tuple[str, str, int] | None:
    """The last request in the control pipe (None: no request, or "fold nothing")."""
    global _unread
    assert _control_fd is not None
    data, _unread = _unread, b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(_control_fd, 65536):
            data += chunk
    return _parse(data)


def _parse(data: bytes) -> tuple[str, str, int] | None:
    """The last request in `data` (None: none, or "fold nothing")."""
    lines = data.splitlines()
    if not lines:
        return None
    try:
        message = json.loads(lines[-1])
        location, path, slots = message["location"], message.get("path"), message.get("slots")
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(location, str) or not isinstance(path, str) or not isinstance(slots, int):
        return None
    return location, path, max(1, slots)


def _before_fork() -> None:
    global _inherited
    if os.getpid() != _server_pid:
        return  # a worker's own fork (its handler's): nothing of ours
    _inherited = None
    try:
        wanted = _last_request()
    except OSError:
        return
    if wanted is None:
        return
    location, path, slots = wanted
    prefold = _prefold(location, path, slots)
    try:
        _inherited = prefold.refresh(slots)
    except Exception:
        # Whatever it is (a log not yet created, damage, a refused checkpoint), the worker
        # meets it again in its own start, which says so in its log: here it is only a
        # fold the worker will not get. The next fork starts the fold again.
        _folds.pop(location).close()
        return
    gc.freeze()  # what the fork copies is left alone by the child's collections


# -- the worker's side ---------------------------------------------------------------------------


def take(location: str) -> StartingFold | None:
    """In a forked worker: the fold inherited from the fork server if it is of `location`'s
    queue (None otherwise), once; the server's log handles and control pipe are closed."""
    global _inherited, _control_fd
    fold, _inherited = _inherited, None
    if _control_fd is not None and _server_pid is not None and os.getpid() != _server_pid:
        os.close(_control_fd)
        _control_fd = None
    for prefold in _folds.values():
        prefold.close()  # this process's copies of the server's handles (never used here)
    _folds.clear()
    if fold is None or fold.location != location:
        return None
    return fold


__all__ = ["install", "request", "take"]
