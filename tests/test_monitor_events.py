"""The supervisor's monitor turns the claims log into events and counts: each record is
decoded once and the fold's verdict decides what more is done with it (a won CLAIM or a DONE
needs nothing but the count), so these pin down what each verdict still produces."""

from __future__ import annotations

from pathlib import Path

from queue_worker.producer import Queue
from queue_worker.protocol.clock import now_us
from queue_worker.protocol.records import Claim, Done, Fail, encode
from queue_worker.topics import open_topics
from supervisor.run.monitor import Monitor

A, B = "w0-100-aaaa", "w1-200-bbbb"
SECOND = 1_000_000


def caught_up(monitor: Monitor) -> list[str]:
    """Poll to the end of both logs; the events' kinds and texts."""
    events = []
    while True:
        events += monitor.poll()
        if monitor.caught_up:
            return [f"{e.kind}: {e.text}" for e in events]


def test_each_verdict_makes_its_event_and_counts(tmp_path: Path) -> None:
    data = tmp_path / ".qw"
    with Queue(data) as queue:
        for _ in range(4):
            queue.enqueue(None)
    monitor = Monitor(str(data))
    try:
        now = now_us()
        tasks, claims = open_topics(data)
        with tasks, claims:
            # task 0: A's lease lapsed, B takes it over, A's late DONE is stale, B's counts
            a0 = claims.append(encode(Claim(0, A, now - 10 * SECOND, SECOND)))
            b0 = claims.append(encode(Claim(0, B, now, 60 * SECOND)))
            claims.append(encode(Done(0, A, now + 1, a0, None)))
            claims.append(encode(Done(0, B, now + 2, b0, "ok")))
            # task 1: failed, to be retried (released); task 2: failed for the last time
            a1 = claims.append(encode(Claim(1, A, now, 60 * SECOND)))
            claims.append(encode(Fail(1, A, now + 3, a1, "boom", now + 60 * SECOND)))
            a2 = claims.append(encode(Claim(2, A, now, 60 * SECOND)))
            claims.append(encode(Fail(2, A, now + 4, a2, "ValueError: bad", None)))
            claims.append(b"\x93not a record")  # malformed: folded as such, no event
            # task 3: held by B
            claims.append(encode(Claim(3, B, now, 60 * SECOND)))
        events = caught_up(monitor)
        assert [e.split(":")[0] for e in events] == ["takeover", "stale", "dead-task"]
        assert "task 0: w0·100 → w1·200" in events[0]
        assert "w0·100's completion was discarded (w1·200 holds it)" in events[1]
        assert events[2] == "dead-task: task 2 is dead after 1 attempt: ValueError: bad"
        taken = monitor.takeover_of(0)
        assert taken is not None and (taken.worker, taken.previous) == (B, A)
        assert monitor.takeover_of(1) is None
        view = monitor.queue_view()
        assert (view.done, view.failed, view.dead, view.held) == (1, 2, 1, 1)
        assert view.pending == 1  # task 1, backing off
        assert not monitor.is_drained()
    finally:
        monitor.close()


def test_drained_once_nothing_published_is_open(tmp_path: Path) -> None:
    data = tmp_path / ".qw"
    with Queue(data) as queue:
        queue.enqueue(None)
    monitor = Monitor(str(data))
    try:
        now = now_us()
        tasks, claims = open_topics(data)
        with tasks, claims:
            c = claims.append(encode(Claim(0, A, now, 60 * SECOND)))
            claims.append(encode(Claim(7, B, now, 60 * SECOND)))  # an id never published
            caught_up(monitor)
            assert not monitor.is_drained()  # task 0 is held
            claims.append(encode(Done(0, A, now + 1, c, None)))
        caught_up(monitor)
        assert monitor.is_drained()  # the claim on id 7 holds no task of this queue
    finally:
        monitor.close()
