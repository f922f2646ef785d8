"""ClaimsFollower folds a read's records in one go (`fold_entries`: `decode_claims_all`, then
`ClaimState.apply_all`): on a real claims log of well-formed, hostile and malformed records,
appended in batches, it must reach what folding one record at a time reaches (`apply`:
the same state, the same malformed count and message), and settle our own records with the
verdicts that fold gives them."""

from __future__ import annotations

import random
from pathlib import Path

import msgpack
import pytest

from logstore import Entry, Log
from logstore.file.log import FileLog
from queue_worker import topics
from queue_worker.protocol.records import (
    Claim,
    ClaimsRecord,
    Done,
    Fail,
    Renew,
    encode,
)
from queue_worker.protocol.state import ClaimSnapshot, Outcome
from queue_worker.topics import ClaimsFollower

T0 = 1_700_000_000_000_000
LEASE = 5_000
WORKERS = ("w0-1-aa", "w1-2-bb", "w2-3-cc")

#: bytes a hostile or broken writer could append with a valid frame: each is malformed
MALFORMED = (
    b"\xc1",  # not msgpack
    b"\x96\x01\xa1C",  # a CLAIM cut short
    msgpack.packb([1, "C", -1, "w", T0, LEASE]),  # task id out of range
    msgpack.packb([1, "D", 2**64 - 1, "w", T0, 0, None]),  # task id out of range
    msgpack.packb([1, "C", True, "w", T0, LEASE]),  # a bool for a task id
    msgpack.packb([1, "T", None, T0]),  # a TASK in the claims topic
    msgpack.packb([1, "C", 0, "w", T0, LEASE]) + b"\x00",  # trailing bytes
    msgpack.packb({"not": "a record"}),
)
UNKNOWN = msgpack.packb([1, "Z", 0, "w", T0])  # a type from a newer writer: skipped


def random_log(seed: int, length: int = 400) -> list[tuple[bytes, ClaimsRecord | None]]:
    """Wire records as workers on a few tasks would write them, junk mixed in: (bytes, the
    record they encode, or None for junk)."""
    rng = random.Random(seed)
    at = T0
    claims: list[tuple[int, Claim]] = []  # (position index, claim)
    out: list[tuple[bytes, ClaimsRecord | None]] = []
    for i in range(length):
        at += rng.randrange(0, 3_000)
        roll = rng.random()
        if roll < 0.06:
            out.append((rng.choice((*MALFORMED, UNKNOWN)), None))
            continue
        task = rng.randrange(0, 12)
        worker = rng.choice(WORKERS)
        record: ClaimsRecord
        if roll < 0.5 or not claims:
            record = Claim(task, worker, at, LEASE)
            claims.append((i, record))
        else:
            # act under a real claim (often the holder's), or a namesake's, or a bogus one
            index, claim = rng.choice(claims[-8:])
            worker = rng.choice(WORKERS) if rng.random() < 0.2 else claim.worker
            kind = rng.random()
            if kind < 0.6:
                record = Done(claim.task, worker, at, index, None)
            elif kind < 0.8:
                record = Renew(claim.task, worker, at, index, LEASE)
            else:
                retry = None if rng.random() < 0.3 else at + rng.randrange(0, 5_000)
                record = Fail(claim.task, worker, at, index, "boom", retry)
        out.append((encode(record), record))
    return out


def append_in_batches(log: Log, datas: list[bytes], rng: random.Random) -> list[int]:
    """Append `datas` in batches of 1 to 40 records; return their positions."""
    positions: list[int] = []
    i = 0
    while i < len(datas):
        n = rng.randrange(1, 41)
        positions += log.append_many(datas[i : i + n])
        i += n
    return positions


def to_positions(record: ClaimsRecord | None, positions: list[int]) -> ClaimsRecord | None:
    """A record whose `claim` names a record by its index, naming it by its position."""
    if isinstance(record, Renew | Done | Fail):
        return record._replace(claim=positions[record.claim])
    return record


def comparable(snap: ClaimSnapshot) -> ClaimSnapshot:
    return snap._replace(closed_above=tuple(sorted(snap.closed_above)))


