"""Keeping the members topic small: what of it may go, and removing it.

Every member appends three heartbeats a lease for as long as it runs, so the members
topic would grow for ever and every member that starts would replay all of it. Only a
little of it decides anything: who is alive now is each member's **last** heartbeat, the
LEAVE of a member whose heartbeat has not lapsed yet, and the newest time (the view's
clock, `MemberView.now`). `keep_from(entries)` is the first position a reader must still
find; everything before it may be removed:

- a heartbeat followed by a later record of the same member changes nothing the later one
  does not (a later heartbeat sets the expiry again; a LEAVE removes the member);
- the last heartbeat of a member that is not alive (it lapsed by the view's clock, which
  only moves forward, or the member left) can make no one alive again;
- a LEAVE of a member whose last heartbeat lapsed says nothing the lapse does not.

So a reader that starts after the cut, and a reader that had read up to some point before
it and then reads on from the cut, both reach the view of the whole topic: the same
members alive, the same clock (`trim_members` checks the first before it removes anything,
and removes nothing when it would differ).

How: on the file log the topic is written in small segments (`MEMBERS_SEGMENT_BYTES`), and
the sealed segments that end at or before the cut are removed (`Log.drop_before`;
a reader whose position was in one gets PositionCompactedError and reads again from the
start: `MemberView.catch_up`). On Redis the stream is trimmed to the cut's entry id
(``XTRIM MINID``): a reader before it reads on from the first entry kept. Any member
trims, from its heartbeat thread every `TRIM_EVERY` heartbeats (`queue_worker.partitions.member`);
two trims at once remove the same things. A member whose own handle fails to read on
after a trim (the file log's handle can take removed segments for a gap) reads the topic
again on a new handle (`Member.rebalance`).

The topic then holds about a lease of heartbeats (3 per member), plus up to two segments
on the file log: bounded by the members alive, not by the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from logstore import Entry, Log
from queue_worker.partitions.membership import (
    Heartbeat,
    MemberView,
    decode_member_record,
    open_members,
)

#: a member trims the topic once every this many heartbeats
TRIM_EVERY: Final = 30


def keep_from(entries: Sequence[Entry]) -> int | None:
    """The first position of `entries` (the whole topic, in order) that a reader must still
    find (see the module docstring); None when there are none."""
    if not entries:
        return None
    last: dict[str, int] = {}  # member -> the position of its last record
    expiry: dict[str, int] = {}  # member -> its last heartbeat's expiry
    now = 0
    newest = entries[0].position  # the record that sets the clock
    for entry in entries:
        record = decode_member_record(entry)
        if record is None:
            continue
        if record.at >= now:
            now, newest = record.at, entry.position
        last[record.member] = entry.position
        if isinstance(record, Heartbeat):
            expiry[record.member] = record.at + record.lease
    cut = newest
    for member, position in last.items():
        # needed: the last heartbeat of a member alive, or the LEAVE of one whose last
        # heartbeat has not lapsed (without it, that heartbeat would make it alive again)
        if expiry.get(member, 0) > now:
            cut = min(cut, position)
    return cut


def read_all(log: Log) -> list[Entry]:
    entries: list[Entry] = []
    position = log.start
    while batch := log.read(position, 4096):
        entries.extend(batch)
        position = batch[-1].next
    return entries


def _view(entries: Sequence[Entry]) -> MemberView:
    view = MemberView()
    for entry in entries:
        view.apply(entry)
    return view


def trim_members(log: Log) -> int:
    """Remove the members topic's records before `keep_from`; how many records went.
    Nothing goes when the view of what would remain differs from the whole topic's."""
    entries = read_all(log)
    cut = keep_from(entries)
    if cut is None:
        return 0
    kept = [e for e in entries if e.position >= cut]
    whole, rest = _view(entries), _view(kept)
    if whole.alive() != rest.alive() or whole.now != rest.now:
        return 0  # (keep_from keeps every record the view needs: a bug, kept safe)
    kept_from = log.drop_before(cut)
    return sum(1 for e in entries if e.position < kept_from)


def trim_members_at(location: str | Path) -> int:
    """`trim_members` on a handle of its own. (A file log handle that has read the topic
    before another handle removed segments ahead of it can take the gap for damage: a trim,
    and a read after one, start on a fresh handle.)"""
    log = open_members(location)
    try:
        return trim_members(log)
    finally:
        log.close()


__all__ = ["TRIM_EVERY", "keep_from", "read_all", "trim_members", "trim_members_at"]
