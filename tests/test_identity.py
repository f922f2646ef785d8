"""A log set knows its identity: logs of another queue, swapped logs, a tasks log cut short,
a directory in place of a log, and logs of the old format are refused in one line (exit 2),
never folded. Each test is an attack that once passed silently (issue 15)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from logstore import ForeignFileError, IdentityError, LogError, open_log
from logstore.file.framing import FILE_HEADER_SIZE, FRAME_HEADER_SIZE
from logstore.file.log import FileLog
from queue_worker.producer import Queue
from queue_worker.topics import CLAIMS_TOPIC, TASKS_TOPIC, open_topic, open_topics

QW = [sys.executable, "-m", "supervisor.cli.app"]


def qw(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QW, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def drained_queue(cwd: Path, name: str, tasks: int = 5) -> Path:
    """A data directory where `qw up` ran `tasks` tasks to the end."""
    data = cwd / name
    result = qw(
        "up",
        "--no-tui",
        "--exit-when-drained",
        "--dir",
        str(data),
        "--tasks",
        str(tasks),
        "--workers",
        "1",
        "--work-ms",
        "1",
        cwd=cwd,
    )
    assert result.returncode == 0, result.stderr
    return data


@pytest.fixture(scope="module")
def two_queues(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    cwd = tmp_path_factory.mktemp("queues")
    return drained_queue(cwd, "a", 5), drained_queue(cwd, "b", 7)


def copy_queue(source: Path, to: Path) -> Path:
    shutil.copytree(source, to)
    return to


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


# -- the queue's logs share one identity ------------------------------------------------------


def test_a_new_queue_creates_every_log_with_one_queue_id_and_its_own_topic(
    data_dir: Path,
) -> None:
    with Queue(data_dir) as queue:
        queue.enqueue({"n": 1})
    tasks = FileLog.open(data_dir / "tasks.log", read_only=True)
    claims = FileLog.open(data_dir / "claims.log", read_only=True)
    with tasks, claims:
        assert tasks.identity.topic == "tasks"
        assert claims.identity.topic == "claims"
        assert tasks.identity.queue == claims.identity.queue
        assert len(tasks.identity.queue) == 16
    # and another queue gets another id
    other = data_dir.parent / "other"
    with open_topic(other, TASKS_TOPIC) as log:
        assert isinstance(log, FileLog)
        assert log.identity.queue != tasks.identity.queue


def test_another_queues_claims_log_is_refused_by_report_and_up(
    two_queues: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = two_queues
    mixed = copy_queue(a, tmp_path / "mixed")
    shutil.copy(b / "claims.log", mixed / "claims.log")
    for args in (["report"], ["up", "--no-tui", "--exit-when-drained", "--workers", "1"]):
        line = one_error_line(qw(*args, "--dir", str(mixed), cwd=tmp_path))
        assert f"{mixed}/" in line
        assert "logs of two queues" in line or "another queue" in line
    with pytest.raises(IdentityError):
        open_topics(mixed)


def test_another_queues_tasks_log_is_refused(two_queues: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_queues
    mixed = copy_queue(a, tmp_path / "mixed")
    shutil.copy(b / "tasks.log", mixed / "tasks.log")
    line = one_error_line(qw("report", "--dir", str(mixed), cwd=tmp_path))
    assert "logs of two queues" in line
    line = one_error_line(qw("enqueue", "--count", "1", "--dir", str(mixed), cwd=tmp_path))
    assert "logs of two queues" in line


def test_swapped_logs_are_refused_naming_the_topic_mismatch(
    two_queues: tuple[Path, Path], tmp_path: Path
) -> None:
    a, _ = two_queues
    swapped = copy_queue(a, tmp_path / "swapped")
    os.rename(swapped / "tasks.log", swapped / "x")
    os.rename(swapped / "claims.log", swapped / "tasks.log")
    os.rename(swapped / "x", swapped / "claims.log")
    before = (swapped / "tasks.log").read_bytes()
    for args in (["report"], ["up", "--no-tui", "--exit-when-drained", "--workers", "1"]):
        line = one_error_line(qw(*args, "--dir", str(swapped), cwd=tmp_path))
        assert f"{swapped}/tasks.log is the 'claims' log, not the 'tasks' log" in line
    assert (swapped / "tasks.log").read_bytes() == before  # nothing appended anywhere


def test_a_tasks_log_cut_short_is_refused_by_enqueue_and_report(
    two_queues: tuple[Path, Path], tmp_path: Path
) -> None:
    a, _ = two_queues
    cut = copy_queue(a, tmp_path / "cut")
    os.truncate(cut / "tasks.log", FILE_HEADER_SIZE)  # header kept: a valid, empty tasks log
    line = one_error_line(qw("enqueue", "--count", "3", "--dir", str(cut), cwd=tmp_path))
    assert f"{cut}/tasks.log is {FILE_HEADER_SIZE} bytes, shorter than" in line
    assert "cut short" in line
    line = one_error_line(qw("report", "--dir", str(cut), cwd=tmp_path))
    assert "cut short" in line
    assert os.path.getsize(cut / "tasks.log") == FILE_HEADER_SIZE  # nothing enqueued


def test_a_tasks_log_cut_short_without_its_sync_file_is_still_refused_by_report_and_up(
    two_queues: tuple[Path, Path], tmp_path: Path
) -> None:
    """The synced offset gone too: the claims fold closes task 4, the tasks log has none."""
    a, _ = two_queues
    cut = copy_queue(a, tmp_path / "cut")
    (cut / "tasks.log.sync").unlink()
    os.truncate(cut / "tasks.log", FILE_HEADER_SIZE)
    line = one_error_line(qw("report", "--dir", str(cut), cwd=tmp_path))
    assert "holds 0 tasks, but its claims log closed task 4" in line
    line = one_error_line(
        qw(
            "up",
            "--no-tui",
            "--exit-when-drained",
            "--workers",
            "1",
            "--dir",
            str(cut),
            cwd=tmp_path,
        )
    )
    assert f"{cut}/tasks.log holds 0 tasks, but {cut}/claims.log closed task 4" in line


def test_a_directory_in_place_of_a_log_is_refused(
    two_queues: tuple[Path, Path], tmp_path: Path
) -> None:
    a, _ = two_queues
    broken = copy_queue(a, tmp_path / "broken")
    (broken / "claims.log").unlink()
    (broken / "claims.log").mkdir()
    for args in (["report"], ["status"], ["tail"]):
        line = one_error_line(qw(*args, "--dir", str(broken), cwd=tmp_path))
        assert f"{broken}/claims.log is not a log file" in line


def test_a_missing_claims_log_beside_a_tasks_log_is_not_a_queue_to_report(
    two_queues: tuple[Path, Path], tmp_path: Path
) -> None:
    a, _ = two_queues
    half = copy_queue(a, tmp_path / "half")
    (half / "claims.log").unlink()
    line = one_error_line(qw("report", "--dir", str(half), cwd=tmp_path))
    assert f"{half}/claims.log: no such log" in line


def test_a_log_of_the_old_format_is_refused_naming_both_versions(data_dir: Path) -> None:
    old = data_dir / "claims.log"
    # a version-1 header (16 bytes: no identity) and one frame
    import struct
    import zlib

    body = struct.pack("<5sBHI", b"QWLOG", 1, 0, 16 << 20)
    old.write_bytes(body + struct.pack("<I", zlib.crc32(body)) + bytes(FRAME_HEADER_SIZE))
    with pytest.raises(ForeignFileError) as info:
        open_topic(data_dir, CLAIMS_TOPIC)
    assert str(info.value) == (
        f"{old}: qw log format version 1 (a log without a queue identity, from an older qw); "
        "this code reads version 2"
    )
    result = qw("report", "--dir", str(data_dir), cwd=data_dir.parent)
    assert "format version 1" in one_error_line(result)


def test_a_raw_open_log_adopts_the_directorys_queue(data_dir: Path) -> None:
    """`open_log` without a family: the queue is whatever qw logs the directory holds."""
    with open_log(data_dir, "tasks") as tasks, open_log(data_dir, "claims") as claims:
        assert isinstance(tasks, FileLog) and isinstance(claims, FileLog)
        assert tasks.identity.queue == claims.identity.queue
    (data_dir / "notes.log").write_text("a file of the user's, not a qw log\n")
    with open_topic(data_dir, TASKS_TOPIC):
        pass  # ignored: it is not a qw log


def test_read_only_open_of_a_missing_queue_creates_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LogError, match="no such log"):
        open_topics(empty, read_only=True)
    assert list(empty.iterdir()) == []
    with pytest.raises(LogError, match="no such data directory"):
        open_topic(tmp_path / "absent", TASKS_TOPIC, read_only=True)
    assert not (tmp_path / "absent").exists()


def test_a_worker_refuses_a_claims_log_that_closed_tasks_the_tasks_log_lacks(
    two_queues: tuple[Path, Path], tmp_path: Path
) -> None:
    """The worker's own start-up check (a worker started without a supervisor's check)."""
    from queue_worker.worker.config import WorkerConfig
    from queue_worker.worker.loop import Worker

    a, _ = two_queues
    cut = copy_queue(a, tmp_path / "cut")
    (cut / "tasks.log.sync").unlink()
    (cut / "fold.checkpoint").unlink(missing_ok=True)
    os.truncate(cut / "tasks.log", FILE_HEADER_SIZE)
    claims_before = (cut / "claims.log").read_bytes()
    config = WorkerConfig(str(cut), str(tmp_path / "run"), name="w0", exit_when_drained=True)
    with (
        Worker(config, handler=lambda payload: None) as worker,
        pytest.raises(IdentityError, match=r"holds 0 tasks, but .*closed task 4"),
    ):
        worker.run()
    assert (cut / "claims.log").read_bytes() == claims_before  # no CLAIM appended
