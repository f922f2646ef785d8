"""`qw replay`: the fold stepped forwards and back over a real run, and its screen.

The run is real: `qw demo redistribution` starts real worker processes and kills one with
SIGKILL while it holds a task (its kill goes to the ops log); a survivor takes the task
over. At every position the stepper's counters and held tasks must be what `qw report
--at POSITION` replays to, whether the position was reached forwards or backwards (through
the snapshots). The player is driven in a real terminal (tmux, 80x24).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from queue_worker.ops import KILL
from queue_worker.proof.explain import explain_task
from queue_worker.proof.report import Report, load_report, read_claims
from queue_worker.protocol.records import Claim, ClaimsRecord, Done, Renew, Unknown
from queue_worker.protocol.state import ClaimState
from supervisor.replay.cli import RULE_NAMES
from supervisor.replay.model import STALE, TAKEOVER, Counters, Stepper
from supervisor.replay.player import Player
from supervisor.replay.rules import RULES
from supervisor.replay.tape import load_tape, make_tape
from supervisor.replay.view import Lanes, plain_screen
from tests.helpers import wait_until
from tests.test_tui_tmux import QW, Tmux, assert_terminal_restored, at_prompt, exit_status

A = "w1-1001-aaaa"
B = "w2-1002-bbbb"
T0 = 1_700_000_000_000_000
LEASE = 1_000_000


def qw(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run: two workers, four tasks, one worker killed (SIGKILL) holding a task."""
    data = tmp_path_factory.mktemp("replay") / "run"
    done = qw(
        "demo",
        "redistribution",
        "--workers",
        "2",
        "--tasks",
        "4",
        "--lease",
        "0.5",
        "--work-ms",
        "600",
        "--dir",
        str(data),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return data


def report_counters(report: Report) -> Counters:
    return Counters(
        done=report.tasks_done,
        takeovers=len(report.takeovers),
        stale=report.completions_stale,
        lost=report.lost,
        leases_lost=report.renewals_refused,
        released=report.fails_accepted - report.tasks_dead,
        dead=report.tasks_dead,
    )


def held(stepper: Stepper) -> list[tuple[int, object]]:
    return sorted((p.task, p.lease) for p in stepper.moment().in_play)


def test_each_position_forwards_and_back_is_what_report_at_replays(run: Path) -> None:
    tape = load_tape(str(run))
    assert len(tape) > 10
    reports = {p: load_report(run, up_to=p) for p in tape.positions}
    stepper = Stepper(tape, every=4)  # small: most steps back restore a snapshot
    stepper.seek(-1)
    assert stepper.counters == Counters() and held(stepper) == []
    for position in tape.positions:  # → all the way
        stepper.step(1)
        assert stepper.moment().position == position
        report = reports[position]
        assert stepper.counters == report_counters(report), position
        assert held(stepper) == sorted((h.task, h.lease) for h in report.held), position
    assert stepper.counters.takeovers == 1  # the killed worker's task, taken over
    for position in reversed(tape.positions):  # ← all the way back
        assert stepper.moment().position == position
        assert stepper.counters == report_counters(reports[position]), position
        assert held(stepper) == sorted((h.task, h.lease) for h in reports[position].held)
        stepper.step(-1)
    assert stepper.index == -1
    # and the command itself, at a few positions reached by going there
    for position in random.Random(7).sample(list(tape.positions), 3):
        out = qw("report", "--dir", str(run), "--at", str(position), "--json")
        body = json.loads(out.stdout)
        stepper.go_position(position)
        c = stepper.counters
        assert (c.done, c.takeovers, c.stale, c.lost) == (
            body["tasks_done"],
            len(body["takeovers"]),
            body["completions_stale"],
            body["lost"],
        )
        assert sorted(h["task"] for h in body["held"]) == [
            p.task for p in sorted(stepper.moment().in_play, key=lambda p: p.task)
        ]


def test_going_anywhere_gives_the_fold_of_the_prefix() -> None:
    """Seeks in a random order (back through snapshots, forwards by steps) reach the state
    a fresh fold of the records up to there reaches."""
    records: list[ClaimsRecord] = []
    for task in range(30):
        worker = (A, B)[task % 2]
        records += [Claim(task, worker, T0 + task * 10, LEASE), Claim(task, B, T0 + task * 10, 1)]
    positions = [10 * (i + 1) for i in range(len(records))]
    for i in range(0, len(records), 3):  # some done by their holder, some refused
        claim = records[i]
        assert isinstance(claim, Claim)
        records.append(Done(claim.task, claim.worker, T0 + 5000, positions[i]))
        positions.append(positions[-1] + 10)
    tape = make_tape("mem", records, positions)
    stepper = Stepper(tape, every=5)
    for target in random.Random(3).sample(range(-1, len(records)), 40):
        stepper.seek(target)
        fresh = ClaimState()
        for r, p in zip(records[: target + 1], positions[: target + 1], strict=True):
            fresh.apply(r, p)
        assert stepper.state == fresh, target


def fenced_run() -> list[tuple[int, ClaimsRecord]]:
    """A pauses past its lease on task 0; B takes it over and finishes; A's DONE is stale."""
    return [
        (10, Claim(0, A, T0, LEASE)),
        (20, Renew(0, A, T0 + 500_000, 10, LEASE)),
        (30, Claim(1, A, T0 + 600_000, LEASE)),
        (40, Claim(1, B, T0 + 700_000, LEASE)),  # lost: A holds task 1
        (50, Done(1, A, T0 + 900_000, 30)),
        (60, Claim(0, B, T0 + 2_000_000, LEASE)),  # takeover
        (70, Done(0, B, T0 + 2_500_000, 60)),
        (80, Done(0, A, T0 + 3_000_000, 10)),  # stale
    ]


def test_jumps_stop_at_the_events_and_the_words_are_qw_whys() -> None:
    claims = fenced_run()
    tape = make_tape("mem", [r for _, r in claims], [p for p, _ in claims])
    stepper = Stepper(tape)
    stepper.seek(-1)
    assert stepper.next_event() is not None and stepper.moment().position == 60
    assert [e.kind for e in stepper.events_here()] == [TAKEOVER]
    assert stepper.next_event() is not None and stepper.moment().position == 80
    assert [e.kind for e in stepper.events_here()] == [STALE]
    assert stepper.next_event() is None  # the last one
    assert stepper.previous_event() is not None and stepper.moment().position == 60
    story = explain_task(0, None, claims)
    for position in (10, 20, 60, 70, 80):
        stepper.go_position(position)
        moment = stepper.moment()
        step = next(s for s in story.steps if s.position == position)
        assert moment.why is not None and (moment.why.verdict, moment.why.why) == (
            step.verdict,
            step.why,
        )
    last = stepper.moment().why
    assert last is not None and "worked twice" in last.why


def test_following_a_task_or_a_worker_steps_only_over_its_records(run: Path) -> None:
    tape = load_tape(str(run))
    claims = list(read_claims(run))
    stepper = Stepper(tape)
    stepper.seek(-1)
    taken = load_report(run).takeovers[0].task  # the killed worker's task
    assert stepper.follow_text(f"task {taken}") is None
    seen: list[int] = []
    while True:
        before = stepper.index
        stepper.step(1)
        if stepper.index == before:
            break
        seen.append(tape.positions[stepper.index])
    assert seen == [p for p, r in claims if not isinstance(r, Unknown) and r.task == taken]
    assert stepper.previous_event() is not None  # its takeover
    assert TAKEOVER in [e.kind for e in stepper.events_here()]
    assert stepper.previous_event() is not None  # before it: the kill of its holder
    assert [e.kind for e in stepper.events_here() if e.op is not None] == [KILL]
    victim = next(op for op in tape.ops if op.kind == KILL)
    assert victim.worker is not None
    label = re.sub(r"^(w\d+)-(\d+)-\w+$", r"\1·\2", victim.worker)
    assert stepper.follow_text(label) is None
    stepper.seek(-1)
    stepper.step(1)
    record = tape.records[stepper.index]
    assert not isinstance(record, Unknown) and record.worker == victim.worker
    assert stepper.next_event() is not None  # the kill of the followed worker
    assert [e.op for e in stepper.events_here() if e.op is not None] == [victim]
    assert stepper.follow_text("w9·1") is not None  # nobody: said, not followed
    assert stepper.follow is not None and stepper.follow.worker == victim.worker
    assert stepper.follow_text("") is None and stepper.follow is None


def test_no_tui_at_prints_the_screen_the_player_draws(run: Path) -> None:
    tape = load_tape(str(run))
    stepper = Stepper(tape)
    takeover = next(e for e in stepper.events if e.kind == TAKEOVER)
    position = tape.positions[takeover.place]
    out = qw("replay", "--dir", str(run), "--no-tui", "--at", str(position))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.rstrip("\n").splitlines()
    assert all(len(line) <= 80 and line == line.rstrip() for line in lines), out.stdout
    assert len(lines) <= 24
    assert re.search(rf"^@{position} CLAIM task \d+ by w\d+·\d+ → takeover$", out.stdout, re.M)
    assert "why: won, a takeover of " in out.stdout
    report = load_report(run, up_to=position)
    assert f"done {report.tasks_done}  takeovers 1  stale 0  lost {report.lost}" in out.stdout, (
        out.stdout
    )
    for h in report.held:
        row = rf"^ +{h.task} +w\d+·\d+ +@{h.lease.claim} "
        assert re.search(row, out.stdout, re.M), out.stdout
    stepper.go_position(position)
    text = plain_screen(stepper.moment(), Lanes(stepper), 80, 24, str(run))
    assert text == out.stdout.rstrip("\n")
    # bad input: one line naming it, exit 2
    for args, said in (
        (["--at", "x"], "expected a log position"),
        (["--rules", "fenced"], f"expected one of {', '.join(RULE_NAMES)}"),
        (["--partition", "1"], "holds a queue without partitions"),
    ):
        bad = qw("replay", "--dir", str(run), "--no-tui", *args)
        assert bad.returncode == 2 and said in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1 and not bad.stdout
    missing = qw("replay", "--dir", str(run / "nothing"), "--no-tui")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert set(RULE_NAMES) == {*RULES, "unfenced"}  # (unfenced: beside qw's, not instead)


# covered in make test by the file log's replay; --partition K opens that partition's logs
@pytest.mark.slow
def test_a_partitioned_queue_is_replayed_one_partition_at_a_time(tmp_path: Path) -> None:
    data = tmp_path / "parts"
    up = qw(
        "up",
        "--dir",
        str(data),
        "--partitions",
        "2",
        "--workers",
        "2",
        "--tasks",
        "6",
        "--work-ms",
        "1",
        "--exit-when-drained",
        "--no-tui",
    )
    assert up.returncode == 0, up.stdout + up.stderr
    whole = qw("replay", "--dir", str(data), "--no-tui")
    assert whole.returncode == 2 and "give --partition K (0 to 1)" in whole.stderr
    assert len(whole.stderr.strip().splitlines()) == 1
    for k in (0, 1):
        one = qw("replay", "--dir", str(data), "--partition", str(k), "--no-tui", columns=400)
        assert one.returncode == 0, one.stderr
        assert one.stdout.startswith("qw replay  record ")
        assert one.stdout.splitlines()[0].endswith(str(data / f"p{k}")), one.stdout
        assert re.search(r"^done [1-6]  ", one.stdout, re.M), one.stdout
    beyond = qw("replay", "--dir", str(data), "--partition", "2", "--no-tui")
    assert beyond.returncode == 2 and "has partitions 0 to 1" in beyond.stderr


def test_the_player_in_a_real_terminal_steps_jumps_follows_plays_and_quits(
    run: Path, tmp_path: Path
) -> None:
    import shutil

    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    tape = load_tape(str(run))
    taken = load_report(run).takeovers[0].task  # the killed worker's task
    term = Tmux(tmp_path / "tmux.sock", 80, 24)
    try:
        term.start(Path(__file__).resolve().parent.parent)
        term.type_line(f"{QW} replay --dir {run}")
        wait_until(lambda: "before the first record" in term.screen(), 30, "the player")
        screen = term.screen()
        assert f"record 0/{len(tape)}" in screen and "q quit" in screen, screen
        term.send("Right")  # → applies the first record
        wait_until(lambda: f"record 1/{len(tape)}" in term.screen(), 10, "one record applied")
        assert f"@{tape.positions[0]} CLAIM task " in term.screen()
        assert re.search(r"why: won: nobody held it", term.screen()), term.screen()
        term.send("]")  # the kill: the ops record right after the record before it
        wait_until(lambda: "killed by the demo" in term.screen(), 10, "the kill")
        then = r"^then: w\d+·\d+ killed by the demo at .*, holding task \d+"
        assert re.search(then, term.screen(), re.M), term.screen()
        term.send("]")  # the takeover of the killed worker's task
        wait_until(lambda: "→ takeover" in term.screen(), 10, "the takeover")
        screen = term.screen()
        assert "why: won, a takeover of " in screen and "takeovers 1" in screen, screen
        assert "▼" in screen
        term.send("[")  # back to the kill
        wait_until(lambda: "killed by the demo" in term.screen(), 10, "back at the kill")
        assert "takeovers 0" in term.screen()
        term.send("/")
        wait_until(lambda: "follow (task id or worker" in term.screen(), 10, "the prompt")
        term.send("-l", str(taken))
        term.send("Enter")
        wait_until(lambda: f"following task {taken}" in term.screen(), 10, "following it")
        term.send("?")
        wait_until(lambda: "qw replay: the keys" in term.screen(), 10, "the keys")
        term.send("?")
        wait_until(lambda: "following task" in term.screen(), 10, "the keys closed")
        lines = term.screen().splitlines()
        assert all(len(line) <= 80 for line in lines)
        term.send("/")  # follow everything again, go to the first record, and play
        term.send("Enter")
        wait_until(lambda: "following everything" in term.screen(), 10, "following all")
        term.send("g")
        term.send("-l", f"@{tape.positions[0]}")
        term.send("Enter")
        wait_until(lambda: f"record 1/{len(tape)}" in term.screen(), 10, "the first record")
        term.send("+")  # ×2: the run's own pace, twice as fast
        term.send("Space")
        end = f"record {len(tape)}/{len(tape)}"
        wait_until(lambda: end in term.screen(), 60, "the play to reach the end")
        wait_until(lambda: "the end of the tape" in term.screen(), 10, "the play to stop")
        term.send("q")
        assert exit_status(term, "qw replay to quit", 20) == 0
        assert at_prompt(term) or "QW_EXIT=0" in term.screen()
        assert_terminal_restored(term)
    finally:
        term.kill_server()


def test_on_a_long_run_the_lanes_are_a_stretch_begun_from_the_fold_before_it() -> None:
    """A claim won long before the stretch the lanes draw, done inside it, is one bar that
    ends DONE (the stretch's model starts from the snapshot's fold, not from nothing)."""
    records: list[ClaimsRecord] = [Claim(0, A, T0, 100 * LEASE)]
    for n in range(1, 40):
        records.append(Claim(n, B, T0 + n * 1000, LEASE))
        records.append(Done(n, B, T0 + n * 1000 + 500, 10 * (2 * n)))
    positions = [10 * (i + 1) for i in range(len(records))]
    records.append(Done(0, A, T0 + 50_000, 10))
    positions.append(positions[-1] + 10)
    tape = make_tape("mem", records, positions)
    stepper = Stepper(tape, every=8)
    assert stepper.counters.done == 40 and stepper.counters.stale == 0
    lanes = Lanes(stepper)
    view = lanes.view_at(len(tape) - 2)
    assert view.start > T0  # a stretch, not the whole run
    (bar,) = [b for b in view.bars if b.task == 0]
    assert (bar.worker, bar.claim, bar.end_kind) == (A, 10, "done")
    assert [lane.worker for lane in view.lanes] == [A, B]


def looks(player: Player) -> tuple[bool, str | None, bool, bool]:
    """Playing, the message, the keys' list shown, done (read afresh at each call)."""
    return player.playing, player.message, player.help, player.done


def said(player: Player) -> str | None:
    return player.message


def test_the_players_keys_go_play_at_the_runs_pace_and_follow() -> None:
    """The player without a terminal: `g` to a position and to a time, `space` moving the
    cursor with the run's own clock (× the speed), `/` and its refusal, `?`, `q`."""
    from supervisor.tui.live import ENTER, LEFT, RIGHT

    claims = fenced_run()
    tape = make_tape("mem", [r for _, r in claims], [p for p, _ in claims])
    player = Player(Stepper(tape))
    player.stepper.seek(-1)
    for key in ["g", *"@55", ENTER]:  # the last record at or before @55: @50
        player.on_key(key)
    assert player.stepper.moment().position == 50 and said(player) is None
    for key in ["g", *"+2s", ENTER]:  # 2 s after the first record: the takeover at T0 + 2 s
        player.on_key(key)
    assert player.stepper.moment().position == 60
    for key in ["g", *"soon", ENTER]:
        player.on_key(key)
    assert "expected a claims-log position" in str(said(player))
    player.on_key(LEFT)
    assert player.stepper.moment().position == 50
    player.on_key(RIGHT)
    assert player.stepper.moment().position == 60
    # space: from @60 (T0 + 2 s), half a second of the wall clock at ×1 reaches @70
    player.on_key(" ", now=100.0)
    assert looks(player)[0]
    assert not player.tick(now=100.4) and player.stepper.moment().position == 60
    assert player.tick(now=100.5) and player.stepper.moment().position == 70
    player.on_key("+", now=100.5)  # ×2: the next half second of the run in a quarter
    assert player.speed == 2
    assert player.tick(now=100.75) and player.stepper.moment().position == 80
    assert looks(player)[:2] == (False, "the end of the tape")
    player.on_key(RIGHT)
    assert said(player) == "no later record"
    for key in ["/", *"w9·9", ENTER]:
        player.on_key(key)
    assert "no task or worker" in str(said(player))
    for key in ["/", *"w1·1001", ENTER]:
        player.on_key(key)
    assert said(player) == "following w1·1001"
    player.stepper.seek(-1)
    player.on_key("]")  # w1's first event: its stale DONE (the takeover is B's)
    assert player.stepper.moment().position == 80 and said(player) == STALE
    player.on_key("?")
    assert looks(player)[2]
    player.on_key("x")  # any key closes the list
    assert looks(player)[2:] == (False, False)
    player.on_key("q")
    assert looks(player)[3]


# covered in make test by test_each_position_forwards_and_back_is_what_report_at_replays (the tape
# reads any Log)
@pytest.mark.slow
def test_a_run_on_redis_is_replayed_as_report_at_replays_it(redis_url: str) -> None:
    up = qw(
        "up",
        "--log",
        redis_url,
        "--workers",
        "2",
        "--tasks",
        "5",
        "--work-ms",
        "1",
        "--exit-when-drained",
        "--no-tui",
    )
    assert up.returncode == 0, up.stdout + up.stderr
    tape = load_tape(redis_url)
    assert len(tape) >= 10  # a CLAIM and a DONE per task
    stepper = Stepper(tape, every=3)
    for place in (len(tape) - 1, len(tape) // 2, 2):
        stepper.seek(place)
        position = tape.positions[place]
        assert stepper.counters == report_counters(load_report(redis_url, up_to=position))
        out = qw("replay", "--log", redis_url, "--no-tui", "--at", str(position))
        assert out.returncode == 0, out.stderr
        assert f"@{position} " in out.stdout
        assert f"done {stepper.counters.done}  " in out.stdout


@pytest.mark.parametrize(("width", "height"), [(80, 24), (120, 40), (200, 60)])
def test_the_screen_fits_and_a_larger_one_shows_more(width: int, height: int) -> None:
    from supervisor.replay.view import screen_lines

    claims = fenced_run()
    tape = make_tape("mem", [r for _, r in claims], [p for p, _ in claims])
    stepper = Stepper(tape)
    stepper.go_position(80)  # the stale DONE
    lines = screen_lines(stepper.moment(), Lanes(stepper), width, height, status="paused")
    text = "\n".join(line.plain for line in lines)
    assert len(lines) == height and all(len(line.plain) <= width for line in lines), text
    assert "@80 DONE task 0 by w1·1001 under claim @10 → stale done" in text
    assert lines[-1].plain.startswith("→← step") and "w2·1002" in text and "▼" in text
    big = height >= 36
    assert ("events so far" in text) is big
    assert ("@60 takeover: task 0 by w2·1002" in text) is big
    assert ("! stale DONE" in text) is (big and width >= 100)  # the legend
