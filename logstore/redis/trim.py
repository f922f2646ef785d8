"""Retention on the Redis log: where a trimmed stream starts, and the trim itself.

Compaction (`queue_worker.compaction.redis_streams`) removes settled history from the front of a
stream with ``XTRIM <stream> MINID <id>``. A reader whose position lies before the trimmed
point must not silently skip what went (its fold would miss DONE records and run tasks
again): it gets `PositionCompactedError`, as on the file log, and restarts from the fold
checkpoint.

So each stream has a **start key** beside it, ``<stream key>:start`` (``qw:claims:start``;
the same hash tag as the stream under a cluster ``prefix``), holding the id of the first
position still retained. It only moves forward, and it moves in the same script call as
the ``XTRIM`` (`trim`): no reader ever sees the stream trimmed while the key still says it
starts earlier. Every read script checks it first (lua/trimmed_before.lua, read with the
scripts of `logstore.redis.log`): a read from before the start answers the error
``QWTRIMMED <start id>``, which the handle raises as `PositionCompactedError`. A stream
never trimmed has no start key, and starts at 0 (its origin) as before.

Sizes: Redis does not say how many bytes one stream entry takes; `stream_bytes` is Redis's
own estimate of the whole stream's memory (``MEMORY USAGE``, which samples a few of its
nodes), and compaction spreads it evenly over the entries (`XLEN`) to decide how many
entries take the stream under ``--retention-bytes``.
"""

from __future__ import annotations

from typing import Final

from logstore.redis.log import COUNTS_LUA, TRIMMED_LUA, RedisLog, format_id, unpack_position
from logstore.redis.scripts import lua_file

# The trim of the stream's front, which the server verdicts' trim goes on from
# (queue_worker.compaction.verdict_trim): lua/trim_to_start.lua says what it takes.
TRIM_TO_START_LUA: Final = (
    TRIMMED_LUA + COUNTS_LUA + lua_file("logstore.redis", "trim_to_start.lua")
)
_TRIM_LUA: Final = TRIM_TO_START_LUA + lua_file("logstore.redis", "trim.lua")


def trim(log: RedisLog, start: int) -> int:
    """Remove every entry before `start` from `log`'s stream, and make `start` the stream's
    start (unless it starts later already: trimming again is harmless). Returns how many
    entries went."""

    first = format_id(*unpack_position(start))
    script = log._client.register_script(_TRIM_LUA)
    removed = log._call(
        "trim",
        lambda: script(
            keys=[log.key, log.start_key, log.removed_key], args=[first], client=log._client
        ),
    )
    return int(removed) if isinstance(removed, int) else 0


def stream_length(log: RedisLog) -> int:
    """How many entries the stream holds now (XLEN)."""
    client = log._client
    return int(log._call("count the entries of", lambda: client.xlen(log.key)))


def stream_bytes(log: RedisLog) -> int:
    """Redis's estimate of the stream's memory in bytes (MEMORY USAGE, sampled); 0 when
    the stream does not exist."""
    client = log._client
    used = log._call("measure", lambda: client.memory_usage(log.key))
    return int(used) if isinstance(used, int) else 0


__all__ = ["stream_bytes", "stream_length", "trim"]
