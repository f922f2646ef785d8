"""Worker processes forked from a fork server that has already imported the worker code.

A fresh interpreter per worker (``python -m queue_worker.process``) costs ~0.2 s of CPU
before it does any work: 8 of them on 2 cores delay the first claim by seconds, and every
restart after a kill -9 pays it again. Instead the supervisor starts one helper process
(`multiprocessing`'s fork server, preloaded with `supervisor.run.forkserver_init`) and asks it
to fork each worker: a fork is a few milliseconds.

Who is whose parent, and why nothing outlives the supervisor:
  supervisor ──▶ fork server (its own session: a terminal's Ctrl-C or hang-up does not
                 reach it) ──▶ workers (each in a session of its own, as before)
  - the fork server exits when the supervisor does, even by kill -9: it watches a pipe
    whose only write end the supervisor holds (each worker closes its copy at once);
  - a worker dies with the fork server (PR_SET_PDEATHSIG, and the watchdog of
    `queue_worker.process` comparing getppid() with the fork server's pid).
The workers are not the supervisor's children, so waitpid does not apply: the fork server
reaps them and writes each one's exit code (negative: the signal that ended it, as
`subprocess.Popen` says it) to a pipe per worker, which `ForkedWorker.poll` reads.

No resource tracker is started for them: multiprocessing's fork server starts one (a
third interpreter, ~65 ms of CPU while the supervisor and the server import theirs, on
two cores) to hand each child; a forked worker instead starts its own the first time it
needs one, as a `python -m` worker does (a handler's named semaphores, shared memory).

The config travels pickled through that pipe, never on a command line (a Redis password
stays out of `ps`); every forked worker's command line is the fork server's.

The server also folds the queue's logs before each fork, and the worker inherits that fold
instead of folding them itself (supervisor.run.prefold): before each fork the supervisor writes
which queue the worker is for to a control pipe, whose read end the server is given as it
is spawned (`_control_pipe`).

`start_worker(..., fork=False)` starts a worker as a plain subprocess instead
(`ExecWorker`: `queue_worker.process.worker_command`), the way other programs start
one: for the tests that need a worker that inherits nothing from the fork server
(tests/qw_run.py starts `qw up` so).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import signal
import sys
import threading
import weakref
from multiprocessing import forkserver, popen_forkserver, reduction, resource_tracker, spawn, util
from multiprocessing.context import set_spawning_popen
from multiprocessing.process import BaseProcess, current_process
from multiprocessing.util import Finalize
from typing import TYPE_CHECKING, Final, Protocol

from supervisor.run import early_server
from supervisor.run.early_server import preload_modules

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from pathlib import Path

    from queue_worker.worker.config import WorkerConfig

# This module imports no worker code itself: `start_server` is called first thing by
# `qw up`, so that the server imports the worker code while the supervisor imports its own.
# Nor anything else the server's start does not need (dataclasses, subprocess: ~15 ms of
# CPU before the server is started, measured): what only a worker's start uses is imported
# there.

#: preparation data a forked worker does not take from the supervisor: its __main__ (the
#: qw script, or pytest's, would be run again in every worker) and its argv (which may hold
#: a password given on the command line)
_NOT_INHERITED: Final = ("init_main_from_name", "init_main_from_path", "sys_argv")


class WorkerHandle(Protocol):
    """A running worker process as the supervisor holds it."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None:
        """The exit code once it has ended (negative: the signal), else None."""
        ...

    def wait(self, timeout: float | None = None) -> int | None:
        """`poll` after waiting up to `timeout` seconds for the end."""
        ...

    @property
    def sentinel(self) -> int | None:
        """A file descriptor readable once the process has ended (None: poll instead)."""
        ...


def start_worker(config: WorkerConfig, log_path: Path, *, fork: bool = True) -> WorkerHandle:
    """Start a worker for `config`, its stdout and stderr appended to `log_path`: forked
    from the fork server, or (`fork=False`) a plain subprocess."""
    if fork:
        return ForkedWorker(config, log_path)
    return ExecWorker(config, log_path)


def start_server(*, redis: bool = False) -> int:
    """Start the fork server if it is not running (it then imports the worker code while
    the caller goes on; with `redis`, the Redis log's too), and return its pid."""
    with _server_lock:
        _adopt(early_server.take())
        forkserver.set_forkserver_preload(preload_modules(redis))
        with _no_resource_tracker(), _control_pipe():
            forkserver.ensure_running()  # also restarts one that died
        pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    assert isinstance(pid, int), "multiprocessing's fork server has no pid"
    return pid


def warm_server(location: str, slots: int) -> None:
    """Tell the fork server (if one runs for us) the queue its workers will be for, so
    that it folds it while we make ready (supervisor.run.prefold.warm)."""
    from supervisor.run.prefold import warm

    with _server_lock:
        _adopt(early_server.take())
        with _control_lock:
            if _control_w is not None:
                warm(_control_w, location, slots)


