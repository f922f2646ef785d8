"""The `qw` console script: `qw up` starts its fork server before anything else is imported.

The fork server (supervisor.forked) is a fresh interpreter that imports the worker code,
~0.25 s of CPU; `qw up` itself imports typer and the supervisor and parses its options,
about as much again. Started here, first thing, the two run side by side (on two cores,
in half the time) and the first worker can be forked as soon as the supervisor is ready.
On Redis the server imports redis-py too (~0.25 s of CPU, most of it the asyncio that
redis-py imports whatever is used), once, instead of every worker after its fork.
Every other command goes straight to the command line (supervisor.cli), which imports
what it needs when it runs.
"""

from __future__ import annotations

import os
import sys

from supervisor.up_args import on_redis, starts_workers


def main() -> int:
    if starts_workers(sys.argv[1:]):
        from supervisor.forked import fork_enabled, start_server

        if fork_enabled():  # QW_WORKER_START=exec: no fork server
            start_server(redis=on_redis(sys.argv[1:], os.environ))
    from supervisor.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
