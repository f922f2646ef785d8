"""A fold checkpoint: a starting worker loads the saved fold and replays only the tail.

Without it every worker start replays both logs from the beginning (`TaskIndex.catch_up`,
`ClaimsFollower.catch_up`): seconds for a few million claims records. A checkpoint is the
`TaskIndex` and the `ClaimsFollower` (with its `ClaimState`) saved at known positions of
the two logs. It is a cache: losing it, or refusing it, only costs a full replay. The
supervisor's monitor and `qw status` begin from it as well (`supervisor.run.fold_begin`), the
FAILs accepted included, and a producer counts the tasks from its index (`tasks_counted`).

The file: ``<data directory>/fold.checkpoint``; on Redis the same bytes in the key
``qw:fold.checkpoint`` beside the streams (`queue_worker.history.redis_checkpoint`: written by
compaction only, and there a "segment" is a trimmed run of a stream's entries). One msgpack
map::

    {"format": "qw-fold-checkpoint", "version": 4, "crc32": crc32(body), "body": bytes}

`body` is a msgpack map with one entry per topic::

    "tasks":  {"log": LOG, "next_position": int, "first": int|nil, "last": int|nil,
               "base": int, "settled": int, "positions": bytes, "foreign": [task],
               "unreadable": [[task, why]], "scheduled": [[task, not_before, priority]],
               "keys": [[key, task]], "duplicates": [[task, first]],
               "after": [[task, [task]]], "retried": [[task, retry]]}
    "claims": {"log": LOG, "next_position": int, "malformed": int, "last_malformed": str|nil,
               "state": {"position", "done_count", "dead_count", "unknown_count",
                         "watermark": int, "closed_above": [task], "dead": [[task, error]],
                         "open": [[task, HOLDER|nil, attempts, retry_at|nil, last_error|nil]],
                         "failed_count": int, "failed_exact": bool}}
    LOG     {"start": int, "first": RECORD|nil, "last": RECORD|nil,
             "identity": "<queue id hex>/<topic>"|nil, "prefix_crc": int,
             "origin": log.origin, "compacted": [SEGMENT], "chain": int}
    RECORD  [position, next position, length, crc32 of its bytes]
    SEGMENT [base, end, crc32 of its bytes]: a segment compaction removed
    HOLDER  [claim, worker, at, expiry]

`positions` is the task index's int64 array, little-endian: the record positions of tasks
`base`, `base` + 1, …; every task below `settled` is done or dead and needs none (the
index keeps only live tasks: see `TaskIndex`). `first` and `last` are the positions of
task 0's record and of the last task's. A checkpoint saved before these keys existed
(every position from task 0) still loads, as `base` = `settled` = 0.

What loading validates, and why: a checkpoint describes particular logs, and applying it to
others would give verdicts no replay gives (a task run twice, or never). The logs may have
been deleted and re-created, replaced by another directory's, or cut short (a power cut
under a lax fsync policy can lose records the checkpoint covered). So for each topic the
first record and the last record folded (the one just before `next_position`) must still
be there with the same position, next position, length and crc32, the log's `start` must
be the same, and the log must be the one named by `identity` (its queue and topic, see
`logstore.identity`). An empty prefix records no records. The records between are not
folded again (that is what the checkpoint saves), but `prefix_crc`, the log's checksum of
everything from its start to `next_position` (`Log.checksum`: the raw bytes of a file
log), must still match: a byte damaged or rewritten anywhere in what the checkpoint covers
refuses it, and the replay from the start then meets the damage itself. A save extends
the checksum its handle took last time, so it reads only what was appended since; a
restore reads the covered prefix once (crc32 only, no decoding: see the README for the
figure). The crc32 of the body catches a torn or damaged file; the snapshots are checked
for consistency (`ClaimState.restore`, `TaskIndex.restore`; and the index may not have
settled a task the fold has not closed). Anything wrong means "no
checkpoint": `load_checkpoint` returns None and the worker replays from the start.

Saving writes a uniquely named temporary file in the same directory and renames it over
the checkpoint (os.replace): a reader sees the old file or the new one, never a mix, and
several workers may save at once (the last rename wins; every one is valid). There is no
fsync: after a power cut a lost or torn checkpoint is refused like any other bad file.
The logs are only read, never written.

The previous checkpoint is kept beside it, ``fold.checkpoint.previous``: a save that
replaces one that opens whole (its checksum holds) first gives that file the second name,
so the two are separate files. Compaction removes segments the older checkpoints need
(they list fewer removals), so it writes its checkpoint twice, as the previous one and
then as the current one, each forced, before it removes anything: every checkpoint kept
lists every segment removed, and either restores the queue. A damaged current one is
refused naming `qw compact --recover`, which puts the previous one back
(`recover_checkpoint`). On Redis there is none: only compaction writes the key.

Compaction (`queue_worker.compaction.files`) removes settled segments from the front of the logs,
and the checkpoint is then the only record of what they held. So a log's map says where
the covered records still retained begin (`start`: the log's start when nothing was
removed), and lists the removed segments in order (`compacted`, from `origin`, the log's
first position ever, to `start`) with a **digest chain** over them: ``chain`` is
crc32(base, end, crc of each removed segment in turn, as 8+8+4 little-endian bytes), so a
list edited after the fact does not match its chain. Loading checks that the list runs
without a gap from `origin` to `start`, that its chain matches, and that the log has lost
nothing after `start`; a log whose records begin after the checkpoint's `start` lost
history no checkpoint covers, and is refused (loudly: a worker will not replay a log that
does not begin at its origin). Saves and compactions take ``fold.checkpoint.lock`` in
turn, and a save carries the list of the checkpoint it replaces forward: a save never
forgets a removal. A version-2 checkpoint (before compaction) is refused like any other
version: the logs it was taken of were never compacted, so one full replay replaces it.

Version 4 added the FAILs accepted (`failed_count`, `ClaimState.failed_count`: what
`qw status` shows as failed attempts, read from the checkpoint instead of counted from
the log's start). A version-3 checkpoint, which lacks them, still loads when it lists
removed segments (compacted logs have no other record of what those held): its fold's
failed count is then not exact (`failed_exact` false) and counts only the FAILs accepted
after it, a lower bound that every later save carries on, the FAILs before it being gone
from both the logs and the checkpoint. A version-3 checkpoint of logs that hold every
record is refused (a checkpoint is a cache there): one replay from the start replaces it
with one whose count is exact.
"""