def _adopt(early: early_server.EarlyServer | None) -> None:
    """Make the server `qw up` started before multiprocessing was imported (early_server)
    multiprocessing's own, as `ForkServer.ensure_running` would have made it."""
    global _control_w
    if early is None:
        return
    server = forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is not None:  # (never: one start per process)
        os.close(early.alive_w)
        os.close(early.control_w)
        return
    server._forkserver_address = early.address  # type: ignore[attr-defined]
    server._forkserver_alive_fd = early.alive_w  # type: ignore[attr-defined]
    server._forkserver_pid = early.pid  # type: ignore[attr-defined]
    server._preload_modules = early.preload  # type: ignore[attr-defined]
    # util.get_temp_dir's directory, removed at exit as multiprocessing removes its own
    if current_process()._config.get("tempdir") is None:  # type: ignore[attr-defined]
        import shutil

        current_process()._config["tempdir"] = early.tempdir  # type: ignore[attr-defined]
        Finalize(None, util._remove_temp_dir, args=(shutil.rmtree, early.tempdir),  # type: ignore[attr-defined]
                 exitpriority=-100)  # fmt: skip
    with _control_lock:
        _close_control()
        _control_w = early.control_w


def stop_server() -> None:
    """Stop the fork server unless a worker it forked for us still runs: so that nothing
    of a supervisor outlives it, even by a moment. The next `start_worker` starts a new
    server."""
    with _server_lock:  # never while another thread starts the server or forks from it
        _stop_unlocked()


def _stop_unlocked() -> None:
    if any(worker.poll() is None for worker in list(_forked)):
        return  # a worker dies with its server: another supervisor's workers may run here
    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if not isinstance(pid, int) or not isinstance(alive_fd, int):
        return
    os.close(alive_fd)
    _close_control()
    for name in ("_forkserver_alive_fd", "_forkserver_address", "_forkserver_pid"):
        setattr(server, name, None)
    # It has no worker left to fork for or to take down with it: rather than wait for it to
    # read EOF and tear down an interpreter full of modules (~50 ms), end it now.
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    # (its listener's socket stays in multiprocessing's directory, removed with it at exit:
    # by multiprocessing's exit handler, or by `qw up` itself, which ends with os._exit)


@contextlib.contextmanager
def _no_resource_tracker() -> Iterator[None]:
    """multiprocessing's fork server without its resource tracker (module docstring): it
    starts none, and hands each child a descriptor of /dev/null in the tracker's place,
    which `run_forked_worker` closes at once. Only these two module functions are
    replaced, and only here: the tracker of this process itself is untouched."""
    global _null_fd
    with _tracker_lock:  # (two threads starting workers must not restore each other's)
        if _null_fd is None:
            _null_fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        null_fd = _null_fd
        saved = resource_tracker.ensure_running, resource_tracker.getfd
        resource_tracker.ensure_running = lambda: None
        resource_tracker.getfd = lambda: null_fd
        try:
            yield
        finally:
            resource_tracker.ensure_running, resource_tracker.getfd = saved


@contextlib.contextmanager
def _control_pipe() -> Iterator[None]:
    """A fork server spawned meanwhile gets the read end of a new control pipe (its number
    last on the server's command line: `supervisor.run.forkserver_init` reads it there), and
    we keep the write end (`_control_w`) for the fold requests (supervisor.run.prefold)."""
    saved = util.spawnv_passfds

    def spawn_with_pipe(path: bytes, args: Sequence[str], passfds: Sequence[int]) -> int:
        global _control_w
        read_end, write_end = os.pipe()
        try:
            pid = saved(path, [*args, str(read_end)], [*passfds, read_end])
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        _close_control()  # the previous server's, if it died
        os.set_blocking(write_end, False)  # a server that stopped reading never blocks us
        _control_w = write_end
        return pid

    with _control_lock:
        util.spawnv_passfds = spawn_with_pipe  # type: ignore[assignment]
        try:
            yield
        finally:
            util.spawnv_passfds = saved


def _close_control() -> None:
    global _control_w
    if _control_w is not None:
        os.close(_control_w)
        _control_w = None


#: the write end of the running fork server's control pipe (see _control_pipe)
_control_w: int | None = None
_control_lock = threading.Lock()
#: Held by whatever reads or changes the one fork server multiprocessing keeps for this
#: process (`forkserver._forkserver`): its adoption, its start, each fork (its fold request,
#: then the fork that takes it: supervisor.run.prefold) and its stop. The supervisors of a
#: partitioned queue share that server from threads of their own: one that drained calls
#: `stop_server` while another's worker is being forked. `ForkServer`'s own lock guards
#: `ensure_running` only, not `connect_to_new_process` nor the fields `_adopt` and
#: `stop_server` set, and a worker in the middle of its fork is not yet in `_forked`, so
#: without this lock the server was killed and its alive fd closed under that fork
#: (EBADF, a None fd in `sendfds`, "no pid" in `start_server`). Reentrant:
#: `ForkedWorker` holds it across `start_server`.
_server_lock = threading.RLock()
#: what each forked worker gets in the resource tracker's place (see _no_resource_tracker)
_null_fd: int | None = None
_tracker_lock = threading.Lock()
#: the workers forked for this process (a worker is forgotten once its handle is)
_forked: weakref.WeakSet[ForkedWorker] = weakref.WeakSet()


