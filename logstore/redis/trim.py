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
starts earlier. Every read script checks it first (`TRIMMED_LUA`, defined with the scripts of
`logstore.redis.log`): a read from before the start answers the error ``QWTRIMMED <start
id>``, which the handle raises as `PositionCompactedError`. A stream never trimmed has no
start key, and starts at 0 (its origin) as before.

Sizes: Redis does not say how many bytes one stream entry takes; `stream_bytes` is Redis's
own estimate of the whole stream's memory (``MEMORY USAGE``, which samples a few of its
nodes), and compaction spreads it evenly over the entries (`XLEN`) to decide how many
entries take the stream under ``--retention-bytes``.
"""

from __future__ import annotations

from typing import Final

from logstore.redis.log import COUNTS_LUA, TRIMMED_LUA, RedisLog, format_id, unpack_position

# KEYS[1] the stream, KEYS[2] its start key, KEYS[3] the count of entries qw removed from
# it (`RedisLog.verify_history`). ARGV[1] the new start id. Moves the start key forward
# (never back), trims the stream to it and counts what went, in one step; `removed` is the
# count of entries removed. A stream an older qw trimmed has a start and no count: what it
# lacks then is taken as that qw's trims. A script that trims more in the same step (the
# server verdicts' state: queue_worker.compaction.verdict_trim) goes on from here.
TRIM_TO_START_LUA: Final = (
    TRIMMED_LUA
    + COUNTS_LUA
    + r"""
if redis.call('EXISTS', KEYS[3]) == 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  local added, length = entry_counts(KEYS[1])
  if added >= 0 then redis.call('SET', KEYS[3], added - length) end
end
if not trimmed_before(KEYS[2], ARGV[1]) then
  redis.call('SET', KEYS[2], ARGV[1])
end
local removed = redis.call('XTRIM', KEYS[1], 'MINID', redis.call('GET', KEYS[2]))
redis.call('INCRBY', KEYS[3], removed)
"""
)
# Returns the entries removed.
_TRIM_LUA: Final = TRIM_TO_START_LUA + "return removed\n"


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
