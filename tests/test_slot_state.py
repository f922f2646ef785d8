"""A worker slot's state is an enum (`SlotState`) that shows, compares and encodes as the
word it always was."""

from __future__ import annotations

import json

import pytest

from queue_worker.worker.snapshot import WorkerState
from supervisor.http_api import worker_json
from supervisor.run.model import SlotState, WorkerView


def test_a_state_reads_as_its_word_everywhere() -> None:
    words = ["starting", "idle", "claiming", "working", "paused", "draining", "dead", "exited"]
    assert [s.value for s in SlotState] == words
    for state in SlotState:
        assert state == state.value and hash(state) == hash(state.value)
        assert str(state) == f"{state}" == f"{state:>8}".strip() == state.value
        assert json.dumps(state) == json.dumps(state.value)


def test_every_state_a_worker_publishes_is_a_slot_state() -> None:
    assert {SlotState(w.value) for w in WorkerState} <= set(SlotState)


def test_a_view_checks_the_word_it_is_given() -> None:
    view = WorkerView(slot=0, name="w0", worker_id=None, pid=None, state="dead")  # type: ignore[arg-type]
    assert view.state is SlotState.DEAD and view.ended
    assert worker_json(view)["state"] == "dead"
    with pytest.raises(ValueError, match="sleeping"):
        WorkerView(slot=0, name="w0", worker_id=None, pid=None, state="sleeping")  # type: ignore[arg-type]
