"""Orphaned tasks: the book that keeps them (pure), and a real kill -9 under a real supervisor.

The kill message, the death message, the orphans panel and the takeover must name one
task: the one the log says the dead worker held.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from supervisor.run.model import Orphan, QueueView, SlotState, SupervisorSnapshot, WorkerView
from supervisor.run.orphans import (
    DEPARTED_AFTER_TAKEOVER_S,
    DEPARTED_MIN_S,
    KEEP_AFTER_TAKEOVER_S,
    OrphanBook,
)
from supervisor.run.supervisor import Supervisor, SupervisorOptions
from supervisor.tui.progress import progress_line
from tests.helpers import wait_until

NOW = 1_700_000_000.0


@dataclass(frozen=True)
class Taken:
    worker: str
    previous: str
    at: float


def dead(slot: int, pid: int, died_at: float = NOW) -> WorkerView:
    return WorkerView(
        slot=slot,
        name=f"w{slot}",
        worker_id=f"w{slot}-{pid}-ab12",
        pid=pid,
        state=SlotState.DEAD,
        exit_code=-9,
        died_at=died_at,
    )


def test_an_orphan_waits_then_names_its_heir_and_stays_a_while() -> None:
    book = OrphanBook()
    book.died(dead(6, 6975), [(246, NOW + 3.0)], now=NOW)
    [orphan] = book.orphans()
    assert (orphan.task, orphan.holder, orphan.lease_expiry) == (246, "w6·6975", NOW + 3.0)
    assert orphan.heir is None

    takeovers: dict[int, Taken] = {}
    book.update(takeovers.get, now=NOW + 2)
    assert book.orphans()[0].heir is None
    # a takeover from another worker than the dead one does not count
    takeovers[246] = Taken("w2-6970-cd34", "w9-1-ffff", NOW + 3.1)
    book.update(takeovers.get, now=NOW + 3.2)
    assert book.orphans()[0].heir is None

    takeovers[246] = Taken("w2-6970-cd34", "w6-6975-ab12", NOW + 3.3)
    book.update(takeovers.get, now=NOW + 3.5)
    [orphan] = book.orphans()
    assert (orphan.heir, orphan.taken_at) == ("w2·6970", NOW + 3.3)
    book.update(takeovers.get, now=NOW + 3.5 + KEEP_AFTER_TAKEOVER_S - 0.1)
    assert book.orphans(), "gone before its time on screen"
    book.update(takeovers.get, now=NOW + 3.5 + KEEP_AFTER_TAKEOVER_S + 0.1)
    assert book.orphans() == []


def test_a_dead_row_stays_while_its_orphan_waits_and_a_few_seconds_at_least() -> None:
    book = OrphanBook()
    book.died(dead(6, 6975), [(246, NOW + 60.0)], now=NOW)
    book.died(dead(3, 6961), [], now=NOW)
    none: dict[int, Taken] = {}
    # the slot still shows the dead process: no second row for it
    assert book.departed([6975, 6961]) == []
    assert {d.pid for d in book.departed([7001, 7002])} == {6975, 6961}
    book.update(none.get, now=NOW + DEPARTED_MIN_S + 1)
    # the one without orphans goes after a few seconds; the one whose task waits stays
    assert [d.pid for d in book.departed([7001, 7002])] == [6975]
    taken = {246: Taken("w2-6970-cd34", "w6-6975-ab12", NOW + 61)}
    book.update(taken.get, now=NOW + 61)
    assert [d.pid for d in book.departed([7001, 7002])] == [6975]  # a moment, reading "taken"
    book.update(taken.get, now=NOW + 61 + DEPARTED_AFTER_TAKEOVER_S + 0.1)
    assert book.departed([7001, 7002]) == []


# -- a real kill -9 -----------------------------------------------------------------------


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    data = tmp_path / "qw"
    sup = Supervisor(
        SupervisorOptions(
            data_dir=data, location=str(data), workers=3, work_ms=4000, lease_s=2.0, tasks=30
        )
    )
    try:
        yield sup
    finally:
        if sup.started_at and not sup.finished:
            sup.stop_now()
            sup.wait(30)


def test_kill_death_orphan_and_takeover_name_one_task(supervisor: Supervisor) -> None:
    sup = supervisor
    sup.start()
    text = wait_until(sup.kill_a_holder, 60, "a worker holding a task")
    assert isinstance(text, str)
    found = re.fullmatch(r"kill -9 (w\d+)·(\d+), holding task (\d+)", text)
    assert found, text
    victim = f"{found.group(1)}·{found.group(2)}"
    pid, task = int(found.group(2)), int(found.group(3))

    def death() -> str | None:
        texts = [e.text for e in sup.snapshot().events if e.kind == "death"]
        return next((t for t in texts if t.startswith(f"{victim} ")), None)

    assert wait_until(death, 30, "the death event") == (
        f"{victim} killed by SIGKILL while holding task {task}"
    )

    # from the death until the takeover the orphan is shown, and the dead worker's row too
    # once its slot runs a new process
    def taken_over() -> tuple[str, float] | None:
        snap = sup.snapshot()
        [orphan] = [o for o in snap.orphans if o.task == task]
        assert orphan.holder == victim
        current = next(w for w in snap.workers if w.slot == orphan.slot)
        if orphan.heir is None:
            if current.pid != pid:
                assert pid in [d.pid for d in snap.departed], "the dead row went early"
            return None
        assert orphan.taken_at is not None and orphan.taken_at >= orphan.lease_expiry
        return orphan.heir, orphan.taken_at

    heir = wait_until(taken_over, 60, f"the takeover of task {task}")
    assert isinstance(heir, tuple) and heir[0] != victim
    takeovers = [e for e in sup.snapshot().events if e.kind == "takeover" and e.task == task]
    assert takeovers and takeovers[-1].text.startswith(f"task {task}: {victim} → {heir[0]}, ")


def test_the_plain_progress_line_names_the_waiting_orphans() -> None:
    snap = SupervisorSnapshot(
        location="/x",
        workers=[],
        queue=QueueView(),
        events=[],
        started_at=NOW - 5,
        orphans=[
            Orphan(246, "w6·6975", "w6-6975-ab12", 6, NOW - 1, NOW + 1.3),
            Orphan(17, "w2·6970", "w2-6970-ab12", 2, NOW - 9, NOW - 5, "w1·6960", NOW - 4.9),
        ],
    )
    line = progress_line(snap, NOW)
    assert line.endswith(" · orphaned: task 246 of w6·6975 (lease 1.3 s left)"), line
