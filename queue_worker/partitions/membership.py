"""Membership: which worker processes work a partitioned queue now, read from a log.

The members of a partitioned queue — worker processes, on any number of hosts and under
any number of supervisors — say they are alive in a topic of their own, ``members``:

    HEARTBEAT  [1, "H", member, at, lease]    alive until at + lease (sent every lease/3)
    LEAVE      [1, "L", member, at]           gone for good (a clean exit)

`MemberView` folds the topic. Who is alive is judged by the records' own times, as leases
are (Rule 7): a member is alive when its last HEARTBEAT's ``at + lease`` is later than the
newest record's time and it has not left. On Redis every record's time is the server's
(`Entry.server_time_us`), so hosts with skewed clocks agree. The view is a pure function
of the log prefix, so every member that has read the same records computes the same
assignment (`queue_worker.partition_layout.assign`) — no coordinator, no vote.

Members that have read different prefixes may briefly disagree: a partition worked by two
members for a moment, or by none. Neither is unsafe — the partition's own claims fold
decides every task, and a lease still has to lapse before a task held by a departed member
is taken over (Rule 1); a member given a partition takes it over only by lease expiry.

Where the topic lives: ``<dir>/members/members.log`` on the file log; on Redis the stream
``{members}:qw:members`` (one hash tag: its append touches one slot). It is kept small:
the records that no longer decide who is alive are removed as members run
(`queue_worker.partitions.members_trim`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import msgpack

from logstore import Entry, Log, PositionCompactedError, is_redis_url, open_log
from queue_worker.partition_layout import assign

MEMBERS_TOPIC: Final = "members"
SCHEMA: Final = 1
#: the members topic's segment size on the file log (~1,000 heartbeats): what is removed
#: when the topic is trimmed (`queue_worker.partitions.members_trim`)
MEMBERS_SEGMENT_BYTES: Final = 64 * 1024


@dataclass(frozen=True)
class Heartbeat:
    member: str
    at: int  # µs
    lease: int  # µs


@dataclass(frozen=True)
class Leave:
    member: str
    at: int


def encode_heartbeat(member: str, at: int, lease: int) -> bytes:
    return bytes(msgpack.packb([SCHEMA, "H", member, at, lease]))


def encode_leave(member: str, at: int) -> bytes:
    return bytes(msgpack.packb([SCHEMA, "L", member, at]))


def decode_member_record(entry: Entry) -> Heartbeat | Leave | None:
    """The record in `entry` (its time the server's when the backend stamps one); None for
    a record this version does not know or that does not decode (skipped by every reader)."""
    try:
        value = msgpack.unpackb(entry.data)
    except Exception:  # untrusted bytes: anything msgpack raises means "not a record"
        return None
    if not isinstance(value, list) or len(value) < 4 or value[0] != SCHEMA:
        return None
    kind, member, at = value[1], value[2], value[3]
    if not isinstance(member, str) or not isinstance(at, int):
        return None
    if entry.server_time_us is not None:
        at = entry.server_time_us
    if kind == "H" and len(value) >= 5 and isinstance(value[4], int):
        return Heartbeat(member, at, value[4])
    if kind == "L":
        return Leave(member, at)
    return None


def members_location(location: str | Path) -> str:
    """Where the members topic of the queue at `location` lives."""
    text = str(location)
    if not is_redis_url(text):
        return str(Path(text) / MEMBERS_TOPIC)
    parts = urlsplit(text)
    query = parse_qsl(parts.query, keep_blank_values=True)
    base = next((v for k, v in query if k == "prefix"), "")
    prefix = f"{base}:{{{base}.members}}" if base else "{members}"
    # (no verdicts=: the members topic has no claims, so the queue's verdict mode means
    # nothing to it, and a members topic created before the mode was recorded must not
    # refuse a URL that names the partitions' mode)
    rest = [(k, v) for k, v in query if k not in ("prefix", "verdicts")]
    return urlunsplit(parts._replace(query=urlencode([("prefix", prefix), *rest])))


def open_members(location: str | Path, *, segment_bytes: int | None = None) -> Log:
    """The members topic of the queue at `location`. On the file log it is written in
    small segments, so that what no longer counts can be removed (`queue_worker.
    members_trim`): `segment_bytes` from now on, or MEMBERS_SEGMENT_BYTES for a topic
    created here (an existing one keeps its own)."""
    where = members_location(location)
    new_file = not is_redis_url(where) and not (Path(where) / f"{MEMBERS_TOPIC}.log").exists()
    if segment_bytes is None and new_file:
        segment_bytes = MEMBERS_SEGMENT_BYTES
    return open_log(where, MEMBERS_TOPIC, family=(MEMBERS_TOPIC,), segment_bytes=segment_bytes)


@dataclass
class MemberView:
    """The fold of the members topic."""

    position: int | None = None  # the next record to read (None: the log's start)
    now: int = 0  # the newest record's time: the clock the view judges by
    expiry: dict[str, int] = field(default_factory=dict)  # member -> alive until
    left: set[str] = field(default_factory=set)

    def apply(self, entry: Entry) -> None:
        record = decode_member_record(entry)
        self.position = entry.next
        if record is None:
            return
        self.now = max(self.now, record.at)
        if isinstance(record, Leave):
            self.left.add(record.member)
            self.expiry.pop(record.member, None)
        elif record.member not in self.left:
            self.expiry[record.member] = record.at + record.lease

    def catch_up(self, log: Log) -> None:
        """Read the topic on from where the view is. When the records there were trimmed
        away (`queue_worker.partitions.members_trim`), start again from the first one kept: what was
        removed decided nothing the rest does not."""
        try:
            self._read_on(log)
        except PositionCompactedError:
            self.position, self.now = None, 0
            self.expiry.clear()
            self.left.clear()
            self._read_on(log)

    def _read_on(self, log: Log) -> None:
        while entries := log.read(log.start if self.position is None else self.position, 4096):
            for entry in entries:
                self.apply(entry)

    def alive(self) -> list[str]:
        return sorted(m for m, until in self.expiry.items() if until > self.now)

    def assignment(self, partitions: int) -> dict[str, list[int]]:
        return assign(self.alive(), partitions)


__all__ = [
    "MEMBERS_SEGMENT_BYTES",
    "MEMBERS_TOPIC",
    "Heartbeat",
    "Leave",
    "MemberView",
    "decode_member_record",
    "encode_heartbeat",
    "encode_leave",
    "members_location",
    "open_members",
]
