"""A small named value kept beside a queue's logs, written once: first writer wins.

A partitioned queue's manifest (`queue_worker.partition_layout`) lives here: a data directory
keeps it in the file ``<dir>/<name>``, a Redis database in the string key ``qw:<name>``
(``P:qw:<name>`` with ``?prefix=P``; on a Redis Cluster the key lives on whichever node
owns its slot, like any key).

`create_blob` never overwrites: two processes creating the same queue at once both get
the value that landed first, and compare it with theirs. On a file the value is written to
a temporary file and hard-linked into place (`link` fails when the name exists), so a
reader never sees half a value; on Redis it is ``SET NX``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from logstore.base import LogError
from logstore.location import is_redis_url


def read_blob(location: str | Path, name: str) -> bytes | None:
    """The value `name` at `location`, or None when there is none. LogError when the place
    cannot be read (a server out of reach, a file we may not read)."""
    text = str(location)
    if is_redis_url(text):
        return _redis_get(text, name)
    path = Path(text) / name
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        # no value there; a location that is a plain file is no data directory at all,
        # which the caller's own check of the directory says in its words
        return None
    except OSError as exc:
        raise LogError(f"{path}: cannot be read: {exc.strerror or exc}") from exc


def create_blob(location: str | Path, name: str, data: bytes) -> bytes:
    """Store `data` as `name` at `location` unless a value is there already; return the
    value that is there now (`data`, or the first writer's)."""
    text = str(location)
    if is_redis_url(text):
        return _redis_set_nx(text, name, data)
    import secrets  # only a writer needs it (random, hmac, base64: ~4 ms of a reader's start)

    directory = Path(text)
    path = directory / name
    temporary = directory / f".{name}.{secrets.token_hex(4)}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # the first writer's value stays
            os.link(temporary, path)
        _fsync_directory(directory)
        return path.read_bytes()
    except OSError as exc:
        raise LogError(f"{path}: cannot be written: {exc.strerror or exc}") from exc
    finally:
        temporary.unlink(missing_ok=True)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _redis_get(url: str, name: str) -> bytes | None:
    from logstore.redis.log import RedisLog  # redis is an optional extra

    # A handle on the key `qw:<name>` (with the URL's prefix): its connection settings,
    # retries and error messages are the log's. The key holds a string, never a stream.
    log = RedisLog(url, name)
    try:
        client = log._client
        value = log._call(f"read {log.key}", lambda: client.get(log.key))
    finally:
        log.close()
    if value is not None and not isinstance(value, bytes):
        raise LogError(f"{log.name}: not a qw value")
    return value


def _redis_set_nx(url: str, name: str, data: bytes) -> bytes:
    from logstore.redis.log import RedisLog

    log = RedisLog(url, name)
    try:
        client = log._client
        log._call(f"write {log.key}", lambda: client.set(log.key, data, nx=True))
        value = log._call(f"read {log.key}", lambda: client.get(log.key))
    finally:
        log.close()
    if not isinstance(value, bytes):
        raise LogError(f"{log.name}: the value just written is gone")
    return value


__all__ = ["create_blob", "read_blob"]
