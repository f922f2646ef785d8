"""qw on Redis Streams, end to end, against real redis-server processes.

- every command with ``--log redis://…`` (up, enqueue, report, status, tail, task, why);
- a server out of reach (refused, silent, a malformed URL) is one line and exit 2;
- a wrong database or ``?prefix=`` is "no qw logs", not an empty queue;
- workers survive a restart of the server (kill -9, AOF on) and resume from their positions
  without folding any record twice; an append whose reply was lost is found in the log, not
  written twice;
- one clock: a worker whose clock runs fast cannot take over a live lease on Redis (it can
  on the file log), and one whose clock runs slow does not delay redistribution there;
- several machines (several `qw up` with their own host names) share one queue.

The kill -9 chaos run on Redis is in test_redis_chaos.py.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped, unused-ignore]
import pytest

from logstore import AppendError, Entry, Log, LogError, open_log
from logstore.redis.log import RedisLog
from queue_worker.opening import open_worker
from queue_worker.producer import Queue
from queue_worker.proof.report import load_report, read_claims
from queue_worker.protocol.clock import now_us, seconds_to_us
from queue_worker.protocol.records import Claim, ClaimsRecord, Done, decode_claims, encode
from queue_worker.protocol.state import Outcome, Verdict
from queue_worker.redis.server_verdicts import ServerVerdicts
from queue_worker.topics import (
    CLAIMS_TOPIC,
    TASKS_TOPIC,
    ClaimsFollower,
    decode_claims_entry,
)
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.handlers import TaskContext
from queue_worker.worker.loop import StepKind, StepResult, Worker
from queue_worker.worker.stats import read_all
from supervisor.cli.app import main
from supervisor.demos.fleet import ClaimsTail
from supervisor.demos.skew import OffsetClock
from tests.helpers import free_port, redis_server_binary, wait_until
from tests.test_chaos import check_log

pytestmark = pytest.mark.redis

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
HOUR_US = 3600 * 1_000_000


# -- helpers ---------------------------------------------------------------------------------


def queue_url(redis_url: str) -> str:
    """A queue of this test's own in the shared database: a unique key prefix."""
    return f"{redis_url}?prefix=t{uuid.uuid4().hex[:10]}"


def qw_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "supervisor.cli.app", *args]


