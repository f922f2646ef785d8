"""`qw up --pick` on a Redis queue with server verdicts: refused before anything is written.

There the server picks each task (queue_worker.redis.server_claim), by a rule of its own
that is none of the strategies `--pick` names; a worker asked for one refuses it
(queue_worker.worker.pick.Picker), and so does the command line, first, so that a refused
`qw up` creates no queue and starts no worker. The queue's verdict mode is read without
writing anything: its recorded mode, or the one a queue created at the URL would get
(`?verdicts=`, else the default); for a partitioned queue, its first partition's.
"""

from __future__ import annotations

from logstore import is_redis_url
from supervisor.options import fail


def verdicts_at(location: str) -> str | None:
    """The verdict mode of the Redis queue at `location` (``server`` or ``client``: recorded,
    or the one a queue created there would get); None for a data directory."""
    if not is_redis_url(location):
        return None
    from queue_worker.partition_layout import partition_location, read_manifest
    from queue_worker.topics import CLAIMS_TOPIC, open_topic

    manifest = read_manifest(location)
    if manifest is not None:
        location = partition_location(location, 0, manifest.count)
    log = open_topic(location, CLAIMS_TOPIC, read_only=True)
    try:
        return log.verdicts
    finally:
        log.close()


def check_pick(location: str, pick: str | None) -> None:
    """One line and exit 2 when `--pick` asks for a strategy on a queue whose server picks."""
    if pick is None:
        return
    from logstore import LogError
    from queue_worker.worker.settings import server_pick_refusal

    try:
        mode = verdicts_at(location)
    except (LogError, ValueError) as e:
        fail(str(e))
    if mode == "server":
        fail(f"--pick {server_pick_refusal(pick)}")
