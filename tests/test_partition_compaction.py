"""A partitioned `qw up` compacts every partition as it runs, as `qw up` compacts a queue:
`--partitions` (a supervisor per partition, each with its compactor) and `--rebalance`
(members; the supervisor runs a compactor per partition), on the file log and on Redis.
With a retention of nothing, each partition's settled history is removed while the run
lives, and `qw report` still proves every task done exactly once.

The run is stopped only once every task is done and every partition's logs start later
(a condition with a deadline): a partition may drain before its compactor's first round,
and a run that ended when drained would then leave that partition uncompacted."""

from __future__ import annotations

from pathlib import Path

import pytest

from queue_worker.compaction.settled import Retention
from queue_worker.partition_layout import partition_location
from queue_worker.partitions.queue import resolve_partitions
from queue_worker.topics import open_topics
from supervisor.partitioned.members import MemberSupervisor
from supervisor.partitioned.run import PartitionedSupervisor
from supervisor.run.supervisor import SupervisorOptions
from tests.helpers import wait_until
from tests.test_cli import qw

PARTITIONS = 2
TASKS = 600
#: small segments (file log): a few hundred tasks fill many, so there is history to remove
SEGMENT_BYTES = 4096


def run(data: Path, location: str, form: str) -> list[str]:
    """Run a partitioned `qw up` (as `form`) until drained; the events it said."""
    manifest = resolve_partitions(location, PARTITIONS)
    assert manifest is not None
    options = SupervisorOptions(
        data_dir=data,
        location=location,
        workers=PARTITIONS,
        work_ms=0,
        tasks=TASKS,
        segment_bytes=SEGMENT_BYTES,
        retention=Retention(seconds=0, bytes=0),
        compact_every_s=0.2,
    )
    sup = (
        MemberSupervisor(options, manifest)
        if form == "rebalance"
        else PartitionedSupervisor(options, manifest)
    )
    sup.start()
    try:
        wait_until(lambda: drained_and_compacted(sup, location), 240, "drained and compacted")
        sup.request_stop()  # the workers are idle: they leave, and the run ends with 0
        assert sup.wait(60), "the run did not end after the stop"
    finally:
        sup.stop_now()
        sup.wait(30)
    assert sup.exit_code == 0, sup.log_failure
    if isinstance(sup, MemberSupervisor):
        return [e.text for e in sup.recent]
    return [f"p{k} {e.text}" for k, part in enumerate(sup.parts) for e in part.snapshot().events]


def drained_and_compacted(sup: MemberSupervisor | PartitionedSupervisor, location: str) -> bool:
    """Every task done, and every partition's two logs start after their first record."""
    if sum(queue.done for queue in sup.partition_queues()) < TASKS:
        return False
    return all(starts_later(partition_location(location, k, PARTITIONS)) for k in range(PARTITIONS))


def starts_later(location: str) -> bool:
    tasks_log, claims_log = open_topics(location)
    with tasks_log, claims_log:
        return tasks_log.start > 0 and claims_log.start > 0


def check(location: str, events: list[str], where: str, cwd: Path) -> None:
    for k in range(PARTITIONS):
        # settled history removed from each partition while it ran (its logs start later)
        assert starts_later(partition_location(location, k, PARTITIONS)), (k, events)
        assert any(e.startswith(f"p{k} compacted: ") for e in events), events
    assert not [e for e in events if "compaction skipped" in e], events
    report = qw("report", where, location, cwd=cwd, timeout=120)
    assert report.returncode == 0, report.stdout + report.stderr
    done = f"({TASKS} done in {PARTITIONS} partitions), none was worked twice"
    assert done in report.stdout, report.stdout


@pytest.mark.parametrize("form", ["partitions", "rebalance"])
def test_a_partitioned_qw_up_compacts_each_partition_on_the_file_log(
    tmp_path: Path, form: str
) -> None:
    data = tmp_path / "qw"
    events = run(data, str(data), form)
    check(str(data), events, "--dir", tmp_path)
    for k in range(PARTITIONS):  # the first segments are gone from the disk
        claims = sorted((data / f"p{k}").glob("claims.*.seg"))
        # (a segment's name is its base: the first one written is 0; a segment ends where a
        # record crosses SEGMENT_BYTES, so the bases are not multiples of it)
        assert int(claims[0].name.split(".")[1]) > 0, (k, [p.name for p in claims])


@pytest.mark.parametrize("form", ["partitions", "rebalance"])
def test_a_partitioned_qw_up_compacts_each_partition_on_redis(
    redis_url: str, tmp_path: Path, form: str
) -> None:
    events = run(tmp_path / "run", redis_url, form)
    check(redis_url, events, "--log", tmp_path)
