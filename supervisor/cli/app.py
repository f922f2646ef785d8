"""The `qw` command line: one typer app, thin command bodies over the supervisor and the logs.

    qw up        start workers on a data directory and watch them (dashboard or plain lines)
    qw enqueue   add tasks
    qw status, tail, task, kill      look at a directory      (supervisor.cli.inspect_commands)
    qw report, why, demo             replay and explain       (supervisor.cli.report_commands)
    qw replay                        step through a run       (supervisor.replay.cli)

Errors are one line on stderr, ``qw: error: …``, naming the bad value and what was expected,
with exit code 2 (typer's own usage errors are reshaped the same way by `main`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer

from logstore.location import is_redis_url
from queue_worker.compaction.settled import DEFAULT_RETENTION_BYTES, DEFAULT_RETENTION_S, Retention
from queue_worker.partition_layout import MAX_PARTITIONS
from queue_worker.worker.config import DEFAULT_DRAIN_TIMEOUT_S, DEFAULT_LEASE_S
from supervisor.cli import compact as compact_cli
from supervisor.cli import inspect_commands as inspect_cli
from supervisor.cli import option_parsers, retry_cli, small_commands
from supervisor.cli import partitioned_commands as partitioned_cli
from supervisor.cli import report_commands as report_cli
from supervisor.cli.help_format import WholeHelpGroup
from supervisor.cli.server_pick import check_pick
from supervisor.options import (
    DEFAULT_DIR,
    FSYNCS,
    MAX_WORKERS,
    PICKS,
    DirOption,
    LogOption,
    bad,
    fail,
    fail_os,
    host_name_option,
    location_of,
    one_of,
    real,
    shown,
    whole,
)
from supervisor.replay import cli as replay_cli
from supervisor.timeline import cli as timeline_cli
from supervisor.width import echo

if TYPE_CHECKING:
    from queue_worker.periodic import Ticker
    from supervisor.http_api import StatsServer
    from supervisor.run.supervisor import Supervisor, SupervisorOptions

# A command imports what it needs when it runs: `qw --help`, `qw status` or `qw enqueue`
# should not pay for the supervisor, the HTTP server or the worker code (see the bench's
# start section for the figures).

#: supervisor.run.supervisor.DEMO_HANDLER (a test checks they agree), not imported from there
DEMO_HANDLER: Final = "queue_worker.worker.handlers:demo"


app = typer.Typer(
    name="qw",
    help="qw: a task queue with no broker. Workers coordinate through two append-only logs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain layout: typer's panels cut names at 80 columns
    cls=WholeHelpGroup,  # …and help text wrapped without breaking a name (help_format)
)


# -- qw up -------------------------------------------------------------------------------------


def _start_fresh(directory: Path, location: str) -> None:
    """`--fresh`: the queue in `directory` removed (said on stderr), or one line why not."""
    if is_redis_url(location):
        fail(f"--fresh removes a data directory's queue, not one on {shown(location)}")
    from supervisor.run.fresh import FreshRefused, start_fresh

    try:
        echo(start_fresh(directory), err=True)
    except FreshRefused as e:
        fail(str(e))
    except OSError as e:
        fail_os(e, "remove it for --fresh")


@app.command(
    epilog="\b\nExamples:\n  qw up --workers 8\n  qw up --app myjobs\n  qw up --demo\n"
    "  qw up --tasks 200 --exit-when-drained --no-tui\n  qw up --http 8080"
)
def up(
    directory: DirOption = DEFAULT_DIR,
    workers: Annotated[
        int,
        typer.Option(
            parser=whole("a number of workers", 1, MAX_WORKERS),
            metavar="N",
            help="Worker processes.",
        ),
    ] = 4,
    handler: Annotated[
        str,
        typer.Option(
            help="The handler of payload tasks, module:function (one function).",
            metavar="MODULE:FUNCTION",
        ),
    ] = DEMO_HANDLER,
    app_module: Annotated[
        str | None,
        typer.Option(
            "--app",
            help="Run every task the module's queue registered (@queue.task), and enqueue "
            "its periodic tasks' ticks (@queue.periodic; not with --exit-when-drained). The "
            "module is imported from the current directory, as `python -c 'import MODULE'` "
            "would; MODULE:NAME names the queue when the module has several.",
            metavar="MODULE",
        ),
    ] = None,
    work_ms: Annotated[
        int,
        typer.Option(
            parser=whole("milliseconds", 0, 3_600_000),
            metavar="MS",
            help="The demo handler's work per task.",
        ),
    ] = 400,
    tasks: Annotated[
        int,
        typer.Option(
            parser=whole("a number of tasks", 0, 10_000_000),
            metavar="K",
            help="Demo tasks to enqueue at start.",
        ),
    ] = 0,
    demo: Annotated[
        bool,
        typer.Option(
            "--demo",
            help="Add demo tasks while running, at 80% of what the workers can do.",
        ),
    ] = False,
    rate: Annotated[
        float | None,
        typer.Option(
            parser=real("tasks per second", 0, 100_000),
            metavar="R",
            help="Add R demo tasks a second while running (implies --demo).",
        ),
    ] = None,
    lease: Annotated[
        float,
        typer.Option(
            parser=real("seconds", 0, 86_400, low_open=True),
            metavar="SECONDS",
            help="Each claim's lease: how long a killed worker's task waits before a "
            "survivor may take it over. The holder renews it at half time while the task "
            "runs, so a short lease is safe for long tasks.",
        ),
    ] = DEFAULT_LEASE_S,
    pick: Annotated[
        str | None,
        typer.Option(
            parser=one_of(*PICKS),
            metavar="|".join(PICKS),
            show_default=False,  # (None stands for it: a pick asked for can be refused)
            help="How a worker picks among claimable tasks. Refused on a Redis queue with "
            "server verdicts, where the server picks: orphans first, then the tasks in "
            "order.  [default: spread]",
        ),
    ] = None,
    max_attempts: Annotated[
        int,
        typer.Option(
            parser=whole("a number of attempts", 1, 1_000_000),
            metavar="N",
            help="Attempts a task gets; after the last one fails, the task is dead.",
        ),
    ] = 3,
    backoff: Annotated[
        float,
        typer.Option(
            parser=real("seconds", 0, 86_400),
            metavar="SECONDS",
            help="Backoff before the first retry; it doubles with each attempt (full jitter).",
        ),
    ] = 1.0,
    task_timeout: Annotated[
        float | None,
        typer.Option(
            parser=real("seconds", 0, 86_400 * 7, low_open=True),
            metavar="SECONDS",
            help="An attempt that runs longer fails (retried after a backoff, or dead on the "
            "last attempt) and its worker process is ended and restarted. A handler's own "
            "@time_limit wins. Default: no limit.",
        ),
    ] = None,
    drain_timeout: Annotated[
        float,
        typer.Option(
            parser=real("seconds", 0, 86_400 * 7, low_open=True),
            metavar="SECONDS",
            help="On a drain (Ctrl-C, SIGTERM, --exit-when-drained), how long a worker's "
            "task in hand may still run; then it ends as a time-out does.",
        ),
    ] = DEFAULT_DRAIN_TIMEOUT_S,
    restart: Annotated[bool, typer.Option(help="Restart workers that die.")] = True,
    fsync: Annotated[
        str,
        typer.Option(
            parser=one_of(*FSYNCS),
            metavar="|".join(FSYNCS),
            help="When log appends are forced to disk.",
        ),
    ] = "commit",
    http: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            help="Serve the live dashboard on / for a browser, and /health /stats "
            "/task/ID /metrics /timeline (loopback unless a host is named).",
        ),
    ] = None,
    http_control: Annotated[
        bool,
        typer.Option(
            "--http-control",
            help="Kill and pause buttons on the --http page, for whoever has the token "
            "qw up prints at start.",
        ),
    ] = False,
    no_tui: Annotated[bool, typer.Option("--no-tui", help="Plain lines, no dashboard.")] = False,
    exit_when_drained: Annotated[
        bool, typer.Option("--exit-when-drained", help="Exit 0 once no task is pending or held.")
    ] = False,
    log: LogOption = None,
    segment_bytes: compact_cli.SegmentBytesOption = None,
    retention: compact_cli.RetentionOption = DEFAULT_RETENTION_S,
    retention_bytes: compact_cli.RetentionBytesOption = DEFAULT_RETENTION_BYTES,
    host_name: Annotated[
        str | None,
        typer.Option(
            "--host-name",
            envvar="QW_HOST",
            show_envvar=True,
            parser=host_name_option,
            metavar="NAME",
            help="The host name the workers report (on --log, it is part of each worker "
            "id). Default: this machine's name.",
        ),
    ] = None,
    partitions: Annotated[
        int | None,
        typer.Option(
            parser=whole("a number of partitions", 1, MAX_PARTITIONS),
            metavar="P",
            help="Create the queue with P partitions (fixed at creation; default: as the "
            "queue was created, 1 for a new one). Each worker works one partition: at "
            "least P workers.",
        ),
    ] = None,
    rebalance: Annotated[
        bool,
        typer.Option(
            "--rebalance",
            help="On a partitioned queue: the workers are members that share the partitions "
            "with every other qw up --rebalance on the queue (any machine), rebalanced when "
            "one joins, dies or leaves.",
        ),
    ] = False,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start on an empty queue: remove the one in --dir first (the tasks a "
            "stopped run left pending with it). Only qw's own files are removed, and only "
            "when no qw up runs on the directory.",
        ),
    ] = False,
) -> None:
    """Start worker processes on a data directory and watch them.

    On a terminal a live dashboard shows the workers, the queue and the events (k kills a
    worker that holds a task, q drains). Without one (or with --no-tui) a status line is
    printed each second. Ctrl-C or SIGTERM drains (workers finish their task); a second
    one kills them now. Several qw up on one directory share its queue, and so do several
    on one --log URL, from as many machines (--host-name tells them apart).

    qw up works the queue it is given. Demo tasks come only when asked: --tasks K at
    start, --demo (or --rate R) while running.
    """
    if http_control and http is None:
        fail("--http-control needs --http HOST:PORT (the page its buttons are on)")
    location = location_of(directory, log)
    check_pick(location, pick)  # before anything is created
    if fresh:
        _start_fresh(directory, location)
    from supervisor.run.forked import warm_server

    warm_server(location, workers)  # the fork server folds the queue while we make ready
    from supervisor.run.supervisor import RestartPolicy, SupervisorOptions, default_demo_rate

    if exit_when_drained and (demo or rate):
        option, value = ("--rate", rate) if rate else ("--demo", True)
        bad(option, value, f"no {option} with --exit-when-drained (the queue would never drain)")
    if rate is None:  # demo traffic only when asked: without it, the workers work the queue
        rate = default_demo_rate(workers, work_ms) if demo else 0.0
    server_address = _parse_http(http)
    if app_module is not None:
        if handler != DEMO_HANDLER:
            bad("--app", app_module, "either --app or --handler, not both")
        _find_app(app_module)  # (before a partitioned queue is created for it)
        partitioned_cli.prepare(
            location,
            partitions,
            workers,
            rebalance=rebalance,
            http=http,
            http_address=server_address,
        )  # the app's Queue(location) opens the partitions: they must be there first
        handler = _app_handler(app_module)
    _check_handler(handler)
    ticker = None if app_module is None or exit_when_drained else _ticker(handler, location)
    token = _control_token() if http_control else None
    options = SupervisorOptions(
        data_dir=directory,
        location=location,
        workers=workers,
        handler=handler,
        work_ms=work_ms,
        lease_s=lease,
        pick=pick,
        fsync=fsync,
        max_attempts=max_attempts,
        backoff_s=backoff,
        task_timeout_s=task_timeout,
        drain_timeout_s=drain_timeout,
        tasks=tasks,
        rate=rate,
        exit_when_drained=exit_when_drained,
        restart=RestartPolicy(enabled=restart),
        host=host_name,
        segment_bytes=segment_bytes,
        retention=Retention(retention, retention_bytes),
    )
    try:
        code = partitioned_cli.up(
            options,
            partitions,
            http=http,
            http_address=server_address,
            control_token=token,
            rebalance=rebalance,
            tui=sys.stdout.isatty() and not no_tui,
            ticker=ticker,
        )
        if code is None:  # a queue without partitions
            code = _up_one(options, server_address, http, token, ticker, no_tui=no_tui)
    finally:
        if ticker is not None:
            ticker.queue.close()
    raise typer.Exit(code)


def _up_one(
    options: SupervisorOptions,
    server_address: tuple[str, int] | None,
    http: str | None,
    token: str | None,
    ticker: Ticker | None,
    *,
    no_tui: bool,
) -> int:
    """`qw up` on a queue without partitions: runs it and returns the exit code."""
    from supervisor.run.supervisor import Supervisor

    supervisor = Supervisor(options)
    location = options.location
    supervisor.location = shown(location)  # what the dashboard shows: no password
    server = None
    if server_address is not None:
        from supervisor.http_api import StatsServer
        from supervisor.web.control import ControlDesk

        desk = None if token is None else ControlDesk(supervisor, token)
        try:
            server = StatsServer(supervisor, *server_address, logs=location, control=desk)
        except OSError as e:
            bad("--http", http, f"an address this machine can listen on ({e.strerror})")
        supervisor.http_address = server.address
    if ticker is not None:
        ticker.start()
    try:
        return _run(supervisor, server, tui=sys.stdout.isatty() and not no_tui, token=token)
    finally:
        if ticker is not None:
            ticker.stop()


def _app_handler(text: str) -> str:
    """`--app MODULE[:NAME]` as the handler spec of the workers: "MODULE:NAME", the module's
    one Queue (`queue_worker.worker.handlers.load_handler` runs what it registered)."""
    import importlib

    from queue_worker.producer import Queue

    _cwd_on_path()
    module_name, _, name = text.partition(":")
    if not module_name:
        bad("--app", text, "a module name (MODULE or MODULE:QUEUE)")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or whatever the module raised
        bad(
            "--app",
            text,
            f"a module importable from the current directory {os.getcwd()} "
            f"(importing it raised {type(e).__name__}: {e})",
        )
    if name:
        if not isinstance(getattr(module, name, None), Queue):
            bad("--app", text, f"a Queue named {name!r} in module {module_name!r}")
        return text
    queues = sorted(n for n, v in vars(module).items() if isinstance(v, Queue))
    if len(queues) != 1:
        found = f"found {', '.join(queues)}" if queues else "found none"
        bad("--app", text, f"a module with one Queue ({found}); MODULE:NAME names one")
    return f"{module_name}:{queues[0]}"


def _find_app(text: str) -> None:
    """One line and exit 2 when `--app`'s module is not there (found, not yet imported)."""
    import importlib.util

    _cwd_on_path()
    module_name = text.partition(":")[0]
    try:
        found = bool(module_name) and importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        bad("--app", text, f"a module importable from the current directory {os.getcwd()}")


