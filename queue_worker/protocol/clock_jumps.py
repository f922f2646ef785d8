"""A worker's clock jumps, named from the claims records alone.

The fold never reads a clock and never asks whether a time is plausible (protocol §3, Rule 7):
a worker whose clock jumps still has every record judged by its `at`, and a jump of more
than a lease makes tasks be worked twice (ahead, its CLAIMs take live leases over; back, its
own leases look lapsed to the others). What the records do show, and `ClockWatch` names as an
observation beside the verdicts (the report, `qw why`, the supervisor's events):

- **back**: a record dated more than `BACK_US` before the same worker's previous record (one
  process writes its records one after another, each with a fresh reading of its clock; a
  renewal thread's record may land a moment after a later-dated DONE, never a second);
- **ahead**: a RENEW, DONE or FAIL dated more than a lease after the same worker's previous
  record under the same claim (a holder renews at half time), and more than a lease after
  every other worker's latest record before it: a worker that was only stopped that long
  wakes up to a log that the others kept writing meanwhile, dated up to its own time.

Each jump is named once, at the record that shows it: the worker's later records are judged
against that one.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from queue_worker.names import worker_label
from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Fail, Renew, Unknown
from queue_worker.times import duration_text

#: how far a worker's record may be dated before its previous one before that is a jump
BACK_US: Final = 1_000_000
#: the time before any record (no other worker's record to compare with yet)
_NEVER: Final = -(2**63)
#: workers remembered (the most recently started ones): one per process ever run
WORKERS_KEPT: Final = 4096


class ClockJump(NamedTuple):
    """A record that shows its worker's clock jumped by `jump_us` (+ ahead, − back)."""

    worker: str
    position: int
    task: int
    jump_us: int

    @property
    def text(self) -> str:
        """ "clock of w1·1234 ran back 1.0 h at @512" """
        way = "ahead" if self.jump_us > 0 else "back"
        return (
            f"clock of {worker_label(self.worker)} ran {way} "
            f"{duration_text(abs(self.jump_us))} at @{self.position}"
        )


class _Last(NamedTuple):
    at: int
    claim: int | None  # the claim its lease is under (a CLAIM's own position), if any
    lease: int


class ClockWatch:
    """Feed it a log's claims records in order (`see`); it answers the clock jumps."""

    def __init__(self) -> None:
        self._last: dict[str, _Last] = {}
        # the latest `at` of the two workers whose records are dated latest, as (at, worker):
        # the newest record of any worker other than a given one is one of these
        self._first: tuple[int, str | None] = (_NEVER, None)
        self._second: tuple[int, str | None] = (_NEVER, None)

    def see(self, position: int, record: ClaimsRecord) -> ClockJump | None:
        if isinstance(record, Unknown):
            return None
        worker, at = record.worker, record.at
        last = self._last.pop(worker, None)
        jump = None
        if last is not None and self._jumped(last, record):
            jump = ClockJump(worker, position, record.task, at - last.at)
        if isinstance(record, Claim):
            self._last[worker] = _Last(at, position, record.lease)
        elif isinstance(record, Renew):
            self._last[worker] = _Last(at, record.claim, record.lease)
        else:  # a DONE or FAIL lets the task go
            self._last[worker] = _Last(at, None, 0)
        if len(self._last) > WORKERS_KEPT:
            del self._last[next(iter(self._last))]
        self._note_latest(worker, at)
        return jump

    def _jumped(self, last: _Last, record: Claim | Renew | Done | Fail) -> bool:
        """Whether `record` is dated too far from its worker's previous one (`last`)."""
        if record.at < last.at - BACK_US:  # back
            return True
        return (  # ahead
            not isinstance(record, Claim)
            and record.claim == last.claim
            and record.at - last.at > last.lease
            and record.at - self._latest_other(record.worker) > last.lease
        )

    def _latest_other(self, worker: str) -> int:
        return self._first[0] if self._first[1] != worker else self._second[0]

    def _note_latest(self, worker: str, at: int) -> None:
        first, second = self._first, self._second
        if worker == first[1]:
            if at > first[0]:
                self._first = (at, worker)
        elif at > first[0]:
            self._first, self._second = (at, worker), first
        elif worker == second[1] or at > second[0]:
            self._second = (max(at, second[0]) if worker == second[1] else at, worker)
