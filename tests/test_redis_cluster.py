"""A partitioned queue on a real Redis Cluster: three `redis-server --cluster-enabled yes`
nodes on free ports, joined by `redis-cli --cluster create`, started by these tests. The
e2e and chaos tests run `qw` processes on it: a drain, a worker killed mid-task, and a node
killed with -9 and restarted (appendonly: it comes back with its data)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest

from logstore import LogError
from queue_worker.partition_layout import partition_location
from queue_worker.partitions.queue import resolve_partitions
from queue_worker.proof.report import read_claims
from queue_worker.protocol.state import ClaimState
from tests.helpers import free_port, redis_server_binary, wait_until
from tests.test_cli import qw, start_up

NODES = 3


@dataclass
class Node:
    port: int
    bus_port: int  # the cluster bus (port + 10000 by default: may not exist, or be taken)
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, binary: str) -> None:
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                str(self.bus_port),
                "--cluster-config-file",
                "nodes.conf",
                # a node that is down stops only its own slots, not the whole cluster
                "--cluster-require-full-coverage",
                "no",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self.accepting, 20, f"redis node {self.port} to accept connections")

    def accepting(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            pytest.fail(f"redis node {self.port} exited with {self.process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


@dataclass
class Cluster:
    binary: str
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0?cluster=yes"

    def cli(self, *args: str) -> str:
        done = subprocess.run(["redis-cli", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"redis-cli {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout

    def node_of(self, key: str) -> Node:
        """The node that holds `key` (an existing key), as the nodes themselves say."""
        slot = self.cli("-p", str(self.nodes[0].port), "cluster", "keyslot", key).strip()
        holders = [
            node
            for node in self.nodes
            if int(self.cli("-p", str(node.port), "cluster", "countkeysinslot", slot)) > 0
        ]
        assert len(holders) == 1, f"{key} is on {len(holders)} nodes"
        return holders[0]

    def ok(self) -> bool:
        info = self.cli("-p", str(self.nodes[0].port), "cluster", "info")
        return "cluster_state:ok" in info


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    binary = redis_server_binary()
    if shutil.which("redis-cli") is None:
        pytest.skip("redis-cli is not installed")
    base = tmp_path_factory.mktemp("cluster")
    made = Cluster(binary)
    try:
        for i in range(NODES):
            directory = base / f"node{i}"
            directory.mkdir()
            node = Node(free_port(), free_port(), directory)
            node.start(binary)
            made.nodes.append(node)
        addresses = [f"127.0.0.1:{node.port}" for node in made.nodes]
        made.cli("--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes")
        wait_until(made.ok, 30, "the cluster to be ok")
        yield made
    finally:
        for node in made.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.terminate()
                node.process.wait(10)


@pytest.fixture
def queue_url(cluster: Cluster) -> str:
    """A queue of its own for one test: a fresh ?prefix= on the shared cluster."""
    return f"{cluster.url}&prefix=t{secrets.token_hex(3)}"


def _held(location: str) -> tuple[int, int] | None:
    """A task held now in the partition at `location`, and its holder's pid."""
    state = ClaimState()
    try:
        for position, record in read_claims(location):
            state.apply(record, position)
    except LogError:
        return None
    for task, lease in state.held_tasks():
        return task, int(lease.worker.split("-")[-2])
    return None


def _done(location: str) -> int:
    """Tasks done so far in the partition at `location` (its claims folded now)."""
    state = ClaimState()
    for position, record in read_claims(location):
        state.apply(record, position)
    return state.done_count


def _prefix(url: str) -> str:
    return dict(parse_qsl(urlsplit(url).query))["prefix"]


