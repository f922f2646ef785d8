"""The compacted prefix: what the report takes from the checkpoint instead of the logs.

Compaction removes settled claims segments; the report can no longer replay them. Before it
removes them, compaction folds them the way the report does (`queue_worker.proof.report`'s
replay, continued from the previous prefix) and keeps the result in the fold checkpoint
(its ``base``): the fold's state right after the last removed record, the report's counters
over every removed record, and the tasks published before the retained tasks records. The
report starts from it and replays every retained record with all its checks; the totals it
shows add the prefix's. The checkpoint's CRC covers it like everything else it holds, and
its digest chain names each removed segment (`queue_worker.history.checkpoint`).

The prefix holds every counter of the report's replay, so that a report of the compacted
queue shows the counts and the verdict the one before compacting showed; only its lists
(the takeovers, stale completions, dead tasks, workers, margins and attempts per task)
keep the retained part. `cancelled_unclaimed` and `lost_by_reason` were added later (as
the checkpoint's "keys" and "scheduled" were: no version change, since an older qw ignores
them); a prefix saved before them reads them as none: its report then counts the tasks a
CANCEL made dead before any claim among those won (the accounting still holds, by the
same count on both sides) and names no reason for the claims it lost.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from queue_worker.history.checkpoint import (
    CheckpointRefused,
    Location,
    listed_start,
    read_base,
    state_from,
    state_plain,
)
from queue_worker.protocol.state import ClaimSnapshot

#: the counters of the report's replay a prefix carries (names of `_Replay` attributes)
COUNTERS = (
    "records",
    "attempts",
    "wins",
    "renewals",
    "renewals_refused",
    "completions",
    "completions_accepted",
    "fails_accepted",
    "fails_stale",
    "cancelled_unclaimed",
)
#: the fields a prefix saved by an older qw lacks (read as their defaults: docstring)
ADDED_LATER = frozenset({"cancelled_unclaimed", "lost_by_reason"})


@dataclass(frozen=True)
class Prefix:
    """The fold of a compacted prefix, as the report continues from it."""

    position: int  # where the retained claims records start (the first not in the prefix)
    tasks: int  # tasks published before the retained tasks records start
    state: ClaimSnapshot  # the claims fold right after the prefix's last record
    records: int = 0
    attempts: int = 0
    wins: int = 0
    renewals: int = 0
    renewals_refused: int = 0
    completions: int = 0
    completions_accepted: int = 0
    fails_accepted: int = 0
    fails_stale: int = 0
    cancelled_unclaimed: int = 0  # tasks a CANCEL made dead before any claim won them
    takeovers: int = 0
    stale_completions: int = 0
    malformed: int = 0
    worked_twice: tuple[int, ...] = ()  # tasks worked twice in the prefix (a failed run)
    lost_by_reason: tuple[tuple[str, int], ...] = ()  # the lost claims per verdict, sorted

    def to_plain(self) -> dict[str, Any]:
        plain = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "state"}
        plain["worked_twice"] = list(self.worked_twice)
        plain["lost_by_reason"] = dict(self.lost_by_reason)
        plain["state"] = state_plain(self.state)
        return plain

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> Prefix:
        """The prefix a checkpoint keeps (CheckpointRefused when it is damaged)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = plain.get(f.name)
            if value is None and f.name in ADDED_LATER:
                continue  # (its default)
            if f.name == "state":
                if not isinstance(value, dict):
                    raise CheckpointRefused("damaged: the prefix has no state")
                values["state"] = state_from(value)
            elif f.name == "worked_twice":
                if not isinstance(value, list) or not all(type(t) is int for t in value):
                    raise CheckpointRefused("damaged: the prefix's worked-twice tasks")
                values["worked_twice"] = tuple(value)
            elif f.name == "lost_by_reason":
                if not isinstance(value, dict) or not all(
                    isinstance(k, str) and type(n) is int and n > 0 for k, n in value.items()
                ):
                    raise CheckpointRefused("damaged: the prefix's lost claims by reason")
                values["lost_by_reason"] = tuple(sorted(value.items()))
            elif type(value) is not int or value < 0:
                raise CheckpointRefused(f"damaged: the prefix's {f.name!r} is {value!r:.40}")
            else:
                values[f.name] = value
        return cls(**values)

    def summary(self) -> dict[str, Any]:
        """The prefix as the report's JSON shows it (no fold state)."""
        shown = asdict(self)
        del shown["state"]
        shown["lost_by_reason"] = dict(self.lost_by_reason)
        shown["tasks_done"] = self.state.done_count
        shown["tasks_dead"] = self.state.dead_count
        return shown


def first_retained_task(location: Location, origin: int) -> tuple[int, int]:
    """For a tasks log compaction removed records of: the id of the task whose record is
    the first retained, by the checkpoint, and its position (where the checkpoint's list of
    removed segments ends: a killed compaction may have left them on disk, still counted
    as removed). A task's id is its index in the topic: a producer counts on from it.
    CheckpointRefused when the checkpoint keeps no usable prefix (history lost)."""
    plain = read_base(location)
    if plain is None:
        raise CheckpointRefused(
            f"{location}: the tasks log was compacted and no checkpoint says how many tasks "
            "it held (lost history): task ids cannot be given"
        )
    return Prefix.from_plain(plain).tasks, listed_start(location, "tasks", origin)