def _ticker(spec: str, location: str) -> Ticker | None:
    """What enqueues the ticks of the app's periodic tasks into the queue `qw up` works
    (None: it has none; a partitioned queue's Queue puts each tick in one partition)."""
    import importlib

    from queue_worker import Queue
    from queue_worker.periodic import Ticker

    module_name, _, name = spec.partition(":")
    app_queue = getattr(importlib.import_module(module_name), name)
    if not app_queue.schedules:
        return None
    return Ticker(Queue(location), app_queue.schedules)


def _cwd_on_path() -> None:
    # The worker runs `python -m`, which puts the working directory on sys.path: so here.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _check_handler(spec: str) -> None:
    from queue_worker.worker.handlers import HandlerLoadError, load_handlers

    _cwd_on_path()
    try:
        load_handlers(spec)
    except HandlerLoadError as e:
        raise typer.BadParameter(str(e), param_hint="'--handler'") from None


def _parse_http(text: str | None) -> tuple[str, int] | None:
    if text is None:
        return None
    from supervisor.http_api import is_loopback, parse_address

    try:
        host, port = parse_address(text)
    except ValueError:
        bad("--http", text, "HOST:PORT or PORT, with a port from 0 to 65535")
    if not is_loopback(host):
        typer.echo(f"qw: warning: {host}:{port} is reachable from other machines", err=True)
    return host, port