def one_at_a_time(log: Log, last: int | None = None) -> tuple[ClaimsFollower, dict[int, Outcome]]:
    """The reference: `apply`, entry by entry (each decoded alone), up to `last` included."""
    follower = ClaimsFollower(log.start)
    outcomes = {}
    for entry in log.iter_from(log.start):
        outcomes[entry.position] = follower.apply(entry)[0]
        if entry.position == last:
            break
    return follower, outcomes


@pytest.mark.parametrize("seed", range(6))
def test_catch_up_reaches_what_one_record_at_a_time_reaches(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    wire = random_log(seed)
    with FileLog.open(tmp_path / "claims.log") as log:
        # the `claim` fields name records by index: write them once to learn the positions,
        # then again with the positions filled in, in other batches
        first = append_in_batches(log, [data for data, _ in wire], rng)
        records = [to_positions(r, first) for _, r in wire]
        datas = [
            data if r is None else encode(r) for (data, _), r in zip(wire, records, strict=True)
        ]
        append_in_batches(log, datas, rng)

        reference, _ = one_at_a_time(log)
        follower = ClaimsFollower(log.start)
        assert follower.catch_up(log) == 2 * len(wire)

    assert reference.malformed > 0 and reference.state.done_count > 0
    assert comparable(follower.state.snapshot()) == comparable(reference.state.snapshot())
    assert follower.state.held_count == reference.state.held_count
    assert follower.next_position == reference.next_position
    assert (follower.malformed, follower.last_malformed) == (
        reference.malformed,
        reference.last_malformed,
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("read_batch", [topics.READ_BATCH, 7])
def test_settle_batch_gives_our_records_the_verdicts_of_the_full_fold(
    tmp_path: Path, seed: int, read_batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Others' records (junk too) before, between and after ours; ours settled in one pass
    (with reads of a few records too: ours then come several reads after the others')."""
    monkeypatch.setattr(topics, "READ_BATCH", read_batch)
    rng = random.Random(seed)
    wire = random_log(seed, 120)
    with FileLog.open(tmp_path / "claims.log") as log:
        positions = append_in_batches(log, [data for data, _ in wire], rng)
        follower = ClaimsFollower(log.start)
        follower.catch_up(log)
        # ours: two CLAIMs, others' records before, between and after them
        mine: list[ClaimsRecord] = [Claim(0, "me-9-ff", T0, LEASE), Claim(1, "me-9-ff", T0, 0)]
        others = [data for data, _ in random_log(seed + 100, 60)]
        append_in_batches(log, others[:30], rng)
        ours = log.append_many([encode(mine[0])])
        log.append_many(others[30:33])
        ours += log.append_many([encode(mine[1])])
        append_in_batches(log, others[33:], rng)
        settled = follower.settle_batch(log, list(zip(ours, mine, strict=True)))

        reference, outcomes = one_at_a_time(log, last=ours[-1])
    assert positions  # the log before ours was folded by catch_up
    assert [s.outcome for s in settled] == [outcomes[p] for p in ours]
    assert [s.entry.position for s in settled] == ours
    assert comparable(follower.state.snapshot()) == comparable(reference.state.snapshot())
    assert follower.malformed == reference.malformed
    # settling folds exactly up to our last record: the records after it are left unread
    assert follower.next_position == settled[-1].entry.next


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("read_batch", [topics.READ_BATCH, 7])
@pytest.mark.parametrize("junk", [False, True])
def test_append_and_settle_on_a_file_log_gives_the_verdicts_of_the_full_fold(
    tmp_path: Path, seed: int, read_batch: int, junk: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our batch appended and settled on a file log (read as the catch-up reads it, junk
    read the entries' way), after others' records the follower has not read: our records
    get the verdicts of the full fold, the follower stops right after our last, and each
    settled entry is the one the log holds."""
    monkeypatch.setattr(topics, "READ_BATCH", read_batch)
    rng = random.Random(seed)
    wire = [(data, record) for data, record in random_log(seed, 160) if junk or record]
    with FileLog.open(tmp_path / "claims.log") as log:
        append_in_batches(log, [data for data, _ in wire[:60]], rng)
        follower = ClaimsFollower(log.start)
        follower.catch_up(log)
        append_in_batches(log, [data for data, _ in wire[60:]], rng)
        mine: list[ClaimsRecord] = [Done(3, "me-9-ff", T0, 0, None), Claim(4, "me-9-ff", T0, 0)]
        data = [encode(record) for record in mine]
        settled = follower.append_and_settle(log, mine, data, durable=False)
        log.append_many([data for data, _ in wire[:30]])  # after ours: left unread
        reference, outcomes = one_at_a_time(log, last=settled[-1].entry.position)
        ours = [s.entry.position for s in settled]
        assert [s.entry for s in settled] == [log.read(p, 1)[0] for p in ours]
    assert [s.outcome for s in settled] == [outcomes[p] for p in ours]
    assert [s.record for s in settled] == mine
    assert comparable(follower.state.snapshot()) == comparable(reference.state.snapshot())
    assert (follower.malformed, follower.last_malformed) == (
        reference.malformed,
        reference.last_malformed,
    )
    assert follower.next_position == settled[-1].entry.next == reference.next_position


@pytest.mark.parametrize("stamped", ["all", "some"])
def test_entries_on_a_servers_clock_are_folded_on_it(stamped: str) -> None:
    """A backend that stamps records (Redis) has the fold judge `at` by its clock: entries
    that carry a server time go the record-at-a-time way, which rewrites `at`."""
    wire = random_log(7, 200)
    entries = []
    position = 100
    for i, (data, _) in enumerate(wire):
        stamp = T0 + 10_000 * i if stamped == "all" or i % 3 == 0 else None
        entries.append(Entry(position, position + len(data) + 1, data, stamp))
        position += len(data) + 1
    reference = ClaimsFollower(entries[0].position)
    for entry in entries:
        reference.apply(entry)
    follower = ClaimsFollower(entries[0].position)
    follower.fold_entries(entries[:50])
    follower.fold_entries(entries[50:])
    assert comparable(follower.state.snapshot()) == comparable(reference.state.snapshot())
    assert (follower.next_position, follower.malformed) == (
        reference.next_position,
        reference.malformed,
    )
    # the server's clock decided: folded on the writers' clocks, the verdicts differ
    on_writers_clock = ClaimsFollower(entries[0].position)
    on_writers_clock.fold_entries([e._replace(server_time_us=None) for e in entries])
    assert comparable(on_writers_clock.state.snapshot()) != comparable(reference.state.snapshot())


@pytest.mark.parametrize("given", ["none", "before ours", "through ours"])
def test_settle_batch_folds_entries_given_and_read_once(tmp_path: Path, given: str) -> None:
    """Entries the caller already read (`read=`, as the append's own read gives them) are
    folded once, together with the ones read after them, however far they reach."""
    rng = random.Random(11)
    wire = random_log(11, 80)
    with FileLog.open(tmp_path / "claims.log") as log:
        append_in_batches(log, [data for data, _ in wire[:20]], rng)
        follower = ClaimsFollower(log.start)
        follower.catch_up(log)
        later = [data for data, _ in wire[20:]]
        later[5::10] = [UNKNOWN] * len(later[5::10])  # each folded twice would count twice
        append_in_batches(log, later, rng)
        mine: list[ClaimsRecord] = [Claim(3, "me-9-ff", T0, LEASE)]
        ours = log.append_many([encode(r) for r in mine])
        everything = log.read(log.start)
        if given == "none":
            read: list[Entry] = []
        elif given == "before ours":  # from before the follower's position, stopping short
            read = everything[10:50]
        else:
            read = everything[5:]
        settled = follower.settle_batch(log, list(zip(ours, mine, strict=True)), read=read)
        reference, outcomes = one_at_a_time(log, last=ours[-1])
    assert [s.outcome for s in settled] == [outcomes[p] for p in ours]
    assert comparable(follower.state.snapshot()) == comparable(reference.state.snapshot())
    assert (follower.malformed, follower.next_position) == (
        reference.malformed,
        reference.next_position,
    )
