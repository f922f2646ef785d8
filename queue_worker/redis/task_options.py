"""A task with options appended to a Redis queue: its key, delay, priority and dependencies
where the server sees them (the producer's side of `lua/next_task.lua`'s pick).

On the file log every worker reads the tasks log, so the pick rules read a task's options
from its record (`queue_worker.worker.pick`) and the first task of a key is found by
reading the log (`queue_worker.topics.TaskIndex`). On a Redis queue with server verdicts
no worker reads the tasks stream: the server picks. So one script call
(`lua/enqueue_options.lua`) appends the task and writes beside it what the server needs:

- ``key``: the first task of each key, in a hash beside the stream (``qw:tasks:keys``: key ->
  its entry id). A task whose key is there is not appended: the call answers the first's
  entry id. Two producers racing with one key run one script each, one after the other, so
  exactly one appends, and the tasks topic never holds a second task of a key (the rule "the
  first in the tasks topic is the task" holds as on the file log, with nothing to resolve).
- the delay's end and the priority, in the entry's field ``o`` (``"<not_before> <priority>"``:
  readers of the record read only ``d``), which the claiming script reads when its cursor
  reaches the entry: a task not due yet, or of a priority other than 0, is parked until the
  pick wants it;
- its dependencies (`after=`), in the entry's field ``a`` (the ids, ``"3,5"``), which the
  claiming script reads there too: a task one of whose dependencies is open, and none dead,
  waits beside the state until one closes (``lua/parked.lua``);
- a priority above 0 (server verdicts only): the entry id in the field ``~ahead`` of the
  claims verdict state, so that the claiming script moves its cursor past it before it hands
  out a task of lower priority (the one place where the server must look ahead).

The hash of keys grows by one field per key (as the file log's task index, which keeps
each key's first task for ever). A field may name an entry compaction trimmed: the key's
first task is still the task, and the producer finds its id in the fold checkpoint's index
(a task's id is its index in the topic: a trimmed entry's cannot be counted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from logstore import AppendError, LogError
from logstore.redis.log import QUEUE_LUA, RedisLog, pack_id, parse_id, redis_key
from logstore.redis.scripts import lua_file
from queue_worker.topics import CLAIMS_TOPIC

_ENQUEUE_LUA: Final = QUEUE_LUA + lua_file("queue_worker.redis", "enqueue_options.lua")


def keys_key(log: RedisLog) -> str:
    """The hash of each key's first task (its entry id), beside the tasks stream."""
    return redis_key(log.prefix, log.topic, "keys")


def append_with_options(
    log: RedisLog,
    data: bytes,
    *,
    key: str | None,
    not_before: int,
    priority: int,
    after: Sequence[int] = (),
) -> tuple[int, bool]:
    """Append the task record `data` with its options; (its position, True), or, when `key`
    has a task already, (that first task's position, False) and nothing is appended."""
    script = log.register_script(_ENQUEUE_LUA)
    state = redis_key(log.prefix, CLAIMS_TOPIC, "verdicts")
    options = f"{not_before} {priority}" if not_before or priority else ""
    ahead = "1" if priority > 0 and log.verdicts == "server" else "0"
    dependencies = ",".join(str(task) for task in after)
    try:
        raw = log.call_appending_script(
            script, [keys_key(log), state], [data, key or "", options, ahead, dependencies]
        )
    except AppendError as e:
        if "QWSEQ" in str(e):
            raise AppendError(
                f"{log.name}: cannot append: the stream's last id has its most entries in "
                "one millisecond already (has the server's clock stood still?)"
            ) from e
        raise
    if not (isinstance(raw, list) and len(raw) == 2 and raw[0] in (b"0", b"1")):
        raise LogError(f"{log.name}: unexpected reply from redis: {raw!r:.200}")
    return pack_id(*parse_id(raw[1])), raw[0] == b"1"


__all__ = ["append_with_options", "keys_key"]