import contextlib
import functools
import os
import sys
import weakref
import zlib
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import msgpack

from logstore import Log, LogClosedError, LogError, LogIdentity, is_redis_url
from logstore.file.segments import sync_directory
from logstore.locking import maintenance_lock
from queue_worker.errors import QwError
from queue_worker.protocol.state import ClaimSnapshot, ClaimState, Lease, OpenTask
from queue_worker.topics import ClaimsFollower, TaskIndex, TaskIndexSnapshot

CHECKPOINT_NAME: Final = "fold.checkpoint"
#: the last checkpoint that opened whole, kept beside the current one (module docstring)
PREVIOUS_NAME: Final = f"{CHECKPOINT_NAME}.previous"
FORMAT: Final = "qw-fold-checkpoint"
VERSION: Final = 4
#: the previous version, which loads without the FAILs accepted (module docstring)
OLD_VERSION: Final = 3
LOCK_NAME: Final = f"{CHECKPOINT_NAME}.lock"

#: temporary files: ``.fold.checkpoint.<pid>.<random>.tmp`` (the pid lets a later save
#: remove what a killed saver left behind)
_TMP_PREFIX: Final = f".{CHECKPOINT_NAME}."
_TMP_SUFFIX: Final = ".tmp"


class CheckpointError(QwError):
    """A checkpoint could not be saved (the reason is in the message). The worker goes on
    without one: the only cost is a longer replay at the next start."""


class CheckpointRefused(QwError):
    """A checkpoint file that cannot be used (missing, damaged, another format, or taken of
    other logs); the message says why."""


class Removed(NamedTuple):
    """A segment compaction removed: its positions and the crc32 of its bytes."""

    base: int
    end: int
    crc: int


def chain_of(removed: Sequence[Removed]) -> int:
    """The digest chain over removed segments (module docstring)."""
    chain = 0
    for r in removed:
        packed = r.base.to_bytes(8, "little") + r.end.to_bytes(8, "little")
        chain = zlib.crc32(packed + r.crc.to_bytes(4, "little"), chain)
    return chain


#: where a checkpoint lives: a data directory, or a Redis URL (a str: a Path would mangle
#: its "//"), whose checkpoint is a key beside the streams (`queue_worker.history.redis_checkpoint`)
Location = Path | str


def _on_redis(location: Location) -> bool:
    return isinstance(location, str) and is_redis_url(location)


def checkpoint_name(location: Location) -> str:
    """The checkpoint of `location` as messages name it: its file, or its Redis key."""
    if _on_redis(location):
        from queue_worker.history import redis_checkpoint

        return redis_checkpoint.name_of(str(location))
    return str(Path(location) / CHECKPOINT_NAME)


def _read_checkpoint(location: Location) -> bytes:
    """The checkpoint's bytes: FileNotFoundError when there is none, OSError when it
    cannot be read."""
    if _on_redis(location):
        from queue_worker.history import redis_checkpoint

        data = redis_checkpoint.read(str(location))
        if data is None:
            raise FileNotFoundError(checkpoint_name(location))
        return data
    return (Path(location) / CHECKPOINT_NAME).read_bytes()


def checkpoint_exists(location: Location) -> bool:
    """Whether `location` has a checkpoint (of any content; nothing of it is read). OSError
    when it cannot tell."""
    if _on_redis(location):
        from queue_worker.history import redis_checkpoint

        return redis_checkpoint.exists(str(location))
    return (Path(location) / CHECKPOINT_NAME).exists()


@contextlib.contextmanager
def checkpoint_lock(directory: Location, *, wait: bool = True) -> Iterator[None]:
    """Saves and compactions of `directory`'s checkpoint, one at a time (across processes).
    `wait=False`: CheckpointError at once when another holds it (a worker's save does not
    wait for a compaction, which takes seconds: it saves next time)."""
    if _on_redis(directory):
        from queue_worker.history import redis_checkpoint

        try:
            with redis_checkpoint.lock(str(directory), wait=wait):
                yield
        except redis_checkpoint.LockHeld as e:
            raise CheckpointError(f"{e} (a compaction under way): not saved this time") from None
        return
    import filelock  # imported when a save or compaction first locks (logstore.locking)

    directory = Path(directory)
    lock = maintenance_lock(str(directory / LOCK_NAME))
    try:
        lock.acquire(timeout=-1 if wait else 0)
    except filelock.Timeout:
        raise CheckpointError(
            f"{directory / LOCK_NAME} is held (a compaction under way): not saved this time"
        ) from None
    try:
        yield
    finally:
        lock.release()


