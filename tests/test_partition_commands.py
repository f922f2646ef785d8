"""`qw status`, `qw tail` and `qw timeline` on a partitioned queue: each partition's
counts, workers and held tasks with the totals; every partition's records in one tail,
tasks named k:id; a timeline section per partition."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from queue_worker.names import worker_label
from queue_worker.partition_layout import partition_location
from queue_worker.proof.report import read_claims
from queue_worker.protocol.records import Unknown
from tests.helpers import wait_until
from tests.test_cli import qw, start_up


def _status(data: Path, tmp_path: Path) -> dict[str, Any]:
    result = qw("status", "--json", "--dir", str(data), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    body: dict[str, Any] = json.loads(result.stdout)
    return body


def test_status_gives_each_partition_its_workers_and_held_tasks_and_the_totals(
    tmp_path: Path,
) -> None:
    data = tmp_path / "qw"
    up = start_up(
        tmp_path, "up", "--dir", str(data), "--partitions", "2", "--workers", "4",
        "--tasks", "20", "--work-ms", "60000", "--lease", "60", "--http", "0",
    )  # fmt: skip
    try:
        wait_until(lambda: (data / "partitions").exists(), 60, "the partitioned queue")

        def all_holding() -> dict[str, Any] | None:
            body = _status(data, tmp_path)
            held = sum(len(p["held"]) for p in body["partitions"])
            running = sum(len(p["workers"]) for p in body["partitions"])
            return body if held == 4 and running == 4 else None

        body = wait_until(all_holding, 60, "four workers, each holding a task")
        assert isinstance(body, dict)
        assert body["partitioned"] is True and body["partitions_count"] == 2
        parts = body["partitions"]
        assert [p["queue"]["published"] for p in parts] == [10, 10]
        for key in ("published", "pending", "held", "done"):
            assert body["queue"][key] == sum(p["queue"][key] for p in parts), key
        for p in parts:
            k = p["partition"]
            assert p["location"] == str(data / f"p{k}")
            assert len(p["workers"]) == 2  # two workers on each partition
            assert all(h["task"].startswith(f"{k}:") for h in p["held"]), p["held"]
            holders = {h["worker"] for h in p["held"]}
            assert holders == {w["worker"] for w in p["workers"]}
        assert len(body["supervisors"]) == 2  # one per partition's run directory

        text = qw("status", "--dir", str(data), cwd=tmp_path)
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert lines[0] == f"qw on {data} · 2 partitions"
        header = next(i for i, line in enumerate(lines) if line.startswith("partition "))
        assert lines[header].split() == [
            "partition", "published", "pending", "held", "done", "dead", "failed", "workers",
        ]  # fmt: skip
        assert lines[header + 1].split() == ["p0", "10", "8", "2", "0", "0", "0", "2", "running"]
        assert lines[header + 2].split() == ["p1", "10", "8", "2", "0", "0", "0", "2", "running"]
        assert lines[header + 3].split() == [
            "total",
            "20",
            "16",
            "4",
            "0",
            "0",
            "0",
            "4",
            "running",
        ]
        held = [line for line in lines if line.startswith("  held: ")]
        assert len(held) == 4
        assert all(re.match(r"  held: task [01]:\d+ by w\d·\d+ \(lease until ", h) for h in held)
        # the one qw up: one supervisor (its partitions' status files are one process)
        address = re.search(r"qw: stats on http://(\S+)/stats", (tmp_path / "up.err").read_text())
        assert address is not None
        assert lines[1:3] == [
            "supervisors  1 running",
            f"  pid {up.pid}  4 workers alive  2 partitions  http {address.group(1)}",
        ], lines

        # drains: the workers finish their minute-long tasks, so every partition's
        # supervisor is still draining (the second SIGTERM, below, kills them)
        up.send_signal(signal.SIGTERM)

        def draining() -> list[str] | None:
            text = qw("status", "--dir", str(data), cwd=tmp_path).stdout.splitlines()
            return text if text[2].endswith("  draining") else None

        drained = wait_until(draining, 30, "qw status to say the supervisor drains")
        assert isinstance(drained, list)
        assert (
            drained[2]
            == f"  pid {up.pid}  4 workers alive  2 partitions  http {address.group(1)}  draining"
        )
    finally:
        up.send_signal(signal.SIGTERM)
        up.send_signal(signal.SIGTERM)  # the second stops the workers now
        up.wait(60)


# covered in make test by K:ID names: test_partitions's qw task and why
@pytest.mark.slow
def test_tail_prints_every_partitions_records_named_k_id(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    result = qw(
        "up", "--no-tui", "--dir", str(data), "--partitions", "3", "--workers", "3",
        "--tasks", "30", "--work-ms", "1", "--exit-when-drained", cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = sum(len(list(read_claims(partition_location(data, k, 3)))) for k in range(3))
    tail = qw("tail", "-n", "100000", "--dir", str(data), cwd=tmp_path)
    assert tail.returncode == 0, tail.stderr
    lines = tail.stdout.splitlines()
    assert len(lines) == records
    done = 0
    for line in lines:
        found = re.match(r"p(\d) @\d+  \S+  (\w+)\s+task (\d):\d+  by w\d·\d+  .* → (\w+)", line)
        assert found is not None, line
        assert found.group(1) == found.group(3), line  # a partition's records name its tasks
        done += found.group(2) == "DONE" and found.group(4) == "done"
    assert done == 30
    last = qw("tail", "-n", "5", "--dir", str(data), cwd=tmp_path)
    assert last.stdout.splitlines() == lines[-5:]
    tasks = qw("tail", "--topic", "tasks", "-n", "100", "--dir", str(data), cwd=tmp_path)
    names = re.findall(r"^p(\d) #(\d):(\d+)  @", tasks.stdout, re.MULTILINE)
    assert len(names) == 30 and all(p == k for p, k, _ in names)
    assert sorted((int(k), int(t)) for _, k, t in names) == [
        (k, t) for k in range(3) for t in range(10)
    ]


# make test runs the same path in
# test_status_gives_each_partition_its_workers_and_held_tasks_and_the_totals
@pytest.mark.slow
def test_timeline_draws_a_section_per_partition(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    result = qw(
        "up", "--no-tui", "--dir", str(data), "--partitions", "2", "--workers", "2",
        "--tasks", "20", "--work-ms", "1", "--exit-when-drained", cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    workers = {
        k: {
            r.worker
            for _, r in read_claims(partition_location(data, k, 2))
            if not isinstance(r, Unknown)
        }
        for k in range(2)
    }
    page = tmp_path / "t.html"
    drawn = qw("timeline", "--dir", str(data), "--out", str(page), cwd=tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    assert drawn.stdout.strip() == str(page)
    html = page.read_text()
    assert "a queue of 2 partitions" in html and "<b>20</b> tasks published" in html
    sections = html.split('<h2 id="p')[1:]
    assert [s[0] for s in sections] == ["0", "1"]
    for k, section in enumerate(sections):
        assert "<b>10</b> tasks published" in section
        labels = {worker_label(w) for w in workers[k]}
        others = {worker_label(w) for w in workers[1 - k]}
        assert all(f">{label}<" in section for label in labels), (k, labels)
        assert not any(f">{label}<" in section for label in others), (k, others)

    only = qw("timeline", "--dir", str(data), "--text", "--tasks", "1:0-2", cwd=tmp_path)
    assert only.returncode == 0, only.stderr
    assert only.stdout.startswith("── partition 1 (task n here is 1:n)")
    assert "partition 0" not in only.stdout

    report = qw("report", "--dir", str(data), "--timeline", str(tmp_path / "r.html"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert f"qw: timeline: {tmp_path / 'r.html'}" in report.stderr
    assert '<h2 id="p1">' in (tmp_path / "r.html").read_text()


def test_supervisor_lines_one_wording_for_a_queue_and_a_partitioned_one() -> None:
    """`qw status` says the same of a supervisor on a queue and on a partitioned queue (its
    status files, one per partition, are one process: one line)."""
    from supervisor.cli.supervisor_lines import supervisor_lines

    def status(pid: int, alive: int, **more: Any) -> dict[str, Any]:
        workers = [{"alive": True}] * alive + [{"alive": False}]
        return {"pid": pid, "workers": workers, "http": None, "draining": False, **more}

    one = [status(7, 4, http="127.0.0.1:8321", draining=True), status(9, 1)]
    assert supervisor_lines(one) == [
        "supervisors  2 running",
        "  pid 7  4 workers alive  http 127.0.0.1:8321  draining",
        "  pid 9  1 worker alive",
    ]
    parts = [status(7, 2), status(7, 2, http="127.0.0.1:8321"), status(7, 1, draining=True)]
    assert supervisor_lines(parts) == [
        "supervisors  1 running",
        "  pid 7  5 workers alive  3 partitions  http 127.0.0.1:8321  draining",
    ]
    members = [status(8, 2, rebalance=True)]  # qw up --rebalance: its processes are members
    assert supervisor_lines(members) == ["supervisors  1 running", "  pid 8  2 members alive"]
    assert supervisor_lines([]) == ["supervisors  0 running"]
