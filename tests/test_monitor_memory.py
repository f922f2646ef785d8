"""The supervisor's monitor keeps nothing that grows with history (issue 14, item 4).

Its fold is the workers' `ClaimState`; beside it the monitor keeps the throughput of the
last seconds, the foreign tasks (of a type no worker here runs), recent worker deaths and
takeovers. Each is bounded by time, by the live tasks or by a count: folding a long
history at start-up fills none of them beyond that, and every view stays the same.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgpack

from queue_worker.protocol.records import Claim, Done
from queue_worker.topics import open_topics
from supervisor.run.monitor import DEATHS_KEPT, HISTORY_SECONDS, MICROS
from tests.test_end_states import S, append_claims, caught_up, now_us, publish


def test_a_long_history_of_completions_keeps_only_the_seconds_a_view_shows(
    tmp_path: Path,
) -> None:
    d = tmp_path / ".qw"
    count = 1_000
    publish(d, count)
    end = now_us()
    ats = [end - (count - t) * S for t in range(count)]  # one DONE a second, up to now
    claims = append_claims(d, *(Claim(t, "w0-1-a", at, 30 * S) for t, at in enumerate(ats)))
    pairs = enumerate(zip(ats, claims, strict=True))
    append_claims(d, *(Done(t, "w0-1-a", at + 1, c) for t, (at, c) in pairs))
    monitor = caught_up(d)
    try:
        kept = monitor.kept()["done_seconds"]
        now = time.time()
        view = monitor.queue_view(now)
    finally:
        monitor.close()
    second = int(now)
    expected = [
        float(sum(1 for at in ats if (at + 1) // MICROS == s))
        for s in range(second - HISTORY_SECONDS, second)
    ]
    assert view.throughput_history == expected
    assert sum(expected) > 0  # the recent seconds are there
    assert view.done == count
    assert kept <= HISTORY_SECONDS + 5  # one a second of history: 1,000


def test_a_foreign_task_a_newer_worker_finished_is_forgotten(tmp_path: Path) -> None:
    d = tmp_path / ".qw"
    tasks, claims = open_topics(d)
    with tasks, claims:
        tasks.append(msgpack.packb([1, "Z", {"from": "the future"}]))
    publish(d, 1)
    t = now_us()
    (c0,) = append_claims(d, Claim(0, "w9-1-new", t, 30 * S))  # a newer worker runs task 0
    append_claims(d, Done(0, "w9-1-new", t + 1, c0))
    monitor = caught_up(d)
    try:
        assert monitor.kept()["foreign"] == 0
        view = monitor.queue_view()
        assert (view.published, view.pending, view.done) == (2, 1, 1)
    finally:
        monitor.close()


def test_deaths_are_remembered_up_to_a_count(tmp_path: Path) -> None:
    monitor = caught_up(tmp_path / ".qw")
    try:
        for n in range(DEATHS_KEPT + 100):
            monitor.worker_died(f"w0-{n}-a", float(n))
        assert monitor.kept()["deaths"] == DEATHS_KEPT
    finally:
        monitor.close()
