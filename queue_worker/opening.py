"""The one place that chooses a queue's worker: `open_worker(config, ...)`.

A queue's claiming protocol is recorded with the queue, so it is known once its logs are
open: a Redis queue with server verdicts (`logstore.redis.verdict_mode`) gets a
`queue_worker.redis.server_worker.ServerVerdictWorker` (imported only then: redis is an
optional extra), every other queue (the file log; Redis with client verdicts) a
`queue_worker.worker.loop.Worker`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from logstore import Log
from queue_worker.topics import open_topics
from queue_worker.worker.base import WorkerBase, WorkerOptions, worker_handler
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.inherited import StartingFold
from queue_worker.worker.loop import Worker

if TYPE_CHECKING:
    from typing_extensions import Unpack


def open_worker(
    config: WorkerConfig, *, start: StartingFold | None = None, **options: Unpack[WorkerOptions]
) -> WorkerBase:
    """The worker for `config`'s queue, by its claiming protocol, with `options`
    (`WorkerOptions`); `start`, a fold inherited from the fork server, applies to the
    client fold only (with server verdicts the server holds the fold).

    The config and the handler are checked before any log is opened: a bad one writes
    nothing. Both logs or neither: given, they stay the caller's to close."""
    config.validate()
    options["handler"] = worker_handler(config, options.get("handler"))
    tasks_log, claims_log = options.get("tasks_log"), options.get("claims_log")
    own_logs = tasks_log is None and claims_log is None
    if tasks_log is None or claims_log is None:
        if not own_logs:
            raise ValueError("open_worker: give both logs (tasks_log, claims_log) or neither")
        tasks_log, claims_log = open_topics(config.location, config.durability)
        options["tasks_log"] = tasks_log
        options["claims_log"] = claims_log
        options["own_logs"] = True  # (closed with the worker)
    try:
        if config.networked and _server_verdicts(claims_log):
            from queue_worker.redis.server_worker import ServerVerdictWorker

            return ServerVerdictWorker(config, **options)
        return Worker(config, start=start, **options)
    except BaseException:
        if own_logs:
            tasks_log.close()
            claims_log.close()
        raise


def _server_verdicts(claims_log: Log) -> bool:
    """Whether the queue of `claims_log` has server verdicts (imported here: redis is an
    optional extra, and a networked queue's log has imported it already)."""
    from queue_worker.redis.server_claim import wants_server_verdicts

    return wants_server_verdicts(claims_log)