class ForkedWorker:
    """A worker forked by the fork server."""

    def __init__(
        self, config: WorkerConfig, log_path: Path, entry: Callable[[str, str], None] | None = None
    ) -> None:
        """`entry`: what the child runs, given the config as JSON and `log_path` as a str
        (`run_forked_worker`, unless a test looks at what a fork inherits); a module-level
        function, which the child imports by name."""
        # Its watchdog compares getppid() with its parent: the fork server, not us.
        from dataclasses import replace

        from logstore.location import is_redis_url
        from supervisor.run.prefold import request

        redis = is_redis_url(config.location)
        #: `stop_server` polls every worker here from whichever supervisor's thread calls it,
        #: while the worker's own supervisor polls it too: the exit code is one read from a
        #: pipe, and of two threads reading it at once the loser would read EOF (255)
        self._poll_lock = threading.Lock()
        with _server_lock:
            config = replace(config, parent_pid=start_server(redis=redis))
            process = _WorkerProcess(
                target=entry or run_forked_worker,
                name=config.name,
                args=(config.to_json(), str(log_path)),
            )
            if _control_w is not None:
                request(_control_w, config)  # the fold the server makes before this fork
            self._popen = _Popen(process)
            _forked.add(self)  # before `stop_server` can look: it keeps the server for us

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the worker has ended."""
        return self._popen.sentinel

    def poll(self) -> int | None:
        with self._poll_lock:
            return self._popen.poll(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int | None:
        from multiprocessing.connection import wait

        if self.poll() is None:
            wait([self.sentinel], timeout)  # (not under the lock: a poll never waits)
        return self.poll()


class ExecWorker:
    """A worker started as a plain subprocess (``python -m queue_worker.process …``)."""

    def __init__(self, config: WorkerConfig, log_path: Path) -> None:
        import subprocess

        from queue_worker.process import worker_command

        command, env = worker_command(config)  # a password stays off the command line
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a terminal's Ctrl-C reaches the supervisor only
            )

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def sentinel(self) -> None:
        return None  # only polling says when it ended

    def poll(self) -> int | None:
        return self._process.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        import subprocess  # (imported by __init__ already)

        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


class _WorkerProcess(BaseProcess):
    """The process object the fork server's child runs (`_Popen` starts it). No start
    method of its own: in the worker, multiprocessing's default stays the platform's."""

    _start_method = None


class _Popen(popen_forkserver.Popen):
    """CPython's fork-server Popen, but the child gets neither our __main__ nor our argv."""

    def _launch(self, process_obj: BaseProcess) -> None:  # as in CPython 3.11
        prep_data = spawn.get_preparation_data(process_obj.name)
        for key in _NOT_INHERITED:
            prep_data.pop(key, None)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        with _no_resource_tracker():
            self.sentinel, w = forkserver.connect_to_new_process([])
        # The child knows its parent is gone (EOF) when the last copy of this end closes.
        parent_w = os.dup(w)
        self.finalizer = Finalize(self, _close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def run_forked_worker(config_json: str, log_path: str) -> None:
    """What a forked worker runs (in the child, right after the fork)."""
    os.setsid()  # a session of its own, as `start_new_session`: kill -9 reaches its group
    # The fork server exits when its last holder of this pipe end does: a worker must not
    # be one, or a supervisor killed with kill -9 would leave the server (and us) behind.
    alive_fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if isinstance(alive_fd, int):
        os.close(alive_fd)
        forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]
    # No resource tracker came with the fork (_no_resource_tracker): like a fresh process,
    # the worker starts its own if it ever needs one.
    tracker = resource_tracker._resource_tracker
    tracker_fd = getattr(tracker, "_fd", None)
    if isinstance(tracker_fd, int):
        os.close(tracker_fd)
        tracker._fd = None  # type: ignore[attr-defined]
    _redirect_output(log_path)
    from queue_worker.process import run_worker_process  # preloaded by the server
    from queue_worker.worker.config import WorkerConfig
    from supervisor.run.prefold import take

    try:
        location = WorkerConfig.from_json(config_json).location
    except ValueError:
        location = None  # run_worker_process says what is wrong with it
    start = take(location) if location is not None else None
    try:
        run_worker_process(config_json, start=start)
    finally:
        # The fork server's child ends with os._exit: run the atexit functions (a handler's
        # own among them) as the end of a `python -m` worker would.
        atexit._run_exitfuncs()


def _redirect_output(log_path: str) -> None:
    """stdin from /dev/null; stdout and stderr appended to the worker's log (fds 0–2, so
    the handler's own subprocesses inherit them too)."""
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    # The fork server's SIGTERM/SIGHUP dispositions are not a worker's: start from defaults.
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


__all__ = [
    "ExecWorker",
    "ForkedWorker",
    "WorkerHandle",
    "run_forked_worker",
    "start_server",
    "stop_server",
    "start_worker",
    "warm_server",
]