def qw(
    *args: str, cwd: Path, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `qw` as a user does (workers import handlers from this repository)."""
    return subprocess.run(
        qw_command(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env or ENV,
    )


def qw_all(commands: Sequence[Sequence[str]], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """Run several `qw` commands at once (each starts a Python: together is quicker)."""
    procs = [
        subprocess.Popen(
            qw_command(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=ENV,
        )
        for args in commands
    ]
    results = []
    for args, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(list(args), proc.returncode, out, err))
    return results


def one_line_error(code: int, capsys: pytest.CaptureFixture[str]) -> str:
    """The single stderr line of a `qw` command (run in this process: a traceback would
    fail the test) that failed with exit 2."""
    out, err = capsys.readouterr()
    assert code == 2, f"exit {code}\n{out}{err}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"not one line:\n{err}"
    assert lines[0].startswith("qw: error: "), lines[0]
    return lines[0]


class OwnRedis:
    """A redis-server of one test's own, AOF on and fsynced on every write, so that a kill -9
    loses nothing acknowledged; restarted on the same port and directory."""

    def __init__(self, directory: Path, *extra: str) -> None:
        self.binary = redis_server_binary()
        self.extra = extra  # more server options
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def start(self) -> None:
        # fmt: off
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
                "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                "--daemonize", "no", *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # fmt: on
        proc = self.proc

        def accepting() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"redis-server exited with {proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return True
            except OSError:
                return False

        wait_until(accepting, 30, "the test's redis-server to accept connections")

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def restart(self) -> None:
        """kill -9, then start again on the same port and directory (the AOF reloads)."""
        self.kill9()
        self.start()
        self.restarts += 1


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.kill9()


def server_time_us(redis_url: str) -> int:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        seconds, micros = client.time()
    finally:
        client.close()
    return int(seconds) * 1_000_000 + int(micros)


def finish(
    procs: Sequence[subprocess.Popen[str]], timeout: float, data_dirs: Sequence[Path]
) -> list[str]:
    """The output of each process once all have exited; if one has not within `timeout`,
    kill them all and fail with every output and every worker's log (to see why)."""
    try:
        wait_until(lambda: all(p.poll() is not None for p in procs), timeout, "qw up to exit")
    except BaseException:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        outputs = [proc.communicate(timeout=30)[0] for proc in procs]
        logs = [
            f"--- {log}\n{log.read_text(errors='replace')}"
            for d in data_dirs
            for log in sorted((d / "run" / "logs").glob("*.log"))
        ]
        snaps = [json.dumps(s) for d in data_dirs for s in read_all(d / "run")]
        pytest.fail("\n".join(["qw up did not exit:", *outputs, *logs, *snaps]))
    return [proc.communicate(timeout=30)[0] for proc in procs]


def worker_config(location: str | Path, run_dir: Path, name: str, **settings: Any) -> WorkerConfig:
    return WorkerConfig(str(location), str(run_dir), name=name, **settings)


def gated(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    """A handler (for worker processes) that works until the file `payload["gate"]` exists:
    every worker holds a task until the test opens the gate."""
    gate = Path(payload["gate"])
    for _ in range(300 * 100):  # gives up after five minutes or so
        if gate.exists():
            return {"n": payload["n"], "worker": ctx.worker_id}
        ctx.sleep(0.01)  # raises TaskCancelled if the lease is lost
    raise TimeoutError(f"the gate {gate} was never opened")


# -- every command, end to end ---------------------------------------------------------------


def test_every_command_works_with_a_redis_log(redis_url: str, tmp_path: Path) -> None:
    url = queue_url(redis_url)
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("".join(f'{{"n": {n}}}\n' for n in range(20)) + '{"x": 1}\n')
    enqueued = qw("enqueue", "--log", url, "--file", str(task_file), cwd=tmp_path)
    assert enqueued.stdout.strip() == f"enqueued 21 tasks (0–20) on {url}", enqueued.stderr

    data = tmp_path / "d"
    # fmt: off
    up = qw(
        "up", "--log", url, "--dir", str(data), "--workers", "3", "--work-ms", "5",
        "--exit-when-drained", "--no-tui", cwd=tmp_path,
    )
    # fmt: on
    assert up.returncode == 0, up.stdout + up.stderr
    assert "qw: drained (published 21, done 21, dead 0, pending 0)" in up.stdout

    report, report_json, status, status_json, tail, tail_tasks, task, why = qw_all(
        [
            ["report", "--log", url],
            ["report", "--log", url, "--json"],
            ["status", "--log", url, "--dir", str(data)],
            ["status", "--log", url, "--dir", str(data), "--json"],
            ["tail", "--log", url, "-n", "4"],
            ["tail", "--log", url, "--topic", "tasks", "-n", "2"],
            ["task", "20", "--log", url, "--json"],
            ["why", "20", "--log", url],
        ],
        cwd=tmp_path,
    )
    for result in (report, report_json, status, status_json, tail, tail_tasks, task, why):
        assert result.returncode == 0, f"{result.args}:\n{result.stdout}{result.stderr}"

    assert f"qw report: {url}, claims log replayed through @" in report.stdout
    assert "OK: every finished task was completed exactly once (21 done)" in report.stdout
    body = json.loads(report_json.stdout)
    assert body["ok"] and body["tasks_published"] == body["tasks_done"] == 21
    assert body["completions_accepted"] == 21 and body["completions_stale"] == 0
    assert 1 <= len(body["workers"]) <= 3  # a busy machine may start one worker late
    # On a shared log a worker id names its host: "w0@box-4711-9f3a".
    assert all("@" in w["worker"] for w in body["workers"])

    assert status.stdout.startswith(f"qw on {url}\n")
    assert "published 21  pending 0  held 0  done 21" in status.stdout
    state = json.loads(status_json.stdout)
    assert state["location"] == url and state["queue"]["done"] == 21
    assert state["workers"]["stopped"] == 3 and state["workers"]["running"] == []

    lines = tail.stdout.splitlines()
    assert len(lines) == 4 and all(" → " in line for line in lines)
    assert "DONE" in tail.stdout and "→ done" in tail.stdout
    assert [line.split()[0] for line in tail_tasks.stdout.splitlines()] == ["#19", "#20"]
    story = json.loads(task.stdout)
    assert story["state"].startswith("done") and story["result"] is not None
    # (two workers may race for the last task: a lost CLAIM is in its story too)
    kinds = [r["kind"] for r in story["records"]]
    assert kinds[0] == "TASK" and set(kinds[1:-1]) == {"CLAIM"} and kinds[-1] == "DONE", kinds
    assert "won: nobody held it" in why.stdout and "done: accepted from the holder" in why.stdout


def test_tail_follow_prints_records_as_they_arrive(redis_url: str, tmp_path: Path) -> None:
    url = queue_url(redis_url)
    with Queue(url) as producer:
        producer.enqueue({"n": 0})
        follow = subprocess.Popen(
            qw_command("tail", "--log", url, "--topic", "tasks", "--follow", "-n", "5"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=ENV,
        )
        lines: queue.Queue[str] = queue.Queue()
        assert follow.stdout is not None
        stdout = follow.stdout

        def read_lines() -> None:
            for line in stdout:
                lines.put(line)

        reader = threading.Thread(target=read_lines)
        reader.start()
        seen: list[str] = []

        def printed(prefix: str) -> Callable[[], bool]:
            def check() -> bool:
                while not lines.empty():
                    seen.append(lines.get())
                return any(line.startswith(prefix) for line in seen)

            return check

        try:
            wait_until(printed("#0 "), 30, "qw tail to print the task already there")
            producer.enqueue_many([{"n": 1}, {"n": 2}])  # XREAD BLOCK wakes the follower
            wait_until(printed("#2 "), 30, "qw tail --follow to print the new tasks")
        finally:
            follow.send_signal(signal.SIGINT)  # how a user ends --follow
            follow.wait(30)
            reader.join(30)
    assert follow.returncode == 0, follow.stderr
    assert [line.split()[0] for line in seen] == ["#0", "#1", "#2"]


def test_a_wrong_database_or_prefix_is_no_logs_not_an_empty_queue(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = queue_url(redis_url)
    with Queue(url) as producer:
        producer.enqueue({"n": 0})
    wrong = queue_url(redis_url)  # another prefix: nothing there
    prefix = wrong.rsplit("=", 1)[1]
    data = str(tmp_path / "d")
    for args in (
        ["report", "--log", wrong],
        ["status", "--log", wrong, "--dir", data],
        ["tail", "--log", wrong],
        ["task", "0", "--log", wrong],
        ["why", "0", "--log", wrong],
    ):
        assert one_line_error(main(args), capsys) == (
            f"qw: error: no qw logs at {wrong} (expected the streams {prefix}:qw:tasks and "
            f"{prefix}:qw:claims; is it the right database number and ?prefix=?)"
        ), args
    assert main(["report", "--log", url]) == 0


# -- a server out of reach: one line, exit 2 -------------------------------------------------


def every_command(url: str, data: Path) -> list[list[str]]:
    return [
        ["enqueue", "--log", url, "--count", "1"],
        ["up", "--log", url, "--dir", str(data), "--workers", "1", "--no-tui"],
        ["report", "--log", url],
        ["report", "--log", url, "--json"],
        ["status", "--log", url, "--dir", str(data)],
        ["tail", "--log", url],
        ["tail", "--log", url, "--follow"],
        ["task", "0", "--log", url],
        ["why", "0", "--log", url],
    ]


def test_a_refused_connection_is_one_line_and_exit_2_for_every_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()  # nothing listens there
    url = f"redis://127.0.0.1:{port}/0?retries=0"
    for args in every_command(url, tmp_path / "d"):
        line = one_line_error(main(args), capsys)
        assert line.startswith(f"qw: error: cannot reach redis at {url}: Connection refused"), (
            args,
            line,
        )
    secret = f"redis://:sekrit@127.0.0.1:{port}/0?retries=0"
    for args in (["enqueue", "--log", secret], ["report", "--log", secret]):
        line = one_line_error(main(args), capsys)  # the password never shows
        assert f"redis://:***@127.0.0.1:{port}/0" in line and "sekrit" not in line
    logs = tmp_path / "d" / "run" / "logs"
    assert not logs.exists() or not any(logs.iterdir()), "no worker was started"


def test_a_server_that_never_answers_times_out_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) and never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        port = silent.getsockname()[1]
        url = f"redis://127.0.0.1:{port}/0?socket_timeout=0.2&retries=0"
        for args in every_command(url, tmp_path / "d"):
            line = one_line_error(main(args), capsys)
            assert line.startswith(f"qw: error: cannot reach redis at {url}: Timeout"), line


def test_a_malformed_url_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(tmp_path / "d")
    line = one_line_error(
        main(["report", "--log", "redis://:sekrit@127.0.0.1:6379/0?retries=many"]), capsys
    )
    assert line == (
        "qw: error: --log: retries='many' in redis://:***@127.0.0.1:6379/0?retries=many is "
        "not an integer"
    )
    line = one_line_error(main(["enqueue", "--log", "redis://127.0.0.1:notaport/0"]), capsys)
    assert line.startswith("qw: error: --log: bad redis URL redis://127.0.0.1:notaport/0")
    up = ["up", "--log", "redis://127.0.0.1:6379/0?socket_timeout=soon", "--dir", data]
    assert "socket_timeout='soon'" in one_line_error(main(up), capsys)
    line = one_line_error(main(["status", "--log", "http://127.0.0.1:6379/0"]), capsys)
    assert "expected a redis:// URL" in line


# -- restarts: workers resume from their positions --------------------------------------------


class RecordingFollower(ClaimsFollower):
    """The worker's fold, remembering the position of every record it folds."""

    def __init__(self, start: int) -> None:
        super().__init__(start)
        self.folded: list[int] = []

    def apply(
        self, entry: Entry, known: ClaimsRecord | None = None
    ) -> tuple[Outcome, ClaimsRecord]:
        self.folded.append(entry.position)
        return super().apply(entry, known)


def test_a_worker_resumes_after_a_restart_and_folds_no_record_twice(
    own_redis: OwnRedis, tmp_path: Path
) -> None:
    # (client verdicts: the worker's own fold is what this test watches); calls made while
    # the server is down fail quickly
    url = f"{own_redis.url}?retries=1&verdicts=client"
    tasks = 6
    with Queue(url) as producer:
        producer.enqueue_many([{"n": n, "down": n == 3} for n in range(tasks)])
    calls: Counter[int] = Counter()
    restarter: list[threading.Thread] = []
    running: list[Worker] = []

    def restart_once_the_worker_notices() -> None:
        [worker] = running
        wait_until(
            lambda: "DONE not settled, retrying" in (worker.stats.last_error or ""),
            30,
            "the worker to notice that its DONE did not land",
        )
        own_redis.start()

    def handler(payload: dict[str, Any]) -> int:
        calls[payload["n"]] += 1
        if payload["down"]:  # the server dies under a running task: its DONE cannot land
            own_redis.kill9()
            thread = threading.Thread(target=restart_once_the_worker_notices)
            thread.start()
            restarter.append(thread)
        return int(payload["n"])

    config = worker_config(url, tmp_path / "run", "solo", lease_s=60, idle_poll_s=0.05)
    with Worker(config, handler=handler) as worker:
        running.append(worker)
        follower = worker.claims = RecordingFollower(worker.claims_log.start)
        assert [worker.step().kind for _ in range(2)] == [StepKind.DONE] * 2

        # Down between two steps: the next task was claimed with the last DONE (one batch)
        # and its payload is in hand, so it runs; its DONE waits for the server to return.
        own_redis.kill9()
        between = threading.Thread(target=restart_once_the_worker_notices)
        between.start()
        assert worker.step().kind is StepKind.DONE  # task 2
        between.join(30)
        worker.stats.last_error = None  # so that the next restart waits for the next retry

        result = worker.step()  # task 3: the server is killed while it runs
        restarter[0].join(30)
        assert (result.kind, result.task, result.verdict) == (StepKind.DONE, 3, Verdict.DONE)

        own_redis.restart()  # once more, between steps, unnoticed
        results = [worker.step() for _ in range(3)]
        assert [r.kind for r in results] == [StepKind.DONE, StepKind.DONE, StepKind.IDLE]
        assert results[-1].drained
        stats = worker.stats.to_dict()

    with open_log(own_redis.url, CLAIMS_TOPIC) as log:
        positions = [entry.position for entry in log.iter_from(log.start)]
    # Every record folded exactly once, in log order: the worker resumed where it was.
    assert follower.folded == positions
    assert calls == dict.fromkeys(range(tasks), 1)  # no task ran twice
    assert stats["finished"] == tasks and stats["consumed_up_to"] == positions[-1] + 1
    report = load_report(own_redis.url)
    assert report.ok, report.verdict
    assert report.attempts == report.completions == report.completions_accepted == tasks


class LosesReplies(Log):
    """A log that fails some appends: either after making them (the reply was lost) or
    without making them (refused), as a networked log may. Everything else is `inner`'s."""

    def __init__(self, inner: Log, fail: Callable[[bytes], str | None]) -> None:
        self.inner = inner
        self.name = inner.name
        self.fail = fail  # "lost" | "refused" | None for each record appended

    def append(self, data: bytes, *, durable: bool = False) -> int:
        how = self.fail(data)
        if how == "refused":
            raise AppendError(f"{self.name}: refused (test)")
        position = self.inner.append(data, durable=durable)
        if how == "lost":
            raise AppendError(f"{self.name}: reply lost (test); the append may have been made")
        return position

    def append_many(self, records: Sequence[bytes], *, durable: bool = False) -> list[int]:
        # One batch, as the real backends make it: all of it lands, or none of it.
        hows = [self.fail(data) for data in records]
        if "refused" in hows:
            raise AppendError(f"{self.name}: refused (test)")
        positions = self.inner.append_many(records, durable=durable)
        if "lost" in hows:
            raise AppendError(f"{self.name}: reply lost (test); the batch may have been made")
        return positions

    def read(self, position: int, max_records: int | None = None) -> list[Entry]:
        return self.inner.read(position, max_records)

    def wait(self, position: int, timeout: float) -> bool:
        return self.inner.wait(position, timeout)

    @property
    def start(self) -> int:
        return self.inner.start

    def end(self) -> int:
        return self.inner.end()

    def close(self) -> None:
        self.inner.close()


def fail_first(kind: type, how: str) -> Callable[[bytes], str | None]:
    failed: list[bytes] = []

    def fail(data: bytes) -> str | None:
        if not failed and isinstance(decode_claims(data), kind):
            failed.append(data)
            return how
        return None

    return fail


@pytest.mark.parametrize(
    ("kind", "how"),
    [(Claim, "lost"), (Done, "lost"), (Claim, "refused"), (Done, "refused")],
)
def test_an_append_that_fails_is_resolved_from_the_log_never_made_twice(
    redis_url: str, tmp_path: Path, kind: type, how: str
) -> None:
    url = queue_url(redis_url)
    with Queue(url) as producer:
        producer.enqueue_many([{"n": 0}, {"n": 1}])
    calls: Counter[int] = Counter()

    def handler(payload: dict[str, int]) -> int:
        calls[payload["n"]] += 1
        return payload["n"]

    tasks_log = open_log(url, TASKS_TOPIC)
    claims_log = LosesReplies(open_log(url, CLAIMS_TOPIC), fail_first(kind, how))
    config = worker_config(url, tmp_path / "run", "w", lease_s=60, idle_poll_s=0.01)
    try:
        worker = Worker(config, tasks_log=tasks_log, claims_log=claims_log, handler=handler)
        if kind is Claim and how == "refused":
            # No CLAIM was made: the attempt is given up (the run loop tries again).
            with pytest.raises(LogError, match="our CLAIM of task 0 is not in the log"):
                worker.step()
        results = [worker.step() for _ in range(3)]
    finally:
        tasks_log.close()
        claims_log.close()
    assert [r.kind for r in results] == [StepKind.DONE, StepKind.DONE, StepKind.IDLE]
    assert calls == {0: 1, 1: 1}
    report = load_report(url)
    assert report.ok, report.verdict
    # One CLAIM and one DONE per task: the lost reply was found, not written again.
    assert (report.attempts, report.completions, report.completions_accepted) == (2, 2, 2)


def test_a_completion_that_cannot_land_before_a_takeover_is_not_written(
    redis_url: str, tmp_path: Path
) -> None:
    url = queue_url(redis_url)
    lease = seconds_to_us(0.2)
    with Queue(url) as producer:
        producer.enqueue({"n": 0})
    thief = open_log(url, CLAIMS_TOPIC)

    def fail(data: bytes) -> str | None:
        record = decode_claims(data)
        if not isinstance(record, Done):
            return None
        # While our DONE cannot be written, the lease lapses and a survivor takes over.
        if not any(isinstance(r, Claim) and r.worker == "thief" for _, r in read_claims(url)):
            [(_, ours)] = list(read_claims(url))
            assert isinstance(ours, Claim)
            expiry = ours.at + ours.lease
            wait_until(lambda: server_time_us(redis_url) > expiry, 30, "the lease to lapse")
            thief.append(encode(Claim(0, "thief", now_us(), seconds_to_us(60))))
        return "refused"

    tasks_log = open_log(url, TASKS_TOPIC)
    claims_log = LosesReplies(open_log(url, CLAIMS_TOPIC), fail)
    config = worker_config(url, tmp_path / "run", "w", lease_s=0.2, idle_poll_s=0.01)
    try:
        worker = Worker(config, tasks_log=tasks_log, claims_log=claims_log, handler=lambda p: p)
        assert worker.config.lease_us == lease
        result = worker.step()
    finally:
        tasks_log.close()
        claims_log.close()
        thief.close()
    assert result.kind is StepKind.CANCELLED
    assert "lease was lost while the log was out of reach" in (worker.stats.last_error or "")
    report = load_report(url)
    assert report.ok and report.completions == 0 and len(report.takeovers) == 1


def test_qw_up_workers_survive_server_restarts_and_every_task_is_done_once(
    own_redis: OwnRedis, tmp_path: Path
) -> None:
    url = own_redis.url
    tasks = 90
    with Queue(url) as producer:
        producer.enqueue_many([{"n": n} for n in range(tasks)])
    data = tmp_path / "d"
    # fmt: off
    up = subprocess.Popen(
        qw_command(
            "up", "--log", url, "--dir", str(data), "--workers", "3", "--work-ms", "40",
            "--lease", "5", "--exit-when-drained", "--no-tui",
        ),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=ENV,
    )
    # fmt: on
    try:
        with ClaimsTail(url) as tail:
            done = 0

            def done_at_least(target: int) -> Callable[[], bool]:
                def check() -> bool:
                    nonlocal done
                    try:
                        tail.poll()
                    except LogError:
                        return False  # the server is restarting
                    done = tail.follower.state.done_count
                    return done >= target or up.poll() is not None

                return check

            def all_working() -> bool:
                snaps = read_all(data / "run")
                return len(snaps) == 3 and all(s["state"] != "starting" for s in snaps)

            wait_until(all_working, 120, "three workers to start")
            for target in (20, 45, 70):  # three restarts under running workers
                wait_until(done_at_least(target), 120, f"{target} tasks done")
                own_redis.restart()
            wait_until(done_at_least(tasks), 120, "the queue to drain after the restarts")
        [output] = finish([up], 120, [data])
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(30)
    assert up.returncode == 0, output
    assert own_redis.restarts == 3
    assert f"qw: drained (published {tasks}, done {tasks}" in output

    # The same three worker processes from start to end: none died and was replaced.
    snaps = read_all(data / "run")
    assert len(snaps) == 3, [s["worker"] for s in snaps]
    assert {s["exit_reason"] for s in snaps} <= {"drained", "queue drained"}
    assert sum(s["finished"] for s in snaps) == tasks
    # Each worker's last view (how far it folded, how many tasks it saw done) is the fold of
    # that prefix of the log: nothing was folded twice, nothing skipped over a restart.
    records = list(read_claims(url))
    _, done_after = check_log(records)
    positions = [position for position, _ in records]
    for snap in snaps:
        prefix = sum(1 for p in positions if p < snap["consumed_up_to"])
        assert snap["done_tasks"] == (done_after[prefix - 1] if prefix else 0)

    report = load_report(url)
    assert report.ok, report.verdict
    assert report.tasks_done == report.completions == report.completions_accepted == tasks
    assert {w.worker for w in report.workers} == {s["worker"] for s in snaps}


# -- one clock -------------------------------------------------------------------------------


def location_for(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The queue for `backend`: "redis", whose workers fold the claims themselves;
    "redis-server", with server verdicts (the server picks and claims:
    `queue_worker.redis.server_claim`); "file", the file log."""
    if backend == "redis":
        return queue_url(request.getfixturevalue("redis_url")) + "&verdicts=client"
    if backend == "redis-server":
        return queue_url(request.getfixturevalue("redis_url")) + "&verdicts=server"
    return str(tmp_path / "qw")


@pytest.mark.parametrize("backend", ["redis", "redis-server", "file"])
def test_a_fast_clock_cannot_take_a_live_lease_over_on_redis_but_can_on_the_file_log(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    location = location_for(backend, request, tmp_path)
    with Queue(location) as producer:
        producer.enqueue({"n": 0})
    release = threading.Event()

    def honest_work(payload: Any) -> str:
        if not release.wait(60):
            raise TimeoutError("never released")
        return "honest"

    run = tmp_path / "run"
    honest_results: list[StepResult] = []
    fast_clock = OffsetClock(HOUR_US)  # an hour ahead: a 60 s lease looks long gone
    with (
        open_worker(
            worker_config(location, run, "honest", lease_s=60), handler=honest_work
        ) as honest,
        open_worker(
            worker_config(location, run, "fast", lease_s=60),
            handler=lambda payload: "fast",
            clock=fast_clock,
        ) as fast,
        ClaimsTail(location) as tail,
    ):
        runner = threading.Thread(target=lambda: honest_results.append(honest.step()))
        runner.start()
        try:
            wait_until(
                lambda: tail.find(lambda s: s.verdict is Verdict.WON), 30, "honest to win task 0"
            )
            stolen = fast.step()
            if backend == "redis":
                # The CLAIM is dated by the server's clock: the lease is live, the claim loses.
                assert (stolen.kind, stolen.verdict) == (StepKind.LOST, Verdict.LOST_HELD)
                # ... and the worker now knows how far its clock is from the server's.
                assert fast.clock_offset_us < -HOUR_US // 2
                assert fast.step().kind is StepKind.IDLE
            elif backend == "redis-server":
                # The server picks by its own clock: a live lease is not offered at all.
                assert stolen.kind is StepKind.IDLE
                # ... and the reply's time tells the worker its clock's offset, so that it
                # waits for the lease's end on the server's clock (not a busy loop).
                assert fast.clock_offset_us < -HOUR_US // 2
                assert stolen.next_change is not None
                assert stolen.next_change - fast.fold_time(fast_clock()) > 0
            else:
                # Dated by its own clock, past the expiry: a takeover every reader accepts.
                assert stolen.kind is StepKind.DONE
                seen = tail.find(lambda s: s.position == stolen.claim)
                assert seen is not None and seen.verdict is Verdict.TAKEOVER
        finally:
            release.set()
            runner.join(60)
    [honest_result] = honest_results
    report = load_report(location)
    if backend.startswith("redis"):
        assert honest_result.kind is StepKind.DONE
        assert report.ok and report.tasks_done == 1 and not report.takeovers
    else:
        assert honest_result.kind is StepKind.STALE  # its DONE came after the takeover
        assert [w.task for w in report.worked_twice] == [0] and report.exit_code == 1


@pytest.mark.parametrize("backend", ["redis", "redis-server", "file"])
def test_a_slow_clock_does_not_delay_redistribution_on_redis(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    location = location_for(backend, request, tmp_path)
    with Queue(location) as producer:
        producer.enqueue({"n": 0})
    lease = seconds_to_us(0.2)
    # What a worker killed right after winning leaves behind: one CLAIM, nothing more.
    with open_log(location, CLAIMS_TOPIC) as claims:
        if backend == "redis-server":  # (every writer of such a queue goes through them)
            assert isinstance(claims, RedisLog)
            ServerVerdicts(claims).append(Claim(0, "ghost", now_us(), lease))
        else:
            claims.append(encode(Claim(0, "ghost", now_us(), lease)))
        [entry] = claims.read(claims.start)
    ghost = decode_claims_entry(entry)  # on Redis, dated by the server's clock
    assert isinstance(ghost, Claim)
    expiry = ghost.at + lease
    if backend.startswith("redis"):
        redis_url = request.getfixturevalue("redis_url")
        wait_until(lambda: server_time_us(redis_url) > expiry, 30, "the lease to lapse")
    else:
        wait_until(lambda: now_us() > expiry, 30, "the lease to lapse")
    slow_clock = OffsetClock(-HOUR_US)
    config = worker_config(location, tmp_path / "run", "slow", lease_s=60)
    with open_worker(config, handler=lambda payload: "slow", clock=slow_clock) as slow:
        if backend == "redis-server":
            result = slow.step()  # the server's pick: the lapsed lease, by the server's clock
        else:
            assert isinstance(slow, Worker)  # (the client fold: it claims the task it names)
            slow.catch_up()
            result = slow.attempt(0, slow_clock())
    if backend.startswith("redis"):
        assert result.kind is StepKind.DONE  # its CLAIM is dated by the server: a takeover
        assert load_report(location).takeovers[0].new_holder == slow.worker_id
    else:
        assert (result.kind, result.verdict) == (StepKind.LOST, Verdict.LOST_HELD)


# -- several machines, one queue -------------------------------------------------------------


def test_three_hosts_share_one_queue_and_no_task_is_done_twice(
    redis_url: str, tmp_path: Path
) -> None:
    url = queue_url(redis_url)
    tasks = 30
    gate = tmp_path / "gate"
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text(
        "".join(json.dumps({"n": n, "gate": str(gate)}) + "\n" for n in range(tasks))
    )
    enqueued = qw("enqueue", "--log", url, "--file", str(task_file), cwd=tmp_path)
    assert enqueued.returncode == 0, enqueued.stderr

    hosts = ["host-a", "host-b.example", "host_c"]
    ups: list[subprocess.Popen[str]] = []
    try:
        for i, host in enumerate(hosts):
            # fmt: off
            args = [
                "up", "--no-tui", "--log", url, "--exit-when-drained", "--workers", "1",
                "--dir", str(tmp_path / host), "--handler", f"{__name__}:gated",
            ]
            # fmt: on
            env = dict(ENV)
            if i == 0:
                env["QW_HOST"] = host  # the environment names the host ...
            else:
                args += ["--host-name", host]  # ... or the option does
            ups.append(
                subprocess.Popen(
                    qw_command(*args),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    cwd=tmp_path,
                    env=env,
                )
            )

        def every_host_works() -> bool:
            return all(
                any(s["state"] == "working" for s in read_all(tmp_path / host / "run"))
                or ups[i].poll() is not None
                for i, host in enumerate(hosts)
            )

        # Deadlines are generous: on a starved machine six Pythons take a while to start.
        wait_until(every_host_works, 120, "a worker of every host to hold a task")
        gate.touch()
        outputs = finish(ups, 180, [tmp_path / host for host in hosts])
    finally:
        for up in ups:
            if up.poll() is None:
                up.kill()
                up.wait(30)
    for up, output in zip(ups, outputs, strict=True):
        assert up.returncode == 0, output

    result = qw("report", "--log", url, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] and report["worked_twice"] == []
    assert report["tasks_done"] == report["completions_accepted"] == tasks
    assert report["completions_stale"] == 0
    by_host: Counter[str] = Counter()
    for line in report["workers"]:
        _, _, rest = line["worker"].partition("@")
        by_host[rest.rsplit("-", 2)[0]] += line["done"]
    assert set(by_host) == set(hosts), report["workers"]
    assert all(by_host[host] >= 1 for host in hosts) and sum(by_host.values()) == tasks
    for host in hosts:  # each host's workers report it in their stats too
        assert {s["host"] for s in read_all(tmp_path / host / "run")} == {host}


def test_a_password_stays_off_every_command_line(tmp_path: Path) -> None:
    password = "s3cret-" + uuid.uuid4().hex[:8]
    server = OwnRedis(tmp_path / "redis", "--requirepass", password)
    server.start()
    url = f"redis://:{password}@127.0.0.1:{server.port}/0"
    gate = tmp_path / "gate"
    data = tmp_path / "d"
    try:
        with Queue(url) as producer:
            producer.enqueue_many([{"n": n, "gate": str(gate)} for n in range(4)])
        command = qw_command(
            *("up", "--dir", str(data), "--workers", "2", "--handler", f"{__name__}:gated"),
            *("--exit-when-drained", "--no-tui"),
        )
        up = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
            env={**ENV, "QW_LOG": url},  # the URL from the environment, not an option
        )
        try:
            wait_until(
                lambda: (
                    any(s["state"] == "working" for s in read_all(data / "run"))
                    or up.poll() is not None
                ),
                120,
                "a worker to hold a task",
            )
            processes = [psutil.Process(up.pid), *psutil.Process(up.pid).children(True)]
            command_lines = [" ".join(p.cmdline()) for p in processes]
            # the workers are forked: the fork server's children, its command line theirs
            # (its program text, then the descriptor of the supervisor's control pipe)
            forkserver = next(
                p
                for p in processes
                if p.ppid() == up.pid and any("forkserver" in part for part in p.cmdline())
            )
            workers = forkserver.children()
            worker_lines = [Path(f"/proc/{p.pid}/cmdline").read_bytes() for p in workers]
            gate.touch()
            [output] = finish([up], 180, [data])
        finally:
            if up.poll() is None:
                up.kill()
                up.wait(30)
        assert up.returncode == 0, output
        assert len(worker_lines) == 2, command_lines
        assert not any(password in line for line in command_lines), command_lines
        assert not any(password.encode() in line for line in worker_lines), worker_lines
        assert password not in output
        report = load_report(url)
        assert report.ok and report.tasks_done == 4
    finally:
        server.kill9()
