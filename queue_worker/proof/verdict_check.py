"""The report's cross-check of server verdicts: re-fold the claims stream, compare every task.

Where the server computes verdicts (`queue_worker.redis.server_verdicts`), the client-side fold
stays the definition: this module reads the server's per-task state together with the
stream's end (one script call: one moment), folds the stream's records up to the last one
the server folded, exactly as every reader does, and compares the two, task by task. Any
difference is a bug in one of the two implementations of the rules, never a property of a
run; `qw report` prints each one and exits non-zero.

A stream whose last record the server did not fold (a writer appended without the verdict
script) is a disagreement too: the server's state no longer describes the log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, cast

from logstore.location import is_redis_url
from logstore.redis.log import RedisLog
from queue_worker.names import printable, worker_label
from queue_worker.protocol.records import RecordDecodeError, Unknown
from queue_worker.protocol.state import ClaimSnapshot, ClaimState
from queue_worker.redis.server_verdicts import ServerVerdicts, TaskView, fold_view
from queue_worker.topics import CLAIMS_TOPIC, MALFORMED, decode_claims_entry, open_topic

__all__ = ["check_location", "check_log", "describe"]

#: the disagreements named one by one; more are counted
SHOWN: Final = 20


def describe(view: TaskView | None) -> str:
    """A task's state in a few words, for a person."""
    if view is None:
        return "never claimed"
    if view.status == "done":
        return "done"
    if view.status == "dead":
        return f"dead ({printable(view.error or '')!r})"
    parts = [f"open, {view.attempts} winning claim{'s' * (view.attempts != 1)}"]
    if view.holder is not None:
        h = view.holder
        parts.append(
            f"held by {worker_label(h.worker)} under claim {h.claim} (at {h.at}, expiry {h.expiry})"
        )
    if view.retry_at is not None:
        parts.append(f"retry at {view.retry_at}")
    if view.error is not None:
        parts.append(f"last error {printable(view.error)!r}")
    return ", ".join(parts)


def check_location(location: str | Path) -> list[str]:
    """The disagreements between the server's verdicts and the fold at `location`: one line
    each (empty when they agree, or when the queue has no server verdicts)."""
    if not is_redis_url(str(location)):
        return []
    from queue_worker.proof.report import compacted_prefix  # (the report's account of a trim)

    # A trimmed stream: the server's state still describes the tasks whose records went;
    # the fold starts from the checkpoint's fold of them, as the report's does.
    compacted = compacted_prefix(location)
    with open_topic(location, CLAIMS_TOPIC, read_only=True) as opened:
        log = cast("RedisLog", opened)  # (a redis:// location's topic is a stream)
        if compacted is None:
            return check_log(log)
        return check_log(log, compacted[0].state, compacted[1])


def check_log(
    log: RedisLog, prefix: ClaimSnapshot | None = None, start: int | None = None
) -> list[str]:
    """`check_location` for an open claims stream; `prefix` is the fold of the records
    before `start` (a trimmed stream's checkpoint), None for a stream that holds them all."""
    server = ServerVerdicts(log).state()
    if server is None:
        return []
    problems: list[str] = []
    if server.tail != server.through:
        problems.append(
            f"the claims stream's last record added is at {server.tail}, but the server's verdicts "
            f"folded through {server.through}: a writer appended without them"
        )
    fold = ClaimState() if prefix is None else ClaimState.restore(prefix)
    through = server.through if server.through is not None else -1
    for entry in log.iter_from(log.start if start is None else start):
        if entry.position > through:
            break
        try:
            record = decode_claims_entry(entry)
        except RecordDecodeError:  # skipped by every fold, as here
            record = Unknown(MALFORMED)
        fold.apply(record, entry.position)
    # every task either side knows: the server's, and the fold's closed and open ones
    snap = fold.snapshot()
    tasks = set(server.tasks)
    tasks.update(range(snap.watermark), snap.closed_above, (o.task for o in snap.open))
    differ: list[str] = []
    for task in sorted(tasks):
        mine = fold_view(fold, task)
        try:
            theirs = server.view(task)  # (a done task below a trim's ~below has no field)
        except ValueError as e:
            differ.append(f"task {task}: the server's state does not decode ({e})")
            continue
        if theirs != mine:
            differ.append(
                f"task {task}: the server's verdicts say {describe(theirs)}; "
                f"the fold of the claims stream says {describe(mine)}"
            )
    # the index the claiming script picks from: every open task, scored by when it may next
    # be claimed (its holder's expiry, or its retry time), and nothing else
    wanted = {
        o.task: o.holder.expiry if o.holder is not None else o.retry_at
        for o in snap.open
        if o.holder is not None or o.retry_at is not None
    }
    for task in sorted(set(wanted) | set(server.scheduled)):
        if wanted.get(task) != server.scheduled.get(task):
            differ.append(
                f"task {task}: the server's index of open tasks says claimable from "
                f"{server.scheduled.get(task, 'never (not indexed)')}; the fold says "
                f"{wanted.get(task, 'not open')}"
            )
    problems += differ[:SHOWN]
    if len(differ) > SHOWN:
        problems.append(f"… and {len(differ) - SHOWN} more tasks")
    return problems