class _Record(NamedTuple):
    """Which record a checkpoint saw at a position: enough to tell if it is still there."""

    position: int
    next: int
    length: int
    crc: int


# -- saving ----------------------------------------------------------------------------------


def save_checkpoint(
    directory: Location,
    tasks: TaskIndex,
    tasks_log: Log,
    claims: ClaimsFollower,
    claims_log: Log,
    *,
    removing: dict[str, list[Removed]] | None = None,
    base: dict[str, Any] | None = None,
    locked: bool = False,
) -> None:
    """Save `tasks` and `claims` (folds that began at their logs' start) as the checkpoint
    of `directory`. Call it from the thread that owns the folds, between catch-ups.

    Raises CheckpointError for a failed save (a full disk, a read-only directory, a log
    that no longer holds what the fold read): catch it and carry on. The checkpoint file is
    then unchanged and no temporary file is left. (LogClosedError, a caller's bug, is not
    caught.)

    `removing`: segments compaction is about to remove, per topic ("tasks", "claims"): the
    checkpoint then starts their logs after them, and lists them (compaction saves this
    way, durably, before it removes them), and `base` is the fold of the removed claims
    records as the report needs it (`queue_worker.proof.report.Prefix`; kept as given, and
    carried forward by later saves). `locked`: the caller holds `checkpoint_lock`.
    """
    if not locked:
        try:
            with checkpoint_lock(directory, wait=False):
                save_checkpoint(
                    directory,
                    tasks,
                    tasks_log,
                    claims,
                    claims_log,
                    removing=removing,
                    base=base,
                    locked=True,
                )
        except OSError as e:
            raise CheckpointError(f"cannot lock the checkpoint of {directory}: {e}") from e
        return
    try:
        current = _current_body(directory)
        before = {} if current is None else _removed_lists(current)
        if base is None and current is not None:
            base = _base_of(current)
        claim_state = claims.state.snapshot()
        index = tasks.snapshot()
        first_task, last_task = _ends(index)
        last_claim = claim_state.position if claim_state.position >= 0 else None
        adding = removing or {}
        tasks_removed = [*before.get("tasks", []), *adding.get("tasks", [])]
        claims_removed = [*before.get("claims", []), *adding.get("claims", [])]
        tasks_ends = _log_plain(
            tasks_log, first_task, last_task, index.next_position, tasks_removed
        )
        claims_ends = _log_plain(claims_log, None, last_claim, claims.next_position, claims_removed)
        body = {
            "tasks": _tasks_plain(index, tasks_ends),
            "claims": _claims_plain(claims, claim_state, claims_ends),
        }
        if base is not None:
            body["base"] = base
        packed: bytes = msgpack.packb(body, use_bin_type=True)
        data: bytes = msgpack.packb(
            {"format": FORMAT, "version": VERSION, "crc32": zlib.crc32(packed), "body": packed},
            use_bin_type=True,
        )
    except LogClosedError:
        raise  # a caller's mistake, not a failed save
    except (LogError, OSError, ValueError, TypeError, OverflowError) as e:
        raise CheckpointError(f"cannot take a checkpoint: {e}") from e
    try:
        if _on_redis(directory):
            from queue_worker.history import redis_checkpoint

            redis_checkpoint.write(str(directory), data)  # (durable: see its docstring)
        else:
            _sweep_tmp(Path(directory))
            _write_atomically(
                Path(directory), data, durable=removing is not None, keep=current is not None
            )
    except OSError as e:
        raise CheckpointError(f"cannot write {checkpoint_name(directory)}: {e}") from e
    finally:
        del data
        _give_back_memory()


def _give_back_memory() -> None:
    """Return the save's freed buffers to the system (glibc keeps them otherwise).

    A save of 1M tasks' fold builds some 30 MB of transient buffers (the position array,
    the packed body, the envelope); glibc keeps freed heap memory, and a worker's resident
    size stayed 15-25 MiB higher after each save (measured: 34 → 57 MiB after two saves,
    back to 33 MiB with malloc_trim). Elsewhere than glibc this does nothing.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    # (ctypes and, below, secrets are imported by a save: `qw status` loads checkpoints
    # and must not pay for them, tests/test_startup_imports.py)
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def _record_at(log: Log, position: int) -> _Record | None:
    """The record exactly at `position`, or None."""
    record = _first_record_from(log, position)
    return record if record is not None and record.position == position else None


def _first_record_from(log: Log, position: int) -> _Record | None:
    """The first record at or after `position`: on a file log the one at it, on a Redis
    stream possibly a later id (ids have gaps: a stream trimmed to its end starts one past
    the last id removed, and the next entry appended is given a later one)."""
    entries = log.read(position, 1)
    if not entries:
        return None
    entry = entries[0]
    return _Record(entry.position, entry.next, len(entry.data), zlib.crc32(entry.data))


def _ends(index: TaskIndexSnapshot) -> tuple[int | None, int | None]:
    """The positions of the first and last task an index holds (None, None when empty)."""
    return index.first, index.last


def _current_body(directory: Location) -> dict[str, Any] | None:
    """The current checkpoint's body, or None when there is none or it does not open."""
    try:
        return _open_envelope(_read_checkpoint(directory))
    except (OSError, CheckpointRefused):
        return None


