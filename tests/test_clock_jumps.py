"""The clock jumps named from the records alone (queue_worker.protocol.clock_jumps): a worker's
record
dated before its previous one, or past its lease while the others' records are not."""

from __future__ import annotations

from queue_worker.protocol.clock_jumps import ClockJump, ClockWatch
from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Renew

S = 1_000_000
HOUR = 3600 * S
T = 1_800_000_000 * S
LEASE = 5 * S


def jumps(*records: ClaimsRecord) -> list[ClockJump]:
    watch = ClockWatch()
    seen = (watch.see(position, record) for position, record in enumerate(records))
    return [jump for jump in seen if jump is not None]


def test_a_record_dated_before_its_workers_previous_one_is_a_jump_back_named_once() -> None:
    found = jumps(
        Claim(0, "w1-11-aa", T, LEASE),
        Done(0, "w1-11-aa", T - HOUR, 0),
        Claim(1, "w1-11-aa", T - HOUR + S, LEASE),  # judged against the jumped record
    )
    assert found == [ClockJump("w1-11-aa", 1, 0, -HOUR)]
    assert found[0].text == "clock of w1·11 ran back 1.0 h at @1"


def test_a_renewal_landing_after_a_later_dated_done_is_no_jump() -> None:
    assert not jumps(
        Claim(0, "w1-11-aa", T, LEASE),
        Done(0, "w1-11-aa", T + 2000, 0),
        Renew(0, "w1-11-aa", T + 1000, 0, LEASE),
    )


def test_a_record_past_its_lease_while_the_others_are_behind_is_a_jump_ahead() -> None:
    found = jumps(
        Claim(0, "w1-11-aa", T, LEASE),
        Claim(1, "w2-22-bb", T + S, LEASE),
        Done(0, "w1-11-aa", T + HOUR, 0),
    )
    assert found == [ClockJump("w1-11-aa", 2, 0, HOUR)]
    assert found[0].text == "clock of w1·11 ran ahead 1.0 h at @2"


def test_a_worker_stopped_past_its_lease_while_the_others_wrote_on_is_no_jump() -> None:
    assert not jumps(
        Claim(0, "w1-11-aa", T, LEASE),
        Claim(1, "w2-22-bb", T + S, LEASE),
        Done(1, "w2-22-bb", T + 2 * S, 1),
        Claim(2, "w2-22-bb", T + HOUR - S, LEASE),  # (the others' tasks meanwhile)
        Done(0, "w1-11-aa", T + HOUR, 0),
    )


def test_a_claim_after_an_idle_hour_is_no_jump() -> None:
    assert not jumps(
        Claim(0, "w1-11-aa", T, LEASE),
        Done(0, "w1-11-aa", T + S, 0),
        Claim(1, "w1-11-aa", T + HOUR, LEASE),
        Done(1, "w1-11-aa", T + HOUR + S, 1),
    )
