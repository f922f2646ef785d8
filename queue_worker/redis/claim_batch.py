"""A worker's batch on a queue with server verdicts: several tasks claimed in one call, and
their DONEs sent together with the next call.

With server verdicts a task costs one script call (`queue_worker.redis.server_claim`): the DONE
of the last task and the CLAIM of the next. Most of a call's cost is the call itself, not
the records (the client's packing, send, wake-up and reply parsing; the server's EVALSHA,
the script's checks before it appends, its reply): while tasks are short, a worker asks
for up to `BATCH_MAX` tasks in one call, runs them one after the other, and sends their
DONEs with the call that claims the next batch.

The rules are unchanged: every record still goes through the script, which folds each one
by the same rules in the order appended; what changes is when a DONE is sent. A DONE held
for the next call is sent before its lease can lapse:

- a task's DONE is held only when the task ran shorter than `SHORT_S`, the next task is
  one this batch already claimed, and the call that claimed it was less than a quarter of
  the lease ago (`can_hold`); otherwise it goes at once, with the held ones before it;
- every other append of the worker (the lease keeper's RENEW of the task that runs next,
  due at half its lease; a timed-out attempt's FAIL) sends the held DONEs first
  (`send_held`, from `ServerVerdictLog.append`): a task that turns out long has its
  predecessors' DONEs sent by its first renewal, three quarters of a lease at most after
  their claim.

A task claimed ahead waits for the ones before it: it is asked for only after a short task,
and one whose claim is a quarter of a lease old by the time it is reached is renewed
before it runs (`take_ahead`), or left if the renewal is refused (its lease lapsed and
another worker took it over).

A worker killed with DONEs held loses them as it loses a DONE it had not written yet: the
tasks' leases lapse and other workers run them again (the window is one short task longer).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final, NamedTuple

from logstore import LogError
from queue_worker.protocol.records import Claim, Done, Renew, encode
from queue_worker.protocol.state import Verdict

if TYPE_CHECKING:
    from queue_worker.redis.server_verdicts import ServerVerdict, ServerVerdicts

#: tasks claimed in one call at most (after a short task; one otherwise). Measured on an
#: 8-worker drain of no-op tasks: eight cut the CPU a task of `qw up` and of redis-server
#: by ~10-15 % against four; sixteen no more than eight (docs/redis.md)
BATCH_MAX: Final = 8
#: a task that ran shorter than this (seconds) is short: more may be claimed with it
SHORT_S: Final = 0.005


class Ahead(NamedTuple):
    """A task claimed by a call beside the one it handed over first, waiting its turn."""

    claimed: ServerVerdict  # the CLAIM's verdict and the task's state after it
    claim: Claim  # as the fold sees it: on the server's clock
    payload: bytes | None  # the task's record (None: not found)
    called_at: float  # monotonic time of the call that claimed it


class ClaimBatch:
    """The tasks a worker claimed ahead and the DONEs it has not sent yet; thread-safe (the
    lease keeper's thread sends held DONEs before a renewal)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ahead: deque[Ahead] = deque()
        self._held: list[tuple[Done, bytes]] = []
        #: monotonic time of the call that claimed the task in hand
        self.called_at = 0.0
        #: held DONEs sent by another thread whose verdict was not DONE, for the worker to
        #: count (its lease had lapsed: never, unless the process stalled for a lease)
        self.late: list[tuple[Done, Verdict]] = []
        #: held DONEs whose sending failed (the log out of reach): each may or may not have
        #: landed, for the worker's recovery to resolve
        self.uncertain: list[tuple[Done, bytes, LogError]] = []

    # -- what to ask for --------------------------------------------------------------------

    @staticmethod
    def want(ran_s: float) -> int:
        """How many tasks to claim after a task that ran `ran_s` seconds."""
        return BATCH_MAX if ran_s < SHORT_S else 1

    def keep(
        self, more: Iterable[tuple[ServerVerdict, Claim, bytes | None]], called_at: float
    ) -> None:
        """A call made at `called_at` (monotonic) claimed `more` (`server_claim.MoreClaim`)
        besides the task it handed over."""
        self.called_at = called_at
        self._ahead.extend(Ahead(*claimed, called_at) for claimed in more)

    @property
    def has_ahead(self) -> bool:
        return bool(self._ahead)

    def take_ahead(
        self, server: ServerVerdicts, worker: str, lease_us: int, now: int
    ) -> Ahead | None:
        """The next task claimed ahead that our claim still holds, or None. One whose claim
        is a quarter of a lease old is renewed first (a RENEW: `now` is our clock) and left
        if the renewal is refused; when the log is out of reach, the rest are left to lapse."""
        while self._ahead:
            ahead = self._ahead.popleft()
            self.called_at = ahead.called_at
            if time.monotonic() - ahead.called_at < lease_us / 4_000_000:
                return ahead
            renew = Renew(ahead.claim.task, worker, now, ahead.claimed.position, lease_us)
            try:
                self.send_held(server)
                answer = server.append(renew, encode(renew))
            except LogError:
                self._ahead.clear()
                return None
            if answer.verdict is Verdict.RENEWED:
                self.called_at = time.monotonic()
                return ahead
        return None

    # -- DONEs held for the next call ------------------------------------------------------

    def can_hold(self, ran_s: float, lease_s: float) -> bool:
        """May the DONE of a task that ran `ran_s` seconds wait for the next call?"""
        return (
            bool(self._ahead)
            and ran_s < SHORT_S
            and time.monotonic() - self.called_at < lease_s / 4
        )

    def hold(self, done: Done, data: bytes) -> None:
        with self._lock:
            self._held.append((done, data))

    def take_held(self) -> list[tuple[Done, bytes]]:
        """The held DONEs, to send with a call (the caller resolves them if it fails)."""
        with self._lock:
            held, self._held = self._held, []
        return held

    def send_held(self, server: ServerVerdicts) -> None:
        """Send the held DONEs now, one call each (before a renewal or a time-out's FAIL:
        rare). A verdict other than DONE is kept in `late`; a failure in `uncertain`."""
        for done, data in self.take_held():
            try:
                answer = server.append(done, data)
            except LogError as e:
                with self._lock:
                    self.uncertain.append((done, data, e))
                continue
            if answer.verdict is not Verdict.DONE:
                with self._lock:
                    self.late.append((done, answer.verdict))

    def take_late(self) -> tuple[list[tuple[Done, Verdict]], list[tuple[Done, bytes, LogError]]]:
        with self._lock:
            late, self.late = self.late, []
            uncertain, self.uncertain = self.uncertain, []
        return late, uncertain


__all__ = ["BATCH_MAX", "SHORT_S", "Ahead", "ClaimBatch"]