def _removed_lists(body: dict[str, Any]) -> dict[str, list[Removed]]:
    """The removed segments a checkpoint's body lists, per topic ({}: it is damaged)."""
    try:
        return {topic: _removed_of(_map(_map(body, topic), "log")) for topic in ("tasks", "claims")}
    except CheckpointRefused:
        return {}


def _base_of(body: dict[str, Any]) -> dict[str, Any] | None:
    base = body.get("base")
    return base if isinstance(base, dict) else None


def _removed_before(directory: Location) -> dict[str, list[Removed]]:
    """The removed segments the current checkpoint lists, per topic (a save carries them
    forward). Nothing for no checkpoint; a checkpoint that cannot be read when segments
    were removed makes `_log_plain` refuse the save (the log does not start at its origin)."""
    body = _current_body(directory)
    return {} if body is None else _removed_lists(body)


def removed_segments(directory: Location) -> dict[str, list[Removed]]:
    """The segments the checkpoint lists as removed, per topic ("tasks", "claims")."""
    return _removed_before(directory)


def read_base(directory: Location) -> dict[str, Any] | None:
    """The fold of the removed claims records the checkpoint keeps (see `save_checkpoint`),
    None when it keeps none (nothing was compacted) or cannot be read."""
    body = _current_body(directory)
    return None if body is None else _base_of(body)


def listed_start(directory: Location, topic: str, origin: int) -> int:
    """Where `topic`'s log starts by the checkpoint's list of removed segments (`origin`
    when it lists none): compaction removes what the durable checkpoint lists."""
    removed = _removed_before(directory).get(topic, [])
    return removed[-1].end if removed else origin


def _log_plain(
    log: Log,
    first_folded: int | None,
    last: int | None,
    next_position: int,
    removed: list[Removed],
) -> dict[str, Any]:
    """The LOG map: where the covered records still retained start, the first and last
    folded records, and the removed segments. `first_folded`: the first record's position
    when the fold knows it (the task index does)."""
    origin = log.origin
    start = removed[-1].end if removed else origin
    if log.start > start:
        raise ValueError(
            f"{log.name}: the log starts at {log.start}, but the checkpoint's list of removed "
            f"segments ends at {start}: segments were removed that no checkpoint lists"
        )
    common = {
        "start": start,
        "identity": _identity_of(log),
        "origin": origin,
        "compacted": [list(r) for r in removed],
        "chain": chain_of(removed),
    }
    if last is None or next_position == start:  # no records, or none retained
        if next_position != start:
            raise ValueError(f"{log.name}: a fold of no records is not at the log's start")
        return {**common, "first": None, "last": None, "prefix_crc": 0}
    if last < start:
        raise ValueError(f"{log.name}: the fold ends before the retained records start")
    first, seen = _first_record_from(log, start), _record_at(log, last)
    if first is None or seen is None or seen.next != next_position or first.position > last:
        raise ValueError(f"{log.name}: the fold does not match the log at position {last}")
    if start == origin and first_folded is not None and first_folded != first.position:
        raise ValueError(f"{log.name}: the fold did not begin at the log's first record")
    return {
        **common,
        "first": list(first),
        "last": list(seen),
        "prefix_crc": _prefix_crc(log, start, next_position),
    }


def _identity_of(log: Log) -> str | None:
    """The log's identity as the checkpoint names it: "<queue id hex>/<topic>"."""
    identity: LogIdentity | None = getattr(log, "identity", None)
    return None if identity is None else f"{identity.queue_hex}/{identity.topic}"


#: per log handle, the checksum from a start up to some position (what the last save
#: computed), so that the next save checksums only what was appended since
_PREFIX_CRCS: weakref.WeakKeyDictionary[Log, tuple[int, int, int]] = weakref.WeakKeyDictionary()


def _prefix_crc(log: Log, start: int, end: int, *, remember: bool = True) -> int:
    """`log.checksum` of everything from `start` to `end`, extending the last one taken
    through this handle from the same start when it covers less (a save reads only the new
    part; after a compaction moved the start, the retained records once)."""
    began, at, crc = _PREFIX_CRCS.get(log, (start, start, 0))
    if began != start or at > end:
        at, crc = start, 0
    crc = log.checksum(at, end, crc)
    if remember:
        _PREFIX_CRCS[log] = (start, end, crc)
    return crc


def _positions_bytes(positions: "array[int]") -> bytes:
    if sys.byteorder == "big":
        positions = array("q", positions)
        positions.byteswap()
    return positions.tobytes()


def _tasks_plain(index: TaskIndexSnapshot, log: dict[str, Any]) -> dict[str, Any]:
    return {
        "log": log,
        "next_position": index.next_position,
        "first": index.first,
        "last": index.last,
        "base": index.base,
        "settled": index.settled,
        "positions": _positions_bytes(index.positions),
        "foreign": list(index.foreign),
        "unreadable": [list(item) for item in index.unreadable],
        "scheduled": [list(item) for item in index.scheduled],
        "keys": [list(item) for item in index.keys],
        "duplicates": [list(item) for item in index.duplicates],
        "after": [[task, list(after)] for task, after in index.after],
        "retried": [list(item) for item in index.retried],
    }


