"""A partitioned queue's layout (docs/protocol.md §9): what makes a data directory one queue,
and every command's refusal, before it creates anything, of one that is not.

The attacks of tests/attacks/partition_damage.py (run by tests/test_attacks.py) run every
command on a removed manifest, partition and claims log; these are the other cases."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from queue_worker.partition_layout import PartitionError, read_manifest
from queue_worker.partitions.queue import PartitionedQueue, resolve_partitions
from queue_worker.producer import Queue
from tests.attacks.partition_damage import tree_fingerprint
from tests.helpers import wait_until
from tests.test_cli import QW, qw


def _refused(data: Path, *args: str, words: str, cwd: Path) -> None:
    """`qw ARGS --dir DATA` exits 2 with one line saying `words`, and writes nothing."""
    before = tree_fingerprint(data)
    result = qw(*args, "--dir", str(data), cwd=cwd)
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.splitlines()) == 1 and words in result.stderr, result.stderr
    assert tree_fingerprint(data) == before


def test_a_removed_manifest_is_refused_even_when_asked_for_the_same_count(
    tmp_path: Path,
) -> None:
    data = tmp_path / "parts"
    manifest = resolve_partitions(data, 3)
    assert manifest is not None
    with PartitionedQueue(data, manifest) as queue:
        queue.enqueue_many([{"n": n} for n in range(9)])
    (data / "partitions").unlink()
    words = "holds partition directories (p0, p1, p2) but no partitions manifest"
    _refused(data, "up", "--no-tui", "--partitions", "3", "--workers", "3", words=words,
             cwd=tmp_path)  # fmt: skip
    with pytest.raises(PartitionError, match="no partitions manifest"):
        Queue(data)  # the library's producer too: no queue made at the top


@pytest.mark.parametrize("damage", ["a partition the manifest does not name", "a log at the top"])
def test_a_manifest_that_disagrees_with_the_directory_is_refused(
    tmp_path: Path, damage: str
) -> None:
    data, other = tmp_path / "parts", tmp_path / "other"
    resolve_partitions(data, 2)
    if damage == "a log at the top":
        with Queue(other) as queue:
            queue.enqueue({"n": 0})
        shutil.copy(other / "tasks.log", data / "tasks.log")
        words = f"{data / 'tasks.log'} is beside {data / 'partitions'}"
    else:
        resolve_partitions(other, 3)
        shutil.copytree(other / "p2", data / "p2")
        words = f"{data / 'p2'} holds logs but {data / 'partitions'} names 2 partitions"
    for command in (["report"], ["enqueue", "--count", "1"], ["status"]):
        _refused(data, *command, words=words, cwd=tmp_path)


def test_an_enqueue_checks_every_partition_before_it_appends_to_any(tmp_path: Path) -> None:
    data, other = tmp_path / "parts", tmp_path / "other"
    manifest = resolve_partitions(data, 2)
    resolve_partitions(other, 2)
    shutil.rmtree(data / "p1")
    shutil.copytree(other / "p1", data / "p1")  # another queue's partition, named alike
    assert manifest is not None
    with PartitionedQueue(data, manifest) as queue, pytest.raises(PartitionError, match="p1"):
        queue.enqueue_many([{"n": 0}, {"n": 1}])
    assert (data / "p0" / "tasks.log").stat().st_size == 48  # partition 0 was not written


def test_a_reader_waits_for_a_creator_between_partitions_and_manifest(tmp_path: Path) -> None:
    """A creator holds the directory's lock from its first partition to its manifest; a
    command meeting the partitions alone waits for it rather than refuse the queue."""
    from logstore.locking import directory_lock

    data, made = tmp_path / "parts", tmp_path / "made"
    resolve_partitions(made, 2)
    data.mkdir()
    with directory_lock(str(data)):  # as a creator: the partitions now, the manifest later
        for k in range(2):
            shutil.copytree(made / f"p{k}", data / f"p{k}")
        report = subprocess.Popen(
            [*QW, "report", "--dir", str(data)], cwd=tmp_path, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        inode = f":{data.stat().st_ino} "
        wait_until(
            lambda: any(
                line.split()[1:6:4] == ["->", str(report.pid)] and inode in line  # waits
                for line in Path("/proc/locks").read_text().splitlines()
            ),
            what="qw report waiting on the directory's lock",
        )
        shutil.copy(made / "partitions", data / "partitions")
    out, err = report.communicate(timeout=60)
    assert report.returncode == 0, out + err
    assert "2 partitions" in out
    assert read_manifest(data) == read_manifest(made)


def test_a_refused_up_creates_no_queue(tmp_path: Path) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    with busy:
        port = str(busy.getsockname()[1])
        for args, words in (
            (["--workers", "2"], "--workers 2: 2 workers for 4 partitions"),
            (["--workers", "4", "--http", port], f"--http {port}: not an address"),
        ):
            data = tmp_path / "p"
            result = qw("up", "--no-tui", "--dir", str(data), "--partitions", "4", *args,
                        cwd=tmp_path)  # fmt: skip
            assert result.returncode == 2 and words in result.stderr, result.stderr
            assert not data.exists()


@pytest.mark.parametrize(
    "args", [["--dir", ""], ["--dir="], ["-d", ""]], ids=["--dir ''", "--dir=", "-d ''"]
)
def test_an_empty_data_directory_is_refused(tmp_path: Path, args: list[str]) -> None:
    for command in (["enqueue"], ["status"], ["report"], ["demo", "pause"]):
        result = qw(*command, *args, cwd=tmp_path)
        assert result.returncode == 2, (command, result.stderr)
        assert "got ''; expected a data directory" in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []
