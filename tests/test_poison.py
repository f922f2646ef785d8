"""Poison pills: a task whose handler kills its worker (os._exit, a segfault) uses up its
attempts like one that raises, and then is dead; the other tasks are done once each, and the
supervisor neither loses its slots nor exits with tasks held. Real worker processes; every
wait is a condition with a deadline."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queue_worker.producer import Queue
from queue_worker.proof.report import read_claims
from queue_worker.protocol.state import ClaimState, Verdict
from supervisor.run.supervisor import EXIT_OK, RestartPolicy, Supervisor, SupervisorOptions

REPO = Path(__file__).resolve().parents[1]

#: fast restarts, and the default storm guard (5 restarts of a slot in 30 s)
FAST_RESTARTS = RestartPolicy(backoff_s=0.01, backoff_max_s=0.05)


class Replay:
    """The claims log folded: verdicts per task."""

    def __init__(self, data: Path) -> None:
        self.state = ClaimState()
        self.wins: Counter[int] = Counter()
        self.done: Counter[int] = Counter()
        self.stale: Counter[int] = Counter()
        for position, record in read_claims(str(data)):
            outcome = self.state.apply(record, position)
            task = outcome.task
            if task is None:
                continue
            if outcome.verdict.won:
                self.wins[task] += 1
            elif outcome.verdict is Verdict.DONE:
                self.done[task] += 1
            elif outcome.verdict is Verdict.STALE_DONE:
                self.stale[task] += 1


@pytest.fixture
def run_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Enqueue payloads, run a supervisor until the queue is drained; returns it."""
    monkeypatch.chdir(REPO)  # the workers import the handlers from tests.poison_handlers
    data = tmp_path / "qw"
    made: list[Supervisor] = []

    def run(payloads: list[Any], **kwargs: Any) -> Supervisor:
        data.mkdir()
        with Queue(str(data)) as queue:
            queue.enqueue_many(payloads)
        options = SupervisorOptions(
            data_dir=data,
            location=str(data),
            exit_when_drained=True,
            restart=FAST_RESTARTS,
            **kwargs,
        )
        sup = Supervisor(options)
        made.append(sup)
        sup.start()
        assert sup.wait(120), "the supervisor did not finish"
        return sup

    yield run
    for sup in made:
        if not sup.finished:
            sup.stop_now()
            sup.wait(30)


def payloads(count: int, poison: set[int]) -> list[dict[str, Any]]:
    return [{"n": n, "poison": True} if n in poison else {"n": n} for n in range(count)]


@pytest.mark.parametrize(
    ("handler", "death"),
    [("exits", "exited with code 1"), ("segfaults", "killed by SIGSEGV")],
)
def test_a_task_that_kills_its_worker_goes_dead_after_max_attempts(
    run_queue: Any, tmp_path: Path, handler: str, death: str
) -> None:
    max_attempts = 3
    sup = run_queue(
        payloads(8, poison={3}),
        workers=2,
        handler=f"tests.poison_handlers:{handler}",
        lease_s=1.0,
        max_attempts=max_attempts,
    )
    assert sup.exit_code == EXIT_OK
    texts = [e.text for e in sup.snapshot().events]
    assert not any("stays dead" in t for t in texts), texts  # no storm guard
    # Each run of the poison task killed one worker: exactly max_attempts runs ...
    assert sum(death in t for t in texts) == max_attempts, texts
    replay = Replay(tmp_path / "qw")
    # ... and one more winning claim, which wrote the dead FAIL without running it.
    assert replay.wins[3] == max_attempts + 1
    assert replay.state.is_dead(3)
    error = replay.state.dead_error(3)
    assert error is not None
    assert error.startswith(
        f"attempts used up: run {max_attempts} times (max_attempts {max_attempts})"
    )
    assert "; the last run's worker (w" in error and ") died or stopped renewing" in error
    assert replay.state.dead_count == 1
    others = [t for t in range(8) if t != 3]
    assert all(replay.done[t] == 1 for t in others), replay.done
    assert not replay.stale
    assert replay.state.held_count == 0
    assert sum(view.restarts for view in sup.snapshot().workers) == max_attempts


def test_exceptions_and_deaths_count_against_the_same_attempts(
    run_queue: Any, tmp_path: Path
) -> None:
    """Attempt 1 raises (a FAIL with a retry time), attempts 2 and 3 kill their worker: with
    max_attempts=3 the fourth winning claim makes the task dead, naming the exception."""
    sup = run_queue(
        payloads(4, poison={1}),
        workers=2,
        handler="tests.poison_handlers:raises_then_exits",
        lease_s=1.0,
        max_attempts=3,
        backoff_s=0.01,
    )
    assert sup.exit_code == EXIT_OK
    replay = Replay(tmp_path / "qw")
    assert replay.wins[1] == 4 and replay.state.is_dead(1)
    error = replay.state.dead_error(1)
    assert error is not None and error.startswith("attempts used up: run 3 times (max_attempts 3)")
    assert error.endswith("an earlier attempt failed with: ValueError: attempt 1 failed")
    assert [replay.done[t] for t in (0, 2, 3)] == [1, 1, 1]
    assert sum("exited with code 1" in e.text for e in sup.snapshot().events) == 2


def test_with_one_attempt_the_first_death_makes_the_task_dead(
    run_queue: Any, tmp_path: Path
) -> None:
    sup = run_queue(
        payloads(3, poison={0}),
        workers=1,
        handler="tests.poison_handlers:exits",
        lease_s=1.0,
        max_attempts=1,
    )
    assert sup.exit_code == EXIT_OK
    replay = Replay(tmp_path / "qw")
    assert replay.wins[0] == 2 and replay.state.is_dead(0)
    error = replay.state.dead_error(0)
    assert error is not None and error.startswith("attempts used up: run 1 time (max_attempts 1);")
    assert [replay.done[t] for t in (1, 2)] == [1, 1]
    assert sum("exited with code 1" in e.text for e in sup.snapshot().events) == 1