def _claims_plain(
    claims: ClaimsFollower, snap: ClaimSnapshot, log: dict[str, Any]
) -> dict[str, Any]:
    return {
        "log": log,
        "next_position": claims.next_position,
        "malformed": claims.malformed,
        "last_malformed": claims.last_malformed,
        "state": state_plain(snap),
    }


def state_plain(snap: ClaimSnapshot) -> dict[str, Any]:
    """A claims fold's snapshot as msgpack values (`state_from` reads it back)."""
    return {
        "position": snap.position,
        "done_count": snap.done_count,
        "dead_count": snap.dead_count,
        "unknown_count": snap.unknown_count,
        "watermark": snap.watermark,
        "closed_above": list(snap.closed_above),
        "dead": [list(item) for item in snap.dead],
        "open": [
            [
                o.task,
                None if o.holder is None else list(o.holder),
                o.attempts,
                o.retry_at,
                o.last_error,
            ]
            for o in snap.open
        ],
        "failed_count": snap.failed_count,
        "failed_exact": snap.failed_exact,
    }


def _write_atomically(
    directory: Path, data: bytes, *, durable: bool = False, keep: bool = False
) -> None:
    """Replace the checkpoint; `durable`: on stable storage before this returns (compaction
    removes segments only once the checkpoint that lists them survives a power cut).
    `keep`: the checkpoint replaced opened whole, and becomes the previous one. A durable
    one is written as the previous one too, a copy of its own, first (module docstring:
    every checkpoint kept lists every segment removed)."""
    current = directory / CHECKPOINT_NAME
    if durable:
        _write_file(directory / PREVIOUS_NAME, data, durable=True)
    elif keep:  # the replaced file under the previous one's name (its bytes, not a copy)
        link = _tmp_name(directory)
        try:
            os.link(current, link)
            os.replace(link, directory / PREVIOUS_NAME)
        except OSError:  # a spare: a file system without hard links keeps none
            with contextlib.suppress(OSError):
                os.unlink(link)
    _write_file(current, data, durable=durable)
    if durable:
        sync_directory(str(directory))


def _tmp_name(directory: Path) -> Path:
    import secrets

    return directory / f"{_TMP_PREFIX}{os.getpid()}.{secrets.token_hex(8)}{_TMP_SUFFIX}"


