"""The report: a replay of the claims log, and what it proves (pure: records in, numbers out).

The end-to-end `qw report` over real files (exit codes, a corrupt log) is at the bottom.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from queue_worker.proof.report import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_WORKED_TWICE,
    ReportInputError,
    build_report,
    duration_text,
    load_report,
)
from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Fail, Renew, Unknown
from queue_worker.topics import MALFORMED
from supervisor.cli.report_commands import register
from supervisor.report_text import render_report
from tests.examples import examples

LEASE = 1_000  # µs: every scripted claim's lease unless a test says otherwise


def qw_app() -> typer.Typer:
    """An app with this module's commands, as `qw` registers them."""
    app = typer.Typer()
    register(app)
    return app


@dataclass
class Script:
    """A claims log written by hand; positions are record indexes (as in the memory log)."""

    records: list[tuple[int, ClaimsRecord]] = field(default_factory=list)

    def _add(self, record: ClaimsRecord) -> int:
        position = len(self.records)
        self.records.append((position, record))
        return position

    def claim(self, task: int, worker: str, at: int, lease: int = LEASE) -> int:
        return self._add(Claim(task, worker, at, lease))

    def renew(self, task: int, worker: str, at: int, claim: int, lease: int = LEASE) -> int:
        return self._add(Renew(task, worker, at, claim, lease))

    def done(self, task: int, worker: str, at: int, claim: int) -> int:
        return self._add(Done(task, worker, at, claim, "ok"))

    def fail(self, task: int, worker: str, at: int, claim: int, retry_at: int | None) -> int:
        return self._add(Fail(task, worker, at, claim, "Boom: no", retry_at))

    def unknown(self, code: str = "Z") -> int:
        return self._add(Unknown(code))


def test_a_clean_run_is_ok_and_counts_what_the_original_counts() -> None:
    s = Script()
    c0 = s.claim(0, "a", 10)
    s.claim(0, "b", 11)  # lost: held by a
    c1 = s.claim(1, "b", 12)
    s.done(0, "a", 500, c0)
    s.done(1, "b", 600, c1)
    s.claim(1, "a", 700)  # lost: done

    r = build_report(3, s.records)

    assert (r.tasks_published, r.tasks_done, r.tasks_held, r.tasks_dead) == (3, 2, 0, 0)
    assert (r.attempts, r.wins, r.lost) == (4, 2, 2)
    assert r.lost_percent == 50.0
    assert r.lost_by_reason == {"lost: held": 1, "lost: done": 1}
    assert (r.completions, r.completions_accepted, r.completions_stale) == (2, 2, 0)
    assert [w.worker for w in r.workers] == ["a", "b"]
    assert r.attempts_histogram == {2: 2, 0: 1}  # task 2 was never claimed
    assert r.worked_twice == () and r.takeovers == ()
    assert r.ok and r.exit_code == EXIT_OK
    assert r.verdict.startswith("OK: every finished task was completed exactly once (2 done)")


def test_a_takeover_of_a_silent_holder_is_redistribution_not_a_failure() -> None:
    s = Script()
    c0 = s.claim(0, "victim", 100)
    s.renew(0, "victim", 600, c0)  # its last sign of life: expiry 1600
    c1 = s.claim(0, "survivor", 1900)
    s.done(0, "survivor", 2000, c1)

    r = build_report(1, s.records)

    assert r.ok and r.tasks_done == 1 and r.wins == 2
    [t] = r.takeovers
    assert (t.task, t.position, t.victim, t.new_holder) == (0, c1, "victim", "survivor")
    assert (t.victim_claim, t.victim_expiry, t.victim_last_at) == (c0, 1600, 600)
    assert (t.gap_after_expiry, t.gap_after_last) == (300, 1300)
    assert r.workers[1].takeovers == 1


