"""A partitioned `qw up` as a user sees it: the live dashboard in a real tmux (each worker's
partition, each partition's backlog, `k` and the takeover in the partition of the killed
worker), the stats endpoint over real HTTP, and the partitions section's layouts."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from queue_worker.partitions.queue import resolve_partitions
from queue_worker.worker.snapshot import parse_snapshot
from supervisor.http_api import StatsServer
from supervisor.partitioned.names import tagged
from supervisor.partitioned.run import PartitionedSupervisor
from supervisor.partitioned.view import PartitionedView, merge_alike
from supervisor.run.model import Event, Orphan, QueueView, SupervisorSnapshot, WorkerView
from supervisor.run.supervisor import SupervisorOptions
from supervisor.tui.dashboard import full_screen
from supervisor.tui.partition_panel import partition_section
from supervisor.tui.worker_table import worker_table
from tests.helpers import wait_until
from tests.test_cli import qw, start_up
from tests.test_http import get
from tests.test_tui_tmux import QW, Tmux, at_prompt, exit_status, keys_line_intact

# -- the dashboard in a real terminal --------------------------------------------------------

#: a row of the worker table: slot, worker, partition, state
ROW = re.compile(r"^\s*▶?(\d+)\s+(w\d+·\d+)(?: ↻\d+)?\s+p(\d+)\s+(\w+)", re.MULTILINE)
SIZES = [(80, 24), (160, 50)]
# make test runs 80x24, the size every screen must fit; make test-all the larger one too
SIZE_PARAMS = [
    pytest.param(size, marks=() if size == SIZES[0] else pytest.mark.slow) for size in SIZES
]
NOW = 1_700_000_000.0


@pytest.fixture(params=SIZE_PARAMS, ids=[f"{w}x{h}" for w, h in SIZES])
def term(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    width, height = request.param
    tmux = Tmux(tmp_path / "tmux.sock", width, height)
    try:
        tmux.start(tmp_path)
        yield tmux
    finally:
        tmux.kill_server()


#: a working row's worker, partition and task (k:id)
WORKING_TASK = re.compile(
    r"^\s*▶?\d+\s+(w\d+·\d+)(?: ↻\d+)?\s+p(\d+)\s+working\s+(\d+):(\d+)\s", re.MULTILINE
)


def rows(screen: str) -> dict[str, tuple[int, str]]:
    """worker label → (its partition, its state), from the worker table."""
    return {m.group(2): (int(m.group(3)), m.group(4)) for m in ROW.finditer(screen)}


# covered in make test by a kill at 80x24 in tmux: test_tui_tmux; the partitioned rows:
# the others here
@pytest.mark.slow
def test_dashboard_shows_partitions_and_a_kill_taken_over_in_its_partition(
    term: Tmux, tmp_path: Path
) -> None:
    term.type_line(
        f"{QW} up --dir {tmp_path / 'qw'} --partitions 4 --workers 8 --lease 3 "
        "--work-ms 2000 --tasks 200"
    )

    def eight_workers() -> dict[str, tuple[int, str]] | None:
        found = rows(term.screen())
        busy = sum(1 for _, state in found.values() if state == "working")
        return found if len(found) == 8 and busy >= 4 else None

    found = wait_until(eight_workers, 60, "eight worker rows, working")
    assert isinstance(found, dict)
    # two workers in each partition, each named in its partition's line
    per_partition = sorted(p for p, _ in found.values())
    assert per_partition == [0, 0, 1, 1, 2, 2, 3, 3], term.screen()
    screen = term.screen()
    assert "4 partitions  ·  up " in screen.splitlines()[0]
    assert "partitions: 4" in screen
    for k in range(4):
        line = next(x for x in screen.splitlines() if x.startswith(f"p{k} "))
        assert re.search(r"done \d+/50\s+pending \d+\s+held \d+", line), line
        if term.width >= 120:  # the workers of the partition end its line
            assert all(label in line for label, (p, _) in found.items() if p == k), line
    assert keys_line_intact(screen), screen
    # the task column names each worker's task k:id, k the worker's own partition
    tasks = WORKING_TASK.findall(screen)
    assert tasks and all(p == k for _, p, k, _ in tasks), screen

    # k: a holder is killed; its task is named k:id; the survivor that takes it over is
    # one of the same partition's workers (or the killed slot's replacement)
    term.send("k")

    def killed() -> tuple[int, str, str] | None:
        m = re.search(r"p(\d) kill -9 (w\d+·\d+), holding task (\d+):(\d+)", term.screen())
        if m is None:
            return None
        assert m.group(1) == m.group(3), m.group(0)  # the task is the partition's own
        return int(m.group(1)), m.group(2), f"{m.group(3)}:{m.group(4)}"

    kill = wait_until(killed, 20, "the kill -9 of a worker holding a task")
    assert isinstance(kill, tuple)
    partition, victim, task = kill
    assert found[victim][0] == partition
    waiting = re.compile(rf"^task {task}  {victim} ", re.MULTILINE)
    wait_until(lambda: waiting.search(term.screen()), 10, f"task {task} in the orphans")
    taken = re.compile(rf"^task {task}  {victim} → (w\d+·\d+)  took over ", re.MULTILINE)

    def heir() -> str | None:
        m = taken.search(term.screen())
        return m.group(1) if m else None

    survivor = wait_until(heir, 60, f"the takeover of task {task}")
    assert isinstance(survivor, str)
    now = rows(term.screen())
    assert now[survivor][0] == partition, term.screen()
    assert now[victim] == (partition, "dead") or victim not in now, term.screen()
    assert keys_line_intact(term.screen()), term.screen()

    term.send("q")
    wait_until(lambda: "DRAINING" in term.screen() or at_prompt(term), 10, "draining")
    assert exit_status(term, "qw up to drain and exit", 60) == 0, term.screen()
    assert "qw: stopped with" in term.screen() and "4 partitions" in term.screen()


# make test watches a partitioned kill at 80x24 in
# test_dashboard_shows_partitions_and_a_kill_taken_over_in_its_partition
@pytest.mark.slow
def test_a_kill_among_more_workers_than_fit_80x24_is_watched_to_its_takeover(
    tmp_path: Path,
) -> None:
    """16 workers in 80x24: the table shows a window of them, and `k` may kill one below
    it. The killed worker's row (dead, its task k:id struck through) comes into view, and
    stays while its lease runs out and a worker of its partition takes the task over."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    term = Tmux(tmp_path / "tmux.sock", 80, 24)
    try:
        term.start(tmp_path)
        term.type_line(
            f"{QW} up --dir {tmp_path / 'qw'} --partitions 4 --workers 16 --lease 3 "
            "--work-ms 2000 --tasks 400"
        )
        more = re.compile(r"… \d+ more rows")
        wait_until(lambda: len(WORKING_TASK.findall(term.screen())) >= 4, 60, "working rows")
        assert more.search(term.screen()), term.screen()
        term.send("k")
        killed = re.compile(r"p(\d) kill -9 (w\d+·\d+), holding task (\d+:\d+)")

        def kill() -> tuple[str, str, str] | None:
            m = killed.search(term.screen())
            return (m.group(1), m.group(2), m.group(3)) if m else None

        found = wait_until(kill, 20, "the kill -9 of a worker holding a task")
        assert isinstance(found, tuple)
        partition, victim, task = found
        dead_row = re.compile(rf"^\s*\d+\s+{victim}\s+p{partition}\s+dead KILL\s+{task}\s")
        orphan = re.compile(rf"^task {task}  {victim} (died|→)", re.MULTILINE)

        def seen_dead() -> bool:
            screen = term.screen()
            lines = screen.splitlines()
            return orphan.search(screen) is not None and any(dead_row.match(x) for x in lines)

        wait_until(seen_dead, 20, f"{victim}'s dead row holding {task}, and its orphan")
        taken = re.compile(rf"^task {task}  {victim} → (w\d+·\d+)  took over ", re.MULTILINE)

        def heir() -> str | None:
            m = taken.search(term.screen())
            return m.group(1) if m else None

        survivor = wait_until(heir, 60, f"the takeover of {task}")
        screen = term.screen()
        # the dead row is still shown beside the takeover, and the heir is of its partition
        assert any(dead_row.match(x) for x in screen.splitlines()), screen
        assert more.search(screen) and keys_line_intact(screen), screen
        heir_row = rows(screen).get(str(survivor))
        assert heir_row is None or heir_row[0] == int(partition), screen
        term.send("q")
        assert exit_status(term, "qw up to drain and exit", 60) == 0, term.screen()
    finally:
        term.kill_server()