def _control_token() -> str:
    from supervisor.web.control import new_token

    return new_token()


def _run(
    supervisor: Supervisor, server: StatsServer | None, *, tui: bool, token: str | None = None
) -> int:
    """Start, watch until the supervisor ends, and say how it ended; returns the exit code.
    `token`: --http-control's, said with the page's address (and on the dashboard)."""
    from logstore import LogError
    from supervisor.run.end_state import left_text
    from supervisor.run.signals import stop_on_signals
    from supervisor.run.supervisor import EXIT_FORCED, EXIT_NO_WORKERS
    from supervisor.tui.progress import run_progress

    with stop_on_signals(supervisor.request_stop):
        try:
            supervisor.start()
        except (LogError, OSError) as e:  # a log that is not ours, a directory we cannot use
            fail(str(e))
        try:
            note = None
            if server is not None:
                server.start()
                note = partitioned_cli.announce_http(server.address, token)
            if tui:
                from supervisor.tui.live import run_dashboard

                run_dashboard(supervisor, note=note)
            else:
                run_progress(supervisor, sys.stdout)
            supervisor.wait()
        except BaseException:
            supervisor.stop_now()  # never leave workers behind a crashed dashboard
            supervisor.wait(10)
            raise
        finally:
            if server is not None:
                server.close()
    code = supervisor.exit_code
    assert code is not None  # wait() returned: the supervisor finished
    q = supervisor.snapshot().queue
    counts = f"published {q.published}, done {q.done}, dead {q.dead}, pending {q.pending}"
    left = left_text(q, supervisor.held_leases(), time.time_ns() // 1000)
    if supervisor.log_failure is not None:
        typer.echo(f"qw: error: stopped on a log: {supervisor.log_failure} ({counts})", err=True)
    elif code == EXIT_FORCED:
        typer.echo(f"qw: stopped: workers killed mid-task ({counts})", err=True)
    elif code == EXIT_NO_WORKERS:
        typer.echo(f"qw: every worker died and none will be restarted ({counts})", err=True)
    elif left is not None:  # the workers stopped, but the queue is not drained
        echo(f"qw: stopped with {left} ({counts})")
    else:
        echo(f"qw: drained ({counts})")
    return code


# -- qw enqueue --------------------------------------------------------------------------------


@app.command(
    epilog="\b\nExamples:\n  qw enqueue --count 100\n  qw enqueue --payload '{\"x\": 1}'\n"
    "  qw enqueue --file tasks.jsonl"
)
def enqueue(
    count: Annotated[
        int | None,
        typer.Option(
            parser=option_parsers.ENQUEUE_COUNT,
            metavar="N",
            help="How many tasks (of --payload, or demo tasks).",
        ),
    ] = None,
    payload: Annotated[
        str | None, typer.Option(metavar="JSON", help="The payload of each task, as JSON.")
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(metavar="FILE", help="Tasks from a file: one JSON payload per line."),
    ] = None,
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
    fsync: Annotated[
        str,
        typer.Option(
            parser=option_parsers.FSYNC,
            metavar="|".join(FSYNCS),
            help="When the append is forced to disk.",
        ),
    ] = "commit",
) -> None:
    """Add tasks to the queue: all of them or, on any error, none.

    Without --payload or --file, demo tasks ({"n": 0}, {"n": 1}, …) are added. Prints the
    new task ids.
    """
    small_commands.enqueue(count, payload, file, directory, log, fsync)


inspect_cli.register(app)
report_cli.register(app)
compact_cli.register(app)
timeline_cli.register(app)
replay_cli.register(app)
retry_cli.register(app)


# -- the entry point ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run `qw`; every usage error is one line on stderr and exit code 2."""
    from supervisor.cli.up_args import on_redis, starts_workers

    args = sys.argv[1:] if argv is None else argv
    up = args[:1] == ["up"]
    if starts_workers(args):
        from supervisor.run.forked import start_server

        # The `qw` script has started it already (supervisor.cli.entry); a caller of `main`
        # gets it here, while typer parses the options.
        start_server(redis=on_redis(args, os.environ.get("QW_LOG")))
    try:
        result: object = app(args=argv, prog_name="qw", standalone_mode=False)
    except typer.TyperException as e:  # typer's usage errors (exit code 2) and the like
        code = _said(e)
    except typer.Abort:
        return 130
    else:
        code = result if isinstance(result, int) else 0
    if up and argv is None:
        # `qw up` from the command line has finished: every worker has exited, the logs are
        # closed. Tearing down an interpreter that holds the fold of a whole log takes
        # ~0.1 s more: end the process now, output flushed.
        sys.stdout.flush()
        sys.stderr.flush()
        _remove_multiprocessing_tempdir()
        os._exit(code)
    return code


def _said(error: typer.TyperException) -> int:
    """Say typer's usage error (or any TyperException) as one line on stderr, `qw: error: …`,
    and return its exit code."""
    message = " ".join(error.format_message().split())
    if message:  # empty: typer has printed the help (`qw` alone)
        typer.echo(f"qw: error: {message}", err=True)
    return int(error.exit_code)


def _remove_multiprocessing_tempdir() -> None:
    """Remove the directory multiprocessing made for its fork server's listener (pymp-…
    in $TMPDIR), as its exit handler would have: `os._exit` skips that handler, and each
    `qw up` left one directory behind."""
    mp_process = sys.modules.get("multiprocessing.process")
    if mp_process is None:
        return
    tempdir = mp_process.current_process()._config.get("tempdir")
    if isinstance(tempdir, str):
        import shutil

        shutil.rmtree(tempdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