def test_a_stale_done_under_a_claim_that_had_won_is_work_done_twice() -> None:
    s = Script()
    c0 = s.claim(0, "paused", 100)
    c1 = s.claim(0, "taker", 1200)  # takeover: paused's lease expired at 1100
    s.done(0, "taker", 1300, c1)
    stale = s.done(0, "paused", 1400, c0)  # resumed, completed anyway: refused
    c2 = s.claim(1, "taker", 1500)
    s.done(1, "taker", 1600, c2)

    r = build_report(2, s.records)

    assert r.tasks_done == 2 and r.completions_accepted == 2  # task 0 counted done once
    assert r.completions == 3 and r.completions_stale == 1
    [w] = r.worked_twice
    assert w.task == 0
    assert [(x.kind, x.position, x.worker, x.verdict.value) for x in w.records] == [
        ("CLAIM", c0, "paused", "won"),
        ("CLAIM", c1, "taker", "takeover"),
        ("DONE", 2, "taker", "done"),
        ("DONE", stale, "paused", "stale done"),
    ]
    [sc] = r.stale_completions
    assert sc.claim_won and sc.holder is None and sc.done_position == 2
    assert not r.ok and r.exit_code == EXIT_WORKED_TWICE
    assert r.verdict == "FAIL: a task was worked twice: 0"


def test_a_stale_done_while_the_taker_still_holds_the_task_is_work_done_twice() -> None:
    s = Script()
    c0 = s.claim(0, "paused", 100)
    c1 = s.claim(0, "taker", 1200)
    s.done(0, "paused", 1300, c0)

    r = build_report(1, s.records)

    assert [w.task for w in r.worked_twice] == [0]
    assert r.stale_completions[0].holder is not None
    assert r.stale_completions[0].holder.claim == c1
    assert r.tasks_held == 1 and r.tasks_done == 0


def test_stale_dones_that_did_no_second_work_are_not_worked_twice() -> None:
    s = Script()
    c0 = s.claim(0, "a", 100)
    lost = s.claim(0, "b", 200)  # lost: its handler never ran
    s.done(0, "b", 300, lost)
    s.done(0, "a", 400, c0)
    s.done(0, "a", 500, c0)  # the same claim again: a duplicate, not a second run

    r = build_report(1, s.records)

    assert r.completions_stale == 2
    assert [sc.claim_won for sc in r.stale_completions] == [False, True]
    assert r.worked_twice == () and r.ok


def test_failures_release_then_kill_a_task_and_the_dead_keep_their_last_error() -> None:
    s = Script()
    c0 = s.claim(0, "a", 100)
    s.fail(0, "a", 200, c0, retry_at=5000)
    s.claim(0, "b", 300)  # lost: backoff
    c1 = s.claim(0, "b", 5000)
    dead = s.fail(0, "b", 5100, c1, retry_at=None)
    s.claim(0, "c", 6000)  # lost: dead
    c2 = s.claim(1, "c", 6000)
    s.fail(1, "c", 6100, c2, retry_at=9000)  # waiting for its retry

    r = build_report(2, s.records)

    assert (r.tasks_dead, r.tasks_waiting, r.tasks_done, r.tasks_held) == (1, 1, 0, 0)
    assert r.fails_accepted == 3 and r.fails_stale == 0
    assert [(d.task, d.position, d.worker, d.error) for d in r.dead] == [(0, dead, "b", "Boom: no")]
    assert r.lost_by_reason == {"lost: backoff": 1, "lost: dead": 1}
    assert r.ok, r.accounting_errors()


def test_the_lease_margin_is_expiry_minus_at_for_renewals_and_completions() -> None:
    s = Script()
    c0 = s.claim(0, "a", 0)  # expiry 1000
    s.renew(0, "a", 400, c0)  # margin 600, expiry 1400
    s.renew(0, "a", 1000, c0)  # margin 400, expiry 2000
    s.done(0, "a", 2100, c0)  # margin -100: late, accepted since nobody took over
    c1 = s.claim(1, "b", 0)
    s.done(1, "b", 100, c1)  # margin 900

    r = build_report(2, s.records)

    assert (r.renewal_margin.samples, r.renewal_margin.min, r.renewal_margin.late) == (2, 400, 0)
    assert r.completion_margin.min == -100 and r.completion_margin.late == 1
    assert r.completion_margin.samples == 2
    assert r.ok


def test_a_refused_renewal_is_a_lost_lease() -> None:
    s = Script()
    c0 = s.claim(0, "a", 0)
    s.claim(0, "b", 1500)
    s.renew(0, "a", 1600, c0)

    r = build_report(1, s.records)

    assert r.renewals == 0 and r.renewals_refused == 1
    assert r.workers[0].leases_lost == 1


