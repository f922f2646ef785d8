"""`qw why TASK`: the story of one task, each record with the rule that decided it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from logstore import open_log
from queue_worker.proof.explain import _Teller, explain_batches, explain_task
from queue_worker.proof.log_reading import OTHER_TASK
from queue_worker.proof.report import EXIT_BAD_INPUT, clock_text
from queue_worker.protocol.records import (
    Claim,
    ClaimsRecord,
    Done,
    Fail,
    Renew,
    TaskRecord,
    Unknown,
    encode,
)
from queue_worker.protocol.state import ClaimState
from supervisor.cli.report_commands import register
from tests.examples import examples
from tests.test_state_model import claims_logs

S = 1_000_000  # µs
T0 = 1_700_000_000 * S  # a wall-clock time, so that the clock texts are real times


def story_of(task: int, records: list[ClaimsRecord]) -> list[tuple[int, str, str]]:
    """(position, verdict, why) of each step about `task`; positions are record indexes."""
    story = explain_task(task, TaskRecord("p", T0), list(enumerate(records)))
    return [(s.position, s.verdict, s.why) for s in story.steps]


def test_a_won_claim_and_its_completion() -> None:
    steps = story_of(
        0,
        [
            Claim(0, "w1", T0, 10 * S),
            Renew(0, "w1", T0 + 5 * S, 0, 10 * S),
            Done(0, "w1", T0 + 6 * S, 0),
        ],
    )
    assert steps[0][:2] == (0, "published")
    assert steps[1] == (0, "won", f"won: nobody held it; lease until {clock_text(T0 + 10 * S)}")
    assert steps[2][1] == "renewed"
    assert "5.00 s were left" in steps[2][2]
    assert steps[3][1] == "done"
    assert "accepted from the holder, claim @0, 9.00 s before its lease expired" in steps[3][2]


def test_a_lost_claim_names_the_holder_and_when_its_lease_ends() -> None:
    steps = story_of(0, [Claim(0, "w3", T0, 2 * S), Claim(0, "w1", T0 + S, 2 * S)])
    assert steps[2][1] == "lost: held"
    assert steps[2][2] == (
        f"lost because held by w3 (claim @0) until {clock_text(T0 + 2 * S)} "
        "(1.00 s after this claim)"
    )


def test_a_takeover_names_the_expired_lease_and_the_gaps() -> None:
    steps = story_of(
        0,
        [
            Claim(0, "w2", T0, 2 * S),
            Renew(0, "w2", T0 + S, 0, 2 * S),  # expiry T0 + 3 s
            Claim(0, "w5", T0 + 4 * S, 2 * S),
        ],
    )
    assert steps[3][1] == "takeover"
    assert steps[3][2] == (
        f"won, a takeover of w2 (claim @0): that lease expired at {clock_text(T0 + 3 * S)}, "
        "1.00 s before this claim; its holder's last record was 3.00 s earlier"
    )


def test_a_stale_completion_after_a_takeover_says_the_task_was_worked_twice() -> None:
    steps = story_of(
        0,
        [
            Claim(0, "paused", T0, S),
            Claim(0, "taker", T0 + 2 * S, S),
            Done(0, "taker", T0 + 2 * S + 1, 1),
            Done(0, "paused", T0 + 3 * S, 0),
        ],
    )
    position, verdict, why = steps[4]
    assert (position, verdict) == (3, "stale done")
    assert why.startswith("stale: claim @0 is not the holder; the task was already done (@2)")
    assert (
        "its handler ran to completion while claim @1 also ran it: the task was worked twice" in why
    )


def test_release_backoff_and_death() -> None:
    steps = story_of(
        0,
        [
            Claim(0, "w1", T0, S),
            Fail(0, "w1", T0 + 1, 0, "ValueError: bad", T0 + 5 * S),
            Claim(0, "w2", T0 + S, S),
            Claim(0, "w2", T0 + 5 * S, S),
            Fail(0, "w2", T0 + 5 * S + 1, 3, "ValueError: worse", None),
            Claim(0, "w3", T0 + 9 * S, S),
        ],
    )
    whys = [why for _, _, why in steps[1:]]
    assert whys[1] == f"released after error: ValueError: bad; retry at {clock_text(T0 + 5 * S)}"
    assert whys[2] == f"lost: the task may not be retried before {clock_text(T0 + 5 * S)}"
    assert whys[3].startswith("won: nobody held it and its retry time had come")
    assert whys[4] == "dead: attempts used up; last error: ValueError: worse"
    assert whys[5] == "lost: the task is dead (@4)"


def test_records_about_other_tasks_are_folded_but_not_told() -> None:
    story = explain_task(
        1,
        None,
        list(enumerate([Claim(0, "a", T0, S), Claim(1, "b", T0, S), Done(0, "a", T0 + 1, 0)])),
    )
    assert [s.position for s in story.steps] == [1]
    assert story.state.startswith("held by b (claim @1) until")
    assert not story.published


def test_the_final_state_of_a_done_task() -> None:
    story = explain_task(
        0, TaskRecord({"x": 1}, T0), list(enumerate([Claim(0, "a", T0, S), Done(0, "a", T0, 0)]))
    )
    assert story.state == "done (@1)"
    assert story.steps[0].why == 'payload {"x": 1}'  # JSON, as qw tail shows it
    assert json.loads(json.dumps(story.to_json()))["records"][2]["verdict"] == "done"


# -- `qw why` over real files ----------------------------------------------------------------


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def test_qw_why_tells_every_record_with_its_log_position(data_dir: Path) -> None:
    with open_log(data_dir, "tasks") as tasks:
        tasks.append(encode(TaskRecord({"n": 0}, T0)))
    with open_log(data_dir, "claims") as claims:
        first = claims.append(encode(Claim(0, "w2", T0, S)))
        second = claims.append(encode(Claim(0, "w5", T0 + 2 * S, S)))
        claims.append(encode(Done(0, "w5", T0 + 2 * S + 1, second)))
        stale = claims.append(encode(Done(0, "w2", T0 + 3 * S, first)))

    result = CliRunner().invoke(_app(), ["why", "0", "--dir", str(data_dir)])

    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == (  # what a position is, said once at the top
        f"@N      a record's position in the claims log: its byte offset in "
        f"{data_dir / 'claims.log'}"
    )
    for position in (first, second, stale):
        assert f"@{position}" in result.output
    assert "takeover of w2" in result.output
    assert "worked twice" in result.output

    as_json = CliRunner().invoke(_app(), ["why", "0", "--dir", str(data_dir), "--json"])
    records = json.loads(as_json.output)["records"]
    assert [r["kind"] for r in records] == ["TASK", "CLAIM", "CLAIM", "DONE", "DONE"]
    assert records[-1]["position"] == stale


def test_qw_why_of_an_unknown_task_is_exit_2(data_dir: Path) -> None:
    with open_log(data_dir, "tasks") as tasks:
        tasks.append(encode(TaskRecord(None, T0)))
    result = CliRunner().invoke(_app(), ["why", "5", "--dir", str(data_dir)])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "task 5 is not in" in result.output


def test_qw_why_on_a_damaged_log_is_exit_2_naming_the_offset(data_dir: Path) -> None:
    with open_log(data_dir, "tasks") as tasks:
        tasks.append(encode(TaskRecord(None, T0)))
    with open_log(data_dir, "claims") as claims:
        for n in range(3):
            claims.append(encode(Claim(0, f"w{n}", T0 + n, S)))
    path = data_dir / "claims.log"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))

    result = CliRunner().invoke(_app(), ["why", "0", "--dir", str(data_dir)])

    assert result.exit_code == EXIT_BAD_INPUT
    assert "claims.log" in result.output and "byte offset" in result.output


@settings(max_examples=examples(200), deadline=None)
@given(claims_logs(), st.integers(min_value=0, max_value=4), st.lists(st.integers(0, 50)))
def test_the_story_from_batches_is_the_story_record_by_record(
    log: list[ClaimsRecord], task: int, cuts: list[int]
) -> None:
    """`explain_batches` (what `qw why` and `qw task` fold: the other tasks' records a run at
    a time) tells each task's story as `explain_task` does, however the log is batched; it
    shows each of the task's records to `seen`, in order. An Unknown record whose code
    equals the task id (0 here; no decoder makes one, the check is defensive) is only folded."""
    zero = Unknown(0)  # type: ignore[arg-type]
    log = [zero if isinstance(r, Unknown) and r.code == "" else r for r in log]
    positions = [10 * i for i in range(len(log))]
    bounds = sorted({0, len(log), *(c for c in cuts if c <= len(log))})
    batches = [(log[a:b], positions[a:b]) for a, b in itertools.pairwise(bounds)]
    now = T0 + 50 * S
    seen: list[tuple[int, ClaimsRecord]] = []
    ours = explain_batches(
        task, TaskRecord("p", T0), batches, now_us=now, seen=lambda *p: seen.append(p)
    )
    theirs = explain_task(task, TaskRecord("p", T0), zip(positions, log, strict=True), now_us=now)
    assert ours == theirs
    about = [(p, r) for p, r in zip(positions, log, strict=True) if not isinstance(r, Unknown)]
    assert seen == [(p, r) for p, r in about if r.task == task]
    # and the whole fold, every task's records, not only the story's (which needs its own)
    teller = _Teller(task)
    for records, at in batches:
        teller.apply_batch(records, at)
    whole = ClaimState()
    for position, record in zip(positions, log, strict=True):
        whole.apply(record, position)
    assert teller.state == whole


@settings(max_examples=examples(200), deadline=None)
@given(
    claims_logs(), st.integers(min_value=0, max_value=4), st.lists(st.integers(0, 50)), st.data()
)
def test_the_story_from_the_tasks_own_records_is_the_whole_folds(
    log: list[ClaimsRecord], task: int, cuts: list[int], data: st.DataObject
) -> None:
    """`fold_others=False` (what `qw why` and `qw task` tell, from a read that may put
    OTHER_TASK for another task's record): the story `explain_task` tells from the whole
    fold, each of the task's records shown to `seen`, whichever of the others are there."""
    positions = [10 * i for i in range(len(log))]
    given_log = [
        OTHER_TASK if (isinstance(r, Unknown) or r.task != task) and data.draw(st.booleans()) else r
        for r in log
    ]
    bounds = sorted({0, len(log), *(c for c in cuts if c <= len(log))})
    batches = [(given_log[a:b], positions[a:b]) for a, b in itertools.pairwise(bounds)]
    now = T0 + 50 * S
    seen: list[tuple[int, ClaimsRecord]] = []
    ours = explain_batches(
        task,
        TaskRecord("p", T0),
        batches,
        now_us=now,
        seen=lambda *p: seen.append(p),
        fold_others=False,
    )
    theirs = explain_task(task, TaskRecord("p", T0), zip(positions, log, strict=True), now_us=now)
    assert ours == theirs
    assert seen == [
        (p, r)
        for p, r in zip(positions, log, strict=True)
        if not isinstance(r, Unknown) and r.task == task
    ]
