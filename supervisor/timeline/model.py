"""What a timeline shows, built from the logs by folding them: lanes, bars, marks, arrows.

`build_model` is pure: claims records (with positions) go through the real `ClaimState`, so
every bar's outcome, every refused record and every takeover is the fold's own verdict,
never re-derived here. TASK enqueue times feed the queue-depth chart; ops records (kills,
pauses, deaths: queue_worker.ops) become windows and marks across the lanes.

Times are µs since the epoch, as in the records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from queue_worker.names import worker_label
from queue_worker.ops import PAUSE, RESUME, OpRecord, worker_pid
from queue_worker.proof.checker import QueueChecker, QueueChecks
from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Fail, Unknown
from queue_worker.protocol.state import ClaimState, Verdict

# how a winning claim ended (a bar's `end_kind`)
DONE: Final = "done"
RELEASED: Final = "released"  # FAIL with a retry time
DEAD: Final = "dead"  # FAIL, attempts used up
TAKEN_OVER: Final = "taken over"  # its lease lapsed and another claim won the task
HELD: Final = "held"  # still held when the log ends

# marks: single records the fold refused
LOST: Final = "lost"  # a CLAIM that lost
STALE: Final = "stale done"  # a DONE from a claim that no longer held the task
LEASE_LOST: Final = "lease lost"  # a refused RENEW
STALE_FAIL: Final = "stale fail"


class Bar(NamedTuple):
    """One winning claim, from its CLAIM to the record that ended it."""

    task: int
    worker: str
    claim: int  # the CLAIM's position: the fencing token
    start: int  # the CLAIM's at
    end: int  # the ending record's at; the lease's expiry for TAKEN_OVER; last seen for HELD
    end_kind: str
    end_position: int | None  # the DONE/FAIL/taking CLAIM; None while held
    expiry: int  # the lease's last expiry (after every renewal)
    renewals: tuple[int, ...]  # the ats of accepted RENEWs
    takeover: bool  # this claim won over an expired holder
    late: int | None = None  # the at of a refused DONE/FAIL under this claim, after it lost
    # spans when the lease had lapsed but nobody took the task over, so the holder's next
    # RENEW or DONE was still accepted (a pause or a stall longer than the lease)
    lapses: tuple[tuple[int, int], ...] = ()


class Mark(NamedTuple):
    """One record the fold refused: a lost CLAIM, a stale DONE, a refused RENEW or FAIL."""

    kind: str
    task: int
    worker: str
    position: int
    at: int
    verdict: str  # the fold's word
    claim: int | None  # the claim a DONE/RENEW/FAIL named


class Arrow(NamedTuple):
    """A takeover: from the expired lease of one claim to the CLAIM that replaced it."""

    task: int
    from_worker: str
    from_claim: int
    from_expiry: int
    to_worker: str
    to_claim: int
    to_at: int


class OpMark(NamedTuple):
    """An operator action or a death, on a lane when its process is known; a pause is a
    window (`end` is its resume, or None when it never resumed)."""

    kind: str
    lane: str | None  # the worker id whose lane it belongs to
    at: int
    end: int | None
    record: OpRecord


class Lane(NamedTuple):
    worker: str
    label: str
    first: int
    last: int


@dataclass(frozen=True)
class Model:
    """Everything a timeline can draw, for the whole run."""

    lanes: tuple[Lane, ...]
    bars: tuple[Bar, ...]
    marks: tuple[Mark, ...]
    arrows: tuple[Arrow, ...]
    ops: tuple[OpMark, ...]
    enqueued: tuple[int, ...]  # each published task's enqueue time, by task id
    done_at: tuple[int, ...]  # the at of each accepted DONE, in log order
    start: int
    end: int
    positions: dict[int, int] = field(default_factory=dict)  # claims position -> at
    checks: QueueChecks = field(default_factory=QueueChecks)  # the total-queue classes
    functions: Mapping[int, str] = field(default_factory=dict)  # task -> its function (by name)

    @property
    def empty(self) -> bool:
        return not self.bars and not self.marks and not self.ops


@dataclass
class _Open:
    """A winning claim not yet ended."""

    task: int
    worker: str
    claim: int
    start: int
    expiry: int
    takeover: bool
    renewals: list[int] = field(default_factory=list)
    lapses: list[tuple[int, int]] = field(default_factory=list)

    def seen_at(self, at: int) -> None:
        """An accepted record of the holder at `at`: was its lease already out?"""
        if at > self.expiry:
            self.lapses.append((self.expiry, at))


_REFUSED: Final = {
    Verdict.STALE_DONE: STALE,
    Verdict.LEASE_LOST: LEASE_LOST,
    Verdict.STALE_FAIL: STALE_FAIL,
}


def build_model(
    claims: Iterable[tuple[int, ClaimsRecord]],
    enqueued: Sequence[int] = (),
    ops: Sequence[OpRecord] = (),
    before: ClaimState | None = None,
    functions: Mapping[int, str] | None = None,
) -> Model:
    """Fold the claims records (in log order) and lay out what the timeline shows.

    `before`: the fold of the records before `claims` (the model of a stretch of a long log,
    `qw replay`'s lanes): the claims it holds are bars begun before the stretch. The
    total-queue checks then judge the stretch alone."""
    state = ClaimState() if before is None else before
    checker = QueueChecker()
    open_claims: dict[int, _Open] = {}  # claim position -> its bar in the making
    ended: dict[int, Bar] = {}  # claim position -> its bar, once ended
    marks: list[Mark] = []
    arrows: list[Arrow] = []
    done_at: list[int] = []
    seen: dict[str, list[int]] = {}  # worker -> [first at, last at]
    if before is not None:
        for task, lease in before.held_tasks():
            open_claims[lease.claim] = _Open(
                task, lease.worker, lease.claim, lease.at, lease.expiry, False
            )
            span = seen.setdefault(lease.worker, [lease.at, lease.at])
            span[0] = min(span[0], lease.at)
    positions: dict[int, int] = {}

    def close(o: _Open, end: int, kind: str, position: int | None, expiry: int) -> None:
        ended[o.claim] = Bar(
            o.task,
            o.worker,
            o.claim,
            o.start,
            end,
            kind,
            position,
            expiry,
            tuple(o.renewals),
            o.takeover,
            lapses=tuple(o.lapses),
        )

    for position, record in claims:
        outcome = state.apply(record, position)
        checker.apply(record, outcome)
        if isinstance(record, Unknown):
            continue
        positions[position] = record.at
        span = seen.setdefault(record.worker, [record.at, record.at])
        span[0], span[1] = min(span[0], record.at), max(span[1], record.at)
        v = outcome.verdict
        if isinstance(record, Claim):
            if v.won:
                assert outcome.holder is not None
                prev = outcome.previous
                if prev is not None:  # a takeover: the previous claim ends at its expiry
                    old = open_claims.pop(prev.claim, None)
                    if old is not None:
                        close(old, prev.expiry, TAKEN_OVER, position, prev.expiry)
                    arrows.append(
                        Arrow(
                            record.task,
                            prev.worker,
                            prev.claim,
                            prev.expiry,
                            record.worker,
                            position,
                            record.at,
                        )
                    )
                open_claims[position] = _Open(
                    record.task,
                    record.worker,
                    position,
                    record.at,
                    outcome.holder.expiry,
                    prev is not None,
                )
            else:
                marks.append(
                    Mark(LOST, record.task, record.worker, position, record.at, v.value, None)
                )
            continue
        if v is Verdict.RENEWED:
            o = open_claims[record.claim]
            o.seen_at(record.at)
            o.renewals.append(record.at)
            assert outcome.holder is not None
            o.expiry = outcome.holder.expiry
            continue
        if v in _REFUSED:
            marks.append(
                Mark(
                    _REFUSED[v],
                    record.task,
                    record.worker,
                    position,
                    record.at,
                    v.value,
                    record.claim,
                )
            )
            late = ended.get(record.claim)
            if late is not None and late.worker == record.worker and late.late is None:
                ended[record.claim] = late._replace(late=record.at)
            continue
        assert isinstance(record, Done | Fail)
        o = open_claims.pop(record.claim)
        o.seen_at(record.at)
        if isinstance(record, Done):
            done_at.append(record.at)
            kind = DONE
        else:
            kind = DEAD if v is Verdict.DEAD else RELEASED
        close(o, record.at, kind, position, o.expiry)

    last = max((span[1] for span in seen.values()), default=0)
    for o in open_claims.values():
        ended[o.claim] = Bar(
            o.task,
            o.worker,
            o.claim,
            o.start,
            max(last, o.start),
            HELD,
            None,
            o.expiry,
            tuple(o.renewals),
            o.takeover,
            lapses=tuple(o.lapses),
        )
    op_marks = _op_marks(ops, seen)
    times = [t for span in seen.values() for t in span] + [m.at for m in op_marks]
    times += [m.end for m in op_marks if m.end is not None]
    start = min(times, default=0)
    end = max(times + [b.expiry for b in ended.values() if b.end_kind == HELD], default=0)
    lanes = sorted(
        (Lane(w, worker_label(w), span[0], span[1]) for w, span in seen.items()),
        key=lambda lane: (lane.first, lane.worker),
    )
    return Model(
        lanes=tuple(lanes),
        bars=tuple(sorted(ended.values(), key=lambda b: b.claim)),
        marks=tuple(marks),
        arrows=tuple(arrows),
        ops=tuple(op_marks),
        enqueued=tuple(enqueued),
        done_at=tuple(done_at),
        start=start,
        end=max(end, start),
        positions=positions,
        checks=checker.result(len(enqueued)),
        functions={} if functions is None else dict(functions),
    )


def _op_marks(ops: Sequence[OpRecord], seen: dict[str, list[int]]) -> list[OpMark]:
    """Ops records on their lanes (by worker id, else by pid), pauses paired with resumes."""
    by_pid = {pid: w for w in seen if (pid := worker_pid(w)) is not None}
    marks: list[OpMark] = []
    paused: dict[tuple[str | None, int | None], int] = {}  # (lane, pid) -> index in marks
    for op in sorted(ops, key=lambda o: o.at):
        lane = op.worker if op.worker in seen else by_pid.get(op.pid or -1)
        key = (lane, op.pid)
        if op.kind == RESUME and key in paused:
            index = paused.pop(key)
            marks[index] = marks[index]._replace(end=op.at)
            continue
        if op.kind == PAUSE:
            paused[key] = len(marks)
        marks.append(OpMark(op.kind, lane, op.at, None, op))
    return marks
