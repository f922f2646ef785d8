"""A real run with a real stale DONE, judged under qw's rules and the original's.

A real worker process wins a task, is frozen (SIGSTOP) past its lease while its handler
(one that ignores cancellation: supervisor.demos.pause.stubborn) works; a second worker
takes the task over and completes it; the frozen one is resumed (SIGCONT) and writes its
DONE. qw's fold refuses that DONE as stale; the original's rules accept it: the task would
have been completed twice. The scenario is the one `qw demo pause` runs (run_scenario).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from queue_worker.names import worker_label
from queue_worker.partitions.queue import create_partitioned
from queue_worker.proof.report import read_claims
from queue_worker.proof.unfenced import UnfencedVerdict, compare
from queue_worker.protocol.state import Verdict
from supervisor.demos.fleet import DemoFailed
from supervisor.demos.pause import PauseOptions, PauseRun, run_scenario
from supervisor.timeline.svg import LABEL_W, WIDTH
from tests.browser import browse, chromium, external_references


def qw(*args: str) -> subprocess.CompletedProcess[str]:
    """`qw ARGS`, its output piped, laid out for 80 columns."""
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )


@pytest.fixture(scope="module")
def paused_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PauseRun]:
    data_dir = tmp_path_factory.mktemp("unfenced") / "qw"
    data_dir.mkdir()
    try:
        run = run_scenario(data_dir, PauseOptions(lease_s=0.5, work_ms=1500, taker_work_ms=100))
    except DemoFailed as e:
        pytest.fail(str(e))
    return data_dir, run


def test_the_stale_done_is_refused_by_qw_and_a_second_completion_without_fencing(
    paused_run: tuple[Path, PauseRun],
) -> None:
    data_dir, run = paused_run
    assert run.stale_done.verdict is Verdict.STALE_DONE  # qw's fold, as the log settled it
    assert run.stale_done.outcome.worker == run.victim
    c = compare(read_claims(data_dir))
    stale = [d for d in c.differences if d.position == run.stale_done.position]
    assert len(stale) == 1, c.differences
    (d,) = stale
    assert d.qw.verdict is Verdict.STALE_DONE
    assert d.unfenced.verdict.accepted_done  # from anyone who names the task
    both = tuple(sorted((run.taker_done.position, run.stale_done.position)))
    assert c.completed_twice == {run.task: both}
    taker = [d for d in c.differences if d.position == run.taker_done.position]
    if run.taker_done.position < run.stale_done.position:
        # the taker's DONE first: judged alike; the frozen worker's is a second completion
        assert d.unfenced.verdict is UnfencedVerdict.DONE_AGAIN and taker == []
    else:
        # the frozen worker's first: the original's rules close the task with it, and the
        # taker's DONE (qw's one completion) is the second
        assert d.unfenced.verdict is UnfencedVerdict.DONE
        assert [(x.qw.verdict, x.unfenced.verdict) for x in taker] == [
            (Verdict.DONE, UnfencedVerdict.DONE_AGAIN)
        ]
    # nothing else differs: the takeover came after the frozen worker's lease, renewed or
    # not, so both rule sets let it win
    assert {x.position for x in c.differences} <= set(both)


def test_qw_report_rules_unfenced_says_it_in_words(paused_run: tuple[Path, PauseRun]) -> None:
    data_dir, run = paused_run
    plain = qw("report", "--dir", str(data_dir))
    result = qw("report", "--dir", str(data_dir), "--rules", "unfenced")
    assert result.returncode == plain.returncode == 1  # qw's verdict: worked twice
    assert result.stdout.startswith(plain.stdout)  # qw's report as it is, then the comparison
    victim, stale = worker_label(run.victim), run.stale_done.position
    first, second = sorted((run.taker_done.position, stale))
    if first == stale:
        taker = worker_label(run.takeover.outcome.worker or "")
        now = f"the holder is {taker} (claim @{run.takeover.position})"
        accepted = "accepted"
    else:
        now, accepted = f"the task was already done @{first}", "accepted again"
    line = (
        f"task {run.task}: {victim}'s DONE @{stale} — refused as stale under qw's rules "
        f"(its token @{run.victim_claim.position} no longer holds the task; {now}); "
        f"{accepted} under unfenced rules, so task {run.task} would have been completed "
        f"twice (@{first} and @{second})"
    )
    assert line in " ".join(result.stdout.split()), result.stdout  # wrapped to 80 columns
    assert max(len(x) for x in result.stdout.splitlines()) <= 80
    assert f"completed more than once: task {run.task}" in result.stdout


# covered in make test by test_qw_report_rules_unfenced_says_it_in_words
@pytest.mark.slow
def test_qw_report_rules_unfenced_json(paused_run: tuple[Path, PauseRun]) -> None:
    data_dir, run = paused_run
    result = qw("report", "--dir", str(data_dir), "--rules", "unfenced", "--json")
    body = json.loads(result.stdout)
    assert body["rules"] == "unfenced"
    (d,) = [x for x in body["unfenced"]["differences"] if x["qw"] == "stale done"]
    assert d["position"] == run.stale_done.position
    assert d["unfenced"] in ("done", "done again")
    assert body["unfenced"]["completed_twice"] == {
        str(run.task): sorted([run.taker_done.position, run.stale_done.position])
    }
    assert "unfenced" not in json.loads(qw("report", "--dir", str(data_dir), "--json").stdout)


# covered in make test by the report's and the replay's tests here
@pytest.mark.slow
def test_qw_timeline_rules_unfenced(paused_run: tuple[Path, PauseRun], tmp_path: Path) -> None:
    data_dir, run = paused_run
    text = qw("timeline", "--dir", str(data_dir), "--rules", "unfenced", "--text")
    assert text.returncode == 0, text.stderr
    assert f"@{run.stale_done.position}" in text.stdout
    assert f"task {run.task} would have been completed twice" in text.stdout
    out = tmp_path / "t.html"
    page = qw("timeline", "--dir", str(data_dir), "--rules", "unfenced", "--out", str(out))
    assert page.returncode == 0, page.stderr
    html = out.read_text()
    assert 'class="unfenced-accepted"' in html and 'class="completed-twice"' in html
    plain = tmp_path / "plain.html"
    qw("timeline", "--dir", str(data_dir), "--out", str(plain))
    assert "unfenced-accepted" not in plain.read_text()
    beside = tmp_path / "beside.html"  # `qw report --timeline` draws the same layer
    qw("report", "--dir", str(data_dir), "--rules", "unfenced", "--timeline", str(beside))
    assert 'class="completed-twice"' in beside.read_text()


# covered in make test by a page in headless Chromium: test_web_browser
@pytest.mark.slow
def test_the_layer_in_a_real_browser(paused_run: tuple[Path, PauseRun], tmp_path: Path) -> None:
    browser = chromium()
    data_dir, run = paused_run
    page = tmp_path / "page.html"
    made = qw("timeline", "--dir", str(data_dir), "--rules", "unfenced", "--out", str(page))
    assert made.returncode == 0, made.stderr
    assert external_references(page.read_text(encoding="utf-8")) == []
    dumped = browse(browser, page, "--dump-dom")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = dumped.stdout
    ring = re.search(
        rf'<g class="unfenced-accepted" data-position="{run.stale_done.position}">'
        r'<title>([^<]*)</title><circle cx="([\d.]+)"',
        dom,
    )
    assert ring is not None, dom[-3000:]
    assert "would have been completed twice" in ring.group(1)
    assert LABEL_W <= float(ring.group(2)) <= WIDTH  # on the plot, not off its edge
    assert f'<g class="completed-twice" data-task="{run.task}">' in dom
    assert "the same log under unfenced rules" in dom


@pytest.mark.parametrize("command", ["report", "timeline"])
def test_a_bad_rules_value_is_one_line_and_exit_2(command: str, tmp_path: Path) -> None:
    result = qw(command, "--dir", str(tmp_path), "--rules", "fenced")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "'fenced'" in line and "qw, unfenced" in line and "--rules" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["report", "timeline"])
def test_a_partitioned_queue_is_refused_in_one_line(command: str, tmp_path: Path) -> None:
    data = tmp_path / "q"
    create_partitioned(data, 2)
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    result = qw(command, "--dir", str(data), "--rules", "unfenced")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "--rules unfenced" in line and "partitioned queue" in line
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before


def test_qw_replay_rules_unfenced_shows_the_difference_where_it_is(
    paused_run: tuple[Path, PauseRun],
) -> None:
    """`qw replay --rules unfenced`: at the frozen worker's DONE the screen says, under qw's
    verdict, how the original's rules judge it; the counter of differences counts it; at a
    record judged alike there is no such line."""
    data_dir, run = paused_run
    stale = run.stale_done.position
    at = qw("replay", "--dir", str(data_dir), "--no-tui", "--rules", "unfenced", "--at", str(stale))
    assert at.returncode == 0, at.stderr
    flat = " ".join(at.stdout.split())
    assert f"unfenced: task {run.task}: {worker_label(run.victim)}'s DONE @{stale}" in flat, flat
    assert "refused as stale under qw's rules" in flat and "completed twice" in flat, flat
    differs = re.search(r"unfenced differs (\d+)", at.stdout)
    assert differs is not None and int(differs.group(1)) >= 1, at.stdout
    assert max(len(x) for x in at.stdout.splitlines()) <= 80
    claim = run.victim_claim.position  # its CLAIM won under both rule sets
    before = qw(
        "replay", "--dir", str(data_dir), "--no-tui", "--rules", "unfenced", "--at", str(claim)
    )
    assert "unfenced:" not in before.stdout and "unfenced differs 0" in before.stdout, before.stdout
    plain = qw("replay", "--dir", str(data_dir), "--no-tui", "--at", str(stale))
    assert "unfenced:" not in plain.stdout and "unfenced differs" not in plain.stdout
