"""The `qw` console script: `qw up` starts its fork server before anything else is imported.

The fork server (supervisor.run.forked) is a fresh interpreter that imports the worker code,
~0.25 s of CPU; `qw up` itself imports typer and the supervisor and parses its options,
about as much again. Started here, first thing (before multiprocessing itself is imported:
supervisor.run.early_server), the two run side by side (on two cores, in half the time) and
the first worker can be forked as soon as the supervisor is ready.
On Redis the server imports redis-py too (~0.25 s of CPU, most of it the asyncio that
redis-py imports whatever is used), once, instead of every worker after its fork.
Every command line then goes to the command line (supervisor.cli.app), whose commands import
what they need when they run.
"""

from __future__ import annotations

import os
import sys

from supervisor.cli.up_args import on_redis, starts_workers


def main() -> int:
    if starts_workers(sys.argv[1:]):
        from supervisor.run import early_server

        redis = on_redis(sys.argv[1:], os.environ.get("QW_LOG"))
        # before multiprocessing is imported (~30 ms), else as multiprocessing does
        if not early_server.spawn(early_server.preload_modules(redis)):
            from supervisor.run.forked import start_server

            start_server(redis=redis)
    from supervisor.cli.app import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
