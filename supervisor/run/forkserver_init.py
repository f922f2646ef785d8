"""Imported by the fork server only (`supervisor.run.forked.PRELOAD`), never by the supervisor.

It leaves the supervisor's session, so that a Ctrl-C, a terminal's hang-up or a signal to
the supervisor's process group reaches the supervisor (which then drains the workers in
order) and not the server (whose death would kill every worker at once). Then it imports
the worker code, once, for every worker it will fork (what no worker needs before its
first claim: once the first is forked). The fold it makes before each fork is installed
by `supervisor.run.forkserver_ready`, preloaded last.
"""

from __future__ import annotations

import contextlib
import os

with contextlib.suppress(OSError):  # already a session leader
    os.setsid()

# The whole worker, the file log included (a worker opens its log, and so imports it, late).
# ctypes too: `logstore.file.waiting` imports it only when a waiter is made (the small commands
# make none), and every worker makes one.
import ctypes  # noqa: F401

import logstore.file.log  # noqa: F401


def import_late() -> None:
    """filelock, imported by the server when it is idle before its first fork
    (`supervisor.run.forkserver_ready`), or else once its first worker is forked
    (`_after_first_fork`): `logstore.locking` and `queue_worker.history.checkpoint` import it only
    when a lock is first taken (for the small commands' sake), and no worker takes one
    before its first claim, but slot 0's worker takes the checkpoint's at its exit
    (imported there, it kept a drained `qw up` from exiting for ~40 ms more). Imported
    while a fork is asked for, it costs that fork ~20 ms; after the first fork it held the
    second one up as long (the server answers a fork after its `after_in_parent` hooks), so
    it is imported while the server waits when it can be. The supervisor forks slot 0 last
    (`Supervisor.start`), so that slot 0 inherits it either way."""
    global _late_done
    if _late_done:
        return
    _late_done = True
    import filelock  # noqa: F401


def _after_first_fork() -> None:
    if os.getpid() == _server_pid:  # (not a worker's own fork: its handler's)
        import_late()


_server_pid = os.getpid()
_late_done = False
os.register_at_fork(after_in_parent=_after_first_fork)
