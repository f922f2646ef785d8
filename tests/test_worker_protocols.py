"""One claiming protocol per worker class, and one place that chooses between them.

The client-fold worker (`queue_worker.worker.loop.Worker`, the laptop's) and what it is
built of (`base`, `attempt`) never name the server-verdict path: no import of a Redis
module, no identifier that says server or redis; importing them loads none of it.
`open_worker` gives each queue the worker its protocol needs.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from queue_worker.opening import open_worker
from queue_worker.producer import Queue
from queue_worker.worker import attempt, base, loop
from queue_worker.worker.config import WorkerConfig

#: the modules of the client-fold worker
CLIENT_FOLD_MODULES = (loop, base, attempt)
#: words none of their identifiers may hold
SERVER_WORDS = ("server", "redis")


def server_words_in(source: str) -> list[str]:
    """Every import of a Redis module and every identifier holding a SERVER_WORD in
    `source` (its comments and docstrings are not code, and are left out)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or "", *(alias.name for alias in node.names)]
        elif isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.arg | ast.keyword):
            names = [node.arg or ""]
        found += [n for n in names if any(word in n.lower() for word in SERVER_WORDS)]
    return found


def test_the_scan_finds_a_server_verdict_branch() -> None:
    branch = (
        "from queue_worker.redis.server_claim import ServerClaims\n"
        "def step(self):\n"
        "    if self._server is not None:\n"
        "        return self._server_step()\n"
    )
    assert sorted(server_words_in(branch)) == [
        "ServerClaims",
        "_server",
        "_server_step",
        "queue_worker.redis.server_claim",
    ]


@pytest.mark.parametrize("module", CLIENT_FOLD_MODULES, ids=lambda m: m.__name__)
def test_the_client_fold_worker_names_no_server_verdict_path(module: object) -> None:
    path = Path(getattr(module, "__file__", ""))
    assert server_words_in(path.read_text()) == []


def test_the_client_fold_worker_has_no_server_member() -> None:
    assert [name for name in dir(loop.Worker) if "server" in name.lower()] == []


def test_importing_the_client_fold_worker_loads_no_redis_module() -> None:
    probe = (
        "import json, sys, queue_worker.worker.loop, queue_worker.opening; "
        "print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] == 'redis' or m.startswith(('queue_worker.redis', 'logstore.redis')))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_a_file_queue_gets_the_client_fold_worker(tmp_path: Path) -> None:
    config = WorkerConfig(str(tmp_path / "data"), str(tmp_path / "run"), name="w0")
    with open_worker(config, handler=lambda payload: payload) as worker:
        assert type(worker) is loop.Worker


def test_a_bad_handler_is_refused_before_any_log_is_opened(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = WorkerConfig(str(data), str(tmp_path / "run"), name="w0", handler="no_such:thing")
    with pytest.raises(ValueError, match="no_such"):
        open_worker(config)
    assert not data.exists()


@pytest.mark.redis
@pytest.mark.parametrize(
    ("verdicts", "kind"),
    [("server", "ServerVerdictWorker"), ("client", "Worker"), (None, "ServerVerdictWorker")],
)
def test_a_redis_queue_gets_the_worker_of_its_verdict_mode(
    redis_url: str, tmp_path: Path, verdicts: str | None, kind: str
) -> None:
    url = f"{redis_url}?prefix=p{uuid.uuid4().hex[:10]}"
    if verdicts is not None:
        url += f"&verdicts={verdicts}"
    with Queue(url) as queue:
        queue.enqueue(1)
    config = WorkerConfig(url, str(tmp_path / "run"), name="w0", exit_when_drained=True)
    with open_worker(config, handler=lambda payload: payload) as worker:
        assert type(worker).__name__ == kind
        assert worker.run() == "queue drained"
        assert worker.stats.finished == 1


@pytest.mark.redis
def test_each_worker_refuses_a_queue_of_the_other_protocol(redis_url: str, tmp_path: Path) -> None:
    from queue_worker.redis.server_worker import ServerVerdictWorker

    def config(location: str) -> WorkerConfig:
        return WorkerConfig(location, str(tmp_path / "run"), name="w0")

    server = f"{redis_url}?prefix=s{uuid.uuid4().hex[:10]}&verdicts=server"
    client = f"{redis_url}?prefix=c{uuid.uuid4().hex[:10]}&verdicts=client"
    with pytest.raises(ValueError, match=r"judged on the server .*open_worker"):
        loop.Worker(config(server), handler=lambda payload: payload)
    for location in (client, str(tmp_path / "data")):
        with pytest.raises(ValueError, match="not a Redis queue with server verdicts"):
            ServerVerdictWorker(config(location), handler=lambda payload: payload)
