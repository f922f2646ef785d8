"""What a handler can do to its worker, and what must come of it (issue 30, rows 6, 7, 13
and 17), with real worker processes run by a real `qw up`:

- a result over the record limit, or one that cannot be encoded, or an exception whose
  text cannot be read: a FAIL under the claim naming why, like any handler error, and no
  worker crash (one worker process wrote every record);
- a non-daemon thread left by a handler does not keep the worker from exiting, on a drain
  or on one SIGTERM;
- a worker whose clock jumps is named, with the jump, in the events, `qw why` and the
  report (the verdicts are the fold's, unchanged).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from queue_worker.opening import open_worker
from queue_worker.producer import Queue
from queue_worker.proof.report import read_claims
from queue_worker.protocol.records import Unknown
from queue_worker.protocol.state import ClaimState
from queue_worker.redis import claim_batch
from queue_worker.worker.config import WorkerConfig
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
QW = [sys.executable, "-m", "supervisor.cli.app"]
LIMIT = 16 * 1024 * 1024  # the file log's and Redis's default record limit


def qw(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout
    )


def run_drained(
    tmp_path: Path,
    payloads: list[Any],
    handler: str,
    *options: str,
    log: str | None = None,
    workers: int = 1,
) -> subprocess.CompletedProcess[str]:
    """Enqueue `payloads` on the queue in tmp_path/qw (or on the Redis `log`) and run
    `qw up --exit-when-drained` with `workers` workers on them to the end."""
    where = ["--dir", str(tmp_path / "qw"), *(["--log", log] if log else [])]
    with Queue(log or str(tmp_path / "qw")) as queue:
        queue.enqueue_many(payloads)
    return qw(
        "up", "--no-tui", "--exit-when-drained", "--workers", str(workers),
        "--handler", f"tests.poison_handlers:{handler}", "--backoff", "0.01",
        *where, *options,
        cwd=tmp_path,
    )  # fmt: skip


def writers(location: str) -> set[str]:
    """The worker ids that wrote the claims log: one per worker process ever started."""
    return {r.worker for _, r in read_claims(location) if not isinstance(r, Unknown)}


def task_json(tmp_path: Path, task: int, *where: str) -> dict[str, Any]:
    done = qw("task", str(task), "--json", *where, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    story: dict[str, Any] = json.loads(done.stdout)
    return story


# -- row 6, 7: what a record cannot carry is a FAIL, not a crash -----------------------------


def assert_failed_without_a_crash(
    up: subprocess.CompletedProcess[str], location: str, tmp_path: Path
) -> str:
    """Task 1 (the poison) is dead with max_attempts=2 after two FAILs of one worker process,
    tasks 0 and 2 are done; returns the dead task's error."""
    assert up.returncode == 0, up.stdout + up.stderr
    assert "died" not in up.stdout and "crashed" not in up.stderr, up.stdout + up.stderr
    assert len(writers(location)) == 1  # one worker process wrote it all: it never crashed
    state = ClaimState()
    for position, record in read_claims(location):
        state.apply(record, position)
    assert state.is_done(0) and state.is_done(2) and state.is_dead(1)
    error = state.dead_error(1)
    assert error is not None
    story = task_json(tmp_path, 1, "--dir", location)
    kinds = [r["kind"] for r in story["records"] if r["kind"] != "RENEW"]  # (a long task renews)
    assert kinds == ["TASK", "CLAIM", "FAIL", "CLAIM", "FAIL"]
    assert story["state"] == f"dead: {error}"
    return error


def assert_names_the_limit_and_the_size(error: str, size: int) -> None:
    found = re.fullmatch(
        rf"result cannot be recorded: record of (\d+) bytes exceeds the maximum record size "
        rf"{LIMIT} bytes",
        error,
    )
    assert found is not None, error
    assert int(found[1]) > size


@pytest.mark.parametrize(
    "poison",
    [
        {"size": 20 << 20},
        {"size": 200 << 20},
        # make test: the strings; the dict is the same limit reached more slowly
        pytest.param({"keys": 2_000_000}, marks=pytest.mark.slow),
    ],
    ids=["20MB-string", "200MB-string", "2M-key-dict"],
)
def test_a_result_over_the_record_limit_is_a_fail_naming_the_limit_and_the_size(
    tmp_path: Path, poison: dict[str, int]
) -> None:
    payloads = [{"n": 0}, {"poison": True, **poison}, {"n": 2}]
    up = run_drained(tmp_path, payloads, "huge_result", "--max-attempts", "2")
    error = assert_failed_without_a_crash(up, str(tmp_path / "qw"), tmp_path)
    assert_names_the_limit_and_the_size(error, poison.get("size", LIMIT))


# covered in make test by
# test_a_result_over_the_record_limit_is_a_fail_naming_the_limit_and_the_size (the worker's check
# is one for both logs)
@pytest.mark.slow
@pytest.mark.redis
def test_a_result_over_the_record_limit_is_a_fail_on_redis_too(
    tmp_path: Path, redis_url: str
) -> None:
    """With server verdicts a short task's DONE may wait for the next call (the claim
    batch, behind a deep backlog): one too large must be refused there as well."""
    payloads: list[Any] = [{"n": n} for n in range(40)]
    payloads[1] = {"poison": True, "size": 20 << 20}
    up = run_drained(tmp_path, payloads, "huge_result", "--max-attempts", "2", log=redis_url)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "died" not in up.stdout and "crashed" not in up.stderr, up.stdout + up.stderr
    assert len(writers(redis_url)) == 1
    story = task_json(tmp_path, 1, "--log", redis_url)
    kinds = [r["kind"] for r in story["records"] if r["kind"] != "RENEW"]  # (a long task renews)
    assert kinds == ["TASK", "CLAIM", "FAIL", "CLAIM", "FAIL"]
    assert story["state"].startswith("dead: "), story["state"]
    assert_names_the_limit_and_the_size(story["state"].removeprefix("dead: "), 20 << 20)


