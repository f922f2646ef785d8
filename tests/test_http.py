"""The stats endpoint: a real supervisor with real workers, read over real HTTP."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.http_api import StatsServer, is_loopback, metrics_text, parse_address
from supervisor.run.model import QueueView, SlotState, SupervisorSnapshot, WorkerView
from supervisor.run.supervisor import Supervisor, SupervisorOptions
from tests.helpers import free_port, wait_until

QW = [sys.executable, "-m", "supervisor.cli.app"]
ORIGINAL_FIELDS = {
    "attempts",
    "won",
    "lost",
    "finished",
    "timeouts",
    "current",
    "knownTasks",
    "consumedUpTo",
    "doneTasks",
    "heldByAnyone",
    "claimLatencyMicros",
}


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """http://127.0.0.1:PORT of a supervisor running 2 demo workers on 10 tasks."""
    data = tmp_path_factory.mktemp("http") / "qw"
    sup = Supervisor(
        SupervisorOptions(data_dir=data, location=str(data), workers=2, tasks=10, work_ms=20)
    )
    server = StatsServer(sup, "127.0.0.1", 0)
    sup.start()
    server.start()
    try:
        yield f"http://{server.address}"
    finally:
        server.close()
        sup.drain()
        sup.wait(30)


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def stats(endpoint: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(get(f"{endpoint}/stats")[2])
    return data


def all_done(endpoint: str) -> dict[str, Any] | None:
    body = stats(endpoint)
    return body if body["queue"]["done"] == 10 else None


def test_health(endpoint: str) -> None:
    assert get(f"{endpoint}/health") == (200, "text/plain; charset=utf-8", "ok\n")


def test_stats_has_the_original_fields_per_worker(endpoint: str) -> None:
    body = wait_until(lambda: all_done(endpoint), 30, "the 10 tasks to be done")
    assert isinstance(body, dict)
    workers = body["workers"]
    assert [w["name"] for w in workers] == ["w0", "w1"]
    for w in workers:
        assert set(w) >= ORIGINAL_FIELDS
        assert set(w["claimLatencyMicros"]) == {"p50", "p90", "p99", "samples"}
        assert isinstance(w["lost"], int)
        assert w["pid"] and w["worker"].startswith(f"{w['name']}-{w['pid']}-")
    # every worker's stats are published at least once per 0.25 s: wait for the finish
    wait_until(lambda: sum(w["finished"] for w in stats(endpoint)["workers"]) == 10, 30, "finished")
    assert body["queue"]["published"] == 10


def test_task_endpoint(endpoint: str) -> None:
    wait_until(lambda: all_done(endpoint), 30, "the 10 tasks to be done")
    status, content_type, text = get(f"{endpoint}/task/3")
    assert (status, content_type) == (200, "application/json")
    task = json.loads(text)
    assert {k: task[k] for k in ("done", "heldBy", "heldAt", "known")} == {
        "done": True,
        "heldBy": None,
        "heldAt": None,
        "known": True,
    }
    # a finished task: its attempts, payload, result and the history of its records
    assert task["state"].startswith("done")
    assert task["attempts"] >= 1
    assert task["payload"] == {"n": 3}
    assert task["result"] is not None
    history = task["history"]
    assert history[0]["kind"] == "TASK"
    wins = [r for r in history if r["kind"] == "CLAIM" and r["verdict"] in ("won", "takeover")]
    assert len(wins) == task["attempts"]
    done = [r for r in history if r["kind"] == "DONE" and r["verdict"] == "done"]
    assert len(done) == 1 and done[0]["claim"] == wins[-1]["position"]
    assert all(r["why"] for r in history)
    status, _, text = get(f"{endpoint}/task/99")  # no record names task 99
    assert status == 404
    assert json.loads(text) == {"error": "no task 99: no TASK record and no claim names it"}
    assert get(f"{endpoint}/task/three")[0] == 400
    assert get(f"{endpoint}/nowhere")[0] == 404


def test_metrics_parse_as_prometheus_text(endpoint: str) -> None:
    wait_until(lambda: all_done(endpoint), 30, "the 10 tasks to be done")
    status, content_type, text = get(f"{endpoint}/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    tasks = {s.labels["state"]: s.value for s in families["qw_tasks"].samples}
    assert tasks["published"] == 10 and tasks["done"] == 10 and tasks["pending"] == 0
    attempts = families["qw_worker_attempts"]
    assert attempts.type == "counter"
    assert {s.labels["worker"] for s in attempts.samples} == {"w0", "w1"}
    assert sum(s.value for s in attempts.samples) >= 10
    latency = families["qw_claim_latency_microseconds"]
    assert latency.type == "summary"
    quantiles = {s.labels.get("quantile") for s in latency.samples if "quantile" in s.labels}
    assert quantiles == {"0.5", "0.9", "0.99"}


def test_metrics_escape_label_values() -> None:
    worker = WorkerView(slot=0, name='w"0\\', worker_id=None, pid=None, state=SlotState.DEAD)
    snap = SupervisorSnapshot(location="x", workers=[worker], queue=QueueView(), events=[])
    families = {f.name: f for f in text_string_to_metric_families(metrics_text(snap))}
    assert families["qw_worker_up"].samples[0].labels == {"worker": 'w"0\\'}


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("8080", ("127.0.0.1", 8080)),
        (":8080", ("127.0.0.1", 8080)),
        ("0.0.0.0:9", ("0.0.0.0", 9)),
        ("[::1]:0", ("::1", 0)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_parse_address(text: str, address: tuple[str, int]) -> None:
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["", "host:", "host:http", "1:65536", "-1"])
def test_parse_address_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        parse_address(text)


def test_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")


def test_the_cli_serves_http_on_loopback(tmp_path: Path) -> None:
    # The option's wiring: `qw up --http 0` picks a free port and says where.
    args = ["--dir", str(tmp_path / "qw"), "--workers", "1", "--tasks", "3", "--work-ms", "1"]
    with (tmp_path / "err").open("w") as err:
        up = subprocess.Popen(
            [*QW, "up", "--no-tui", "--exit-when-drained", "--http", "0", *args],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    assert up.wait(60) == 0
    first = (tmp_path / "err").read_text().splitlines()[0]
    assert first.startswith("qw: stats on http://127.0.0.1:") and first.endswith("/stats")


def hang_up(port: int, request: bytes) -> None:
    """Send `request` and reset the connection at once (SO_LINGER 0): the server's answer
    meets a socket that is gone."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_clients_that_hang_up_print_no_tracebacks(tmp_path: Path) -> None:
    port = free_port()
    args = ["--dir", str(tmp_path / "qw"), "--workers", "1", "--demo", "--http", str(port)]
    with (tmp_path / "err").open("w") as err:
        up = subprocess.Popen(
            [*QW, "up", "--no-tui", *args], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        wait_until(lambda: port_answers(port), 60, "the stats endpoint to answer")
        for _ in range(20):
            hang_up(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # slowloris, then gone
            hang_up(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # gone before the answer
        assert get(f"http://127.0.0.1:{port}/health")[0] == 200  # still serving
        up.send_signal(signal.SIGTERM)
        assert up.wait(60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    text = (tmp_path / "err").read_text()
    assert "Traceback" not in text, text
    assert "Error" not in text, text


def port_answers(port: int) -> bool:
    try:
        return get(f"http://127.0.0.1:{port}/health")[0] == 200
    except OSError:
        return False
