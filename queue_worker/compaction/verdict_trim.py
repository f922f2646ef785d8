"""Compaction of the server verdicts' state: done tasks' fields go with the trimmed stream.

The verdict script (`queue_worker.redis.server_verdicts`) keeps one field per task ever claimed in
the hash ``<claims key>:verdicts``. Compaction (`queue_worker.compaction.redis_streams`) trims the
claims stream; here, in the same script call as that trim, the fields of the tasks below
the compaction fold's watermark are dropped, except dead tasks' (a CLAIM of a dead task
must still lose as ``lost: dead``, and the report shows their errors), and the hash's
``~below`` moves up to the watermark: the script reads a task below it without a field as
done. Every task below the watermark is closed in the fold, and the server's state holds
at least what that fold does (the script folds every record as it appends it, before any
reader can see it), so the script's verdicts do not change: a CLAIM of such a task loses
(``lost: done``) as before, and `queue_worker.proof.verdict_check` reads a missing field below
``~below`` as done, which the fold says too.

One script call: a kill -9 of compaction leaves either the trim and the drop made, or
neither (then the next compaction makes both, as it makes any listed trim).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from logstore.redis.log import RedisLog, format_id, unpack_position
from logstore.redis.scripts import lua_file
from logstore.redis.trim import TRIM_TO_START_LUA
from queue_worker.redis.server_verdicts import BELOW, state_key

# the trim of the stream's front, then the drop of the state's fields (lua/verdict_trim.lua)
_TRIM_LUA: Final = TRIM_TO_START_LUA + lua_file("queue_worker.redis", "verdict_trim.lua")


def state_below(log: RedisLog) -> int:
    """The state's ``~below`` (0: none yet, or no state)."""
    key = state_key(log)
    client = log._client
    raw = log._call("read the verdicts' state of", lambda: client.hget(key, BELOW))
    return int(raw) if isinstance(raw, bytes) else 0


def trim_claims(log: RedisLog, start: int, watermark: int, dead: Iterable[int]) -> tuple[int, int]:
    """Trim the claims stream `log` to `start` (`logstore.redis.trim.trim`) and, in the same
    call, drop the verdicts' fields of the tasks below `watermark` that are not `dead`
    (module docstring). Returns (entries removed, fields dropped)."""
    below = state_below(log)
    kept = sorted(t for t in dead if below <= t < watermark)
    first = format_id(*unpack_position(start))
    script = log.register_script(_TRIM_LUA)
    keys = [log.key, log.start_key, log.removed_key, state_key(log)]
    args: list[str | int] = [first, watermark, *kept]
    raw = log._call("trim", lambda: script(keys=keys, args=args, client=log._client))
    if not isinstance(raw, list) or len(raw) != 2:
        return 0, 0
    removed, dropped = raw
    return int(removed), int(dropped)


__all__ = ["state_below", "trim_claims"]
