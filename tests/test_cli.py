"""The `qw` command line, run as real subprocesses on real files.

Every wait is a condition with a deadline (tests.helpers.wait_until); no test sleeps.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from queue_worker.proof.report import read_claims, read_task
from queue_worker.protocol.records import Done
from queue_worker.protocol.state import ClaimState, Verdict
from supervisor.cli.app import app, main
from tests.helpers import wait_until

QW = [sys.executable, "-m", "supervisor.cli.app"]


def qw(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def start_up(tmp_path: Path, label: str, *args: str) -> subprocess.Popen[str]:
    """`qw up --no-tui …` in the background; its output goes to <label>.out / .err."""
    out = (tmp_path / f"{label}.out").open("w")
    err = (tmp_path / f"{label}.err").open("w")
    with out, err:
        return subprocess.Popen(
            [*QW, "up", "--no-tui", *args], cwd=tmp_path, stdout=out, stderr=err, text=True
        )


def fold(data_dir: Path) -> tuple[ClaimState, Counter[int], int]:
    """The claims log's verdict: the state, accepted DONEs per task, stale DONEs."""
    state = ClaimState()
    done: Counter[int] = Counter()
    stale = 0
    for position, record in read_claims(str(data_dir)):
        outcome = state.apply(record, position)
        if outcome.verdict is Verdict.DONE and outcome.task is not None:
            done[outcome.task] += 1
        stale += outcome.verdict is Verdict.STALE_DONE
    return state, done, stale


def supervisor_status(data_dir: Path, pid: int) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(
            (data_dir / "run" / "supervisors" / f"{pid}.json").read_text()
        )
    except (OSError, ValueError):
        return None
    return data


def worker_entry(data_dir: Path, pid: int, name: str) -> dict[str, Any] | None:
    """The status file's entry for worker `name` once it is alive with a known id."""
    status = supervisor_status(data_dir, pid)
    for worker in status["workers"] if status else []:
        if worker["name"] == name and worker["alive"] and worker["worker_id"]:
            return dict(worker)
    return None


# -- qw up: drain, invalid values, two supervisors ----------------------------------------------


