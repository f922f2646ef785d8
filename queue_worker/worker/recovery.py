"""A worker's log out of reach: finding out whether an append whose reply was lost landed.

A log out of reach (a Redis server restarting, a network partition, a full disk): the log's
own retries come first; after them a failed read or wait only pauses the worker's loop, and
the worker resumes from the positions it has folded (it never folds a record twice). An
append that fails may still have landed (its reply was lost), so the worker resolves it
from the log once the log answers again (`OutageRecovery.resolve`): a CLAIM found there is
settled (and worked, if it won); a DONE or FAIL found there is settled, and one that did
not land is appended again while our claim still holds the task, so that a finished task is
not run a second time. A won task whose payload could not be read is run when the log
answers, if our claim still holds it (`OutageRecovery.still_holds`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from logstore import Log, LogError, RecordTooLargeError
from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Fail
from queue_worker.topics import READ_BATCH, ClaimsFollower, Settled, TaskIndex
from queue_worker.worker.lease import FATAL_LOG_ERRORS
from queue_worker.worker.recorder import StatsRecorder


class OutageRecovery:
    """Resolves a worker's records of uncertain fate against its folds.

    The worker's folds (`tasks`, `claims`) are passed to each call, which folds them on as
    the worker would; `draining` is its drain flag; `poll_s` how long to wait between two
    looks at the log; `fold_now` the current time on the fold's clock (µs).
    """

    def __init__(
        self,
        claims_log: Log,
        record: StatsRecorder,
        *,
        draining: threading.Event,
        poll_s: float,
        fold_now: Callable[[], int],
    ) -> None:
        self.claims_log = claims_log
        self.record = record
        self._draining = draining
        self._poll_s = poll_s
        self._fold_now = fold_now

    def resolve(
        self,
        folds: tuple[TaskIndex, ClaimsFollower],
        record: Claim | Done | Fail,
        data: bytes,
        ahead: Claim | None,
        error: LogError,
    ) -> tuple[Settled | None, Settled | None]:
        """`record` (encoded as `data`, appended with the CLAIM `ahead` in one batch when
        not None) failed to append or settle with `error`: it may or may not be in the log.
        Returns its settling (None: it was given up), and that of `ahead` when both landed.

        Every `poll_s` the claims log is folded on to its end, looking for the record (same
        type, worker, task, claim): found, its verdict is the answer. Not found: a CLAIM is
        given up (None; another attempt makes a new one); a DONE or FAIL is appended again
        while our claim still holds the task, and given up (None) once it does not (the
        lease lapsed and the task was taken over). A CLAIM stops being retried (`error` is
        raised) when the worker is asked to drain.
        """
        claims = folds[1]
        durable = not isinstance(record, Claim)
        kind = type(record).__name__.upper()
        while True:
            self.record.settle_retrying(record.task, kind, error)
            if isinstance(record, Claim) and self._draining.is_set():
                raise error
            if (
                not isinstance(record, Claim)
                and self._draining.is_set()
                and self.lease_lapsed(claims, record.task, record.claim)
            ):
                # Draining, and our lease has run out by the fold's clock: the task is
                # another worker's to take over now, and a drain must end (a full disk
                # would otherwise hold it for ever). Nothing of ours is recorded.
                self.record.settle_given_up(record.task, kind, error)
                return None, None
            time.sleep(self._poll_s)
            try:
                found, found_ahead = self.fold_to_end_finding(folds, record, ahead)
                if found is not None:
                    return found, found_ahead
                if isinstance(record, Claim):
                    return None, None  # it never landed: no claim was made
                holder = claims.state.holder(record.task)
                if holder is None or holder.claim != record.claim:
                    return None, None
                position = self.claims_log.append(data, durable=durable)
                return claims.settle(self.claims_log, position, record), None
            except (RecordTooLargeError, *FATAL_LOG_ERRORS):
                raise
            except LogError as e:
                error = e

    def still_holds(self, claims: ClaimsFollower, settled: Settled) -> bool:
        """Fold the claims log on: does our won claim `settled` still hold its task?"""
        claims.catch_up(self.claims_log)
        task = settled.outcome.task
        assert task is not None
        holder = claims.state.holder(task)
        return holder is not None and holder.claim == settled.entry.position

    def lease_lapsed(self, claims: ClaimsFollower, task: int, claim: int) -> bool:
        """Whether our claim `claim` on `task` no longer holds it, or its lease has run out
        by the fold's clock (our clock, shifted to the server's where there is one)."""
        holder = claims.state.holder(task)
        if holder is None or holder.claim != claim:
            return True
        return holder.expiry <= self._fold_now()

    def fold_to_end_finding(
        self,
        folds: tuple[TaskIndex, ClaimsFollower],
        record: Claim | Done | Fail,
        ahead: Claim | None = None,
    ) -> tuple[Settled | None, Settled | None]:
        """Fold the claims log to its end; the first record folded that is `record` (as
        written by an append that failed), with its verdict, or None; and the same for
        `ahead` (the CLAIM of the same batch) after it."""
        tasks, claims = folds
        found: Settled | None = None
        found_ahead: Settled | None = None
        while entries := self.claims_log.read(claims.next_position, READ_BATCH):
            for entry in entries:
                outcome, folded = claims.apply(entry)
                if found is None:
                    if same_record(folded, record):
                        found = Settled(outcome, folded, entry)
                elif ahead is not None and found_ahead is None and same_record(folded, ahead):
                    found_ahead = Settled(outcome, folded, entry)
        self.record.folded(tasks, claims)
        return found, found_ahead


def same_record(folded: ClaimsRecord, mine: Claim | Done | Fail) -> bool:
    """Is `folded` (as the fold saw it: on the server's clock, where there is one) the record
    `mine` that this worker appended? Compared on everything but `at`."""
    if type(folded) is not type(mine):
        return False
    if isinstance(mine, Claim):
        assert isinstance(folded, Claim)
        return (folded.task, folded.worker, folded.lease) == (mine.task, mine.worker, mine.lease)
    assert isinstance(folded, Done | Fail)
    return (folded.task, folded.worker, folded.claim) == (mine.task, mine.worker, mine.claim)
