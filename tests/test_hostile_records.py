"""Hostile but well-formed records (valid checksums, written through the log's own append)
never crash a reader, never hold a task, and are shown as what they are.

The records are the attack run's (issue 15 items 6 and 7): times at 2^63 − 1, a lease of
2^64 − 1, a CLAIM for task −1 and for task 2^64 − 1, a worker named with terminal escapes.
Every command runs as a real subprocess on real files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest

from queue_worker.producer import Queue
from queue_worker.proof.explain import explain_batches, explain_task
from queue_worker.proof.log_reading import OTHER_TASK, read_claims_batches
from queue_worker.proof.report import read_claims
from queue_worker.protocol.records import (
    MAX_TASK_ID,
    Claim,
    RecordDecodeError,
    Unknown,
    _c_module,
    decode,
    encode,
)
from queue_worker.protocol.state import ClaimState
from queue_worker.topics import open_topics
from queue_worker.values import json_value, value_text

QW = [sys.executable, "-m", "supervisor.cli.app"]
BIG = 2**63 - 1
T0 = 1_700_000_000_000_000  # 2023-11-14, µs
LEASE = 30_000_000
ESCAPE_WORKER = "\x1b[2J\x1b[31mevil-1-ab"
GOOD_WORKER = "w2-4711-abcd"


def qw(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def append_raw(directory: Path, topic: str, items: list[Any]) -> int:
    """Append one record as its msgpack array, through the log's own append (valid CRC)."""
    tasks, claims = open_topics(directory)
    with tasks, claims:
        log = tasks if topic == "tasks" else claims
        return log.append(msgpack.packb(items, use_bin_type=True))


@pytest.fixture
def hostile(tmp_path: Path) -> dict[str, int]:
    """Three tasks, then the attack's claims records; returns their positions by name."""
    with Queue(str(tmp_path / ".qw")) as queue:
        queue.enqueue_many([{"n": n} for n in range(3)])
    d = tmp_path / ".qw"
    return {
        "big_at": append_raw(d, "claims", [1, "C", 0, GOOD_WORKER, BIG, 2**64 - 1]),
        "escape": append_raw(d, "claims", [1, "C", 1, ESCAPE_WORKER, T0, LEASE]),
        "minus_one": append_raw(d, "claims", [1, "C", -1, GOOD_WORKER, T0, LEASE]),
        "huge_task": append_raw(d, "claims", [1, "C", 2**64 - 1, GOOD_WORKER, T0, LEASE]),
        "big_retry": append_raw(d, "claims", [1, "F", 1, ESCAPE_WORKER, T0 + 1, 9, "x", BIG]),
        "big_enqueued": append_raw(d, "tasks", [1, "T", {"n": 3}, BIG]),
    }


# -- decoding: a task id out of range is malformed ------------------------------------------


@pytest.mark.parametrize("task", [-1, -(2**63), MAX_TASK_ID + 1, 2**64 - 1])
@pytest.mark.parametrize(
    "layout",
    [
        lambda t: [1, "C", t, "w", T0, LEASE],
        lambda t: [1, "R", t, "w", T0, 0, LEASE],
        lambda t: [1, "D", t, "w", T0, 0, None],
        lambda t: [1, "F", t, "w", T0, 0, "e", None],
    ],
    ids=["claim", "renew", "done", "fail"],
)
def test_a_task_id_out_of_range_decodes_as_malformed(task: int, layout: Any) -> None:
    with pytest.raises(RecordDecodeError, match=f"'task' is {task}"):
        decode(msgpack.packb(layout(task)))


def test_the_largest_task_id_decodes() -> None:
    assert decode(encode(Claim(MAX_TASK_ID, "w", T0, LEASE))) == Claim(MAX_TASK_ID, "w", T0, LEASE)
    with pytest.raises(RecordDecodeError, match="'task' is -1"):
        decode(encode(Claim(-1, "w", T0, LEASE)))


def test_hostile_task_ids_hold_nothing_for_any_reader(
    tmp_path: Path, hostile: dict[str, int]
) -> None:
    state = ClaimState()
    for position, record in read_claims(str(tmp_path / ".qw")):
        state.apply(record, position)
    held = sorted(task for task, _ in state.held_tasks())
    assert held == [0, 1]  # the claims for −1 and 2^64 − 1 were skipped as malformed
    assert state.unknown_count == 2


