"""Words and numbers a newcomer can read: payloads and results as one line of JSON
everywhere (`queue_worker.values`), and what a position is (`qw why`'s header)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from queue_worker.values import json_value, value_text
from supervisor.report_text import positions_note


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"n": 3}, '{"n": 3}'),  # JSON, not the Python form {'n': 3}
        ([1, None, True, "é"], '[1, null, true, "é"]'),
        ("a\nb\x1b[31m", '"a\\nb\\u001b[31m"'),  # escapes stay escaped: one safe line
        ({1: b"\x00"}, '{"1": "b\'\\\\x00\'"}'),  # what JSON lacks, as close as it gets
    ],
)
def test_a_value_reads_as_one_line_of_json(value: Any, text: str) -> None:
    assert value_text(value) == text
    assert "\n" not in value_text(value)


def test_a_json_payload_pastes_back_as_itself() -> None:
    payload = {"path": "a.png", "sizes": [1, 2.5], "meta": {"ok": False, "none": None}}
    assert json.loads(value_text(payload)) == payload
    assert json_value(payload) == payload


def test_a_long_value_is_cut_with_an_ellipsis() -> None:
    text = value_text({"a": "x" * 100}, 20)
    assert len(text) == 20 and text.endswith("…") and text.startswith('{"a": "xxx')
    assert value_text("short", 20) == '"short"'


def test_c1_controls_cannot_reach_the_terminal() -> None:
    assert "\x9b" not in value_text("\x9b2J")  # C1 CSI: json.dumps leaves it as it is


def test_the_positions_note_says_what_a_position_is() -> None:
    assert "its byte offset in .qw/claims.log" in positions_note(".qw")
    assert "stream entry id MS-SEQ" in positions_note("redis://127.0.0.1:6379/0")
    assert "task #N a task's id" in positions_note(".qw")
