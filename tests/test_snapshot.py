"""The typed reading of a worker's published stats: every field the worker writes comes back
under the same name, and a missing or wrongly-typed field reads as its default, not a crash."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from queue_worker.worker.snapshot import (
    ClaimLatency,
    WorkerSnapshot,
    WorkerState,
    parse_snapshot,
    read_snapshots,
)
from queue_worker.worker.stats import WorkerStats


def busy_stats() -> WorkerStats:
    """A WorkerStats whose every published field differs from its default (and from the
    other fields), so a field dropped or renamed on either side changes the answer."""
    stats = WorkerStats(worker="w3-4242-ab12", name="w3", pid=4242, host="box", started_at=1.5)
    numbers = iter(range(101, 1000))
    for f in fields(WorkerStats):
        if f.name.startswith("_") or f.name in ("worker", "name", "pid", "host", "started_at"):
            continue
        current = getattr(stats, f.name)
        if f.name == "state":
            setattr(stats, f.name, "working")
        elif f.name == "lost":
            stats.count_lost("lost: held")
            stats.count_lost("lost: held")
            stats.count_lost("lost: done")
        elif f.name in ("last_error", "log_error", "exit_reason", "current_function"):
            setattr(stats, f.name, f"{f.name} text")
        elif f.name in ("current_since", "lease_expiry", "updated_at"):
            setattr(stats, f.name, next(numbers) + 0.25)
        elif f.name in ("current_task", "current_claim") or isinstance(current, int):
            setattr(stats, f.name, next(numbers))
        else:
            raise AssertionError(f"a WorkerStats field this test does not know: {f.name}")
    for micros in (300, 900, 100, 5000):
        stats.record_latency(micros)
    return stats


def written(stats: WorkerStats) -> dict[str, Any]:
    """The JSON as the worker publishes it, decoded as a reader decodes the file."""
    decoded: dict[str, Any] = json.loads(json.dumps(stats.to_dict()))
    return decoded


def test_every_published_field_round_trips() -> None:
    data = written(busy_stats())
    snap = parse_snapshot(data)
    assert snap.to_dict() == data  # a key renamed on one side shows up here, not as a 0
    assert set(data) == {f.name for f in fields(WorkerSnapshot)}


def test_the_fields_read_typed() -> None:
    stats = busy_stats()
    snap = parse_snapshot(written(stats))
    assert snap.state is WorkerState.WORKING
    assert snap.current_task == stats.current_task
    assert snap.lease_expiry == stats.lease_expiry
    assert snap.lost == {"lost: held": 2, "lost: done": 1} and snap.lost_total == 3
    assert snap.leases_lapsed == stats.leases_lapsed and snap.log_error == "log_error text"
    assert snap.claim_latency_micros == ClaimLatency(
        p50=900, p90=5000, p99=5000, samples=stats.latency_samples
    )


def test_the_states_are_the_ones_the_worker_writes() -> None:
    for state in ("starting", "idle", "claiming", "working", "draining", "exited"):
        assert parse_snapshot({"state": state}).state == WorkerState(state)
        assert parse_snapshot({"state": state}).to_dict()["state"] == state


def test_a_renamed_field_reads_as_its_default() -> None:
    data = written(busy_stats())
    data["current_task_id"] = data.pop("current_task")
    data["finish"] = data.pop("finished")
    snap = parse_snapshot(data)
    assert snap.current_task is None and snap.finished == 0


@pytest.mark.parametrize(
    ("key", "value", "attribute", "expected"),
    [
        ("current_task", "seven", "current_task", None),
        ("current_task", True, "current_task", None),  # a bool is not a task id
        ("current_task", 7.0, "current_task", None),
        ("attempts", True, "attempts", 0),
        ("attempts", "40", "attempts", 0),
        ("attempts", None, "attempts", 0),
        ("lease_expiry", "soon", "lease_expiry", None),
        ("lease_expiry", 12, "lease_expiry", 12.0),
        ("pid", "4242", "pid", None),
        ("started_at", [1], "started_at", None),
        ("state", "sleeping", "state", None),
        ("state", 3, "state", None),
        ("log_error", 5, "log_error", None),
        ("worker", {"id": 1}, "worker", None),
        ("claim_latency_micros", [1, 2], "claim_latency_micros", ClaimLatency()),
        ("lost", "many", "lost", {}),
    ],
)
def test_a_wrongly_typed_field_reads_as_its_default(
    key: str, value: object, attribute: str, expected: object
) -> None:
    data = written(busy_stats())
    data[key] = value
    snap = parse_snapshot(data)
    assert getattr(snap, attribute) == expected
    assert snap.won == data["won"]  # the other fields still read


def test_bad_parts_of_the_nested_objects_read_as_missing() -> None:
    snap = parse_snapshot(
        {
            "lost": {"lost: held": 2, "lost: done": "x", "lost: backoff": False},
            "claim_latency_micros": {"p50": "fast", "p99": 2350, "samples": 4},
        }
    )
    assert snap.lost == {"lost: held": 2}
    assert snap.lost_total == 2  # no total written: the sum of the verdicts that read
    assert snap.claim_latency_micros == ClaimLatency(p50=0, p90=0, p99=2350, samples=4)


@pytest.mark.parametrize("data", [None, [], "idle", 3, {}])
def test_anything_but_an_object_reads_as_an_empty_snapshot(data: object) -> None:
    assert parse_snapshot(data) == WorkerSnapshot()


def test_read_snapshots_skips_broken_files_and_sorts_by_start(tmp_path: Path) -> None:
    later, earlier = busy_stats(), busy_stats()
    later.worker, later.started_at = "w1-2-b", 20.0
    earlier.worker, earlier.started_at = "w0-1-a", 10.0
    later.publish(tmp_path / f"{later.worker}.json")
    earlier.publish(tmp_path / f"{earlier.worker}.json")
    (tmp_path / "half.json").write_text('{"worker": "w2')
    (tmp_path / "list.json").write_text("[1, 2]")
    assert [s.worker for s in read_snapshots(tmp_path)] == ["w0-1-a", "w1-2-b"]
    assert read_snapshots(tmp_path / "missing") == []