def test_hostile_records_read_in_batches_as_one_by_one(
    tmp_path: Path, hostile: dict[str, int]
) -> None:
    """`read_claims_batches` (what `qw why` and `qw task` read) gives `read_claims`'s records
    and positions: a malformed one as Unknown(MALFORMED), a batch of them read as entries."""
    d = tmp_path / ".qw"
    append_raw(d, "claims", [1, "Z", 0])  # a type this version does not know
    batched = [
        (position, record)
        for records, positions in read_claims_batches(str(d))
        for record, position in zip(records, positions, strict=True)
    ]
    assert batched == list(read_claims(str(d)))
    assert sum(isinstance(r, Unknown) for _, r in batched) == 3


@pytest.mark.parametrize("task", [0, 1, 2, 3, MAX_TASK_ID])
def test_one_tasks_story_from_its_own_records_is_the_whole_folds(
    tmp_path: Path, hostile: dict[str, int], task: int
) -> None:
    """`read_claims_batches(location, task)` (what `qw why` and `qw task` read: another
    task's record may be left out, not decoded) told without folding the others gives the
    story the whole fold tells; and it gives every record of the task, as read."""
    d = tmp_path / ".qw"
    append_raw(d, "claims", [1, "Z", task])  # a type this version does not know, "of" it
    append_raw(d, "claims", [1, "D", task, GOOD_WORKER, T0 + 2, hostile["escape"], {"k": [1]}])
    own = list(read_claims_batches(str(d), task))
    whole = explain_task(task, None, read_claims(str(d)), now_us=T0)
    assert explain_batches(task, None, own, now_us=T0, fold_others=False) == whole
    ours = dict((p, r) for rs, ps in own for r, p in zip(rs, ps, strict=True))
    theirs = dict(read_claims(str(d)))
    assert all(theirs[p] == r for p, r in ours.items())  # as read, where read
    left_out = [r for p, r in theirs.items() if p not in ours]
    assert all(isinstance(r, Unknown) or r.task != task for r in left_out)  # none of its own
    if _c_module() is not None:  # (the C decoder passes over the others' records)
        assert left_out
    assert OTHER_TASK not in ours.values()


# -- every reader: no crash, absurd times shown as such --------------------------------------

READERS = [
    ["report"],
    ["report", "--json"],
    ["tail"],
    ["tail", "--topic", "tasks"],
    ["why", "0"],
    ["why", "0", "--json"],
    ["why", "1"],
    ["task", "0"],
    ["task", "1", "--json"],
    ["task", "3"],
    ["status"],
    ["status", "--json"],
]


@pytest.mark.parametrize("args", READERS, ids=" ".join)
def test_no_reader_crashes_on_hostile_records(
    tmp_path: Path, hostile: dict[str, int], args: list[str]
) -> None:
    run = qw(*args, cwd=tmp_path)
    assert run.returncode == 0, run.stderr  # 1 would read as "a task was worked twice"
    assert "Traceback" not in run.stderr
    assert "\x1b" not in run.stdout
    if "--json" in args:
        json.loads(run.stdout)


@pytest.mark.parametrize(
    "args", [["report"], ["tail"], ["why", "0"], ["task", "0"], ["task", "3"]], ids=" ".join
)
def test_an_impossible_time_is_shown_as_its_number(
    tmp_path: Path, hostile: dict[str, int], args: list[str]
) -> None:
    run = qw(*args, cwd=tmp_path)
    assert f"{BIG} µs (not a date)" in run.stdout


def test_report_counts_malformed_records_and_impossible_times(
    tmp_path: Path, hostile: dict[str, int]
) -> None:
    run = qw("report", "--json", cwd=tmp_path)
    body = json.loads(run.stdout)
    assert body["malformed"] == [hostile["minus_one"], hostile["huge_task"]]
    assert body["impossible_times"] == [hostile["big_at"], hostile["big_retry"]]
    assert body["ok"] is True
    text = qw("report", cwd=tmp_path).stdout
    assert f"malformed records (skipped)    2: @{hostile['minus_one']}" in text
    assert "records with impossible times  2" in text


def test_tail_names_what_is_malformed(tmp_path: Path, hostile: dict[str, int]) -> None:
    lines = qw("tail", cwd=tmp_path).stdout.splitlines()
    minus = next(line for line in lines if line.startswith(f"@{hostile['minus_one']} "))
    assert "malformed, skipped by every reader" in minus and "'task' is -1" in minus


