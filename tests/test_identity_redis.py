"""The Redis log knows its queue too: a server reset under a running queue (restarted
without persistence, or flushed) stops the readers with a clear error instead of folding
the new server's records into the old fold (issue 15, attack 3)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from logstore import IdentityError
from queue_worker.producer import Queue
from queue_worker.proof.report import ReportInputError, load_report
from queue_worker.topics import open_topics
from tests.helpers import free_port, wait_until

QW = [sys.executable, "-m", "supervisor.cli.app"]


class Server:
    """A redis-server of this test's own (no persistence), which it may restart."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
             str(self.workdir), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

        def accepting() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return True
            except OSError:
                return False

        wait_until(accepting, 20, "redis-server to accept connections")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def test_a_reader_refuses_a_restarted_server(server: Server) -> None:
    with Queue(server.url) as queue:
        queue.enqueue_many([{"n": n} for n in range(5)])
    tasks, claims = open_topics(server.url)
    with tasks, claims:
        assert len(tasks.read(tasks.start)) == 5
        server.restart()
        with Queue(server.url) as queue:  # a new queue on the new server
            queue.enqueue_many([{"n": n} for n in range(3)])
        with pytest.raises(IdentityError, match=r"identity .* has changed: the server was reset"):
            tasks.read(tasks.start)


def test_an_idle_reader_notices_a_flushed_server(server: Server) -> None:
    import redis

    tasks, claims = open_topics(server.url)
    with tasks, claims:
        client = redis.Redis.from_url(server.url)
        client.flushdb()
        client.close()
        with pytest.raises(IdentityError, match=r"identity .* is missing"):
            tasks.wait(tasks.end(), 0.01)


def test_streams_without_their_identity_are_refused(server: Server) -> None:
    import redis

    with Queue(server.url) as queue:
        queue.enqueue({"n": 1})
    client = redis.Redis.from_url(server.url)
    client.delete("qw:queue")
    client.close()
    with pytest.raises(IdentityError, match="hold records but the queue identity qw:queue"):
        open_topics(server.url)


def done(url: str) -> int:
    try:
        return load_report(url).tasks_done
    except ReportInputError:  # no logs yet
        return -1


def test_up_stops_on_a_server_restarted_mid_run_and_no_task_is_lost(
    server: Server, tmp_path: Path
) -> None:
    up = subprocess.Popen(
        [*QW, "up", "--no-tui", "--log", server.url, "--dir", str(tmp_path / "qw"),
         "--workers", "2", "--tasks", "5", "--work-ms", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: done(server.url) == 5, 60, "the first 5 tasks done")
        server.restart()
        enqueued = subprocess.run(
            [*QW, "enqueue", "--log", server.url, "--count", "20"],
            cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert enqueued.returncode == 0, enqueued.stderr
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 3, err
    assert "the server was reset" in err
    # the tasks enqueued after the restart (ids 0-19 again) are all run by a new run
    again = subprocess.run(
        [*QW, "up", "--no-tui", "--exit-when-drained", "--log", server.url, "--dir",
         str(tmp_path / "qw"), "--workers", "2", "--work-ms", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    report = load_report(server.url)
    assert (report.tasks_published, report.tasks_done) == (20, 20)
