"""Keeping a won task's lease while its handler runs, and cancelling the handler when the
lease is lost.

A `LeaseKeeper` is run by a `RenewalThread`, not by the handler's thread, so a handler that
blocks (or never looks at its context) cannot stop the renewals. A worker keeps one
renewal thread for its whole life and hands it each task's keeper: starting a thread per
task cost 0.5–0.75 ms a task (measured by `make bench`), and most tasks end long before
their first renewal is due. At half the lease it appends RENEW (naming the
winning claim's position: the fencing token) and learns the verdict by folding the claims
log from just after that claim up to its RENEW, restricted to the one task (see
`SingleTaskFold`). RENEWED moves the expiry on. LEASE_LOST — or a takeover already seen in
the log, in which case no RENEW is written — sets the cancellation flag (a
`threading.Event` the handler sees as `ctx.cancelled`) and stops the renewals. Renewal also
stops when the handler returns (`stop()`, or leaving the `with` block).

A lapse by our own clock is a loss too. The keeper remembers the expiry it last secured (the
CLAIM's, then each accepted RENEW's). A worker that was frozen (SIGSTOP, a laptop lid, a VM
paused) or starved past that expiry wakes with a lease it cannot vouch for: another worker
may already have taken the task over, or may do so at any moment. So once the worker's clock
(on the fold's clock) reaches that expiry, the lease is lost (`LeaseKeeper.check_lapse`):
the flag is set and no RENEW is written — whichever thread notices first, the renewal
thread or the handler's own `ctx.sleep` / `ctx.raise_if_cancelled`, which ask the keeper
before they return. Without this the default handler's `ctx.sleep`, whose time ran out
during the freeze, returned normally, and the worker wrote a DONE the fold refused.

What a lost lease means for the completion
------------------------------------------
A handler that honours the flag raises `TaskCancelled`: the worker writes no DONE (and no
FAIL) — the task belongs to the claim that took it over (or, after a lapse nobody has acted
on yet, to whoever claims it next: it is an orphan, tried first by every worker). A handler
that ignores the flag and completes anyway still gets its DONE written, as evidence: its work
was done, side effects and all. If the task was taken over, the fold refuses that DONE
(STALE_DONE: it names a claim that no longer holds the task), the result is discarded, and
the report counts the task as worked twice; if nobody took it over, the DONE is accepted
and the work is not wasted. The worker cannot know which before it writes (a takeover may
land just before its DONE), so only the log decides.

Timing is by the local monotonic clock (renew every `lease/2` seconds of real time); the
records' `at` comes from the worker's clock (injectable), and expiry is judged, as always,
by the fold.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

from logstore import (
    CorruptLogError,
    Entry,
    ForeignFileError,
    IdentityError,
    Log,
    LogClosedError,
    LogError,
)
from queue_worker.protocol.records import Claim, RecordDecodeError, Renew, encode
from queue_worker.protocol.state import ClaimState, Lease, Outcome, Verdict
from queue_worker.topics import SETTLE_TIMEOUT_S, decode_claims_entry, read_through

#: Errors after which a log handle cannot be used again: a lease keeper stops renewing (and
#: cancels the handler), a worker exits. Other LogErrors (an append that did not land, a
#: server out of reach) may pass, and are retried after a pause.
FATAL_LOG_ERRORS: Final = (CorruptLogError, ForeignFileError, IdentityError, LogClosedError)

#: how often the keeper thread wakes between renewals to let the worker publish its stats
TICK_S: Final = 0.25

#: after a failed append, how soon the renewal is tried again (seconds, at most)
RETRY_S: Final = 1.0


class SingleTaskFold:
    """The fold of the claims log restricted to one task, from one winning claim onward.

    Why a fresh `ClaimState` fed only this task's records gives the verdicts the full fold
    gives: `ClaimState.apply` on a record of task t reads and writes only t's own state
    (its holder, retry time, attempts) and whether t itself is closed; records of other tasks
    never touch t's state (the watermark only moves over closed ids, and t is open while we
    hold it). Right after our winning CLAIM the full fold has t open, held by our claim,
    with no retry time — exactly what a fresh state has after applying that CLAIM (only the
    attempt count differs, and no verdict reads it). From there both folds see the same
    records of t in the same order, so they agree on every verdict about t.
    """

    def __init__(self, claim: Claim, claim_position: int, read_from: int) -> None:
        self.task = claim.task
        self.claim_position = claim_position
        self.next_position = read_from
        self.state = ClaimState()
        first = self.state.apply(claim, claim_position)
        assert first.verdict.won, "a fresh fold always grants the first claim"

    def feed(self, entry: Entry) -> Outcome | None:
        """Apply one entry if it is about this task; its outcome, or None if skipped."""
        self.next_position = entry.next
        try:
            record = decode_claims_entry(entry)
        except RecordDecodeError:
            return None  # the full fold skips it too (it has no task to act on)
        if getattr(record, "task", None) != self.task:
            return None
        return self.state.apply(record, entry.position)

    def catch_up(self, log: Log) -> None:
        while entries := log.read(self.next_position):
            for entry in entries:
                self.feed(entry)

    def settle(self, log: Log, position: int, timeout: float = SETTLE_TIMEOUT_S) -> Outcome:
        """Fold up to and including the record at `position`; return its outcome."""
        for entry in read_through(log, self.next_position, position, timeout):
            outcome = self.feed(entry)
            if entry.position == position:
                if outcome is None:
                    raise LogError(f"{log.name}: the record at {position} is not about our task")
                return outcome
        raise AssertionError("read_through returns only after yielding `position`")

    @property
    def holder(self) -> Lease | None:
        return self.state.holder(self.task)

    @property
    def held(self) -> bool:
        """Does our claim still hold the task, as far as the log has been read?"""
        holder = self.holder
        return holder is not None and holder.claim == self.claim_position


#: held while a CancelFlag makes its Condition (two threads may ask for it at once)
_MAKING_CONDITION: Final = threading.Lock()


class CancelFlag(threading.Event):
    """A `threading.Event` (what a handler sees as `ctx.cancelled`), made faster to build:
    one is made for every task. Its Condition (what `set`, `clear` and `wait` use; `is_set`
    reads the flag alone) is made at the first of those calls: most tasks never make one
    (a short handler does not wait, and a lease is seldom lost), and it was most of the
    cost of a task's Event. It is over an RLock: a Condition over a plain Lock looks for
    three methods the Lock lacks, each an AttributeError raised and caught (~3x slower to
    build), and waits and wakes the same."""

    def __init__(self) -> None:  # (threading.Event.__init__, the Condition left for later)
        self._flag = False
        self._made: threading.Condition | None = None

    @property
    def _cond(self) -> threading.Condition:  # what threading.Event's methods use
        made = self._made
        if made is None:
            with _MAKING_CONDITION:
                made = self._made
                if made is None:
                    made = self._made = threading.Condition(threading.RLock())
        return made


#: held while a keeper marks its lease lost: the renewal thread and the handler's may race.
#: One lock for every keeper: a lease is seldom lost.
_LOSING: Final = threading.Lock()


class LeaseListener(Protocol):
    """What the keeper tells the worker (called from the keeper's thread)."""

    def lease_renewed(self, expiry: int) -> None: ...

    def lease_lost(self, holder: Lease | None) -> None: ...

    def lease_error(self, error: str) -> None: ...

    def lease_lapsed(self, overdue_us: int) -> None: ...

    def lease_tick(self) -> None: ...


class LeaseKeeper:
    """Renews one winning claim's lease from a renewal thread until stopped or lost.

    Give it the worker's long-lived `renewer`; without one it starts a renewal thread of its
    own (and ends it in `stop()`), which suits tests and one-off use.
    """

    def __init__(
        self,
        log: Log,
        *,
        claim: Claim,
        claim_position: int,
        read_from: int,
        lease_us: int,
        clock: Callable[[], int],
        cancelled: threading.Event | None = None,
        listener: LeaseListener | None = None,
        renew_every_s: float | None = None,
        renewer: RenewalThread | None = None,
        fold_clock: Callable[[], int] | None = None,
    ) -> None:
        """`fold_clock`: now on the clock the fold judges by (the server's, on a log that
        stamps records), for judging a lapse; `clock` stamps the RENEW records."""
        self.log = log
        self.claim = claim
        self.lease_us = lease_us
        self.clock = clock
        self.claim_position = claim_position
        self.read_from = read_from
        self._fold: SingleTaskFold | None = None  # built at the first renewal (see `fold`)
        self.cancelled = cancelled if cancelled is not None else CancelFlag()
        self.listener = listener
        self.renew_every_s = renew_every_s if renew_every_s is not None else lease_us / 2e6
        self.renewals = 0
        self.fold_clock = fold_clock if fold_clock is not None else clock
        # the expiry (fold clock) of the CLAIM as folded, then of each accepted RENEW
        self.secured_expiry = claim.at + claim.lease
        self.lost = False
        self.lapsed = False  # lost because our own clock passed `secured_expiry`
        self.lost_to: Lease | None = None  # who holds the task after we lost it, if anyone
        self.last_error: str | None = None
        # monotonic seconds; set by start()
        self.next_renewal = math.inf
        self._renewer = renewer
        self._own_renewer = renewer is None

    @property
    def task(self) -> int:
        return self.claim.task

    @property
    def fold(self) -> SingleTaskFold:
        """The task's own fold, built when first needed: most tasks end before their first
        renewal, and building it for each of them was a measurable part of a no-op task."""
        if self._fold is None:
            self._fold = SingleTaskFold(self.claim, self.claim_position, self.read_from)
        return self._fold

    @property
    def expiry(self) -> int | None:
        """Our lease's expiry as the fold has it (None once lost)."""
        holder = self.fold.holder
        return holder.expiry if holder is not None and self.fold.held else None

    # -- one renewal -------------------------------------------------------------------------

    def check_lapse(self) -> bool:
        """Has the lease been lost, or has our clock reached the expiry we last secured? A
        lapse is a loss: the flag is set, and no renewal follows. Safe from any thread."""
        if self.lost:
            return True
        overdue = self.fold_clock() - self.secured_expiry
        if overdue < 0:
            return False
        with _LOSING:
            first = self._lose_locked(None)  # not if another thread lost it meanwhile
            self.lapsed = self.lapsed or first
        if first and self.listener is not None:
            self.listener.lease_lapsed(overdue)
        return True

    def renew_once(self) -> Verdict:
        """Renew now: RENEWED, or LEASE_LOST (the cancellation flag is then set)."""
        if self.lost:
            return Verdict.LEASE_LOST
        # A takeover already in the log: the lease is gone, and a RENEW would only be refused.
        self.fold.catch_up(self.log)
        if not self.fold.held:
            self._lose(self.fold.holder)
            return Verdict.LEASE_LOST
        if self.check_lapse():  # nobody has taken it yet, but we cannot vouch for it
            return Verdict.LEASE_LOST
        renew = Renew(
            self.task, self.claim.worker, self.clock(), self.fold.claim_position, self.lease_us
        )
        position = self.log.append(encode(renew))
        outcome = self.fold.settle(self.log, position)
        if outcome.verdict is not Verdict.RENEWED:
            self._lose(outcome.holder)
            return Verdict.LEASE_LOST
        self.renewals += 1
        if outcome.holder is not None:
            self.secured_expiry = outcome.holder.expiry
            if self.listener is not None:
                self.listener.lease_renewed(outcome.holder.expiry)
        return Verdict.RENEWED

    def _lose(self, holder: Lease | None) -> None:
        with _LOSING:
            first = self._lose_locked(holder)
        if first and self.listener is not None:
            self.listener.lease_lost(holder)

    def _lose_locked(self, holder: Lease | None) -> bool:
        """Mark the lease lost (under `_LOSING`); False if it already was."""
        if self.lost:
            return False
        self.lost = True
        self.lost_to = holder
        self.cancelled.set()
        return True

    # -- driven by the renewal thread --------------------------------------------------------

    def start(self) -> None:
        """Begin renewing: the first renewal is due `renew_every_s` from now."""
        self.next_renewal = time.monotonic() + self.renew_every_s
        if self._renewer is None:
            self._renewer = RenewalThread()
        self._renewer.attach(self)

    def stop(self) -> None:
        """Stop renewing (the handler has returned). Waits for a renewal in flight."""
        renewer = self._renewer
        if renewer is None:
            return
        renewer.detach(self)
        if self._own_renewer:
            renewer.close()
            self._renewer = None

    def tick(self) -> None:
        """Called by the renewal thread: renew if due, and let the worker publish its stats."""
        if time.monotonic() >= self.next_renewal:
            self.next_renewal = self._renew_in_thread(self.next_renewal)
        if self.listener is not None:
            self.listener.lease_tick()

    def _renew_in_thread(self, scheduled: float) -> float:
        """Renew, and return when to renew next."""
        try:
            self.renew_once()
        except FATAL_LOG_ERRORS as e:
            # The log cannot be trusted or used: without renewals the lease will lapse, so
            # stop the handler now rather than let it finish as a stale completion.
            self._fail(f"lease renewal of task {self.task} stopped: {e}")
            self._lose(None)
        except LogError as e:  # an append that did not land (disk full, connection lost)
            self._fail(f"lease renewal of task {self.task} failed, retrying: {e}")
            return time.monotonic() + min(RETRY_S, self.renew_every_s / 4)
        except Exception as e:  # a bug: do not let the handler run on with no renewals
            self._fail(f"lease renewal of task {self.task} crashed: {type(e).__name__}: {e}")
            self._lose(None)
        return max(scheduled, time.monotonic()) + self.renew_every_s

    def _fail(self, error: str) -> None:
        self.last_error = error
        if self.listener is not None:
            self.listener.lease_error(error)

    def __enter__(self) -> LeaseKeeper:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class RenewalThread:
    """A long-lived daemon thread that ticks the attached keeper (one task at a time).

    While no task runs it wakes every TICK_S (a few wake-ups a second: no CPU to speak of).
    Attaching a keeper wakes it early only when the keeper's first renewal is due before the
    thread would wake anyway, so handing over a short task costs a lock, not a thread switch.
    """

    def __init__(self) -> None:
        # `with self._lock` where no wait is needed: the Condition's own `with` is two
        # Python calls more, and attach/detach run at every task
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._keeper: LeaseKeeper | None = None
        self._ticking: LeaseKeeper | None = None  # the keeper inside tick() right now
        self._wake_at = math.inf
        self._closed = False
        self._daemon: threading.Thread | None = None

    def attach(self, keeper: LeaseKeeper) -> None:
        with self._lock:
            self._keeper = keeper
            if self._daemon is None:
                self._daemon = threading.Thread(target=self._run, name="qw-lease", daemon=True)
                self._daemon.start()
            elif keeper.next_renewal < self._wake_at:
                self._cond.notify_all()

    def detach(self, keeper: LeaseKeeper) -> None:
        """Stop ticking `keeper`; returns once no tick of it is in flight."""
        with self._lock:
            if self._keeper is keeper:
                self._keeper = None
            while self._ticking is keeper:
                self._cond.wait()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._daemon
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                keeper = self._keeper
                now = time.monotonic()
                wake = now + TICK_S
                if keeper is not None and not keeper.lost:
                    wake = min(wake, keeper.next_renewal)
                self._wake_at = wake
                self._cond.wait(max(0.0, wake - now))
                self._wake_at = math.inf
                keeper = self._keeper
                if keeper is None or keeper.lost or self._closed:
                    continue
                self._ticking = keeper
                self._cond.release()
                try:
                    keeper.tick()
                finally:
                    self._cond.acquire()
                    self._ticking = None
                    self._cond.notify_all()