def _report(tmp_path: Path, url: str) -> dict[str, object]:
    result = qw("report", "--json", "--log", url, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    body = json.loads(result.stdout)
    assert isinstance(body, dict)
    return body


@pytest.mark.slow  # make test runs the cluster once, through its retention test
def test_partitions_spread_over_the_nodes_and_drain_exactly_once(
    cluster: Cluster, queue_url: str, tmp_path: Path
) -> None:
    result = qw(
        "up", "--no-tui", "--log", queue_url, "--dir", str(tmp_path / "run"),
        "--partitions", "3", "--workers", "3", "--tasks", "90", "--work-ms", "2",
        "--exit-when-drained",
        cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    body = _report(tmp_path, queue_url)
    assert body["ok"] and body["tasks_done"] == body["tasks_published"] == 90
    parts = body["per_partition"]
    assert isinstance(parts, list)
    assert all(p["tasks_done"] == p["tasks_published"] == 30 for p in parts)
    # each partition's keys on one node, and the three partitions on three nodes
    owners = set()
    for k in range(3):
        prefix = _prefix(partition_location(queue_url, k, 3))
        nodes = {cluster.node_of(f"{prefix}:qw:{t}").port for t in ("tasks", "claims", "queue")}
        assert len(nodes) == 1
        owners |= nodes
    assert len(owners) == 3


@pytest.mark.slow  # make test runs the cluster once, through its retention test
def test_a_killed_worker_is_taken_over_by_lease_expiry_on_the_cluster(
    cluster: Cluster, queue_url: str, tmp_path: Path
) -> None:
    manifest = resolve_partitions(queue_url, 2)
    assert manifest is not None
    up = start_up(
        tmp_path, "up", "--log", queue_url, "--dir", str(tmp_path / "run"),
        "--workers", "4", "--tasks", "40", "--work-ms", "300", "--lease", "4",
        "--exit-when-drained", "--no-restart",
    )  # fmt: skip
    try:
        where = partition_location(queue_url, 0, 2)
        held = wait_until(lambda: _held(where), 90, "a worker of partition 0 to hold a task")
        assert isinstance(held, tuple)
        task, pid = held
        os.kill(pid, signal.SIGKILL)
        assert up.wait(180) == 0, (tmp_path / "up.err").read_text()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    body = _report(tmp_path, queue_url)
    assert body["ok"] and body["tasks_done"] == 40
    parts = body["per_partition"]
    assert isinstance(parts, list)
    takeover = next(t for t in parts[0]["takeovers"] if t["task"] == task)
    assert f"-{pid}-" in takeover["victim"] and f"-{pid}-" not in takeover["new_holder"]
    assert takeover["gap_after_expiry"] >= 0


@pytest.mark.slow  # make test runs the cluster once, through its retention test
def test_a_node_restarted_with_kill_9_loses_nothing(
    cluster: Cluster, queue_url: str, tmp_path: Path
) -> None:
    # A node's outage lasts while the other partitions are watched, then its restart and the
    # cluster's agreement that it is back: retries long enough to ride that out (docs/redis.md)
    queue_url += "&retries=20"
    manifest = resolve_partitions(queue_url, 3)
    assert manifest is not None
    up = start_up(
        tmp_path, "up", "--log", queue_url, "--dir", str(tmp_path / "run"),
        "--workers", "3", "--tasks", "300", "--work-ms", "60", "--exit-when-drained",
    )  # fmt: skip
    try:
        where = partition_location(queue_url, 1, 3)
        wait_until(lambda: _held(where), 90, "a worker of partition 1 to hold a task")
        victim = cluster.node_of(f"{_prefix(where)}:qw:claims")
        others = [
            partition_location(queue_url, k, 3)
            for k in (0, 2)
            if cluster.node_of(f"{_prefix(partition_location(queue_url, k, 3))}:qw:claims")
            is not victim
        ]
        assert others  # the partitions are spread: some live on another node
        victim.kill()  # kill -9 the node that holds partition 1, mid-drain
        # While it is down, the partitions of the other nodes go on being worked.
        before = sum(_done(o) for o in others)
        wait_until(lambda: sum(_done(o) for o in others) > before, 60, "other partitions")
        victim.start(cluster.binary)  # the same config and AOF: its slots and data return
        wait_until(cluster.ok, 60, "the cluster to be ok again")
        assert up.wait(240) == 0, (tmp_path / "up.err").read_text()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    body = _report(tmp_path, queue_url)
    assert body["ok"], body["verdict"]
    assert body["tasks_published"] == body["tasks_done"] == 300


def test_a_bad_cluster_parameter_is_one_line_before_anything_connects(tmp_path: Path) -> None:
    result = qw("enqueue", "--log", "redis://127.0.0.1:1/0?cluster=maybe", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        "cluster='maybe' in redis://127.0.0.1:1/0?cluster=maybe: expected yes or no"
    )


@pytest.mark.slow  # make test runs the cluster once, through its retention test
def test_members_on_the_cluster_rebalance_after_a_kill_9(
    cluster: Cluster, queue_url: str, tmp_path: Path
) -> None:
    import psutil

    from queue_worker.partitions.member import read_assignment
    from queue_worker.partitions.report import load_partitioned_report

    manifest = resolve_partitions(queue_url, 3)
    assert manifest is not None
    common = ["--log", queue_url, "--rebalance", "--work-ms", "100", "--lease", "4",
              "--exit-when-drained"]  # fmt: skip
    from queue_worker.partitions.queue import PartitionedQueue

    with PartitionedQueue(queue_url, manifest) as queue:  # before any member: none drains early
        queue.enqueue_many([{"n": n} for n in range(120)])
    a = start_up(tmp_path, "a", *common, "--dir", str(tmp_path / "a"), "--workers", "1",
                 "--host-name", "a")  # fmt: skip
    b = start_up(tmp_path, "b", *common, "--dir", str(tmp_path / "b"), "--workers", "2",
                 "--host-name", "b")  # fmt: skip
    try:
        wait_until(lambda: len(read_assignment(queue_url, manifest)) == 3, 90, "three members")

        def a_b_member_holding() -> int | None:
            mine = {
                p.pid
                for p in psutil.Process(b.pid).children()
                if "queue_worker.partitions.member" in " ".join(p.cmdline())
            }
            for k in range(3):
                held = _held(partition_location(queue_url, k, 3))
                if held is not None and held[1] in mine:
                    return held[1]
            return None

        victim = wait_until(a_b_member_holding, 90, "a member of b to hold a task")
        assert isinstance(victim, int)
        os.kill(victim, signal.SIGKILL)
        assert a.wait(240) == 0, (tmp_path / "a.err").read_text()
        assert b.wait(240) == 0, (tmp_path / "b.err").read_text()
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    report = load_partitioned_report(queue_url, manifest)
    assert report.ok and report.tasks_done == 120, report.verdict
    takeovers = [
        t for r in report.partitions for t in r.takeovers if int(t.victim.split("-")[-2]) == victim
    ]
    assert takeovers, "the killed member held a task: it must have been taken over"
    assert all(t.gap_after_expiry >= 0 for t in takeovers)


# covered in make test by the cluster's trim: test_members_trim's cluster test
@pytest.mark.slow
def test_retention_trims_each_partition_on_the_cluster(queue_url: str, tmp_path: Path) -> None:
    """`qw compact --log` on a partitioned queue of the cluster: each partition's checkpoint
    key, start key and streams share its hash tag (one slot), so the trim script and the
    checkpoint work there as on one server, and the report still adds up."""
    from tests.test_redis_compaction import fold, make_queue, starts

    resolve_partitions(queue_url, 2, create=True)
    where = [partition_location(queue_url, k, 2) for k in range(2)]
    for location in where:
        make_queue(location, done=40, pending=5)
    before = [fold(location) for location in where]
    result = qw(
        "compact", "--log", queue_url, "--retention", "0", "--retention-bytes", "0", cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line for line in result.stdout.splitlines() if "claims: trimmed" in line] == [
        line for line in result.stdout.splitlines() if "claims:" in line
    ]
    for location, folded in zip(where, before, strict=True):
        assert fold(location) == folded
        assert all(start > 0 for start in starts(location))
    body = _report(tmp_path, queue_url)
    assert body["ok"] is True
