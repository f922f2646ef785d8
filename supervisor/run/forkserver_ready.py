"""Imported by the fork server only, last of what it preloads (`supervisor.run.early_server`).

It installs the fold the server makes before each fork (supervisor.run.prefold), given the
control pipe last on its command line: which first waits for the supervisor's first word
and folds that queue. Last, so that the server has imported everything (the Redis log
too, on Redis) before it waits.
"""

from __future__ import annotations

import sys

import supervisor.run.prefold

# `python -c <server code> <control fd>` (supervisor.run.forked._control_pipe)
if len(sys.argv) > 1 and sys.argv[-1].isdigit():
    supervisor.run.prefold.install(int(sys.argv[-1]))
    if not supervisor.run.prefold.fork_asked():  # idle until the first fork is asked for
        import supervisor.run.forkserver_init

        supervisor.run.forkserver_init.import_late()