def test_unknown_and_malformed_records_are_skipped_and_shown() -> None:
    s = Script()
    s.unknown("Z")
    bad = s.unknown(MALFORMED)
    c0 = s.claim(0, "a", 0)
    s.done(0, "a", 10, c0)

    r = build_report(1, s.records)

    assert r.unknown_records == 1 and r.malformed == (bad,)
    assert r.ok


def test_claims_for_tasks_the_tasks_log_lacks_are_named() -> None:
    s = Script()
    s.claim(7, "a", 0)
    r = build_report(2, s.records)
    assert r.unpublished_tasks == (7,)


def test_the_json_object_has_the_documented_keys_and_is_plain_json() -> None:
    s = Script()
    c0 = s.claim(0, "paused", 100)
    c1 = s.claim(0, "taker", 1200)
    s.done(0, "taker", 1300, c1)
    s.done(0, "paused", 1400, c0)

    data = json.loads(json.dumps(build_report(1, s.records).to_json()))

    for key in (
        "tasks_published",
        "tasks_done",
        "tasks_held",
        "tasks_dead",
        "attempts",
        "wins",
        "lost",
        "completions",
        "completions_accepted",
        "completions_stale",
        "worked_twice",
        "takeovers",
        "workers",
        "verdict",
    ):
        assert key in data, key
    assert data["worked_twice"] == [0]
    assert data["takeovers"][0]["victim"] == "paused"
    assert data["takeovers"][0]["gap_after_expiry"] == 100
    assert data["workers"][0]["worker"] == "paused"
    assert data["worked_twice_records"]["0"][-1]["verdict"] == "stale done"


def test_durations_read_in_the_unit_that_fits() -> None:
    assert duration_text(850) == "850 µs"
    assert duration_text(12_300) == "12.3 ms"
    assert duration_text(4_200_000) == "4.20 s"
    assert duration_text(-1500) == "-1.5 ms"


# -- properties over any log -----------------------------------------------------------------

WORKERS = ("a", "b", "c")


@st.composite
def claims_logs(draw: st.DrawFn) -> list[tuple[int, ClaimsRecord]]:
    """Arbitrary claims logs over a few tasks and workers, clocks roughly moving forward.
    RENEW/DONE/FAIL name a random earlier position: often a real claim, often not."""
    s = Script()
    at = 0
    for _ in range(draw(st.integers(0, 40))):
        at += draw(st.integers(-50, 400))
        task = draw(st.integers(0, 3))
        worker = draw(st.sampled_from(WORKERS))
        kind = draw(st.sampled_from("CCRDF"))
        if kind == "C" or not s.records:
            s.claim(task, worker, at, draw(st.integers(1, 1500)))
            continue
        claim = draw(st.integers(0, len(s.records) - 1))
        if kind == "R":
            s.renew(task, worker, at, claim, draw(st.integers(1, 1500)))
        elif kind == "D":
            s.done(task, worker, at, claim)
        else:
            retry = draw(st.one_of(st.none(), st.integers(at, at + 2000)))
            s.fail(task, worker, at, claim, retry)
    return s.records


@settings(max_examples=examples(80), deadline=None)
@given(claims_logs())
def test_the_accounting_holds_on_every_prefix_of_any_log(
    records: list[tuple[int, ClaimsRecord]],
) -> None:
    done_before = 0
    for end in range(len(records) + 1):
        r = build_report(4, records[:end])
        assert r.accounting_errors() == []
        # the original's invariants, on distinct tasks (takeovers keep a task held)
        assert (
            r.tasks_done
            <= r.tasks_won
            <= r.tasks_done + r.tasks_held + r.tasks_dead + (r.tasks_waiting)
        )
        assert r.tasks_done >= done_before  # a reader further along never sees fewer done
        done_before = r.tasks_done
        assert r.completions_accepted + r.completions_stale == r.completions
        assert r.attempts == r.wins + r.lost


# -- `qw report` over real files -------------------------------------------------------------


def _write_log(data_dir: Path, records: list[tuple[int, ClaimsRecord]], tasks: int) -> None:
    from logstore import open_log
    from queue_worker.protocol.records import TaskRecord, encode

    with open_log(data_dir, "tasks") as log:
        for i in range(tasks):
            log.append(encode(TaskRecord({"n": i}, 0)))
    with open_log(data_dir, "claims") as log:
        positions: dict[int, int] = {}  # scripted position -> file position
        for index, record in records:
            if isinstance(record, Renew | Done | Fail):
                record = record._replace(claim=positions[record.claim])
            positions[index] = log.append(encode(record))


