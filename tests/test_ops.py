"""The ops topic: its records, and the supervisor writing them when it kills, pauses,
resumes, restarts, and sees a worker die (real processes, a real kill -9)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

from queue_worker.names import worker_label
from queue_worker.ops import (
    DEATH,
    KILL,
    PAUSE,
    RESTART,
    RESUME,
    OpRecord,
    decode_op,
    encode_op,
    read_ops,
)
from queue_worker.protocol.records import RecordDecodeError, RecordEncodeError
from supervisor.run.supervisor import Supervisor, SupervisorOptions
from tests.helpers import wait_until


def test_a_record_survives_the_round_trip() -> None:
    for record in (
        OpRecord(KILL, 1_700_000_000_000_000, "w6", "w6-6975-4ede", 6975, 12, "operator", "x"),
        OpRecord(RESTART, 1, "w0", None, None, None, "supervisor"),
    ):
        assert decode_op(encode_op(record)) == record


@pytest.mark.parametrize(
    "items",
    [
        [1, "O", "kill", 1, "w0", None, None, None, "operator"],  # a field short
        [1, "C", "kill", 1, "w0", None, None, None, "operator", ""],  # not an ops record
        [0, "O", "kill", 1, "w0", None, None, None, "operator", ""],
        [1, "O", "kill", True, "w0", None, None, None, "operator", ""],  # a bool for `at`
        [1, "O", "kill", 1, "w0", 5, None, None, "operator", ""],  # an int for the id
        {"kill": 1},
        "kill",
    ],
)
def test_malformed_records_raise_the_decode_error_only(items: object) -> None:
    with pytest.raises(RecordDecodeError):
        decode_op(msgpack.packb(items))


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x92\x01", bytes(range(40))])
def test_garbage_raises_the_decode_error_only(data: bytes) -> None:
    with pytest.raises(RecordDecodeError):
        decode_op(data)


def test_encoding_refuses_a_field_of_the_wrong_type() -> None:
    with pytest.raises(RecordEncodeError, match="'pid'"):
        encode_op(OpRecord(KILL, 1, "w0", None, "12", None, "operator"))  # type: ignore[arg-type]


def test_reading_a_directory_without_an_ops_log_creates_nothing(tmp_path: Path) -> None:
    assert read_ops(tmp_path) == ([], 0)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    data = tmp_path / "qw"
    sup = Supervisor(
        SupervisorOptions(data_dir=data, location=str(data), workers=2, work_ms=300, rate=20.0)
    )
    yield sup
    if sup.started_at and not sup.finished:
        sup.stop_now()
        sup.wait(30)


def test_the_supervisor_records_pause_resume_kill_death_and_restart(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    sup = supervisor
    sup.start()
    wait_until(lambda: all(w.worker_id for w in sup.snapshot().workers), 30, "worker ids")
    assert sup.toggle_pause(0) is not None
    assert sup.toggle_pause(0) is not None
    text = wait_until(sup.kill_a_holder, 30, "a worker holding a task")
    assert isinstance(text, str)
    slot = int(text.split()[2].split("·")[0][1:])  # "kill -9 w1·4711, holding task 7"
    wait_until(lambda: sup.snapshot().workers[slot].restarts == 1, 30, "the restart")
    sup.drain()
    assert sup.wait(30)

    ops, malformed = read_ops(tmp_path / "qw")
    assert malformed == 0
    assert [op.kind for op in ops] == [PAUSE, RESUME, KILL, DEATH, RESTART]
    pause, resume, kill, death, restart = ops
    assert pause.name == resume.name == "w0" and pause.worker is not None
    assert kill.task is not None  # it was killed because it held one
    assert death.worker == kill.worker and death.pid == kill.pid
    assert (death.detail, death.by, death.task) == ("killed by SIGKILL", "supervisor", kill.task)
    assert restart.name == kill.name and restart.pid != kill.pid
    assert restart.detail == f"was {worker_label(kill.worker or '')}"
    assert not (tmp_path / "qw" / "claims.log").read_bytes().count(b"kill")  # never there


def test_qw_why_cites_the_ops_of_a_process_while_it_held_the_task() -> None:
    from queue_worker.proof.explain import explain_task
    from queue_worker.protocol.records import Claim, ClaimsRecord, Done

    a, b, lease = "w1-1001-aaaa", "w2-1002-bbbb", 1_000_000
    claims: list[tuple[int, ClaimsRecord]] = [
        (10, Claim(0, a, 0, lease)),
        (20, Claim(0, b, 2_000_000, lease)),  # a takeover: a's lease lapsed at 1 s
        (30, Done(0, b, 2_500_000, 20)),
        (40, Done(0, a, 3_000_000, 10)),  # a, resumed, writes a stale DONE
    ]
    ops = [
        OpRecord(PAUSE, 500_000, "w1", None, 1001, None, "operator", "SIGSTOP"),  # by pid
        OpRecord(RESUME, 2_800_000, "w1", a, 1001, None, "operator", "SIGCONT"),
        OpRecord(KILL, 2_600_000, "w2", b, 1002, None, "operator"),  # b no longer held it
        OpRecord(KILL, 100, "w9", "w9-9-zz", 9, 0, "operator"),  # another process
    ]
    story = explain_task(0, None, claims, ops)
    cited = [(s.kind, s.position, s.why) for s in story.steps]
    assert [(k, p) for k, p, _ in cited] == [
        ("CLAIM", 10),
        ("OP", 10),
        ("CLAIM", 20),
        ("DONE", 30),
        ("OP", 10),
        ("DONE", 40),
    ]
    assert cited[1][2].startswith("w1·1001 paused by the operator at ")
    assert cited[1][2].endswith(", holding this task")
    assert cited[4][2].endswith("after losing this task (claim @10)")


def test_the_ops_topic_is_a_stream_of_its_own_on_redis(redis_url: str) -> None:
    import redis

    from supervisor.run.ops_recorder import OpsRecorder, ProcessRef

    recorder = OpsRecorder(redis_url)
    recorder.paused(ProcessRef("w0", "w0-10-abcd", 10), 4)
    recorder.close()
    assert recorder.last_error is None
    ops, malformed = read_ops(redis_url)
    assert malformed == 0
    assert [(op.kind, op.task, op.worker) for op in ops] == [(PAUSE, 4, "w0-10-abcd")]
    client = redis.Redis.from_url(redis_url)
    try:
        # the ops stream, beside the queue's identity (logstore.identity) and its verdict
        # mode, recorded with it (logstore.redis.verdict_mode): no other topic
        assert sorted(client.keys("*")) == [b"qw:ops", b"qw:queue", b"qw:queue:verdicts"]
    finally:
        client.close()
