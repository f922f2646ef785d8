"""Every bad input is refused in one line naming the value, with exit 2, and writes nothing.

From the attack run (issue 15 item 9): a payload nested 1000 deep (RecursionError), a
--count of 10^20 (grew to 24 GB), `tail -n 10^20` (OverflowError), GET /task/<5000 digits>
(no reply at all). Each command runs as a real subprocess on a real data directory whose
log files are compared byte for byte before and after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_worker.producer import Queue
from queue_worker.protocol.records import MAX_TASK_ID, Claim, encode
from queue_worker.topics import open_topics
from supervisor.cli.enqueue_input import MAX_ENQUEUE, MAX_PAYLOAD_DEPTH
from supervisor.http_api import StatsServer, parse_task_id
from supervisor.run.model import SupervisorSnapshot
from supervisor.run.monitor import Monitor, TaskInfo

QW = [sys.executable, "-m", "supervisor.cli.app"]
HUGE = "9" * 20
DIGITS_5000 = "7" * 5000


def qw(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A data directory with three tasks and one claim."""
    directory = tmp_path / ".qw"
    with Queue(str(directory)) as queue:
        queue.enqueue_many([{"n": n} for n in range(3)])
    tasks, claims = open_topics(directory)
    with tasks, claims:
        claims.append(encode(Claim(0, "w0-100-abcd", 1_700_000_000_000_000, 30_000_000)))
    return directory


def log_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.log"))}


DEEP = "[" * 1000 + "]" * 1000

# (arguments, a piece of the bad value the message must quote)
BAD = [
    (["enqueue", "--payload", DEEP], "[[[[[[[["),
    (["enqueue", "--payload", "[" * 300 + "]" * 300], "[[[[[[[["),
    (["enqueue", "--count", HUGE], HUGE),
    (["enqueue", "--count", DIGITS_5000], "7777777777"),
    (["enqueue", "--count", str(MAX_ENQUEUE + 1)], str(MAX_ENQUEUE + 1)),
    (["enqueue", "--count", "0"], "'0'"),
    (["enqueue", "--payload", json.dumps("x" * 1000), "--count", str(MAX_ENQUEUE)], "--count"),
    (["tail", "-n", HUGE], HUGE),
    (["tail", "-n", "-1"], "-1"),
    (["why", HUGE], HUGE),
    (["task", HUGE], HUGE),
    (["task", str(MAX_TASK_ID + 1)], str(MAX_TASK_ID + 1)),
    (["report", "--at", HUGE], HUGE),
    (["report", "--at", "-1"], "-1"),
    (["demo", "collisions", "--workers", HUGE], HUGE),
    (["demo", "pause", "--lease", "0"], "'0'"),
]


@pytest.mark.parametrize(("args", "named"), BAD, ids=lambda v: str(v)[:40])
def test_a_bad_input_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path, data: Path, args: list[str], named: str
) -> None:
    before = log_bytes(data)
    run = qw(*args, "--dir", str(data), cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("qw: error: ") and run.stderr.count("\n") == 1, run.stderr
    assert named in run.stderr
    assert len(run.stderr) < 400  # the value is quoted cut short, never 5000 digits
    assert "Traceback" not in run.stderr
    assert log_bytes(data) == before


def test_a_payload_just_within_the_depth_bound_is_enqueued(tmp_path: Path, data: Path) -> None:
    nested = "[" * MAX_PAYLOAD_DEPTH + "]" * MAX_PAYLOAD_DEPTH
    run = qw("enqueue", "--payload", nested, "--dir", str(data), cwd=tmp_path)
    assert (run.returncode, run.stdout) == (0, f"enqueued task 3 on {data}\n")


def test_a_file_line_nested_too_deep_names_the_line(tmp_path: Path, data: Path) -> None:
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text('{"ok": 1}\n' + DEEP + "\n")
    before = log_bytes(data)
    run = qw("enqueue", "--file", str(jsonl), "--dir", str(data), cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr == (
        f"qw: error: {jsonl} line 2: JSON nested deeper than {MAX_PAYLOAD_DEPTH} levels; "
        "expected one JSON value per line\n"
    )
    assert log_bytes(data) == before


def test_a_record_larger_than_the_log_takes_is_refused_naming_the_option(
    tmp_path: Path, data: Path
) -> None:
    jsonl = tmp_path / "big.jsonl"
    jsonl.write_text(json.dumps("x" * (17 * 1024 * 1024)) + "\n")
    before = log_bytes(data)
    run = qw("enqueue", "--file", str(jsonl), "--dir", str(data), cwd=tmp_path)
    assert run.returncode == 2
    assert run.stderr.startswith("qw: error: --file: record of ")
    assert "exceeds the maximum record size" in run.stderr and run.stderr.count("\n") == 1
    assert log_bytes(data) == before


# -- the HTTP API: /task/ID ------------------------------------------------------------------


class _MonitorSource:
    """What StatsServer reads, from a real Monitor of a real data directory."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def snapshot(self) -> SupervisorSnapshot:
        raise AssertionError("not asked in these tests")

    def task_info(self, task: int) -> TaskInfo | None:
        return self.monitor.task_info(task)


@pytest.fixture
def endpoint(data: Path) -> Iterator[str]:
    monitor = Monitor(str(data))
    while not monitor.caught_up:
        monitor.poll()
    server = StatsServer(_MonitorSource(monitor), "127.0.0.1", 0, logs=str(data))
    server.start()
    try:
        yield f"http://{server.address}"
    finally:
        server.close()
        monitor.close()


def get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize(
    "text", [DIGITS_5000, str(MAX_TASK_ID + 1), "²", "٣", "-1", "1e3", ""], ids=lambda t: t[:20]
)
def test_a_bad_task_id_over_http_is_a_400_that_names_it(endpoint: str, text: str) -> None:
    sent = urllib.parse.quote(text)  # the server names the id as the request line has it
    status, body = get(f"{endpoint}/task/{sent}")
    if text == "":  # /task/ is /task: no such path
        assert status == 404
        return
    assert status == 400
    assert isinstance(body["error"], str) and sent[:20] in body["error"]
    assert len(body["error"]) < 200


def test_the_largest_task_id_over_http_is_answered(endpoint: str) -> None:
    status, body = get(f"{endpoint}/task/{MAX_TASK_ID}")
    assert status == 404  # a task id, but no record names it
    assert str(body["error"]).startswith(f"no task {MAX_TASK_ID}: ")


def test_a_held_task_over_http_has_a_label_and_says_its_lease_expired(endpoint: str) -> None:
    status, body = get(f"{endpoint}/task/0")
    assert status == 200
    assert body["heldByWorker"] == "w0-100-abcd" and body["heldByLabel"] == "w0·100"
    assert body["leaseExpired"] is True  # its lease ended in 2023


def test_parse_task_id() -> None:
    assert parse_task_id("17") == 17
    assert parse_task_id(str(MAX_TASK_ID)) == MAX_TASK_ID
    for text in (DIGITS_5000, str(MAX_TASK_ID + 1), "²", "٣", "-1", " 1", "1_0", ""):
        assert parse_task_id(text) is None