def _write_file(path: Path, data: bytes, *, durable: bool) -> None:
    """Write `path` whole under a temporary name of its own, then rename it into place."""
    tmp = _tmp_name(path.parent)
    try:
        # O_EXCL: the name is ours alone; mode 0o666 less the umask, like the logs
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with open(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def recover_checkpoint(directory: Path) -> str:
    """Put the previous checkpoint back in place of a current one that does not open
    (damaged), under the checkpoint lock; what was done, in a sentence. CheckpointRefused
    when the previous one does not open either (then nothing is changed)."""
    current, previous = directory / CHECKPOINT_NAME, directory / PREVIOUS_NAME
    with checkpoint_lock(directory):
        try:
            _open_envelope(current.read_bytes())
            return f"{current} is whole: nothing to recover"
        except (OSError, CheckpointRefused) as e:
            damage = f"{current}: {_why(e)}"
        try:
            data = previous.read_bytes()
            _open_envelope(data)
        except (OSError, CheckpointRefused) as e:
            raise CheckpointRefused(
                f"{damage}, and the previous checkpoint {previous}: {_why(e)}: nothing to "
                "recover it from (the history of the removed segments is in no checkpoint)"
            ) from None
        _write_atomically(directory, data, durable=True)
        return f"{damage}: put back from {previous}"


def _why(error: OSError | CheckpointRefused) -> str:
    return error.strerror or str(error) if isinstance(error, OSError) else str(error)


def _sweep_tmp(directory: Path) -> None:
    """Remove temporary files that savers killed mid-save left (their pid is gone)."""
    for path in directory.glob(f"{_TMP_PREFIX}*{_TMP_SUFFIX}"):
        pid_text = path.name[len(_TMP_PREFIX) :].split(".", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid() or _alive(int(pid_text)):
            continue
        with contextlib.suppress(OSError):
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process (or no such pid number): leave its file
    return True


# -- loading ---------------------------------------------------------------------------------


def load_checkpoint(
    directory: Location, tasks_log: Log, claims_log: Log
) -> tuple[TaskIndex, ClaimsFollower] | None:
    """The folds saved in `directory`'s checkpoint, to catch up from where they stopped; or
    None when there is no usable checkpoint for these logs (then replay from the start).
    Never raises for a bad checkpoint file; never writes anything."""
    try:
        return restore_checkpoint(directory, tasks_log, claims_log)
    except CheckpointRefused:
        return None


def restore_checkpoint(
    directory: Location, tasks_log: Log, claims_log: Log
) -> tuple[TaskIndex, ClaimsFollower]:
    """`load_checkpoint`, saying why not: raises CheckpointRefused with the reason."""
    with _refusals(directory) as body:
        tasks, claims = _map(body, "tasks"), _map(body, "claims")
        index = _tasks_from(tasks)
        follower = _claims_from(claims)
        first_task, last_task = _ends(index)
        _check_log(_map(tasks, "log"), tasks_log, first_task, last_task, index.next_position)
        last_claim = follower.state.position if follower.state.position >= 0 else None
        _check_log(_map(claims, "log"), claims_log, None, last_claim, follower.next_position)
        _check_whole(_map(tasks, "log"), tasks_log, index.next_position)
        _check_whole(_map(claims, "log"), claims_log, follower.next_position)
        if index.settled > follower.state.watermark:  # the index forgets what the fold closed
            raise CheckpointRefused("the task index settled tasks the fold has not closed")
        if not follower.state.failed_exact and not _compacted(tasks, claims):
            raise CheckpointRefused(
                f"no exact count of the FAILs accepted (format version {OLD_VERSION}), of "
                "logs that hold every record: a replay from the start counts them"
            )
        return TaskIndex.restore(index), follower


def tasks_counted(location: Location, tasks_log: Log) -> tuple[int, int]:
    """How many tasks the checkpoint's task index knows, and the position where the record
    of the next one begins: a producer, which learns a task's id by counting the records
    before it, goes on counting from there rather than from the log's start (a queue of
    500,000 tasks: ~0.2 s a `qw enqueue`). The tasks log is checked as `restore_checkpoint`
    checks it (its identity, the first and last records covered, a crc32 of every byte
    covered): ids counted from a checkpoint of another log would be wrong for ever.
    CheckpointRefused otherwise (then count from the start)."""
    index = _checked_index(location, tasks_log)
    return index.known, index.next_position


def links_counted(location: Location, tasks_log: Log) -> tuple[dict[str, int], dict[int, int]]:
    """The first task of each key, and the first retry of each dead task retried, among
    the tasks the checkpoint's task index knows (it keeps both for ever), checked as
    `tasks_counted` checks: a producer that counts on from the checkpoint, or from the
    first task compaction kept, reads none of the records before, yet a key's first task
    is the task however long ago it ran (even once compaction removed it: protocol §2),
    and a dead task retried is never retried again. CheckpointRefused when it cannot be
    used."""
    index = _checked_index(location, tasks_log)
    return dict(index.keys), dict(index.retried)


def _checked_index(location: Location, tasks_log: Log) -> TaskIndexSnapshot:
    with _refusals(location) as body:
        tasks = _map(body, "tasks")
        index = _tasks_from(tasks)
        first_task, last_task = _ends(index)
        log_plain = _map(tasks, "log")
        _check_log(log_plain, tasks_log, first_task, last_task, index.next_position)
        _check_whole(log_plain, tasks_log, index.next_position)
        TaskIndex.restore(index)  # (its consistency checks)
        return index


@contextlib.contextmanager
def _refusals(location: Location) -> Iterator[dict[str, Any]]:
    """The checkpoint's body, for checks against the logs; whatever is wrong with the file
    or found wrong by the checks is raised as CheckpointRefused, naming the file."""
    path = checkpoint_name(location)
    try:
        data = _read_checkpoint(location)
    except FileNotFoundError:
        raise CheckpointRefused(f"{path}: no checkpoint{_recovery_hint(location)}") from None
    except OSError as e:
        raise CheckpointRefused(f"{path}: cannot read: {e}{_recovery_hint(location)}") from e
    try:
        body = _open_envelope(data)
    except CheckpointRefused as e:
        raise CheckpointRefused(f"{path}: {e}{_recovery_hint(location)}") from None
    try:
        yield body
    except CheckpointRefused as e:
        raise CheckpointRefused(f"{path}: {e}") from None
    except LogClosedError:
        raise  # a caller's mistake, not a bad checkpoint
    except (LogError, ValueError, OSError, OverflowError) as e:
        # ValueError: the restores' consistency checks; OSError and OverflowError: a log
        # read at an absurd position. (A log that cannot be read fails the replay as well.)
        raise CheckpointRefused(f"{path}: {e}") from e


def _recovery_hint(location: Location) -> str:
    """For a damaged checkpoint: the command that puts the previous one back, when that
    one opens whole (nothing, on Redis: compaction alone writes its checkpoint there)."""
    if _on_redis(location):
        return ""
    previous = Path(location) / PREVIOUS_NAME
    try:
        _open_envelope(previous.read_bytes())
    except (OSError, CheckpointRefused):
        return ""
    return f"; the previous checkpoint is whole: qw compact --recover --dir {location} puts it back"


def _open_envelope(data: bytes) -> dict[str, Any]:
    try:
        # msgpack raises several unrelated exception types on garbage (as in records.py)
        outer = msgpack.unpackb(data, raw=False)
    except Exception as e:
        raise CheckpointRefused(f"not msgpack: {type(e).__name__}: {e}") from None
    if not isinstance(outer, dict) or outer.get("format") != FORMAT:
        raise CheckpointRefused("not a qw fold checkpoint")
    if outer.get("version") not in (VERSION, OLD_VERSION):
        raise CheckpointRefused(f"format version {outer.get('version')!r}; expected {VERSION}")
    packed, crc = outer.get("body"), outer.get("crc32")
    if not isinstance(packed, bytes) or zlib.crc32(packed) != crc:
        raise CheckpointRefused("damaged (checksum mismatch)")
    try:
        body = msgpack.unpackb(packed, raw=False)
    except Exception as e:
        raise CheckpointRefused(f"damaged body: {type(e).__name__}: {e}") from None
    if not isinstance(body, dict):
        raise CheckpointRefused("damaged body")
    return body


def _check_log(
    plain: dict[str, Any],
    log: Log,
    first_folded: int | None,
    last: int | None,
    next_position: int,
) -> None:
    """Refuse the checkpoint unless `log` is still the log it was taken of (module doc)."""
    start = _int(plain, "start")
    origin = _int(plain, "origin") if "origin" in plain else start
    if origin != log.origin:
        raise CheckpointRefused(f"{log.name}: taken of a log that starts elsewhere")
    removed = _removed_of(plain)
    _check_chain(plain, log, removed, origin, start)
    if log.start > start:
        raise CheckpointRefused(
            f"{log.name}: the log starts at {log.start}, after the {start} where this "
            "checkpoint's records begin: segments were removed that it does not cover "
            "(lost history)"
        )
    if start != origin:
        first_folded = None  # (the fold's first records were compacted away)
    first, seen = _opt_record(plain, "first"), _opt_record(plain, "last")
    if last is not None and first is None and seen is None and next_position == start:
        last = None  # every record the fold covers was compacted away
    if last is None:
        if first is not None or seen is not None or next_position != start:
            raise CheckpointRefused(f"{log.name}: an empty fold that records records")
        return
    if first is None or seen is None or seen.position != last or seen.next != next_position:
        raise CheckpointRefused(f"{log.name}: the recorded records do not match the fold")
    if first_folded is not None and first_folded != first.position:
        raise CheckpointRefused(f"{log.name}: the fold did not begin at the first record")
    for want in (first, seen):
        if want.position < start:
            raise CheckpointRefused(f"{log.name}: position {want.position} is before the start")
        if _record_at(log, want.position) != want:
            raise CheckpointRefused(
                f"{log.name}: the record at position {want.position} is missing or differs "
                "(the log was replaced, cut short or rewritten)"
            )


def _check_whole(plain: dict[str, Any], log: Log, next_position: int) -> None:
    """Refuse the checkpoint unless it names `log`'s identity and every byte it covers is
    still as it was (after `_check_log` of both logs: a log whose records differ is named
    by that check first)."""
    if plain.get("identity") != _identity_of(log):
        raise CheckpointRefused(
            f"{log.name}: taken of the log {plain.get('identity')!r}, not of this one "
            f"({_identity_of(log)!r})"
        )
    # Every byte the checkpoint covers, not just its ends: a record damaged or rewritten in
    # between would otherwise be trusted for ever (the fold never reads it again).
    start = _int(plain, "start")
    if _prefix_crc(log, start, next_position, remember=False) != plain.get("prefix_crc"):
        raise CheckpointRefused(
            f"{log.name}: the records the checkpoint covers (up to position {next_position}) "
            "have changed since it was taken (damaged or rewritten)"
        )


def _compacted(tasks: dict[str, Any], claims: dict[str, Any]) -> bool:
    """Whether the checkpoint lists segments removed from either log (maps of its body)."""
    return any(_removed_of(_map(topic, "log")) for topic in (tasks, claims))


def _removed_of(plain: dict[str, Any]) -> list[Removed]:
    """The LOG map's removed segments (none in a version-2 checkpoint)."""
    items = plain.get("compacted", [])
    if not isinstance(items, list) or not all(
        isinstance(item, list) and len(item) == 3 for item in items
    ):
        raise CheckpointRefused("damaged: 'compacted' is not a list of segments")
    return [Removed(*(_int_item(v) for v in item)) for item in items]


def _check_chain(
    plain: dict[str, Any], log: Log, removed: list[Removed], origin: int, start: int
) -> None:
    """The removed segments run without a gap from `origin` to `start`, and their digest
    chain is the one recorded: a list edited (a segment dropped from it, or changed) after
    the checkpoint was written does not pass."""
    at = origin
    for r in removed:
        if r.base != at or r.end <= r.base:
            raise CheckpointRefused(
                f"{log.name}: the removed segments leave a gap at position {at}: history lost"
            )
        at = r.end
    if at != start:
        raise CheckpointRefused(
            f"{log.name}: the removed segments end at {at}, not at {start}: history lost"
        )
    if chain_of(removed) != plain.get("chain", 0):
        raise CheckpointRefused(
            f"{log.name}: the digest chain of the removed segments does not match: tampered"
        )


def _tasks_from(plain: dict[str, Any]) -> TaskIndexSnapshot:
    raw = plain.get("positions")
    positions = array("q")
    if not isinstance(raw, bytes) or positions.itemsize != 8 or len(raw) % 8:
        raise CheckpointRefused("damaged task positions")
    positions.frombytes(raw)
    if sys.byteorder == "big":
        positions.byteswap()
    if "base" in plain:
        first, last = _opt_int(plain, "first"), _opt_int(plain, "last")
        base, settled = _int(plain, "base"), _int(plain, "settled")
    else:  # saved before the index kept only live tasks: every task from 0, none settled
        first = positions[0] if positions else None
        last = positions[-1] if positions else None
        base = settled = 0
    return TaskIndexSnapshot(
        _int(plain, "next_position"),
        first,
        last,
        base,
        settled,
        positions,
        tuple(_int_item(t) for t in _list(plain, "foreign")),
        tuple((_int_item(t), _str_item(why)) for t, why in _pairs(plain, "unreadable")),
        _scheduled(plain),
        tuple((_str_item(k), _int_item(t)) for k, t in _pairs(plain, "keys"))
        if "keys" in plain
        else (),
        tuple((_int_item(t), _int_item(f)) for t, f in _pairs(plain, "duplicates"))
        if "duplicates" in plain
        else (),
        _after(plain),
        tuple((_int_item(t), _int_item(r)) for t, r in _pairs(plain, "retried"))
        if "retried" in plain
        else (),
    )


def _after(plain: dict[str, Any]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The index's tasks with dependencies (none in a checkpoint saved before)."""
    if "after" not in plain:
        return ()
    found = []
    for task, after in _pairs(plain, "after"):
        if not isinstance(after, list) or not after:
            raise CheckpointRefused(f"dependencies {after!r}; expected [task, [task, ...]]")
        found.append((_int_item(task), tuple(_int_item(d) for d in after)))
    return tuple(found)


def _scheduled(plain: dict[str, Any]) -> tuple[tuple[int, int, int], ...]:
    """The index's tasks with a delay or a priority (none in a checkpoint saved before)."""
    if "scheduled" not in plain:
        return ()
    found = []
    for item in _list(plain, "scheduled"):
        if not isinstance(item, list) or len(item) != 3:
            expected = "expected [task, not_before, priority]"
            raise CheckpointRefused(f"scheduled task {item!r}; {expected}")
        found.append((_int_item(item[0]), _int_item(item[1]), _int_item(item[2])))
    return tuple(found)


def _claims_from(plain: dict[str, Any]) -> ClaimsFollower:
    snap = state_from(_map(plain, "state"))
    follower = ClaimsFollower(_int(plain, "next_position"), ClaimState.restore(snap))
    follower.malformed = _int(plain, "malformed")
    last_malformed = plain.get("last_malformed")
    follower.last_malformed = None if last_malformed is None else _str_item(last_malformed)
    return follower


def state_from(state: dict[str, Any]) -> ClaimSnapshot:
    """The snapshot `state_plain` wrote (CheckpointRefused when it is damaged). One of
    version 3 has no FAIL count: 0, not exact (module docstring)."""
    open_tasks: list[OpenTask] = []
    for item in _list(state, "open"):
        if not isinstance(item, list) or len(item) != 5:
            raise CheckpointRefused("damaged open task")
        task, holder, attempts, retry_at, last_error = item
        open_tasks.append(
            OpenTask(
                _int_item(task),
                None if holder is None else _lease(holder),
                _int_item(attempts),
                None if retry_at is None else _int_item(retry_at),
                None if last_error is None else _str_item(last_error),
            )
        )
    return ClaimSnapshot(
        _int(state, "position"),
        _int(state, "done_count"),
        _int(state, "dead_count"),
        _int(state, "unknown_count"),
        _int(state, "watermark"),
        tuple(_int_item(t) for t in _list(state, "closed_above")),
        tuple((_int_item(t), _str_item(error)) for t, error in _pairs(state, "dead")),
        tuple(open_tasks),
        _int(state, "failed_count") if "failed_count" in state else 0,
        _bool(state, "failed_exact") if "failed_exact" in state else False,
    )


# -- typed access to decoded msgpack (a checkpoint file is untrusted input) ------------------


def _map(plain: dict[str, Any], key: str) -> dict[str, Any]:
    value = plain.get(key)
    if not isinstance(value, dict):
        raise CheckpointRefused(f"damaged: {key!r} is not a map")
    return value


def _list(plain: dict[str, Any], key: str) -> list[Any]:
    value = plain.get(key)
    if not isinstance(value, list):
        raise CheckpointRefused(f"damaged: {key!r} is not a list")
    return value


def _pairs(plain: dict[str, Any], key: str) -> list[tuple[Any, Any]]:
    items = _list(plain, key)
    if not all(isinstance(item, list) and len(item) == 2 for item in items):
        raise CheckpointRefused(f"damaged: {key!r} is not a list of pairs")
    return [(a, b) for a, b in items]


def _int(plain: dict[str, Any], key: str) -> int:
    return _int_item(plain.get(key))


def _opt_int(plain: dict[str, Any], key: str) -> int | None:
    value = plain.get(key)
    return None if value is None else _int_item(value)


def _int_item(value: Any) -> int:
    if type(value) is not int:  # bool is an int subclass, and not a task id
        raise CheckpointRefused(f"damaged: {value!r:.40} where an integer goes")
    return value


def _bool(plain: dict[str, Any], key: str) -> bool:
    value = plain.get(key)
    if type(value) is not bool:
        raise CheckpointRefused(f"damaged: {key!r} is {value!r:.40}, not a boolean")
    return value


def _str_item(value: Any) -> str:
    if not isinstance(value, str):
        raise CheckpointRefused(f"damaged: {value!r:.40} where a string goes")
    return value


def _lease(value: Any) -> Lease:
    if not isinstance(value, list) or len(value) != 4:
        raise CheckpointRefused("damaged lease")
    claim, worker, at, expiry = value
    return Lease(_int_item(claim), _str_item(worker), _int_item(at), _int_item(expiry))


def _opt_record(plain: dict[str, Any], key: str) -> _Record | None:
    value = plain.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 4:
        raise CheckpointRefused(f"damaged: {key!r} is not a record")
    return _Record(*(_int_item(v) for v in value))
