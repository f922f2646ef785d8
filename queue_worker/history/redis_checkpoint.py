"""The fold checkpoint of a queue on Redis: a string key beside its streams.

A data directory keeps its checkpoint in the file ``fold.checkpoint``; a Redis queue keeps
the same bytes (`queue_worker.history.checkpoint`'s format, digest chain and all) in the
key ``qw:fold.checkpoint`` (``P:qw:fold.checkpoint`` with ``?prefix=P``: under a cluster
prefix with a hash tag it lives in the slot of the queue's streams). Only compaction writes
it (`queue_worker.compaction.redis_streams`): workers on Redis read it when they start on a trimmed
stream, or when a read meets a trimmed position.

Atomic: one ``SET`` replaces the whole value; a reader gets the old value or the new one.

Durable before any trim: compaction trims a stream only after the ``SET`` returned, on the
same server. Redis applies, logs (AOF) and replicates writes in one order, and what a crash
or a failover loses is a suffix of that order: a trim can only survive with the checkpoint
written before it. (``appendfsync always`` makes both survive a power cut at once; with
``everysec`` the last second of both may go, the trim first.)

Saves and compactions take turns on the lock key ``…:fold.checkpoint:lock``: ``SET NX``
with the holder's host, pid and a random token, released by the holder only (compare and
delete), and renewed by a thread of the holder's every third of `LOCK_TTL_MS` (a minute)
while it works. A holder killed with kill -9 leaves it behind: a process on the same host
takes it over once that pid is gone, and it expires within a minute anyway (a holder on
another host that died).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Final

from logstore import LogError
from logstore.redis.log import RedisLog, redis_key
from logstore.redis.scripts import lua_file

NAME: Final = "fold.checkpoint"
#: a lock left by a holder on another host that died expires after a minute; its holder
#: renews it every third of that while it works (a first compaction of a long stream takes
#: minutes: 57 s for 100k tasks, measured under load)
LOCK_TTL_MS: Final = 60 * 1000
#: how often a compaction waiting for the lock asks again (seconds)
LOCK_POLL_S: Final = 0.2

#: the lock released, and renewed, by its holder only (lua/lock_release.lua, lock_renew.lua)
_RELEASE_LUA: Final = lua_file("queue_worker.redis", "lock_release.lua")
_RENEW_LUA: Final = lua_file("queue_worker.redis", "lock_renew.lua")


class LockHeld(Exception):
    """The checkpoint's lock is held by another process (the message names it)."""


def _handle(url: str) -> RedisLog:
    # A handle on the key qw:fold.checkpoint: the log's connection settings, retries and
    # error messages (as logstore.blob does); the key holds a string, never a stream.
    return RedisLog(url, NAME)


def name_of(url: str) -> str:
    """The checkpoint's name in messages: the URL (no password) and the key."""
    log = _handle(url)
    try:
        return log.name
    finally:
        log.close()


def read(url: str) -> bytes | None:
    """The checkpoint's bytes, None when there is none. OSError when the server cannot be
    read (the message says why)."""
    log = _handle(url)
    try:
        client = log._client
        value = log._call("read", lambda: client.get(log.key))
    except LogError as e:
        raise OSError(str(e)) from e
    finally:
        log.close()
    if value is not None and not isinstance(value, bytes):
        raise OSError(f"{log.name}: not a qw checkpoint")
    return value


def exists(url: str) -> bool:
    """Whether there is a checkpoint (EXISTS: its bytes are not sent). OSError when the
    server cannot be asked."""
    log = _handle(url)
    try:
        client = log._client
        return bool(log._call("look for", lambda: client.exists(log.key)))
    except LogError as e:
        raise OSError(str(e)) from e
    finally:
        log.close()


def write(url: str, data: bytes) -> None:
    """Replace the checkpoint with `data` (one SET). OSError when it could not be written."""
    log = _handle(url)
    try:
        client = log._client
        log._call("write", lambda: client.set(log.key, data))
    except LogError as e:
        raise OSError(str(e)) from e
    finally:
        log.close()


@contextlib.contextmanager
def lock(url: str, *, wait: bool = True) -> Iterator[None]:
    """Hold the checkpoint's lock (module docstring). `wait=False`: LockHeld at once when
    another process holds it. OSError when the server cannot be reached."""
    log = _handle(url)
    key = redis_key(log.prefix, NAME, "lock")
    mine = f"{socket.gethostname()} {os.getpid()} {secrets.token_hex(8)}".encode()
    client = log._client
    release = client.register_script(_RELEASE_LUA)
    try:
        while not log._call("lock", lambda: client.set(key, mine, nx=True, px=LOCK_TTL_MS)):
            holder = log._call("read the lock", lambda: client.get(key))
            if isinstance(holder, bytes) and _dead_here(holder):
                log._call("take over the lock", partial(release, keys=[key], args=[holder]))
                continue
            if not wait:
                raise LockHeld(f"{log.url} {key} is held by {_who(holder)}")
            time.sleep(LOCK_POLL_S)  # a compaction holds it for seconds
    except LogError as e:
        log.close()
        raise OSError(str(e)) from e
    except BaseException:
        log.close()
        raise
    done = threading.Event()
    renewer = threading.Thread(
        target=_renew, args=(url, key, mine, done), name="qw-lock-renewal", daemon=True
    )
    renewer.start()
    try:
        yield
    finally:
        done.set()
        renewer.join()
        with contextlib.suppress(LogError):  # it expires by itself anyway
            log._call("release the lock", lambda: release(keys=[key], args=[mine]))
        log.close()


def _renew(url: str, key: str, mine: bytes, done: threading.Event) -> None:
    """Keep the lock ours while the holder works (a thread with a handle of its own)."""
    log = _handle(url)
    try:
        renew = log._client.register_script(_RENEW_LUA)
        while not done.wait(LOCK_TTL_MS / 3000):
            with contextlib.suppress(LogError):  # (the next renewal may get through)
                log._call("renew the lock", partial(renew, keys=[key], args=[mine, LOCK_TTL_MS]))
    finally:
        log.close()


def _who(holder: object) -> str:
    if not isinstance(holder, bytes):
        return "nobody now"
    host, _, rest = holder.decode("utf-8", "replace").partition(" ")
    return f"pid {rest.partition(' ')[0]} on {host}"


def _dead_here(holder: bytes) -> bool:
    """Whether the lock's holder ran on this host and its process is gone (killed)."""
    host, _, rest = holder.decode("utf-8", "replace").partition(" ")
    pid_text = rest.partition(" ")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


__all__ = ["LOCK_TTL_MS", "NAME", "LockHeld", "exists", "lock", "name_of", "read", "write"]