def test_qw_report_exits_0_on_a_clean_log_and_1_naming_a_task_worked_twice(
    data_dir: Path,
) -> None:
    s = Script()
    c0 = s.claim(0, "paused", 100)
    c1 = s.claim(0, "taker", 1200)
    s.done(0, "taker", 1300, c1)
    s.done(0, "paused", 1400, c0)
    _write_log(data_dir, s.records, tasks=1)
    runner = CliRunner()

    result = runner.invoke(qw_app(), ["report", "--dir", str(data_dir)])
    assert result.exit_code == EXIT_WORKED_TWICE, result.output
    assert "FAIL: a task was worked twice: 0" in result.output
    assert "task 0 was worked twice: CLAIM @" in result.output

    as_json = runner.invoke(qw_app(), ["report", "--dir", str(data_dir), "--json"])
    assert as_json.exit_code == EXIT_WORKED_TWICE
    assert json.loads(as_json.output)["worked_twice"] == [0]

    # the state right after the takeover's DONE: nothing was worked twice yet
    done_at = load_report(data_dir).worked_twice[0].records[2].position
    before = runner.invoke(qw_app(), ["report", "--dir", str(data_dir), "--at", str(done_at)])
    assert before.exit_code == EXIT_OK, before.output
    assert "OK: every finished task was completed exactly once (1 done)" in before.output


def test_qw_report_exits_2_without_logs(tmp_path: Path) -> None:
    result = CliRunner().invoke(qw_app(), ["report", "--dir", str(tmp_path / "nothing")])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "no qw logs at" in result.output
    assert not (tmp_path / "nothing").exists()  # reading never creates the directory


def test_a_corrupt_log_is_exit_2_naming_the_byte_offset(data_dir: Path) -> None:
    s = Script()
    for task in range(3):
        c = s.claim(task, "a", task * 10)
        s.done(task, "a", task * 10 + 5, c)
    _write_log(data_dir, s.records, tasks=3)
    claims = data_dir / "claims.log"
    raw = bytearray(claims.read_bytes())
    middle = len(raw) // 2
    raw[middle] ^= 0xFF  # damage a byte well before the tail
    claims.write_bytes(bytes(raw))

    with pytest.raises(ReportInputError, match=r"claims\.log.*offset \d+"):
        load_report(data_dir)
    result = CliRunner().invoke(qw_app(), ["report", "--dir", str(data_dir)])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "byte offset" in result.output


def test_qw_report_with_a_log_that_is_not_a_url_is_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(qw_app(), ["report", "--log", str(tmp_path)])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "expected a redis:// URL" in result.output


def test_the_text_report_has_every_section_with_positions() -> None:
    s = Script()
    c0 = s.claim(0, "paused", 100)
    s.claim(0, "late", 150)  # lost: held
    c1 = s.claim(0, "taker", 1200)
    s.done(0, "taker", 1300, c1)
    s.done(0, "paused", 1400, c0)
    c2 = s.claim(1, "taker", 1500)
    s.fail(1, "taker", 1600, c2, retry_at=None)
    s.claim(2, "late", 1700)  # still held
    report = build_report(4, s.records)
    console = Console(file=io.StringIO(), width=200, color_system=None)

    console.print(render_report(report, "/data", plain=True))
    text = console.file.getvalue()  # type: ignore[attr-defined]

    assert re.search(r"lost attempts +1 \(20\.0%\): lost: held 1", text)
    assert re.search(r"completions written +2 \(1 accepted, 1 stale\)", text)
    for expected in (
        "qw report: /data, claims log replayed through @7 (8 records)",
        "takeovers (redistribution)",
        "stale completions (results discarded)",
        "dead tasks",
        "Boom: no",
        "held now",
        "task 0 was worked twice: CLAIM @0 by paused (won); CLAIM @2 by taker (takeover)",
        "FAIL: a task was worked twice: 0",
    ):
        assert expected in text, expected
    # the per-worker table leaves out columns that are 0 for everyone
    assert "renewals  " not in text.split("workers")[-1]