@pytest.fixture(scope="module")
def drained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory where `qw up --exit-when-drained` ran 40 tasks to the end."""
    cwd = tmp_path_factory.mktemp("drained")
    data = cwd / "qw"
    result = qw(
        "up",
        "--no-tui",
        "--exit-when-drained",
        "--dir",
        str(data),
        "--tasks",
        "40",
        "--workers",
        "3",
        "--work-ms",
        "10",
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "qw: drained (published 40, done 40, dead 0, pending 0)"
    )
    return data


def test_up_drains_and_every_task_is_done_exactly_once(drained_dir: Path) -> None:
    state, done, stale = fold(drained_dir)
    assert sorted(done) == list(range(40))
    assert set(done.values()) == {1}
    assert stale == 0
    assert state.held_count == 0
    assert not list((drained_dir / "run" / "supervisors").glob("*.json"))  # removed at exit


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--workers", "0"],
            "Invalid value for '--workers': got '0'; expected a number of workers from 1 to 256",
        ),
        (
            ["--workers", "many"],
            "Invalid value for '--workers': got 'many'; expected a number of workers from 1 to 256",
        ),
        (
            ["--pick", "fastest"],
            "Invalid value for '--pick': got 'fastest'; expected one of first, random, spread",
        ),
        (
            ["--lease", "0"],
            "Invalid value for '--lease': got '0'; expected seconds > 0 and <= 86400",
        ),
        (
            ["--fsync", "sometimes"],
            "Invalid value for '--fsync': got 'sometimes'; expected one of none, commit, always",
        ),
        (
            ["--http", "localhost:99999"],
            "Invalid value for '--http': got 'localhost:99999'; expected HOST:PORT or PORT, "
            "with a port from 0 to 65535",
        ),
        (
            ["--handler", "no_such_module_qw:run"],
            "Invalid value for '--handler': handler 'no_such_module_qw:run': cannot import "
            "module 'no_such_module_qw' (No module named 'no_such_module_qw'); expected an "
            "importable module",
        ),
        (
            ["--log", "http://example.org"],
            "Invalid value for '--log': got 'http://example.org'; expected a redis:// URL "
            "(the files in --dir are the default)",
        ),
        (
            ["--rate", "5", "--exit-when-drained"],
            "Invalid value for '--rate': got 5.0; expected no --rate with --exit-when-drained "
            "(the queue would never drain)",
        ),
        (  # demo traffic would keep the queue from ever draining
            ["--demo", "--exit-when-drained"],
            "Invalid value for '--demo': got True; expected no --demo with "
            "--exit-when-drained (the queue would never drain)",
        ),
        (
            ["--demo", "--rate", "5", "--exit-when-drained"],
            "Invalid value for '--rate': got 5.0; expected no --rate with "
            "--exit-when-drained (the queue would never drain)",
        ),
    ],
)
def test_up_rejects_an_invalid_value_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    # In process (the same `main` the console script runs): these end before anything starts.
    code = main(["up", "--no-tui", "--dir", str(tmp_path / "qw"), *args])
    assert code == 2
    assert capsys.readouterr().err == f"qw: error: {message}\n"
    assert not (tmp_path / "qw").exists()  # nothing started, nothing written


def test_an_invalid_value_exits_2_from_the_real_command(tmp_path: Path) -> None:
    result = qw("up", "--dir", str(tmp_path / "qw"), "--work-ms", "-5", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "qw: error: Invalid value for '--work-ms': got '-5'; expected milliseconds "
        "from 0 to 3600000\n"
    )
    assert result.stdout == ""


def test_up_rejects_a_busy_http_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = qw("up", "--no-tui", "--dir", str(tmp_path), "--http", str(port), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        f"qw: error: Invalid value for '--http': got '{port}'; expected an address this "
        "machine can listen on (Address already in use)\n"
    )


def test_two_supervisors_on_one_directory_share_the_queue(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    common = ["--dir", str(data), "--workers", "1", "--work-ms", "200", "--exit-when-drained"]
    # 30 tasks of 200 ms: one worker alone needs 6 s, time enough for the second to join
    first = start_up(tmp_path, "first", *common, "--tasks", "30")
    try:
        # its status file is written after the tasks are enqueued
        wait_until(lambda: supervisor_status(data, first.pid), 30, "the first supervisor")
        second = start_up(tmp_path, "second", *common)
        assert second.wait(60) == 0, (tmp_path / "second.err").read_text()
        assert first.wait(60) == 0, (tmp_path / "first.err").read_text()
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
    _, done, stale = fold(data)
    assert sorted(done) == list(range(30)) and set(done.values()) == {1}
    assert stale == 0
    finishers = {r.worker for _, r in read_claims(str(data)) if isinstance(r, Done)}
    assert len(finishers) == 2  # one worker of each supervisor finished tasks


# -- qw enqueue ----------------------------------------------------------------------------------


def test_enqueue_count_payload_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = str(tmp_path / "qw")
    # --count and --payload in process (the same `main`), --file as a real command
    assert main(["enqueue", "--dir", data, "--count", "3"]) == 0
    assert capsys.readouterr().out == f"enqueued 3 tasks (0–2) on {data}\n"
    assert main(["enqueue", "--dir", data, "--payload", '{"x": 1}']) == 0
    assert capsys.readouterr().out == f"enqueued task 3 on {data}\n"
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text('{"a": 1}\n\n[1, 2]\n"text"\n')
    many = qw("enqueue", "--dir", data, "--file", str(jsonl), cwd=tmp_path)
    assert (many.returncode, many.stdout) == (0, f"enqueued 3 tasks (4–6) on {data}\n")
    tail = qw("tail", "--dir", data, "--topic", "tasks", cwd=tmp_path)
    payloads = [line.split("  ", 3)[3] for line in tail.stdout.splitlines()]
    expected = ['{"n": 0}', '{"n": 1}', '{"n": 2}', '{"x": 1}', '{"a": 1}', "[1, 2]", '"text"']
    assert payloads == expected


def test_enqueue_a_bad_line_names_it_and_writes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text('{"ok": 1}\n{"ok": 2}\n{not json}\n')
    result = qw("enqueue", "--dir", str(data), "--file", str(jsonl), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        f"qw: error: {jsonl} line 3: not JSON (Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1)); expected one JSON value per line\n"
    )
    assert read_task(str(data), 0) is None  # nothing was written


def test_enqueue_rejects_bad_payload_json(tmp_path: Path) -> None:
    result = qw("enqueue", "--dir", str(tmp_path), "--payload", "{", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("qw: error: Invalid value for '--payload': got '{'; ")
    assert result.stderr.count("\n") == 1


# -- qw status, tail, task -------------------------------------------------------------------------


def test_status_of_a_drained_directory(drained_dir: Path) -> None:
    result = qw("status", "--dir", str(drained_dir), cwd=drained_dir.parent)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert "supervisors  0 running" in lines
    assert "workers      0 running, 3 stopped" in lines
    assert lines[-1] == (
        "queue        published 40  pending 0  held 0  done 40  dead 0  failed attempts 0"
    )


def test_status_of_a_directory_without_logs(tmp_path: Path) -> None:
    result = qw("status", "--dir", str(tmp_path / "nothing"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        f"qw: error: no qw logs at {tmp_path / 'nothing'} (expected tasks.log and claims.log)\n"
    )
    assert not (tmp_path / "nothing").exists()


def test_tail_claims_shows_positions_and_verdicts(drained_dir: Path) -> None:
    result = qw("tail", "--dir", str(drained_dir), "-n", "200", cwd=drained_dir.parent)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    claims = [line for line in lines if " CLAIM " in line]
    dones = [line for line in lines if " DONE " in line]
    assert all(line.startswith("@") for line in lines)
    # a lost claim names the holder it ran into and when that lease ran out
    verdict = re.compile(r"→ (won|lost: done|lost: held by \S+ until \d\d:\d\d:\d\d\.\d{3})$")
    assert claims and all(verdict.search(line) for line in claims), claims
    assert len([line for line in dones if line.endswith("→ done")]) == 40


def test_tail_follow_prints_new_records(tmp_path: Path) -> None:
    data = str(tmp_path / "qw")
    assert qw("enqueue", "--dir", data, cwd=tmp_path).returncode == 0
    out_path = tmp_path / "tail.out"
    with out_path.open("w") as out:
        follower = subprocess.Popen(
            [*QW, "tail", "--follow", "--topic", "tasks", "--dir", data],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: out_path.read_text().startswith("#0 "), 30, "the first task")
        assert qw("enqueue", "--dir", data, "--payload", '"later"', cwd=tmp_path).returncode == 0
        wait_until(lambda: '"later"' in out_path.read_text(), 30, "the new task")
        assert out_path.read_text().splitlines()[1].startswith("#1 ")
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(30) == 0  # Ctrl-C is how --follow ends


def test_task_shows_state_result_and_history(drained_dir: Path) -> None:
    result = qw("task", "5", "--dir", str(drained_dir), cwd=drained_dir.parent)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith("task 5: done")
    assert lines[1] == '  result  {"task": 5, "worked_ms": 10}'
    assert "TASK" in lines[2] and 'payload {"n": 5}' in lines[2]
    assert lines[-1].split()[-1] == "done" and "DONE" in lines[-1]


def test_task_unknown_id(drained_dir: Path) -> None:
    result = qw("task", "999", "--dir", str(drained_dir), cwd=drained_dir.parent)
    assert result.returncode == 2
    assert result.stderr == (
        f"qw: error: task 999 is not in {drained_dir}: no TASK record and no claims name it\n"
    )


@pytest.mark.parametrize("command", ["up", "enqueue", "status", "tail", "task", "kill"])
def test_every_command_explains_itself_with_an_example(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], terminal_width=100)
    assert result.exit_code == 0
    assert "Example" in result.output


# -- qw kill, and the restart that follows ---------------------------------------------------


def test_kill_a_worker_by_name_and_its_slot_restarts(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    up = start_up(tmp_path, "up", "--dir", str(data), "--workers", "2", "--work-ms", "50")
    try:
        before = wait_until(lambda: worker_entry(data, up.pid, "w1"), 30, "w1 to run")
        assert isinstance(before, dict)
        killed = qw("kill", "w1", "--dir", str(data), cwd=tmp_path)
        assert killed.returncode == 0, killed.stderr
        assert killed.stdout == (f"kill -9 w1 (pid {before['pid']}, id {before['worker_id']})\n")

        def restarted() -> dict[str, Any] | None:
            now = worker_entry(data, up.pid, "w1")
            return now if now and now["pid"] != before["pid"] else None

        after = wait_until(restarted, 30, "w1 to be restarted")
        assert isinstance(after, dict)
        assert after["restarts"] == 1
        assert after["worker_id"] != before["worker_id"]  # a new process is a new id
        assert not psutil.pid_exists(before["pid"]) or (
            psutil.Process(before["pid"]).status() == psutil.STATUS_ZOMBIE
        )
        status = qw("status", "--dir", str(data), cwd=tmp_path)
        assert "supervisors  1 running" in status.stdout.splitlines()
        unknown = qw("kill", "w7", "--dir", str(data), cwd=tmp_path)
        assert unknown.returncode == 2
        assert unknown.stderr.startswith(
            "qw: error: Invalid value for 'WORKER': got 'w7'; expected a running worker on "
        )
    finally:
        up.send_signal(signal.SIGTERM)
        assert up.wait(30) == 0
    events = (tmp_path / "up.out").read_text()
    assert f"w1·{before['pid']} killed by SIGKILL" in events
    assert f"w1 restarted as w1·{after['pid']} (was w1·{before['pid']})" in events
    from queue_worker.ops import read_ops  # the kill, the death and the restart, recorded

    ops = [(op.kind, op.by, op.pid) for op in sorted(read_ops(data)[0], key=lambda op: op.at)]
    assert ops[:3] == [
        ("kill", "operator", before["pid"]),
        ("death", "supervisor", before["pid"]),
        ("restart", "supervisor", after["pid"]),
    ]
