"""The worker process: what ``python -m queue_worker.process '<config JSON>'`` runs.

`run_worker_process(config_json)` parses the config, makes sure the process dies with its
supervisor (PDEATHSIG on Linux, and a watchdog thread everywhere), drains on SIGTERM,
exits at once on a second SIGTERM, ignores SIGINT (the supervisor owns Ctrl-C), and runs the
queue's worker (`queue_worker.opening.open_worker`) until it stops; the reason for a
failure goes to stderr in one line and the exit code says which kind it was (EXIT_*). The
supervisor forks its workers from a fork server that calls `run_worker_process`
(supervisor.run.forked); `worker_command` is the one command line that starts a worker as a
plain subprocess (the fallback, demos, benches, tests).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from logstore import LogError, is_redis_url
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.watchdog import EXIT_TIME_LIMIT

if TYPE_CHECKING:
    from queue_worker.worker.base import WorkerBase
    from queue_worker.worker.inherited import StartingFold

# The worker itself is imported when a worker process starts (or by the fork server, ahead
# of time), not by whoever wants only an exit code or the command line.

# Exit codes of a worker process.
EXIT_OK: Final = 0  # drained, stopped, or the queue was drained (exit_when_drained)
EXIT_ERROR: Final = 1  # the worker failed: a log out of reach, or a bug (message on stderr)
EXIT_CONFIG: Final = 2  # the config is invalid or the handler cannot be loaded
EXIT_ORPHANED: Final = 3  # the supervisor is gone: exit rather than outlive it
#: a log it cannot use, damaged or another queue's (`queue_worker.worker.lease.FATAL_LOG_ERRORS`):
#: a restart would meet it again, so the supervisor stops the run (message on stderr)
EXIT_LOG_UNUSABLE: Final = 4
# EXIT_TIME_LIMIT (124, as timeout(1)): a task ran past its time limit (or a drain's): its
# FAIL was written, and the process ended because a thread cannot be stopped (watchdog.py)
EXIT_TERMINATED: Final = 128 + signal.SIGTERM  # a second SIGTERM: exit at once

#: how often the orphan watchdog compares getppid() with the supervisor's pid
WATCHDOG_PERIOD_S: Final = 0.2

PARENT_PID_ENV: Final = "QW_PARENT_PID"

#: where `worker_command` puts a config that must not be on the command line
CONFIG_ENV: Final = "QW_WORKER_CONFIG"

PR_SET_PDEATHSIG: Final = 1


def _die_with_parent(parent_pid: int) -> None:
    """Exit when the supervisor dies, even by kill -9: the kernel sends us SIGKILL (Linux),
    and a watchdog thread notices a changed parent within WATCHDOG_PERIOD_S as a fallback
    (other systems; and PDEATHSIG fires when the parent *thread* that started us exits)."""
    if sys.platform.startswith("linux"):
        import ctypes  # here: the supervisor imports this module for its exit codes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    # Checked after prctl: a parent that died before it took effect is caught here.
    if os.getppid() != parent_pid:
        os._exit(EXIT_ORPHANED)

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_PERIOD_S)
            if os.getppid() != parent_pid:
                os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="orphan-watchdog", daemon=True).start()


def _parent_pid(config: WorkerConfig) -> int:
    if config.parent_pid is not None:
        return config.parent_pid
    env = os.environ.get(PARENT_PID_ENV)
    if env is not None and env.isdigit():
        return int(env)
    return os.getppid()


def run_worker_process(config_json: str, start: StartingFold | None = None) -> None:
    """The worker process: parse the config, guard against orphaning, handle signals, run.
    `start`: a fold of the queue inherited from the fork server (see `open_worker`).

    Returns on a clean exit (drained, or the queue drained with exit_when_drained); raises
    SystemExit with one of the EXIT_* codes otherwise, the reason on stderr in one line.
    """
    from queue_worker.opening import open_worker
    from queue_worker.protocol.clock import offset_clock, seconds_to_us
    from queue_worker.protocol.records import error_text

    stop = threading.Event()
    terms = 0
    worker: WorkerBase | None = None

    def on_sigterm(signum: int, frame: object) -> None:
        nonlocal terms
        terms += 1
        if terms > 1:
            os._exit(EXIT_TERMINATED)
        stop.set()
        if worker is not None:
            worker.drain()

    # Signals first: a SIGTERM while the logs are opening still means "drain".
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        config = WorkerConfig.from_json(config_json)
        config.validate()
    except ValueError as e:
        print(f"qw worker: invalid config: {e}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    _die_with_parent(_parent_pid(config))
    try:
        clock = offset_clock(seconds_to_us(config.clock_offset_s))
        worker = open_worker(config, clock=clock, start=start)
    except ValueError as e:  # the handler cannot be loaded, or the pick is refused
        print(f"qw worker {config.name}: {e}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    except LogError as e:
        print(f"qw worker {config.name}: {e}", file=sys.stderr)
        raise SystemExit(_log_exit(e)) from None
    if stop.is_set():
        worker.drain()
    code = EXIT_OK
    try:
        with worker:
            worker.run(stop)
    except LogError as e:
        print(f"qw worker {worker.worker_id}: {e}", file=sys.stderr)
        code = _log_exit(e)
    except Exception as e:
        traceback.print_exc()
        print(f"qw worker {worker.worker_id}: crashed: {error_text(e)}", file=sys.stderr)
        code = EXIT_ERROR
    _exit_past_left_threads(worker.worker_id, code)
    if code != EXIT_OK:
        raise SystemExit(code)


def _exit_past_left_threads(worker_id: str, code: int) -> None:
    """End the process now, with `code`, when threads a handler started are still running:
    the interpreter's exit would wait for every non-daemon one, and a thread that never
    ends would keep a worker that has finished its last task alive, deaf to a drain. (The
    process is the worker's, not the handler's.) The atexit functions run first, as at a
    normal exit; without such threads, nothing happens here."""
    current = threading.current_thread()
    left = [t for t in threading.enumerate() if t is not current and not t.daemon]
    if not left:
        return
    names = ", ".join(sorted(t.name for t in left))
    print(
        f"qw worker {worker_id}: exiting past {len(left)} thread(s) its handler left "
        f"running ({names})",
        file=sys.stderr,
    )
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _log_exit(error: LogError) -> int:
    """The exit code for a log error that ended the worker."""
    from queue_worker.worker.lease import FATAL_LOG_ERRORS

    return EXIT_LOG_UNUSABLE if isinstance(error, FATAL_LOG_ERRORS) else EXIT_ERROR


__all__ = [
    "EXIT_CONFIG",
    "EXIT_ERROR",
    "EXIT_LOG_UNUSABLE",
    "EXIT_OK",
    "EXIT_ORPHANED",
    "EXIT_TERMINATED",
    "EXIT_TIME_LIMIT",
    "main",
    "run_worker_process",
    "worker_command",
]


def worker_command(config: WorkerConfig) -> tuple[list[str], dict[str, str] | None]:
    """How to start a worker process for `config`: its command line, and its environment
    (None: the caller's). A config whose log URL holds a password travels in the environment
    (which only its user can read) instead of the command line (which `ps` shows everyone)."""
    command = [sys.executable, "-m", "queue_worker.process"]
    if not (is_redis_url(config.location) and urlsplit(config.location).password is not None):
        return [*command, config.to_json()], None
    return command, {**os.environ, CONFIG_ENV: config.to_json()}


def main(argv: list[str]) -> int:
    if not argv and CONFIG_ENV in os.environ:
        config_json = os.environ.pop(CONFIG_ENV)  # not passed on to the handler's children
    elif len(argv) == 1:
        config_json = argv[0]
    else:
        print("usage: python -m queue_worker.process '<worker config JSON>'", file=sys.stderr)
        return EXIT_CONFIG
    run_worker_process(config_json)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
