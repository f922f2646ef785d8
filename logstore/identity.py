"""A log set's identity: which queue a log belongs to, and which of its topics it is.

A queue is a set of logs (one per topic) read together: the tasks log, the claims log, and
any topic added later. Folding one queue's claims log against another queue's tasks log
gives verdicts no run ever made (tasks "done" that never ran), so every log names its set:

    queue   16 random bytes chosen when the queue's first log is created
    topic   the topic's name ("tasks", "claims", …)

The file log keeps both in each file's header (`logstore.file.framing`); the Redis log in a key
beside its streams (`logstore.redis.log`). An open that names its *family* (the topics of
its queue, `open_log(..., family=...)`) resolves the queue id from the family's logs that
exist, refuses a mix (two queue ids, or a file holding another topic's log), and creates a
missing log with the set's id. The check is made once, at open: records carry no identity.
"""

import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Final, NamedTuple

from logstore.base import ForeignFileError, LogError
from logstore.file import framing

QUEUE_ID_SIZE: Final = framing.QUEUE_ID_SIZE


class IdentityError(LogError):
    """A log that is not the one expected: of another queue, another topic, or shorter than
    what the rest of its set (or a checkpoint) has seen of it."""


class LostHistoryError(IdentityError):
    """A log that no longer holds every record it held since its start, and nothing (the
    fold checkpoint of a compaction) accounts for the ones gone: what a reader would fold
    is not the queue's history."""


class LogIdentity(NamedTuple):
    queue: bytes  # QUEUE_ID_SIZE bytes
    topic: str

    @property
    def queue_hex(self) -> str:
        return self.queue.hex()


def new_queue_id() -> bytes:
    import secrets  # here: it imports hmac and OpenSSL (~4 ms), for a queue being created

    return secrets.token_bytes(QUEUE_ID_SIZE)


def check_identity(found: LogIdentity, expected: LogIdentity, name: str) -> None:
    """Raise IdentityError unless the log `name` (which says it is `found`) is `expected`."""
    if found.topic != expected.topic:
        raise IdentityError(
            f"{name} is the {found.topic!r} log, not the {expected.topic!r} log "
            "(logs swapped or copied from elsewhere?)"
        )
    if found.queue != expected.queue:
        raise IdentityError(
            f"{name} belongs to queue {found.queue_hex}, not to this queue "
            f"({expected.queue_hex}): a log from another queue?"
        )


def read_file_header(path: str | Path) -> framing.FileHeader | None:
    """The header of the log file at `path`; None when there is no file or it is empty.
    ForeignFileError for a directory, or a file that is not a qw log."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ForeignFileError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ForeignFileError(f"{path} is not a log file (a directory or a device)")
        raw = os.pread(fd, framing.FILE_HEADER_SIZE, 0)
    finally:
        os.close(fd)
    return framing.decode_file_header(raw, str(path)) if raw else None


def read_file_identity(path: Path) -> LogIdentity | None:
    """The identity in the header of the log file at `path` (see `read_file_header`)."""
    header = read_file_header(path)
    return None if header is None else LogIdentity(header.queue, header.topic)


def directory_queue(directory: Path, family: Iterable[str]) -> bytes | None:
    """The queue id of the logs of `family` in `directory` (None when none exists yet).

    Raises IdentityError when a file holds another topic's log, or the files disagree."""
    found: list[tuple[Path, bytes]] = []
    for topic in family:
        path = directory / f"{topic}.log"
        identity = read_file_identity(path)
        if identity is None:
            continue
        if identity.topic != topic:
            raise IdentityError(
                f"{path} is the {identity.topic!r} log, not the {topic!r} log "
                "(logs swapped or copied from elsewhere?)"
            )
        found.append((path, identity.queue))
    for path, queue in found[1:]:
        first_path, first_queue = found[0]
        if queue != first_queue:
            raise IdentityError(
                f"{path} belongs to queue {queue.hex()} but {first_path} to queue "
                f"{first_queue.hex()}: logs of two queues in one place"
            )
    return found[0][1] if found else None


def sibling_topics(directory: Path) -> list[str]:
    """The topics of the qw logs in `directory`: ``<topic>.log`` files that start with the
    log magic (other files, of any name, are not ours and are left alone)."""
    topics = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    for name in names:
        if not name.endswith(".log"):
            continue
        try:
            with open(directory / name, "rb") as f:
                if f.read(len(framing.MAGIC)) != framing.MAGIC:
                    continue
        except OSError:
            continue
        topics.append(name.removesuffix(".log"))
    return topics
