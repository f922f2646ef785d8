"""A fold of a queue's two logs made once, for every worker that starts from it.

Each worker starts by indexing the whole tasks log and folding the whole claims log (from
the fold checkpoint, when there is one): 4 µs a record, 0.041 s for a 10,000-task backlog,
and eight workers on two cores each doing the same work delayed the first claim by ~0.3 s.
The supervisor's fork server instead keeps one fold per queue (`Prefold`), brings it up to
date just before it forks a worker (it reads only what was appended since its last fork),
and the worker inherits it with the fork's memory: a `StartingFold`, from which `Worker`
reads only what came after.

A starting fold is only a head start, never an authority: the worker adopts it only when
its own logs are the logs the fold was made of (`StartingFold.fits`: the same queue and
topic identity, the same origin, not cut short before the fold's position, and the last
record the fold read still there, byte for byte). Otherwise, and when the fold's position
was compacted away meanwhile (`PositionCompactedError` at the first catch-up), the worker
starts as it always did: from the fold checkpoint, or from the start of the logs. The
checks a fold's start makes (`begin_folds`: the checkpoint's identity, digest chain and
contents; a compacted log without a usable checkpoint refused) are the same code for the
fork server's fold and for a worker's own.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from logstore import Log, LogError, PositionCompactedError
from queue_worker.history.checkpoint import (
    CheckpointRefused,
    checkpoint_exists,
    checkpoint_name,
    restore_checkpoint,
)
from queue_worker.topics import ClaimsFollower, TaskIndex, open_topics

if TYPE_CHECKING:
    from logstore.identity import LogIdentity
    from queue_worker.history.checkpoint import Location

#: a prefolded index keeps small task payloads for every slot: this many per slot
#: (`TaskIndex.keep_payloads`' own limit), so that each worker inherits as many of its own
#: as it would have kept reading the log itself
KEEP_PER_SLOT = 4096


def begin_folds(
    tasks_log: Log, claims_log: Log, directory: Location | None
) -> tuple[tuple[TaskIndex, ClaimsFollower] | None, str | None]:
    """The folds restored from `directory`'s fold checkpoint when it fits these logs (None:
    start from the logs' start), and why an existing checkpoint was refused (None
    otherwise). Raises CheckpointRefused when the logs were compacted and there is no
    usable checkpoint: the history it kept is lost, and a replay would run tasks again."""
    # A log whose first segments were compacted away cannot be replayed from its start:
    # the checkpoint is then the only record of what they held (lost, loudly, without it).
    compacted = any(log.start != log.origin for log in (tasks_log, claims_log))
    if directory is None or not checkpoint_exists(directory):
        if compacted:
            raise CheckpointRefused(
                f"{claims_log.name}: the logs were compacted and there is no fold "
                "checkpoint: the history it kept is lost; a replay would run tasks again"
            )
        return None, None
    try:
        return restore_checkpoint(directory, tasks_log, claims_log), None
    except CheckpointRefused as e:
        if compacted:
            raise CheckpointRefused(
                f"the logs were compacted and their fold checkpoint cannot be used: {e}"
            ) from e
        return None, f"fold checkpoint not used (replaying from the start): {e}"


@dataclass(frozen=True, slots=True)
class LogMark:
    """Which log a fold read, and how far: what a worker checks its own log against."""

    identity: LogIdentity | None  # the queue and topic (None: a backend without one)
    origin: int
    position: int  # the next unread record
    last: tuple[int, int, int] | None  # the last record read: position, next, crc32 of data

    @classmethod
    def of(cls, log: Log, position: int, last: int | None) -> LogMark:
        """The mark of a fold of `log` read up to `position`, `last` the position of the
        last record it read (None: none)."""
        seen = None
        if last is not None:
            entry = log.read(last, 1)[0]
            seen = (entry.position, entry.next, zlib.crc32(entry.data))
        return cls(getattr(log, "identity", None), log.origin, position, seen)

    def misfit(self, log: Log) -> str | None:
        """Why `log` is not the log this mark was taken of (None: it is, as far as a
        look at its identity, its end and its last record read can tell)."""
        if getattr(log, "identity", None) != self.identity or log.origin != self.origin:
            return f"{log.name} is not the log the starting fold was made of"
        if self.last is None:
            return None  # nothing read: nothing to compare
        # (The record itself, not `log.end()`: on a file log a writer's first `end` walks
        # every frame of the active segment, 20 ms for 10,000 tasks; nor `log.start`, a
        # listing of the directory.)
        try:
            entries = log.read(self.last[0], 1)
        except PositionCompactedError:
            return None  # compacted away since: the first catch-up starts from the checkpoint
        if not entries or entries[0].position != self.last[0]:
            return f"{log.name} ends before the starting fold's position {self.position}"
        entry = entries[0]
        if (entry.position, entry.next, zlib.crc32(entry.data)) != self.last:
            return f"{log.name}: the record at {self.last[0]} is not the one the fold read"
        return None


@dataclass(frozen=True, slots=True)
class StartingFold:
    """The folds of one queue's logs up to some position, handed to a starting `Worker`
    (which then owns them: they are its own copy after a fork)."""

    location: str  # as the workers' config names the queue
    tasks: TaskIndex
    claims: ClaimsFollower
    tasks_mark: LogMark
    claims_mark: LogMark
    #: the positions the fold began from (a checkpoint's, or the logs' start): the worker
    #: saves its next checkpoint counting from there, and the tasks from `first_new_task`
    #: on are new to it as they would be in its own replay (a spread pick holds them back)
    began_at: tuple[int, int]
    first_new_task: int
    note: str | None  # why the data directory's checkpoint was refused, if it was

    def misfit(self, location: str, tasks_log: Log, claims_log: Log) -> str | None:
        """Why a worker of `location` over these logs must not start from this fold (None:
        it may)."""
        if location != self.location:
            return f"the starting fold is of {self.location!r}, not of {location!r}"
        return self.tasks_mark.misfit(tasks_log) or self.claims_mark.misfit(claims_log)


class Prefold:
    """One queue's fold in the fork server, kept up to date at each `refresh`."""

    def __init__(self, location: str, path: str) -> None:
        """`location` as the workers' config names it; `path` the directory (absolute)."""
        self.location = location
        self._path = path
        self._logs: tuple[Log, Log] | None = None
        self._fold: tuple[TaskIndex, ClaimsFollower] | None = None
        self._began: tuple[tuple[int, int], int, str | None] = ((0, 0), 0, None)
        self._keep = KEEP_PER_SLOT
        self._saved: int | None = None  # the checkpoint file's mtime at the last refresh

    def refresh(self, slots: int = 1) -> StartingFold:
        """The fold up to the logs' end now (reading only what is new since the last
        refresh, or from the checkpoint again when that was compacted away). Raises
        LogError (CheckpointRefused among them) when the logs cannot be folded."""
        if self._logs is None:
            # Read-only: the fork server creates nothing and takes no writer's lock.
            self._logs = open_topics(self._path, read_only=True)
        if slots * KEEP_PER_SLOT > self._keep and self._fold is not None:
            self._fold = None  # more workers than it kept payloads for: index them again
        saved = _saved_at(self._path)
        if saved != self._saved:
            # A checkpoint saved since the last refresh (every 8 MiB of claims log, or by
            # compaction): a fold long unrefreshed (a restart after a long run) starts from
            # it, as a worker of its own would, rather than folding all that came since.
            self._fold, self._saved = None, saved
        try:
            return self._catch_up(slots)
        except PositionCompactedError:
            self._fold = None  # compacted since the last refresh: from the checkpoint again
            return self._catch_up(slots)

    def _catch_up(self, slots: int) -> StartingFold:
        assert self._logs is not None
        tasks_log, claims_log = self._logs
        if self._fold is None:
            restored, note = begin_folds(tasks_log, claims_log, Path(self._path))
            if restored is None:
                restored = TaskIndex(tasks_log.start), ClaimsFollower(claims_log.start)
            tasks, claims = restored
            self._began = ((tasks.next_position, claims.next_position), tasks.known, note)
            self._keep = slots * KEEP_PER_SLOT
            tasks.keep_payloads(0, 1, self._keep)  # every slot's: each worker keeps its own
            self._fold = tasks, claims
        tasks, claims = self._fold
        tasks.catch_up(tasks_log)
        claims.catch_up(claims_log)
        tasks.settle_below(claims.state.watermark)
        began_at, first_new, note = self._began
        return StartingFold(
            self.location,
            tasks,
            claims,
            LogMark.of(tasks_log, tasks.next_position, tasks.last_position),
            LogMark.of(claims_log, claims.next_position, claims.last_position),
            began_at,
            first_new,
            note,
        )

    def close(self) -> None:
        if self._logs is not None:
            for log in self._logs:
                log.close()
        self._logs, self._fold = None, None


def _saved_at(directory: str) -> int | None:
    """When the checkpoint of `directory` was last written (ns; None: there is none)."""
    try:
        return os.stat(checkpoint_name(directory)).st_mtime_ns
    except OSError:
        return None


__all__ = [
    "KEEP_PER_SLOT",
    "LogError",
    "LogMark",
    "Prefold",
    "StartingFold",
    "begin_folds",
]
