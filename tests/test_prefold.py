"""Workers start from the fold the fork server made before it forked them
(queue_worker.worker.inherited, supervisor.run.prefold), and reach the same state as a worker that
folds the logs itself: with records appended between the fold and the worker's start,
after a compaction, after a kill -9; and a fold of other logs is not adopted.

The forks are real (the fork server, its control pipe, the at-fork fold): the child runs
`start_both`, which starts one worker from what it inherited and one from scratch, on the
same logs, and writes what each sees for the test to compare.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from logstore.file.log import FileLog
from queue_worker.compaction.files import compact
from queue_worker.history.checkpoint import save_checkpoint
from queue_worker.protocol.records import Claim, Done, TaskRecord, decode_claims, encode
from queue_worker.protocol.state import ClaimState
from queue_worker.topics import (
    CLAIMS_TOPIC,
    ClaimsFollower,
    TaskIndex,
    open_topic,
    open_topics,
)
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.inherited import Prefold
from queue_worker.worker.loop import Worker
from supervisor.run import prefold
from supervisor.run.forked import ForkedWorker, stop_server
from tests.helpers import wait_until
from tests.test_compaction import EVERYTHING, LEASE, NOW_US, make_queue

REPO = Path(__file__).resolve().parents[1]
PROBE = "probe-1-ffff"


def noop(payload: Any) -> None:
    return None


def hang(payload: Any) -> None:
    """Holds its task until the process is killed."""
    import threading

    threading.Event().wait()


def what_it_sees(worker: Worker) -> dict[str, Any]:
    """The worker's fold after a catch-up, and the verdict a CLAIM of each task it knows
    would get from it now (on a copy: the worker's own fold is left as it is)."""
    worker.catch_up()
    snap = worker.claims.state.snapshot()
    verdicts = []
    for task in range(worker.tasks.known):
        state = ClaimState.restore(snap)
        claim = Claim(task, PROBE, NOW_US + 10**6, LEASE)
        verdicts.append(state.apply(claim, 1 << 40).verdict.value)
    same = snap._replace(  # (the same fold, whatever order a restore lists its tasks in)
        closed_above=tuple(sorted(snap.closed_above)),
        dead=tuple(sorted(snap.dead)),
        open=tuple(sorted(snap.open)),
    )
    tasks = worker.tasks.snapshot()
    return {
        "claims": repr(same),
        "claims_at": worker.claims.next_position,
        "tasks": repr((*tasks[:5], list(tasks.positions), *tasks[6:])),
        "known": worker.tasks.known,
        "verdicts": verdicts,
        "drained": worker.is_drained(),
    }


def start_both(config_json: str, spec_path: str) -> None:
    """In the forked child: take the inherited fold; do what the test asks between the
    fork and the start (append records, compact); start a worker from the fold and one
    from scratch; write what each sees."""
    config = WorkerConfig.from_json(config_json)
    spec = json.loads(Path(spec_path).read_text())
    fold = prefold.take(config.location)
    if spec["then"] == "append":
        append_more(Path(config.location))
    elif spec["then"] == "compact":
        compact(Path(config.location), EVERYTHING)
    result: dict[str, Any] = {"inherited": fold is not None}
    with Worker(config, start=fold, handler=noop) as inherited:
        result["adopted"] = fold is not None and inherited.tasks is fold.tasks
        result["from_fold"] = what_it_sees(inherited)
    with Worker(config, handler=noop) as scratch:
        result["from_scratch"] = what_it_sees(scratch)
    Path(spec["out"]).write_text(json.dumps(result))


def append_more(directory: Path) -> None:
    """Five more tasks; one of them claimed, one claimed and done."""
    tasks_log, claims_log = open_topics(directory)
    with tasks_log, claims_log:
        first = len(list(tasks_log.iter_from(tasks_log.start)))
        for n in range(5):
            tasks_log.append(encode(TaskRecord({"more": n}, NOW_US)))
        claims_log.append(encode(Claim(first, "w9-9-bbbb", NOW_US, LEASE)))
        claim = claims_log.append(encode(Claim(first + 1, "w9-9-bbbb", NOW_US, LEASE)))
        claims_log.append(encode(Done(first + 1, "w9-9-bbbb", NOW_US + 1, claim, None)))


@pytest.fixture
def forks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Fork `start_both` for the queue in tmp_path/qw; returns what the child wrote."""
    monkeypatch.chdir(REPO)  # the child imports this module by name
    data = tmp_path / "qw"
    runs = iter(range(1000))

    def fork(then: str | None = None, slots: int = 2) -> dict[str, Any]:
        run = next(runs)
        out, spec = tmp_path / f"seen-{run}.json", tmp_path / f"spec-{run}.json"
        spec.write_text(json.dumps({"then": then, "out": str(out)}))
        child = ForkedWorker(config_of(data, slots=slots), spec, entry=start_both)
        assert child.wait(60) == 0, f"the child exited with {child.poll()}"
        return dict(json.loads(out.read_text()))

    yield fork
    stop_server()


def config_of(
    data: Path, *, slot: int = 1, slots: int = 2, handler: str = "tests.test_prefold:noop"
) -> WorkerConfig:
    return WorkerConfig(
        location=str(data),
        run_dir=str(data / "run"),
        name=f"w{slot}",
        handler=handler,
        slot=slot,  # (slot 0 saves checkpoints: these workers leave the directory as it is)
        slots=slots,
        fsync="none",
    )


def assert_same(seen: dict[str, Any]) -> None:
    assert seen["inherited"] and seen["adopted"]
    assert seen["from_fold"] == seen["from_scratch"]


def test_a_worker_starts_from_the_fork_servers_fold_and_sees_what_a_replay_sees(
    tmp_path: Path, forks: Any
) -> None:
    make_queue(tmp_path / "qw", done=120, pending=30, held=7)
    seen = forks()
    assert_same(seen)
    assert seen["from_fold"]["known"] == 150
    assert seen["from_fold"]["verdicts"][7] == "lost: held"  # the live lease is in the fold
    assert seen["from_fold"]["verdicts"][140] == "won"


def test_records_appended_between_the_fold_and_the_start_are_read(
    tmp_path: Path, forks: Any
) -> None:
    make_queue(tmp_path / "qw", done=50, pending=10)
    seen = forks("append")
    assert_same(seen)
    assert seen["from_fold"]["known"] == 65
    assert seen["from_fold"]["verdicts"][60:62] == ["lost: held", "lost: done"]


def test_the_next_fork_reads_only_what_came_since_and_agrees(tmp_path: Path, forks: Any) -> None:
    make_queue(tmp_path / "qw", done=50, pending=10)
    assert_same(forks())
    append_more(tmp_path / "qw")  # after the server's fold: its next fork brings it up to date
    seen = forks()
    assert_same(seen)
    assert seen["from_fold"]["known"] == 65


def test_a_fold_compacted_away_falls_back_to_the_checkpoint(tmp_path: Path, forks: Any) -> None:
    data = tmp_path / "qw"
    make_queue(data, done=300, pending=20)
    # Compacted between the server's fold and the worker's start: the worker's first
    # catch-up finds its position gone and starts again from the checkpoint.
    seen = forks("compact")
    assert seen["inherited"] and seen["adopted"]
    assert seen["from_fold"] == seen["from_scratch"]
    assert seen["from_fold"]["known"] == 320
    # And the server's own fold, whose position is gone too, is made again from the
    # checkpoint at the next fork.
    append_more(data)
    compact(data, EVERYTHING)
    seen = forks()
    assert_same(seen)
    assert seen["from_fold"]["known"] == 325


def test_a_restart_after_kill_9_starts_from_a_fold_that_has_the_dead_workers_claim(
    tmp_path: Path, forks: Any
) -> None:
    data = tmp_path / "qw"
    make_queue(data, done=20, pending=5)
    assert_same(forks())  # the server folds the queue once
    config = config_of(data, slot=0, slots=1, handler="tests.test_prefold:hang")
    victim = ForkedWorker(config, tmp_path / "victim.log")

    def claimed() -> bool:
        claims_log = open_topic(data, CLAIMS_TOPIC)
        with claims_log:
            records = [decode_claims(e.data) for e in claims_log.iter_from(claims_log.start)]
        mine = (r for r in records if isinstance(r, Claim) and r.worker != "w0-1-aaaa")
        return any(r.worker.startswith("w0-") for r in mine)

    wait_until(claimed, what="the victim's CLAIM")
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait(30) == -signal.SIGKILL
    seen = forks()
    assert_same(seen)
    held = [v for v in seen["from_fold"]["verdicts"] if v == "lost: held"]
    assert len(held) == 1  # the killed worker's lease, still live, is in the inherited fold


def test_with_the_prefold_off_the_child_inherits_nothing(
    tmp_path: Path, forks: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_queue(tmp_path / "qw", done=10, pending=5)
    monkeypatch.setattr(prefold, "can_prefold", lambda location: False)  # the prefold off
    seen = forks()
    assert not seen["inherited"]
    assert seen["from_fold"] == seen["from_scratch"]


# -- a fold of other logs is not adopted (in one process: the checks are the worker's) ------------


def test_a_fold_of_a_replaced_queue_is_not_adopted(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    make_queue(data, done=10, pending=5)
    server = Prefold(str(data), str(data))
    fold = server.refresh()
    server.close()
    shutil.rmtree(data)
    make_queue(data, done=3, pending=2)  # the same path, another queue
    config = config_of(data)
    with Worker(config, start=fold, handler=noop) as worker:
        assert worker.tasks is not fold.tasks
        seen = what_it_sees(worker)
    with Worker(config, handler=noop) as scratch:
        assert seen == what_it_sees(scratch)
    assert seen["known"] == 5


def test_a_fold_of_a_log_cut_short_or_rewritten_is_not_adopted(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    make_queue(data, done=10, pending=5)
    server = Prefold(str(data), str(data))
    fold = server.refresh()
    server.close()
    claims = FileLog.open(data / "claims.log")
    end = claims.end()
    claims.close()
    assert fold.claims_mark.position == end
    with open(data / "claims.log", "r+b") as f:  # the last record's last byte changed
        f.seek(end - 1)
        last = f.read(1)
        f.seek(end - 1)
        f.write(bytes([last[0] ^ 1]))
    tasks_log, claims_log = open_topics(data)
    with tasks_log, claims_log:
        assert fold.misfit(str(data), tasks_log, claims_log) is not None
    os.truncate(data / "tasks.log", fold.tasks_mark.position - 1)
    tasks_log, claims_log = open_topics(data)
    with tasks_log, claims_log:
        why = fold.tasks_mark.misfit(tasks_log)
    assert why is not None and "ends before" in why


def test_a_fold_of_another_location_is_not_adopted(tmp_path: Path) -> None:
    data = tmp_path / "qw"
    make_queue(data, done=10, pending=5)
    server = Prefold("elsewhere", str(data))
    fold = server.refresh()
    server.close()
    with Worker(config_of(data), start=fold, handler=noop) as worker:
        assert worker.tasks is not fold.tasks


def test_a_checkpoint_saved_since_the_last_fold_is_started_from(tmp_path: Path) -> None:
    # A restart long after the last fork: the server's fold starts again from the newer
    # checkpoint, as a worker of its own would, rather than folding everything since.
    data = tmp_path / "qw"
    make_queue(data, done=30, pending=5)
    server = Prefold(str(data), str(data))
    first = server.refresh()
    tasks_log, claims_log = open_topics(data)
    with tasks_log, claims_log:
        assert first.began_at == (tasks_log.start, claims_log.start)  # no checkpoint yet
    append_more(data)
    tasks_log, claims_log = open_topics(data)
    with tasks_log, claims_log:
        tasks, claims = TaskIndex(tasks_log.start), ClaimsFollower(claims_log.start)
        tasks.catch_up(tasks_log)
        claims.catch_up(claims_log)
        save_checkpoint(data, tasks, tasks_log, claims, claims_log)
        saved_at = (tasks.next_position, claims.next_position)
    again = server.refresh()
    assert again.began_at == saved_at
    with Worker(config_of(data), start=again, handler=noop) as worker:
        assert worker.tasks is again.tasks
        seen = what_it_sees(worker)
    with Worker(config_of(data), handler=noop) as scratch:
        assert seen == what_it_sees(scratch)
    server.close()


def test_the_server_knows_when_no_fork_is_asked_for_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fork server imports filelock while it waits (supervisor.run.forkserver_ready) only when
    # no fork is asked for: a `warm` alone read, nothing more in the control pipe.
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(read_end, False)
        monkeypatch.setattr(prefold, "_control_fd", read_end)
        prefold.warm(write_end, "/nowhere/queue", 8)
        monkeypatch.setattr(prefold, "_unread", os.read(read_end, 65536))
        assert prefold._parse(prefold._unread) == ("/nowhere/queue", "/nowhere/queue", 8)
        assert prefold.fork_asked() is False
        # a fork's request waiting in the pipe
        prefold.request(write_end, WorkerConfig(location="/nowhere/queue", run_dir="/r", name="w0"))
        assert prefold.fork_asked() is True
        # or already read with the warm
        monkeypatch.setattr(prefold, "_unread", prefold._unread + os.read(read_end, 65536))
        assert prefold.fork_asked() is True
        # nothing read at all (no warm came) but a request waiting
        monkeypatch.setattr(prefold, "_unread", b"")
        assert prefold.fork_asked() is False
        prefold.request(write_end, WorkerConfig(location="/nowhere/queue", run_dir="/r", name="w1"))
        assert prefold.fork_asked() is True
    finally:
        os.close(read_end)
        os.close(write_end)