# -- the stats endpoint ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """http://127.0.0.1:PORT of a partitioned run: 3 partitions, 4 workers, 30 tasks."""
    data = tmp_path_factory.mktemp("http") / "qw"
    manifest = resolve_partitions(str(data), 3)
    assert manifest is not None
    options = SupervisorOptions(data_dir=data, location=str(data), workers=4, tasks=30, work_ms=20)
    sup = PartitionedSupervisor(options, manifest)
    server = StatsServer(PartitionedView(sup, shown=str(data)), "127.0.0.1", 0)
    sup.start()
    server.start()
    try:
        yield f"http://{server.address}"
    finally:
        server.close()
        sup.request_stop()
        sup.wait(30)


def stats(endpoint: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(get(f"{endpoint}/stats")[2])
    return body


def all_done(endpoint: str) -> dict[str, Any] | None:
    """/stats once the 30 tasks are done by the fold and by the workers' own published
    counts (which follow a moment later)."""
    body = stats(endpoint)
    finished = sum(w["finished"] for w in body["workers"])
    return body if body["queue"]["done"] == 30 and finished == 30 else None


def test_stats_give_each_partition_and_their_sum(endpoint: str) -> None:
    body = wait_until(lambda: all_done(endpoint), 60, "30 tasks done, by the workers too")
    assert isinstance(body, dict)
    parts = body["partitions"]
    assert [p["partition"] for p in parts] == [0, 1, 2]
    for key in ("published", "done", "pending", "held"):
        assert sum(p[key] for p in parts) == body["queue"][key]
    assert sorted(p["published"] for p in parts) == [10, 10, 10]
    workers = body["workers"]
    assert sorted(w["partition"] for w in workers) == [0, 0, 1, 2]
    assert len({w["name"] for w in workers}) == 4  # unique across partitions
    assert sorted(w["slot"] for w in workers) == [0, 1, 2, 3]
    assert sum(w["finished"] for w in workers) == 30
    assert body["orphans"] == []


def test_metrics_label_partitions(endpoint: str) -> None:
    wait_until(lambda: all_done(endpoint), 60, "30 tasks done, by the workers too")
    status, content_type, text = get(f"{endpoint}/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    done = {
        s.labels["partition"]: s.value
        for s in families["qw_partition_tasks"].samples
        if s.labels["state"] == "done"
    }
    assert done == {"0": 10.0, "1": 10.0, "2": 10.0}
    finished = families["qw_worker_finished"].samples
    assert sorted(s.labels["partition"] for s in finished) == ["0", "0", "1", "2"]
    assert sum(s.value for s in finished) == 30
    assert [s.value for s in families["qw_orphans"].samples] == [0, 0, 0]


def test_task_endpoint_takes_partition_colon_id(endpoint: str) -> None:
    wait_until(lambda: stats(endpoint)["queue"]["done"] == 30, 60, "30 tasks done")
    status, _, text = get(f"{endpoint}/task/2:4")
    body = json.loads(text)
    assert status == 200, body
    assert body["task"] == "2:4" and body["partition"] == 2 and body["done"] is True
    assert [h["kind"] for h in body["history"]][:2] == ["TASK", "CLAIM"]
    status, _, text = get(f"{endpoint}/task/7:4")
    assert status == 404 and "partition 7 does not exist" in json.loads(text)["error"]
    status, _, text = get(f"{endpoint}/task/2:99")
    assert status == 404 and "no task 2:99" in json.loads(text)["error"]
    status, _, text = get(f"{endpoint}/task/4")
    assert status == 400 and "/task/K:ID" in json.loads(text)["error"]


# -- the pieces ------------------------------------------------------------------------------


def render(renderable: object, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue()


def test_many_partitions_are_packed_into_the_lines_given() -> None:
    queues = [QueueView(published=10, done=k) for k in range(16)]
    orphan = Orphan(3, "w0·1", "w0-1-ab", 0, 0.0, 0.0, partition=5)
    text = render(partition_section(queues, [], [orphan], lines=2), 40)
    lines = text.splitlines()
    assert lines[0].startswith("── partitions: 16")
    assert len(lines) == 3
    assert "p0 0/10" in lines[1] and "p5 5/10 !" in text  # the orphaned partition marked
    more = re.search(r"… (\d+) more", lines[2])
    assert more is not None, text
    shown = len(re.findall(r"\bp\d+ ", text))
    assert shown + int(more.group(1)) == 16
    assert all(len(line) <= 40 for line in lines)
    # room for every partition: one line each
    text = render(partition_section(queues[:3], [], [], lines=3), 100)
    assert [line.split()[0] for line in text.splitlines()[1:]] == ["p0", "p1", "p2"]


def partition_worker(slot: int, partition: int, task: int | None, **over: Any) -> WorkerView:
    """A worker row of a partitioned `qw up` (`PartitionedView` numbers the slots)."""
    fields: dict[str, Any] = {
        "slot": slot,
        "name": f"p{partition}.w{slot}",
        "worker_id": f"w{slot}-{41000 + slot}-9fe3",
        "pid": 41000 + slot,
        "state": "working" if task is not None else "idle",
        "stats": parse_snapshot(
            {"current_task": task, "current_since": NOW - 1, "lease_expiry": NOW + 2}
        ),
        "partition": partition,
    }
    fields.update(over)
    return WorkerView(**fields)


def test_the_worker_table_names_tasks_partition_colon_id() -> None:
    """The task column names a task as every other line does, ``k:id`` (``#5`` would name
    task 5 of each partition), for a live worker, a dead one's last task and its orphan."""
    live = partition_worker(0, 2, 5)
    dead = partition_worker(1, 3, 9, state="dead", exit_code=-9, died_at=NOW - 1)
    gone = partition_worker(2, 1, 4, state="dead", exit_code=-9, died_at=NOW - 1)
    orphan = Orphan(4, gone.label, gone.worker_id or "", 2, NOW - 1, NOW + 1, partition=1)
    text = render(worker_table([live, dead, gone], now=NOW, orphans=[orphan]), 100)
    row = {line.split()[1]: line for line in text.splitlines()[2:]}
    assert re.search(r"\bp2\s+working\s+2:5\s", row[live.label]), text
    assert re.search(r"\bp3\s+dead KILL\s+3:9\s", row[dead.label]), text
    assert re.search(r"\bp1\s+dead KILL\s+1:4\s+\d", row[gone.label]), text  # lease left
    assert "#" not in text, text
    # a queue without partitions: #id, as before
    plain = dataclasses.replace(live, partition=None)
    assert re.search(r"working\s+#5\s", render(worker_table([plain], now=NOW), 100))


def test_a_killed_worker_stays_on_an_80x24_screen_however_many_rows_there_are() -> None:
    """16 workers do not fit 80x24: the table shows a window of them. The worker just
    killed (its row struck through, its lease counting down), is in that window, with the
    workers next to it (its partition's: one of them takes its task over)."""
    workers = [partition_worker(i, i // 4, 10 + i) for i in range(16)]
    victim = partition_worker(13, 3, 23, state="dead", exit_code=-9, died_at=NOW - 1)
    heir = partition_worker(13, 3, 40, worker_id="w13-42000-77aa", pid=42000, restarts=1)
    workers[13] = heir
    orphan = Orphan(23, victim.label, victim.worker_id or "", 13, NOW - 1, NOW + 2, partition=3)
    snap = SupervisorSnapshot(
        location="parts",
        workers=workers,
        queue=QueueView(published=400, pending=300, held=16, done=84),
        events=[],
        orphans=[orphan],
        departed=[victim],
        partitions=[QueueView(published=100) for _ in range(4)],
    )
    out = io.StringIO()
    Console(file=out, width=80, height=24, color_system=None).print(
        full_screen(snap, now=NOW, height=24)
    )
    screen = out.getvalue()
    assert len(screen.splitlines()) == 24, screen
    assert re.search(r"… \d+ more rows", screen), screen  # not every row fits
    found = rows(screen)
    assert found[victim.label] == (3, "dead"), screen
    assert re.search(rf"{victim.label}\s+p3\s+dead KILL\s+3:23\s", screen), screen
    assert found[heir.label] == (3, "working"), screen
    # a selection still decides what is shown
    chosen = dataclasses.replace(snap, selected=0)
    out = io.StringIO()
    Console(file=out, width=80, height=24, color_system=None).print(
        full_screen(chosen, now=NOW, height=24)
    )
    assert workers[0].label in rows(out.getvalue()), out.getvalue()


def test_partition_texts_name_tasks_partition_colon_id() -> None:
    assert tagged("kill -9 w1·3857, holding task 5", 2) == "p2 kill -9 w1·3857, holding task 2:5"
    assert tagged("w0·1 died holding tasks 4, 17", 1) == "p1 w0·1 died holding tasks 1:4, 1:17"
    assert tagged("publishing 2.5 demo tasks/s", 0) == "p0 publishing 2.5 demo tasks/s"
    alike = [
        Event(100.0 + k / 10, "info", tagged("publishing 1 demo tasks/s", k)) for k in range(3)
    ]
    other = Event(101.0, "death", "p1 w0·7 killed")
    merged = merge_alike([*alike, other], 3)
    assert [e.text for e in merged] == ["p* publishing 1 demo tasks/s", "p1 w0·7 killed"]
    assert merge_alike(alike[:2], 3) == alike[:2]  # said by some partitions only: kept each


# -- qw up --rebalance: members --------------------------------------------------------------

#: a member's worker row: slot, m<member>.p<k>·pid, partition, state
MEMBER_ROW = re.compile(r"^\s*▶?(\d+)\s+(m(\d)\.p(\d)·(\d+))\s+p(\d)\s+(\w+)", re.MULTILINE)


def on_screen(term: Tmux, pattern: re.Pattern[str]) -> Callable[[], bool]:
    return lambda: pattern.search(term.screen()) is not None


# make test watches a partitioned kill at 80x24 in
# test_dashboard_shows_partitions_and_a_kill_taken_over_in_its_partition
@pytest.mark.slow
def test_rebalance_dashboard_shows_members_partitions_and_a_killed_members_takeovers(
    tmp_path: Path,
) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    term = Tmux(tmp_path / "tmux.sock", 80, 24)
    try:
        term.start(tmp_path)
        term.type_line(
            f"{QW} up --dir {tmp_path / 'qw'} --partitions 4 --workers 2 --rebalance "
            "--lease 3 --work-ms 2000 --tasks 120"
        )

        def both_members() -> dict[int, set[int]] | None:
            works: dict[int, set[int]] = {}
            for m in MEMBER_ROW.finditer(term.screen()):
                assert m.group(4) == m.group(6), m.group(0)  # the row's partition is its name's
                works.setdefault(int(m.group(3)), set()).add(int(m.group(4)))
            if sorted(works) != [0, 1] or len(works[0] | works[1]) != 4:
                return None
            # (while a member joins, the other may still work a partition it is giving up)
            return works if not works[0] & works[1] else None

        wait_until(both_members, 60, "two members sharing the four partitions, two each")
        assert "4 partitions  ·  up " in term.screen().splitlines()[0]

        term.send("k")
        # the kill and the death name the member process and every task it held, whole
        # on an 80-column screen (k:id: each in its partition)
        said = re.compile(r"^kill -9 m(\d)·(\d+), holding tasks? ((?:\d:\d+(?:, )?)+)$", re.M)
        died = re.compile(r"m(\d)·(\d+) killed by SIGKILL while holding tasks? ([\d:, ]+)$", re.M)

        def death() -> tuple[str, str, list[str]] | None:
            screen = term.screen()
            kill, dead = said.search(screen), died.search(screen)
            if kill is None or dead is None:
                return None
            assert kill.groups() == dead.groups(), screen
            # the feed, newest first: the death above the kill that caused it
            label = f"m{dead.group(1)}·{dead.group(2)}"
            lines = screen.splitlines()
            feed_kill = [i for i, x in enumerate(lines) if f" info       kill -9 {label}" in x]
            feed_death = [i for i, x in enumerate(lines) if f" death      {label} killed" in x]
            assert feed_kill and feed_death and feed_death[0] < feed_kill[0], screen
            return (dead.group(1), dead.group(2), dead.group(3).split(", "))

        found = wait_until(death, 20, "the kill and the death of a member, with its tasks")
        assert isinstance(found, tuple)
        member, pid, tasks = found
        assert all(re.fullmatch(r"[0-3]:\d+", task) for task in tasks), tasks
        for task in tasks:  # each taken over in its partition, by lease expiry
            k = task.split(":")[0]
            taken = re.compile(
                rf"^task {task}  m{member}\.p{k}·{pid} → (m\d\.p{k}·\d+)  took over ", re.MULTILINE
            )
            wait_until(on_screen(term, taken), 60, f"the takeover of {task}")
        assert keys_line_intact(term.screen()), term.screen()
        term.send("q")
        assert exit_status(term, "qw up --rebalance to drain and exit", 60) == 0, term.screen()
    finally:
        term.kill_server()


class DeadMemberBoard:
    """What `MembersView` reads of a `MemberSupervisor` whose member m0 was killed -9 while
    its replacement already runs: m0's new process works p1, the dead one's rows (p0, p2)
    are on the board until their tasks are taken over; m1 works p3."""

    def __init__(self, tmp_path: Path) -> None:
        self.options = SupervisorOptions(data_dir=tmp_path, location=str(tmp_path))
        self.manifest = None
        self.started_at = NOW - 60

    def member_pids(self) -> list[int | None]:
        return [200, 300]

    def member_rows(self, member: int, pid: int) -> list[WorkerView]:
        k = 1 if member == 0 else 3
        return [member_row(member, pid, k, 10 + k)]

    def board(self, pids: list[int | None]) -> tuple[list[Orphan], list[WorkerView], list[Event]]:
        assert pids == [200, 300]
        dead = [
            member_row(0, 100, k, 20 + k, state="dead", exit_code=-9, died_at=NOW - 1)
            for k in (0, 2)
        ]
        orphans = [Orphan(20, dead[0].label, "m0.p0-100-ab", 0, NOW - 1, NOW + 2, partition=0)]
        return orphans, dead, []

    def monitors(self) -> list[Any]:
        return []

    def snapshot(self) -> SupervisorSnapshot:
        return SupervisorSnapshot(location="parts", workers=[], queue=QueueView(), events=[])


def member_row(member: int, pid: int, k: int, task: int, **over: Any) -> WorkerView:
    worker_id = f"m{member}.p{k}-{pid}-ab"
    return partition_worker(
        member, k, task, name=f"m{member}.p{k}", worker_id=worker_id, pid=pid, **over
    )


def test_a_dead_members_rows_stay_beneath_its_replacements(tmp_path: Path) -> None:
    """As a restarted slot's dead process in a queue's table: the dead member's rows come
    right after the rows of the member that replaced it, not at the bottom of the table."""
    from typing import cast

    from supervisor.partitioned.members import MemberSupervisor
    from supervisor.partitioned.members_view import MembersView

    view = MembersView(cast(MemberSupervisor, DeadMemberBoard(tmp_path)), shown="parts")
    snap = view.snapshot()
    assert [(w.slot, w.name, w.pid, w.state) for w in snap.workers] == [
        (0, "m0.p1", 200, "working"),
        (1, "m0.p0", 100, "dead"),
        (2, "m0.p2", 100, "dead"),
        (3, "m1.p3", 300, "working"),
    ]
    text = render(worker_table(snap.workers, now=NOW, orphans=snap.orphans), 100)
    assert re.search(r"m0\.p0·100\s+p0\s+dead KILL\s+0:20\s", text), text
    assert view.kill(1) is None  # a dead row: no process there to kill


def test_rebalance_serves_stats_with_each_members_partitions(tmp_path: Path) -> None:
    up = start_up(
        tmp_path, "up", "--dir", str(tmp_path / "qw"), "--partitions", "2", "--workers", "2",
        "--rebalance", "--tasks", "400", "--work-ms", "50", "--http", "0",
    )  # fmt: skip
    try:

        def address() -> str | None:
            found = re.search(r"qw: stats on (http://\S+)/stats", (tmp_path / "up.err").read_text())
            return found.group(1) if found else None

        endpoint = wait_until(address, 60, "the stats address")
        assert isinstance(endpoint, str)

        def two_members() -> dict[str, Any] | None:
            body = stats(endpoint)
            names = {w["name"] for w in body["workers"]}
            return body if names == {"m0.p0", "m1.p1"} or names == {"m0.p1", "m1.p0"} else None

        body = wait_until(two_members, 60, "each member on one partition")
        assert isinstance(body, dict)
        assert sorted(w["partition"] for w in body["workers"]) == [0, 1]
        assert [p["published"] for p in body["partitions"]] == [200, 200]
        assert body["queue"]["published"] == 400
        status, _, text = get(f"{endpoint}/task/1:0")
        assert status == 200 and json.loads(text)["task"] == "1:0"
        # qw status: this qw up, its two members and where it serves (it said no supervisor)
        said = qw("status", "--dir", str(tmp_path / "qw"), cwd=tmp_path)
        assert said.returncode == 0, said.stderr
        assert said.stdout.splitlines()[1:3] == [
            "supervisors  1 running",
            f"  pid {up.pid}  2 members alive  http {endpoint.removeprefix('http://')}",
        ], said.stdout
    finally:
        up.send_signal(signal.SIGTERM)
        up.send_signal(signal.SIGTERM)
        up.wait(60)


def test_a_second_stop_request_before_any_tick_still_ends_the_members(tmp_path: Path) -> None:
    """Two stop requests at once (two SIGTERMs in a row): the members are killed and not
    restarted, and the run ends (it restarted them for ever)."""
    from supervisor.partitioned.members import MemberSupervisor
    from supervisor.run.supervisor import EXIT_FORCED

    data = tmp_path / "qw"
    manifest = resolve_partitions(str(data), 2)
    assert manifest is not None
    options = SupervisorOptions(data_dir=data, location=str(data), workers=2, tasks=50, work_ms=200)
    sup = MemberSupervisor(options, manifest)
    sup.request_stop()
    sup.request_stop()
    sup.start()
    try:
        assert sup.wait(60), "the members supervisor did not end"
        assert sup.exit_code == EXIT_FORCED
    finally:
        sup.stop_now()
