"""Time limits: a task that runs past its limit fails (retried, then dead) and its worker is
ended and restarted, without tripping the storm guard; a drain always ends, even with a
handler that ignores cancellation. Real `qw up` processes; every wait has a deadline."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from queue_worker.producer import Queue
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.handlers import HandlerLoadError, handler_from_function, time_limit
from queue_worker.worker.watchdog import EXIT_TIME_LIMIT, TimeLimits
from supervisor.run.supervisor import EXIT_OK
from tests.helpers import wait_until
from tests.test_poison import Replay, payloads

QW = [sys.executable, "-m", "supervisor.cli.app"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Any]:
    """Start `qw up --no-tui` on tmp_path/qw with payloads enqueued first; kills it at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(items: list[Any], *args: str) -> subprocess.Popen[str]:
        data = tmp_path / "qw"
        data.mkdir()
        with Queue(str(data)) as queue:
            queue.enqueue_many(items)
        with (tmp_path / "up.out").open("w") as out, (tmp_path / "up.err").open("w") as err:
            process = subprocess.Popen(
                [*QW, "up", "--no-tui", "--dir", str(data), "--backoff", "0.01", *args],
                cwd=REPO,  # the workers import tests.poison_handlers
                stdout=out,
                stderr=err,
                text=True,
            )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def test_a_task_past_its_timeout_fails_then_goes_dead(up: Any, tmp_path: Path) -> None:
    """6 time-outs in a row in one slot: more than the storm guard's 5 restarts in 30 s, which
    a time-limit exit must not count (it is no crash)."""
    max_attempts = 6
    process = up(
        payloads(4, poison={2}),
        "--handler",
        "tests.poison_handlers:hangs",
        "--workers",
        "1",
        "--task-timeout",
        "0.5",
        "--max-attempts",
        str(max_attempts),
        "--exit-when-drained",
    )
    assert process.wait(120) == EXIT_OK, (tmp_path / "up.err").read_text()
    out = (tmp_path / "up.out").read_text()
    assert "stays dead" not in out
    assert out.count("ended by a task's time limit") == max_attempts, out
    replay = Replay(tmp_path / "qw")
    assert replay.wins[2] == max_attempts  # each time-out wrote its own FAIL: no extra claim
    assert replay.state.dead_error(2) == "timed out after 0.5 s"
    assert [replay.done[t] for t in (0, 1, 3)] == [1, 1, 1]
    assert not replay.stale and replay.state.held_count == 0


def test_a_handler_time_limit_wins_over_the_task_timeout(up: Any, tmp_path: Path) -> None:
    process = up(
        payloads(2, poison={0}),
        "--handler",
        "tests.poison_handlers:hangs_limited",
        "--workers",
        "1",
        "--task-timeout",
        "3600",
        "--max-attempts",
        "1",
        "--exit-when-drained",
    )
    assert process.wait(120) == EXIT_OK, (tmp_path / "up.err").read_text()
    replay = Replay(tmp_path / "qw")
    assert replay.wins[0] == 1 and replay.state.dead_error(0) == "timed out after 1 s"
    assert replay.done[1] == 1


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--drain-timeout", "1"], "timed out: still running 1 s after the worker was stopped"),
        (["--task-timeout", "3"], "timed out after 3 s"),
    ],
)
def test_sigterm_drains_a_handler_that_ignores_cancellation(
    up: Any, tmp_path: Path, args: list[str], error: str
) -> None:
    """Both workers hold a task that never returns; SIGTERM must still end the run: at the
    drain timeout, or at the task's time limit (whichever comes first)."""
    process = up(
        payloads(2, poison={0, 1}),
        "--handler",
        "tests.poison_handlers:hangs",
        "--workers",
        "2",
        "--lease",
        "1",
        *args,
    )
    data = tmp_path / "qw"
    wait_until(lambda: Replay(data).state.held_count == 2, 60, "both tasks held")
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == EXIT_OK, (tmp_path / "up.err").read_text()
    replay = Replay(data)
    assert replay.state.held_count == 0  # each worker let its task go with a FAIL
    for task in (0, 1):
        state = replay.state.task_state(task)
        assert state is not None and state.last_error == error
        assert not replay.state.is_closed(task)  # failed with a retry time: not dead


# -- the watchdog and the decorator in this process ---------------------------------------------


def test_the_watchdog_records_then_exits_and_spares_a_task_that_ends_in_time() -> None:
    exits: list[int] = []
    exited = threading.Event()
    errors: list[str] = []

    def exit(code: int) -> None:
        exits.append(code)
        exited.set()

    limits = TimeLimits(exit=exit)
    with limits.running(60, errors.append):
        pass  # ends in time: nothing recorded
    with limits.running(0.05, errors.append):
        assert exited.wait(30)  # the handler still runs when the time is up
    # The block ended only after the watchdog's exit (in a worker, os._exit never returns).
    assert (errors, exits) == (["timed out after 0.05 s"], [EXIT_TIME_LIMIT])


def test_time_limit_marks_the_handler_and_rejects_a_bad_value() -> None:
    @time_limit(2.5)
    def handler(payload: Any) -> Any:
        return payload

    assert handler_from_function(handler).time_limit_s == 2.5
    assert handler_from_function(lambda p: p).time_limit_s is None
    with pytest.raises(ValueError, match="time_limit is 0; expected a number of seconds > 0"):
        time_limit(0)

    def bad(payload: Any) -> Any:
        return payload

    bad.qw_time_limit_s = "soon"  # type: ignore[attr-defined]
    with pytest.raises(HandlerLoadError, match="qw_time_limit_s = 'soon'"):
        handler_from_function(bad, "m:bad")


def test_timeouts_in_the_worker_config() -> None:
    base = WorkerConfig(location="d", run_dir="r")
    assert (base.task_timeout_s, base.drain_timeout_s) == (None, 600.0)
    parsed = WorkerConfig.from_json(
        WorkerConfig(location="d", run_dir="r", task_timeout_s=2.5, drain_timeout_s=None).to_json()
    )
    assert (parsed.task_timeout_s, parsed.drain_timeout_s) == (2.5, None)
    with pytest.raises(ValueError, match=r"^task_timeout_s is 0; expected a number > 0$"):
        WorkerConfig(location="d", run_dir="r", task_timeout_s=0).validate()
    with pytest.raises(ValueError, match="'drain_timeout_s' is '9'; expected a number or null"):
        WorkerConfig.from_json('{"location": "d", "run_dir": "r", "drain_timeout_s": "9"}')


@pytest.mark.parametrize("option", ["--task-timeout", "--drain-timeout"])
def test_qw_up_refuses_a_timeout_that_is_not_positive(tmp_path: Path, option: str) -> None:
    done = subprocess.run(
        [*QW, "up", "--no-tui", "--dir", str(tmp_path / "qw"), option, "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"qw: error: Invalid value for '{option}': got '0'; expected seconds > 0 and <= 604800"
    )
    assert not (tmp_path / "qw").exists()  # nothing started, nothing written
