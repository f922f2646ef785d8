"""A Redis queue's verdict mode: who settles its claims, recorded once, when it is created.

On Redis a queue's claims are settled either by every reader's own fold (``client``) or by
the server's copy of the rules too, which folds every claims record as it is appended
(``server``, see queue_worker.redis.server_verdicts). The two cannot mix: a record appended
without the server's script leaves the server's state behind, and the script then refuses
the queue. So the mode belongs to the queue, not to whoever opens it: it is kept in the key
``<prefix>:qw:queue:verdicts`` beside the queue identity (``<prefix>:qw:queue``), both set
by one script when the queue is created (no moment where the queue exists without its
mode; of two creators racing, the first one's script sets both and the second reads them).

The URL's ``verdicts=`` parameter chooses the mode of a queue it creates (``server`` when
absent: the default); on an existing queue it may only repeat the recorded mode
(`VerdictModeError` otherwise, before anything is appended). A queue created before the
mode was recorded has no record: it reads as ``server`` when one of its topics has the
server's state (the hash ``<stream key>:verdicts`` holding ``~through``), else ``client``;
nothing is written for it (``SET <prefix>:qw:queue:verdicts server`` by hand turns such a
queue with no claims yet into a server one).

This layer keeps the word only: what it means is queue_worker's (server_claim.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, TypeVar

from logstore.identity import IdentityError
from logstore.redis.keys import redis_key
from logstore.redis.scripts import lua_file

_T = TypeVar("_T")


class RedisLog(Protocol):
    """What this module reads of a `logstore.redis.log.RedisLog`, whose helper it is (typed
    by its shape, so that the log's module can import this one and not the other way)."""

    prefix: str
    id_key: str
    url: str
    _client: Any

    def _call(self, what: str, fn: Callable[[], _T]) -> _T: ...


CLIENT: Final = "client"
SERVER: Final = "server"
MODES: Final = (CLIENT, SERVER)
#: the mode of a queue created by a URL without ``verdicts=``
DEFAULT: Final = SERVER
#: the field of the server's state (queue_worker.redis.server_verdicts.THROUGH) whose presence
#: makes a queue created before the mode was recorded a server one
STATE_FIELD: Final = "~through"

#: the script that reads (and, for a new queue, sets) the identity and the mode together
_RESOLVE_LUA: Final = lua_file("logstore.redis", "verdict_mode.lua")


class VerdictModeError(IdentityError):
    """A URL's ``verdicts=`` contradicts the mode the queue was created with."""


def mode_key(log: RedisLog) -> str:
    """The key of the queue's recorded mode: ``<prefix>:qw:queue:verdicts``."""
    return redis_key(log.prefix, "queue", "verdicts")


def state_keys(log: RedisLog, family: Sequence[str]) -> list[str]:
    """The server's state beside each stream of `family` (``<stream key>:verdicts``)."""
    return [redis_key(log.prefix, topic, "verdicts") for topic in family]


def resolve(
    log: RedisLog, family: Sequence[str], asked: str | None, new_id: bytes | None
) -> tuple[bytes | None, str]:
    """The queue's identity and verdict mode, in one script call; with `new_id`, a queue
    that does not exist yet is created with it and the mode `asked` (or `DEFAULT`).
    Returns (None, the mode it would get) when there is no queue and `new_id` is None.
    Raises VerdictModeError when `asked` is not the queue's mode."""
    client = log._client
    script = client.register_script(_RESOLVE_LUA)
    keys = [log.id_key, mode_key(log), *state_keys(log, family)]
    args: list[bytes | str] = [new_id or b"", asked or DEFAULT, STATE_FIELD]
    raw = log._call("read the identity", lambda: script(keys=keys, args=args, client=client))
    if not isinstance(raw, list) or len(raw) != 3:
        raise IdentityError(f"{log.url}: unexpected reply reading {log.id_key}: {raw!r:.100}")
    queue, recorded, _created = raw
    if queue is None:
        return None, asked or DEFAULT
    word = recorded.decode("ascii", "replace") if isinstance(recorded, bytes) else ""
    legacy = word.startswith("legacy-")
    mode = word.removeprefix("legacy-")
    if mode not in MODES:
        raise IdentityError(
            f"{log.url}: {mode_key(log)} holds {word!r}, not a verdict mode "
            f"(expected {CLIENT} or {SERVER})"
        )
    if asked is not None and asked != mode:
        how = (
            f"was created before qw recorded the mode and reads as verdicts={mode} ("
            + ("the server's verdict state exists)" if mode == SERVER else "no verdict state)")
            if legacy
            else f"was created with verdicts={mode} ({mode_key(log)})"
        )
        raise VerdictModeError(
            f"{log.url}: the URL asks for verdicts={asked} but the queue {how}: every writer "
            f"of a queue must use its mode (leave verdicts= out to follow the queue)"
        )
    return queue if isinstance(queue, bytes) else None, mode


__all__ = ["CLIENT", "DEFAULT", "MODES", "SERVER", "VerdictModeError", "mode_key", "resolve"]
