"""The choices and bounds of a worker's settings that a command line checks: the default
lease and drain time-out, the pick strategies and fsync policies, the host name rule.

queue_worker.worker.config (WorkerConfig) re-exports them; the small commands import them from
here, without building that dataclass.
"""

from __future__ import annotations

import re
from typing import Final

from logstore.base import Durability

#: The lease a claim carries unless told otherwise. The original used 30 s because it could
#: not renew; we renew at half the lease, so a killed worker's task is taken over after
#: seconds, not half a minute, and a long task still keeps its lease.
DEFAULT_LEASE_S: Final = 5.0

#: how long a drain waits for the task in hand before ending it as a time-out (Dramatiq's
#: worker shutdown timeout is 10 minutes too)
DEFAULT_DRAIN_TIMEOUT_S: Final = 600.0

#: the choices of `pick` and `fsync`, defined here once (the CLI's parsers and help use them)
PICK_STRATEGIES: Final = ("first", "random", "spread")
#: the pick of a worker whose own fold settles its claims, unless one is asked for
DEFAULT_PICK: Final = "spread"
#: what the server picks on a queue with server verdicts (queue_worker.redis.server_claim),
#: where no other pick can be asked for: none of PICK_STRATEGIES is its rule
SERVER_PICK: Final = (
    "orphans first (the task claimable longest: its lease lapsed or its backoff over), "
    "then the tasks in order"
)
FSYNC_POLICIES: Final = tuple(d.value for d in Durability)  # none, commit, always

# A worker id is "<name>-<pid>-<hex>" (or "<name>@<host>-<pid>-<hex>") and names the stats
# file, so the name and the host must be safe in a file name and readable in a table.
_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NOT_IN_NAMES: Final = re.compile(r"[^A-Za-z0-9_.-]")


def default_host() -> str:
    """This machine's host name, as a worker id can hold it (other characters become '_')."""
    import socket  # here: importing it is ~3 ms of every `qw` command's start, for a name

    return _NOT_IN_NAMES.sub("_", socket.gethostname())[:64] or "localhost"


def server_pick_refusal(pick: str) -> str:
    """Why `pick` cannot be asked for on a queue with server verdicts (one line, after the
    option or field that asked for it)."""
    return (
        f"{pick!r}: this queue's claims are settled by the server (verdicts=server), which "
        f"picks each task itself: {SERVER_PICK}; leave the pick out, or create the queue "
        "with ?verdicts=client to choose one"
    )


def check_host(host: str) -> None:
    """Raise ValueError unless `host` can stand in a worker id."""
    if not _NAME_PATTERN.fullmatch(host):
        raise ValueError(
            f"host {host!r} is not a valid host name for a worker; expected 1-64 letters, "
            "digits, '_', '.' or '-'"
        )
