"""Records as `qw tail` prints them, one line each: the tasks topic's, and the claims
topic's with the verdict the fold gives each (one place for a single queue and the merged
partitions of a partitioned one)."""

from __future__ import annotations

from typing import Any

from queue_worker.names import printable, worker_label
from queue_worker.protocol.records import (
    Claim,
    ClaimsRecord,
    Done,
    Fail,
    RecordDecodeError,
    Renew,
    Unknown,
    decode_task,
)
from queue_worker.protocol.state import Outcome, Verdict
from queue_worker.times import clock_text, duration_text
from queue_worker.topics import MALFORMED, ClaimsFollower
from queue_worker.values import value_text


class TasksPrinter:
    """The lines of the tasks topic (`qw tail --topic tasks`); `at` is the last line's
    record time (its enqueue time; None for a record that does not decode)."""

    def __init__(self) -> None:
        self.index = 0
        self.at: int | None = None

    def line(self, entry: Any) -> str:
        task, self.index = self.index, self.index + 1
        head = f"#{task}  @{entry.position}"
        self.at = None
        try:
            record = decode_task(entry.data)
        except RecordDecodeError as e:
            return f"{head}  malformed: {e}"
        if isinstance(record, Unknown):
            return f"{head}  a record of unknown type {_short(record.code, 40)}"
        self.at = record.enqueued_at
        return f"{head}  {clock_text(record.enqueued_at)}  {_short(record.payload)}"


class ClaimsPrinter:
    """The lines of the claims topic, each with the fold's verdict; `at` as TasksPrinter's."""

    def __init__(self) -> None:
        self.follower = ClaimsFollower(0)
        self.at: int | None = None

    def line(self, entry: Any) -> str:
        outcome, record = self.follower.apply(entry)
        self.at = None if isinstance(record, Unknown) else record.at
        if isinstance(record, Unknown) and record.code == MALFORMED:
            why = self.follower.last_malformed or "does not decode"
            return f"@{entry.position}  malformed, skipped by every reader: {printable(why)}"
        return f"@{entry.position}  {_record_text(record)}  → {_verdict_text(outcome)}"


def _short(value: Any, limit: int = 80) -> str:
    return value_text(value, limit)  # payloads and results read as JSON everywhere


def _record_text(r: ClaimsRecord) -> str:
    if isinstance(r, Unknown):
        return f"a record of unknown type {_short(r.code, 40)}"
    who = worker_label(r.worker)
    head = f"{clock_text(r.at)}  {type(r).__name__.upper():5}  task {r.task}  by {who}"
    if isinstance(r, Claim):
        return f"{head}  lease {duration_text(r.lease)}"
    if isinstance(r, Renew):
        return f"{head}  claim @{r.claim}  lease {duration_text(r.lease)}"
    if isinstance(r, Done):
        return f"{head}  claim @{r.claim}  result {_short(r.result, 40)}"
    assert isinstance(r, Fail)
    then = "dead" if r.retry_at is None else f"retry at {clock_text(r.retry_at)}"
    return f"{head}  claim @{r.claim}  {then}: {_short(r.error, 60)}"


def _verdict_text(o: Outcome) -> str:
    text = o.verdict.value
    if o.verdict is Verdict.TAKEOVER and o.previous is not None:
        return f"{text} from {worker_label(o.previous.worker)}"
    if o.verdict is Verdict.LOST_HELD and o.holder is not None:
        return f"{text} by {worker_label(o.holder.worker)} until {clock_text(o.holder.expiry)}"
    return text


__all__ = ["ClaimsPrinter", "TasksPrinter"]
