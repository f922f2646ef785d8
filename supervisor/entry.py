"""The `qw` console script: `qw up` starts its fork server before anything else is imported.

The fork server (supervisor.forked) is a fresh interpreter that imports the worker code,
~0.25 s of CPU; `qw up` itself imports typer and the supervisor and parses its options,
about as much again. Started here, first thing (before multiprocessing itself is imported:
supervisor.early_server), the two run side by side (on two cores, in half the time) and
the first worker can be forked as soon as the supervisor is ready.
On Redis the server imports redis-py too (~0.25 s of CPU, most of it the asyncio that
redis-py imports whatever is used), once, instead of every worker after its fork.
The plain forms of `qw status`, `task`, `why` and `enqueue` run without typer
(supervisor.fast_path), and `qw --help` is read from a cache of typer's own output
(supervisor.help_cache) when the build wrote one for these sources; every other command
line goes to the command line (supervisor.cli), which imports what it needs when it runs.
"""

from __future__ import annotations

import gc
import os
import sys

from supervisor.up_args import on_redis, starts_workers


def main() -> int:
    if starts_workers(sys.argv[1:]):
        from supervisor import early_server

        if early_server.fork_enabled():  # QW_WORKER_START=exec: no fork server
            redis = on_redis(sys.argv[1:], os.environ.get("QW_LOG"))
            # before multiprocessing is imported (~30 ms), else as multiprocessing does
            if not early_server.spawn(early_server.preload_modules(redis)):
                from supervisor.forked import start_server

                start_server(redis=redis)
    else:
        args = sys.argv[1:]
        # A small command is over in a few tens of ms: its imports alone make tens of
        # thousands of objects, and the cyclic collector ran ~40 times over them looking
        # for cycles that are not garbage (~4 % of `qw why`'s instructions, counted). It
        # is off until the command is known to be one of these; refcounting frees the rest.
        # (Left off when one has run: the process ends with it, and turned on again the
        # collector would go once over everything made since, ~2 % more, counted.)
        gc.disable()
        if args == ["--help"]:
            from supervisor.help_cache import cached_help

            code = cached_help(args)  # typer's own help, rendered at build time
        else:
            from supervisor.fast_path import run

            code = run(args)  # status, task, why, enqueue in their plain forms: no typer
        if code is not None:
            # Python's exit collects three times over everything still alive, to free it
            # (module by module) a moment before the process ends anyway: ~6 % of `qw
            # status`'s instructions, counted. Frozen, the collector passes over it all
            # (refcounting still frees what each module held, and the files a command opens
            # it closes itself).
            gc.freeze()
            return code
        gc.enable()  # any other command may run for long (qw tail -f, the dashboard)
    from supervisor.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
