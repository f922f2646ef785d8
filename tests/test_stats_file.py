"""The light reading of a worker's stats file (`qw status`'s, queue_worker.worker.stats_file) is the
typed one's (`WorkerSnapshot.to_dict()` of `parse_snapshot`) for any JSON a file may hold."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from queue_worker.worker.snapshot import WorkerSnapshot, WorkerState, parse_snapshot, read_snapshots
from queue_worker.worker.stats_file import FIELDS, STATES, parse_stats, read_stats

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
field_values = {
    name: json_values
    | st.sampled_from(sorted(STATES))
    | st.dictionaries(st.sampled_from(["p50", "p99", "lost: held", "x"]), json_values, max_size=3)
    for name in FIELDS
}
stats_json = st.fixed_dictionaries({}, optional=field_values)


def test_the_fields_are_the_snapshots_in_its_order() -> None:
    assert list(FIELDS) == [f.name for f in fields(WorkerSnapshot)]
    assert {s.value for s in WorkerState} == STATES


@given(stats_json | json_values)
def test_the_light_reading_is_the_typed_ones_dict(data: Any) -> None:
    assert parse_stats(data) == parse_snapshot(data).to_dict()


def test_read_stats_reads_and_orders_as_read_snapshots(tmp_path: Path) -> None:
    (tmp_path / "b.json").write_text(json.dumps({"worker": "w1-2-b", "started_at": 2.0}))
    (tmp_path / "a.json").write_text(json.dumps({"worker": "w0-1-a", "started_at": 1.0}))
    (tmp_path / "c.json").write_text('{"torn')
    (tmp_path / "d.json").write_text("[1, 2]")
    assert read_stats(tmp_path) == [s.to_dict() for s in read_snapshots(tmp_path)]
    assert [s["worker"] for s in read_stats(tmp_path)] == ["w0-1-a", "w1-2-b"]
    assert read_stats(tmp_path / "missing") == []