# -- names: escapes never reach the terminal; labels in text, full ids in JSON --------------


@pytest.mark.parametrize("args", [["report"], ["why", "1"], ["tail"], ["task", "1"]], ids=" ".join)
def test_a_worker_name_with_escapes_is_printed_escaped(
    tmp_path: Path, hostile: dict[str, int], args: list[str]
) -> None:
    run = qw(*args, cwd=tmp_path)
    assert "\x1b" not in run.stdout
    assert "�[2J�[31mevil·1" in run.stdout


@pytest.mark.parametrize("args", [["report"], ["why", "0"], ["tail"], ["task", "0"]], ids=" ".join)
def test_text_output_names_workers_by_label(
    tmp_path: Path, hostile: dict[str, int], args: list[str]
) -> None:
    run = qw(*args, cwd=tmp_path)
    assert "w2·4711" in run.stdout
    assert GOOD_WORKER not in run.stdout


def test_json_output_keeps_the_full_worker_id(tmp_path: Path, hostile: dict[str, int]) -> None:
    body = json.loads(qw("report", "--json", cwd=tmp_path).stdout)
    assert GOOD_WORKER in [w["worker"] for w in body["workers"]]
    assert ESCAPE_WORKER in [w["worker"] for w in body["workers"]]
    assert {w["worker"]: w["label"] for w in body["workers"]}[GOOD_WORKER] == "w2·4711"
    story = json.loads(qw("why", "0", "--json", cwd=tmp_path).stdout)
    claim = story["records"][1]
    assert (claim["worker"], claim["label"]) == (GOOD_WORKER, "w2·4711")


def test_a_checkpoint_of_a_fold_that_held_an_impossible_task_id_is_refused() -> None:
    # An older version folded a CLAIM for task −1 as a win; its checkpoint must not be
    # restored, or its reader would disagree with every reader that replays the log.
    state = ClaimState()
    state.apply(Claim(-1, GOOD_WORKER, T0, LEASE), 0)
    with pytest.raises(ValueError, match="task id outside"):
        ClaimState.restore(state.snapshot())
    fine = ClaimState()
    fine.apply(Claim(MAX_TASK_ID, GOOD_WORKER, T0, LEASE), 0)
    assert ClaimState.restore(fine.snapshot()).holder(MAX_TASK_ID) is not None


def test_a_record_of_an_unknown_type_is_shown_bounded_and_escaped(tmp_path: Path) -> None:
    with Queue(str(tmp_path / ".qw")) as queue:
        queue.enqueue({"n": 0})
    code = "\x1b]0;pwned\x07" + "Z" * 5000
    append_raw(tmp_path / ".qw", "claims", [1, code, 0, "w"])
    append_raw(tmp_path / ".qw", "tasks", [1, code])
    for topic in ("claims", "tasks"):
        run = qw("tail", "--topic", topic, cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        assert "a record of unknown type" in run.stdout
        assert "\x1b" not in run.stdout and "\x07" not in run.stdout
        assert max(len(line) for line in run.stdout.splitlines()) < 200
    report = json.loads(qw("report", "--json", cwd=tmp_path).stdout)
    assert (report["unknown_records"], report["malformed"]) == (1, [])


def test_a_payload_nested_900_deep_is_shown_not_crashed_on(tmp_path: Path) -> None:
    # msgpack decodes it (its limit is 1024); json.dumps and a recursive walk would not
    deep = b"\x94\x01\xa1T" + b"\x91" * 900 + b"\xc0" + msgpack.packb(T0)
    tasks, claims = open_topics(tmp_path / ".qw")
    with tasks, claims:
        tasks.append(deep)
    for args in (
        ["task", "0"],
        ["task", "0", "--json"],
        ["why", "0"],
        ["tail", "--topic", "tasks"],
    ):
        run = qw(*args, cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        assert "[[[[" in run.stdout and "Traceback" not in run.stderr


def test_value_text_and_json_value_never_raise_on_a_deep_value() -> None:
    deep = msgpack.unpackb(b"\x91" * 900 + b"\xc0")
    assert value_text(deep, 40).startswith("[[[[")
    assert isinstance(json_value(deep), str)
    json.dumps({"payload": json_value(deep)})  # the HTTP body builds
