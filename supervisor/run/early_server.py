"""multiprocessing's fork server, started by `qw up` before multiprocessing is imported.

The fork server is the first worker's critical path: it must start its interpreter and
import the worker code before it can fork anything. `multiprocessing.forkserver` (with
`multiprocessing.connection`, `util`, `subprocess`, `tempfile`, `socket`, `pickle`) costs
the supervisor ~30 ms of CPU before the server can be started at all (~55 ms on a loaded
machine, measured with `python -X importtime`). `spawn` starts the very same server (the
same command line `ForkServer.ensure_running` builds, the same listener, "alive" pipe and
control pipe) with only `os` and `_socket`, first thing; `supervisor.run.forked` adopts it
(`take`) when it is imported, and from then on multiprocessing sees its own server
running: the same process, the same fds, the same clean-up of the listener's directory.

Nothing changes for the server or the workers: which process is whose parent, the alive
pipe whose end only the supervisor holds (the server exits at its EOF, even after a kill
-9 of the supervisor), the server's own session (supervisor.run.forkserver_init).

Whenever this cannot be done (a temporary directory that cannot be made, a listener that
cannot be bound, a fork refused), `spawn` returns False and `supervisor.run.forked.start_server`
starts the server the ordinary way.
"""

from __future__ import annotations

import contextlib
import os
import sys

TYPE_CHECKING = False  # (typing itself costs ~5 ms before the server could be started)
if TYPE_CHECKING:
    from typing import Final

#: what the fork server imports before it forks anything (see forkserver_init.py), and
#: last, what makes it wait for the supervisor's first word (forkserver_ready.py)
PRELOAD: Final = ["supervisor.run.forkserver_init", "supervisor.run.forkserver_ready"]
#: ... and for a queue on Redis: the Redis log and the server verdicts' claiming (redis-py
#: costs ~0.25 s of CPU to import: once here, not once in every worker after its fork),
#: before that wait
REDIS_PRELOAD: Final = ["logstore.redis.log", "queue_worker.redis.server_worker"]


def preload_modules(redis: bool) -> list[str]:
    """The fork server's preload for a queue of files, or on Redis."""
    if not redis:
        return list(PRELOAD)
    return [*PRELOAD[:-1], *REDIS_PRELOAD, *PRELOAD[-1:]]


#: multiprocessing.forkserver.ForkServer.ensure_running's command (CPython 3.10-3.13)
_COMMAND: Final = "from multiprocessing.forkserver import main; main(%d, %d, %r, **%r)"
#: sys.flags that `subprocess._args_from_interpreter_flags` turns into options (when all
#: are 0, and there are no -W or -X options, it returns none)
_FLAGS: Final = (
    "debug",
    "dont_write_bytecode",
    "no_user_site",
    "no_site",
    "verbose",
    "bytes_warning",
    "quiet",
    "optimize",
    "isolated",
    "ignore_environment",
    "safe_path",
    "dev_mode",
)


class EarlyServer:
    """A started fork server, as `ForkServer` keeps one (and the control pipe's write end)."""

    def __init__(
        self, pid: int, address: str, alive_w: int, control_w: int, preload: list[str], tempdir: str
    ) -> None:
        self.pid = pid
        self.address = address
        self.alive_w = alive_w
        self.control_w = control_w
        self.preload = preload
        self.tempdir = tempdir


_started: EarlyServer | None = None


def spawn(preload: list[str]) -> bool:
    """Start the fork server with `preload`; True if started (`take` hands it over)."""
    global _started
    if _started is not None:
        return True
    if not (3, 10) <= sys.version_info[:2] <= (3, 13):
        # the server's command line and state are those of CPython 3.10-3.13 (3.14's
        # server also authenticates its clients): elsewhere multiprocessing starts it
        return False
    try:
        _started = _spawn(preload)
    except OSError:
        return False
    return True


def _interpreter_flags() -> list[str]:
    """The options multiprocessing gives its server: this interpreter's own (-B, -O, -X …;
    none, usually: then subprocess, ~10 ms, is not imported for them)."""
    if sys.warnoptions or sys._xoptions or any(getattr(sys.flags, f, 0) for f in _FLAGS):
        import subprocess

        return subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined,no-any-return]
    return []


def take() -> EarlyServer | None:
    """The server `spawn` started, once (None: none was)."""
    global _started
    server, _started = _started, None
    return server


def _spawn(preload: list[str]) -> EarlyServer:
    import _socket

    # util.get_temp_dir's directory (tempfile.mkdtemp(prefix="pymp-")), in $TMPDIR or /tmp
    # (multiprocessing removes it at exit once adopted; `_remove` if it never is)
    base = os.environ.get("TMPDIR") or "/tmp"
    # (names as long as multiprocessing's: a socket's path has ~107 bytes at most)
    tempdir = os.path.join(base, "pymp-" + os.urandom(4).hex())
    os.mkdir(tempdir, 0o700)
    address = os.path.join(tempdir, "listener-" + os.urandom(4).hex())
    listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    opened: list[int] = []
    try:
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        opened += [alive_r, alive_w]
        control_r, control_w = os.pipe()
        opened += [control_r, control_w]
        # spawn.get_preparation_data's sys.path: "" is the directory we started in
        sys_path = [os.path.abspath(os.getcwd()) if p == "" else p for p in sys.path]
        command = _COMMAND % (listener.fileno(), alive_r, preload, {"sys_path": sys_path})
        # the control pipe's read end last (supervisor.run.forked._control_pipe)
        args = [sys.executable, *_interpreter_flags(), "-c", command, str(control_r)]
        pid = _fork_exec(args, (listener.fileno(), alive_r, control_r))
    except BaseException:
        for fd in opened:
            os.close(fd)
        _remove(tempdir)
        raise
    finally:
        listener.close()  # the server's now, not ours (and ours on a failure)
    os.close(alive_r)
    os.close(control_r)
    os.set_blocking(control_w, False)  # a server that stopped reading never blocks us
    import atexit

    atexit.register(_remove, tempdir)  # (a no-op once multiprocessing removed it)
    return EarlyServer(pid, address, alive_w, control_w, list(preload), tempdir)


def _fork_exec(args: list[str], passfds: tuple[int, ...]) -> int:
    """fork + exec `args` with only stdin, stdout, stderr and `passfds` open, as
    `multiprocessing.util.spawnv_passfds` does (this process has no thread yet)."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: nothing but closing, then exec
        for fd in passfds:
            os.set_inheritable(fd, True)
        low = 3
        for fd in sorted(passfds):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, os.sysconf("SC_OPEN_MAX"))
        os.execv(args[0], args)
    finally:
        os._exit(127)


def _remove(tempdir: str) -> None:
    with contextlib.suppress(OSError):
        for name in os.listdir(tempdir):
            os.unlink(os.path.join(tempdir, name))
        os.rmdir(tempdir)


__all__ = [
    "PRELOAD",
    "REDIS_PRELOAD",
    "EarlyServer",
    "preload_modules",
    "spawn",
    "take",
]