@pytest.mark.redis
def test_a_done_too_large_is_refused_before_the_batch_holds_it(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The held DONE itself (every task counted short, so each DONE may wait): refused when
    it is made, a FAIL, never sent with a later call that would append it."""
    monkeypatch.setattr(claim_batch, "SHORT_S", 3600.0)
    with Queue(redis_url) as queue:
        queue.enqueue_many(list(range(20)))
    huge = "x" * (20 << 20)
    config = WorkerConfig(
        redis_url, str(tmp_path / "run"), name="w0", exit_when_drained=True, max_attempts=1
    )
    with open_worker(config, handler=lambda n: huge if n == 5 else n) as worker:
        assert worker.run() == "queue drained"
    state = ClaimState()
    for position, record in read_claims(redis_url):
        state.apply(record, position)
    assert state.done_count == 19 and state.is_dead(5)
    assert_names_the_limit_and_the_size(state.dead_error(5) or "", 20 << 20)


@pytest.mark.parametrize(
    ("poison", "error"),
    [
        ("result", "result cannot be recorded: cannot encode as msgpack: RuntimeError: items() "
         "refused"),
        ("error", "_Unprintable: (its message cannot be read: str() raised RuntimeError)"),
    ],
)  # fmt: skip
def test_a_value_whose_encoding_raises_is_a_fail_saying_what(
    tmp_path: Path, poison: str, error: str
) -> None:
    up = run_drained(tmp_path, [{"n": 0}, {"poison": poison}, {"n": 2}], "unencodable",
                     "--max-attempts", "2")  # fmt: skip
    assert assert_failed_without_a_crash(up, str(tmp_path / "qw"), tmp_path) == error


# -- row 13: a thread left by a handler does not keep its worker alive ------------------------


def left_thread_payloads() -> list[Any]:
    return [{"n": 0}, {"poison": True}, {"n": 2}]


def test_a_thread_left_by_a_handler_does_not_keep_exit_when_drained_waiting(
    tmp_path: Path,
) -> None:
    up = run_drained(tmp_path, left_thread_payloads(), "leaves_a_thread")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "qw: drained (published 3, done 3, dead 0, pending 0)" in up.stdout, up.stdout
    logs = "".join(p.read_text() for p in (tmp_path / "qw").rglob("*.log") if "run" in p.parts)
    assert "exiting past 1 thread(s) its handler left running (left-by-handler)" in logs, logs


def test_one_sigterm_ends_a_worker_whose_handler_left_a_thread(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    with Queue(str(data)) as queue:
        queue.enqueue_many(left_thread_payloads())
    with (tmp_path / "up.out").open("w") as out, (tmp_path / "up.err").open("w") as err:
        up = subprocess.Popen(
            [*QW, "up", "--no-tui", "--workers", "1", "--dir", str(data),
             "--handler", "tests.poison_handlers:leaves_a_thread"],
            cwd=tmp_path, env=ENV, stdout=out, stderr=err,
        )  # fmt: skip
    try:

        def all_done() -> bool:
            state = ClaimState()
            for position, record in read_claims(str(data)):
                state.apply(record, position)
            return state.done_count == 3

        wait_until(all_done, 60, "the three tasks done")
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    said = (tmp_path / "up.out").read_text() + (tmp_path / "up.err").read_text()
    assert "killed mid-task" not in said, said
    assert "qw: drained (published 3, done 3, dead 0, pending 0)" in said, said


# -- row 17: a worker's clock jump is named -------------------------------------------------


@pytest.mark.parametrize(("jump_s", "way"), [(-3600, "back"), (3600, "ahead")])
def test_a_clock_jump_is_named_in_the_events_qw_why_and_the_report(
    tmp_path: Path, jump_s: int, way: str
) -> None:
    payloads: list[Any] = [{"n": n} for n in range(60)]
    payloads[20] = {"poison": True, "jump_s": jump_s}
    up = run_drained(tmp_path, payloads, "jumps_the_clock", "--lease", "1", workers=3)
    assert up.returncode == 0, up.stdout + up.stderr
    named = rf"clock of (w\d·\d+) ran {way} 1\.0 h at @(\d+)"
    event = re.search(rf"clock: task 20: {named}", up.stdout)
    assert event is not None, up.stdout
    jump = event[0].removeprefix("clock: task 20: ")
    why = qw("why", "20", "--dir", "qw", cwd=tmp_path)
    assert re.search(rf"CLOCK +{event[1]} +{re.escape(jump)}", why.stdout), why.stdout
    report = qw("report", "--dir", "qw", cwd=tmp_path)
    assert report.returncode in (0, 1), report.stderr  # (1: tasks were worked twice)
    assert re.search(rf"clock jumps +\d+: .*{re.escape(jump)}", report.stdout), report.stdout
